"""``tokenmix bench decode``: per-token decode latency and cached positions at the end of an n-token
context, for each pattern mixer and a KV-cache attention baseline.

The context is prefilled with the mixer's fast mode (its returned state is the decode cache), then
``steps`` tokens are decoded one at a time with ``mixer.step``; latency is the median step time,
``latency_min_ms`` the fastest step (less sensitive to a loaded machine). Growth ratios compare the
largest n with the smallest, for both.
"""
from __future__ import annotations

import statistics
import time

import torch

from tokenmix.core.registry import build_mixer, mixer_names

PATTERNS = ["pow2", "pow2_ce", "sq1", "sq1_ce", "first_order", "kth_order", "dense_recurrence"]
SIZES = [1024, 4096, 16384]


@torch.no_grad()
def decode_case(name: str, n: int, heads: int = 4, head_dim: int = 64, steps: int = 64) -> dict:
    torch.manual_seed(0)
    m = build_mixer(name, heads * head_dim, n_heads=heads)
    x = torch.randn(1, n + steps, heads * head_dim)
    _, state = m(x[:, :n])
    cached_at_n = state.cached_positions()
    times = []
    for s in range(steps):
        t = time.perf_counter()
        _, state = m.step(x[:, n + s], state)
        times.append(time.perf_counter() - t)
    return {"mixer": name, "n": n, "latency_ms": 1e3 * statistics.median(times), "latency_min_ms": 1e3 * min(times),
            "cached_positions": cached_at_n, "peak_positions_measured": state.peak_positions,
            "cache_positions_derived": m.cache_positions(n + steps),
            "state_scalars": state.numel_per_batch()}


def run(sizes: list[int] | None = None, mixers: list[str] | None = None, progress=None) -> dict:
    sizes = sizes or SIZES
    names = mixers or PATTERNS + (["attention"] if "attention" in mixer_names() else [])
    results = []
    for name in names:
        for n in sizes:
            results.append(decode_case(name, n))
            if progress:
                progress(results[-1])
    summary = {}
    for name in names:
        rows = [r for r in results if r["mixer"] == name]
        lat = {r["n"]: r["latency_ms"] for r in rows}
        fastest = {r["n"]: r["latency_min_ms"] for r in rows}
        summary[name] = {f"latency_ms@{n}": round(v, 3) for n, v in lat.items()}
        summary[name][f"growth_{max(lat)}/{min(lat)}"] = round(lat[max(lat)] / lat[min(lat)], 2)
        summary[name][f"growth_min_{max(lat)}/{min(lat)}"] = round(fastest[max(lat)] / fastest[min(lat)], 2)
        summary[name][f"cached_positions@{max(lat)}"] = next(r["cached_positions"] for r in rows if r["n"] == max(lat))
    return {"benchmark": "decode", "results": results, "summary": summary}
