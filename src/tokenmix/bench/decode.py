"""``tokenmix bench decode``: per-token decode latency and cached positions at the end of an n-token
context, for each pattern mixer and a KV-cache attention baseline.

For each mixer, one context per n is prefilled with the mixer's fast mode (its returned state is
the decode cache); then ``steps`` tokens are decoded with ``mixer.step`` round-robin over the n
values, so the lengths being compared are timed side by side under the same machine load.
``latency_ms`` is the median wall time of a step, ``latency_min_ms`` the fastest step and
``cpu_ms`` the median process CPU time of a step (the least sensitive to other processes on a
shared machine). Growth ratios compare the largest n with the smallest, for each of the three.
"""
from __future__ import annotations

import statistics
import time

import torch

from tokenmix.mixers.registry import build_mixer, mixer_names

PATTERNS = ["pow2", "pow2_ce", "sq1", "sq1_ce", "first_order", "kth_order", "dense_recurrence"]
SIZES = [1024, 4096, 16384]


@torch.no_grad()
def decode_mixer(name: str, sizes: list[int], heads: int = 4, head_dim: int = 64, steps: int = 64) -> list[dict]:
    """One result per n for mixer ``name`` (same weights for every n), steps timed round-robin."""
    torch.manual_seed(0)
    m = build_mixer(name, heads * head_dim, n_heads=heads)
    xs, states, cached = {}, {}, {}
    for n in sizes:
        xs[n] = torch.randn(1, n + steps, heads * head_dim)
        _, states[n] = m(xs[n][:, :n])
        cached[n] = states[n].cached_positions()
    wall: dict[int, list[float]] = {n: [] for n in sizes}
    cpu: dict[int, list[float]] = {n: [] for n in sizes}
    for s in range(steps):
        for n in sizes:
            t, c = time.perf_counter(), time.process_time()
            _, states[n] = m.step(xs[n][:, n + s], states[n])
            cpu[n].append(time.process_time() - c)
            wall[n].append(time.perf_counter() - t)
    return [{"mixer": name, "n": n, "latency_ms": 1e3 * statistics.median(wall[n]),
             "latency_min_ms": 1e3 * min(wall[n]), "cpu_ms": 1e3 * statistics.median(cpu[n]),
             "cached_positions": cached[n], "peak_positions_measured": states[n].peak_positions,
             "cache_positions_derived": m.cache_positions(n + steps), "state_scalars": states[n].numel_per_batch()}
            for n in sizes]


def run(sizes: list[int] | None = None, mixers: list[str] | None = None, progress=None) -> dict:
    sizes = sizes or SIZES
    names = mixers or PATTERNS + (["attention"] if "attention" in mixer_names() else [])
    results = []
    for name in names:
        for r in decode_mixer(name, sizes):
            results.append(r)
            if progress:
                progress(r)
    summary = {}
    for name in names:
        rows = {r["n"]: r for r in results if r["mixer"] == name}
        lo, hi = min(rows), max(rows)
        entry = summary[name] = {f"latency_ms@{n}": round(r["latency_ms"], 3) for n, r in rows.items()}
        entry.update({f"cpu_ms@{n}": round(r["cpu_ms"], 3) for n, r in rows.items()})
        for key, label in (("latency_ms", "growth"), ("latency_min_ms", "growth_min"), ("cpu_ms", "growth_cpu")):
            entry[f"{label}_{hi}/{lo}"] = round(rows[hi][key] / rows[lo][key], 2)
        entry[f"cached_positions@{hi}"] = rows[hi]["cached_positions"]
    return {"benchmark": "decode", "results": results, "summary": summary}
