"""The on-disk record of a run: its configs, atomic file writes, checkpoints, result rows, metrics,
and the clocks its measurements are taken with. Training writes runs; analysis and study read them.
"""
