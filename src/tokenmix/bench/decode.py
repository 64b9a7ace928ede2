"""``tokenmix bench decode``: per-token decode latency and cached positions at the end of an n-token
context, for each pattern mixer and a KV-cache attention baseline.

Every mixer prefills one context per n with its fast mode (its returned state is the decode
cache); then ``steps`` tokens are decoded with ``mixer.step`` in blocks of 8, round-robin over the
mixers and the n values (``decode_mixers``), so the mixers and lengths being compared are timed
side by side under the same machine load; each block's first step is not timed (it finds the CPU
caches holding another mixer's weights, which a decode of one model does not). ``latency_ms`` is the median
wall time of a step,
``latency_min_ms`` the fastest step and ``cpu_ms`` the median process CPU time of a step (the least
sensitive to other processes on a shared machine). Growth ratios compare the largest n with the
smallest, for each of the three. A pattern mixer's row names its decode ``strategy`` and the
``backend`` its steps ran on (ops/pattern/backend.py). ``device`` "cuda": the mixers and their
caches on the GPU, each step timed by CUDA events (``bench/device.py``; the prefill is the warm-up).
"""

from __future__ import annotations

import statistics

import torch

from tokenmix.bench.device import timed_call
from tokenmix.mixers.pattern_cache import PatternCache
from tokenmix.mixers.registry import build_mixer, mixer_names

PATTERNS = ["pow2", "pow2_ce", "sq1", "sq1_ce", "first_order", "kth_order", "dense_recurrence"]
SIZES = [1024, 4096, 16384]


def decode_strategy(state) -> str:
    """How the steps read the state: a pattern recurrence's strategy (``pattern_cache.STRATEGIES``),
    else the state's kind (a KV cache, a recurrent state)."""
    return state.strategy if type(state) is PatternCache else type(state).__name__


@torch.no_grad()
def decode_mixers(
    names: list[str],
    sizes: list[int],
    heads: int = 4,
    head_dim: int = 64,
    steps: int = 128,
    block: int = 8,
    progress=None,
    device: str = "cpu",
) -> list[dict]:
    """One result per (mixer, n): every mixer prefilled at every n (one mixer's weights for all its
    n), then the ``steps`` decode steps taken in blocks of ``block`` tokens, round-robin over the
    mixers (the first one rotating) and the lengths, so a burst of load from other processes falls
    on all of them alike: the ratios between mixers are measured under the same conditions."""
    models, xs, states, cached = {}, {}, {}, {}
    for name in names:
        torch.manual_seed(0)
        models[name] = build_mixer(name, heads * head_dim, n_heads=heads).to(device)
        for n in sizes:
            xs[name, n] = torch.randn(1, n + steps, heads * head_dim).to(device)
            _, states[name, n] = models[name](xs[name, n][:, :n])
            cached[name, n] = states[name, n].cached_positions()
    wall: dict[tuple, list[float]] = {key: [] for key in states}
    cpu: dict[tuple, list[float]] = {key: [] for key in states}
    for r, first in enumerate(range(0, steps, block)):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for n in sizes:
                for s in range(first, min(steps, first + block)):
                    key = (name, n)
                    w, c, _, _ = timed_call(lambda: _step(models[name], xs[key][:, n + s], states, key), device)
                    if s > first:  # the block's first step warms the caches the other mixers used
                        cpu[name, n].append(c)
                        wall[name, n].append(w)
    results = []
    for name in names:
        m = models[name]
        for n in sizes:
            key = (name, n)
            results.append(
                {
                    "mixer": name,
                    "n": n,
                    "latency_ms": 1e3 * statistics.median(wall[key]),
                    "latency_min_ms": 1e3 * min(wall[key]),
                    "cpu_ms": 1e3 * statistics.median(cpu[key]),
                    "cached_positions": cached[key],
                    "peak_positions_measured": states[key].peak_positions,
                    "cache_positions_derived": m.cache_positions(n + steps),
                    "state_scalars": states[key].numel_per_batch(),
                    "strategy": decode_strategy(states[key]),
                    **({"backend": states[key].backend} if getattr(states[key], "backend", None) else {}),
                }
            )
            if progress:
                progress(results[-1])
    return results


def _step(model, x_t, states: dict, key: tuple) -> None:
    """One decode step of ``model`` on the state under ``key``, which it replaces."""
    _, states[key] = model.step(x_t, states[key])


def run(sizes: list[int] | None = None, mixers: list[str] | None = None, progress=None, device: str = "cpu") -> dict:
    sizes = sizes or SIZES
    names = mixers or PATTERNS + (["attention"] if "attention" in mixer_names() else [])
    results = decode_mixers(names, sizes, progress=progress, device=device)
    summary = {}
    for name in names:
        rows = {r["n"]: r for r in results if r["mixer"] == name}
        lo, hi = min(rows), max(rows)
        entry = summary[name] = {f"latency_ms@{n}": round(r["latency_ms"], 3) for n, r in rows.items()}
        entry.update({f"cpu_ms@{n}": round(r["cpu_ms"], 3) for n, r in rows.items()})
        for key, label in (("latency_ms", "growth"), ("latency_min_ms", "growth_min"), ("cpu_ms", "growth_cpu")):
            entry[f"{label}_{hi}/{lo}"] = round(rows[hi][key] / rows[lo][key], 2)
        entry[f"cached_positions@{hi}"] = rows[hi]["cached_positions"]
        entry["strategy"] = rows[hi]["strategy"]
        if "backend" in rows[hi]:
            entry["backend"] = rows[hi]["backend"]
    return {"benchmark": "decode", "device": device, "results": results, "summary": summary}
