"""Benchmarks: measured side by side in one run, printed as JSON. Timings are wall clock on this
machine; each case runs in its own subprocess so that peak memory (max RSS growth over the set-up
baseline) is attributable to that case alone."""
