"""``tokenmix bench solver``: forward+backward time and peak memory of the structured mixer's
``dense`` mode vs its ``chunked`` mode on each backend that runs on the device (ops/pattern/backend.py:
torch and numba on the CPU, torch and triton on CUDA) per pattern, with torch SDPA causal attention as
the baseline. A row's ``backend`` is the one its calls ran on (``requested_backend`` the one it
asked for); the summary names a chunked row ``<pattern>/chunked:<requested backend>``
(``chunked:numba`` is what earlier runs called ``compiled``).

Shapes: B = 1, H = 4, head dim 64 (d_model 256). The dense mode materialises [B, H, n, n]; it is run
only up to ``MAX_DENSE_N``. The dense *pattern* (every j < t) in chunked mode takes the matmul
path (ops/pattern/window_softmax.py ``chunked_window_softmax``): O(n C) memory but O(n^2) time, so it is
skipped beyond ``MAX_DENSE_PATTERN_N`` to keep the run short.

``time_s`` is the best wall time of a fwd+bwd call (``repeats`` calls after a warm-up), ``cpu_s`` the
best process CPU time of a call (all threads; on a shared machine it is the steadier of the two,
since time-slicing by other processes inflates wall time), ``peak_mb`` the RSS growth of the
case's process during the timed calls (activations kept for backward included). ``device`` "cuda":
every case on the GPU, timed by CUDA events after a warm-up (``bench/device.py``).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from tokenmix.bench.settings import FULL_SOLVER_SIZES
from tokenmix.bench.worker import case_main, run_in_subprocess
from tokenmix.mixers import build_mixer
from tokenmix.ops import numba_runtime
from tokenmix.ops.pattern import backend as backends

PATTERNS = ["pow2", "sq1", "pow2_ce", "sq1_ce", "first_order", "dense_recurrence"]
SIZES = list(FULL_SOLVER_SIZES)
MAX_DENSE_N = 4096
MAX_DENSE_PATTERN_N = 4096
CASE_MODULE = "tokenmix.bench.solver"  # each case runs as `python -m CASE_MODULE <json>`


def _with_cpu_time(work, extra: dict):
    """fn() running ``work`` and keeping the best process CPU time of a call in extra["cpu_s"] (the
    worker merges ``extra`` into the result after timing)."""

    def fn():
        c = time.process_time()
        work()
        extra["cpu_s"] = min(extra.get("cpu_s", float("inf")), time.process_time() - c)

    return fn, extra


def prepare_solver_case(case: dict):
    n, h, hd = case["n"], case["heads"], case["head_dim"]
    device = case.get("device", "cpu")
    if case["mixer"] == "sdpa":
        q, k, v = (torch.randn(1, h, n, hd, device=device, requires_grad=True) for _ in range(3))

        def work():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        return _with_cpu_time(work, {})
    backend = {"backend": case["requested_backend"]} if "requested_backend" in case else {}
    m = build_mixer(case["mixer"], h * hd, n_heads=h, chunk_size=case.get("chunk_size", 64), **backend).to(device)
    x = torch.randn(1, n, h * hd, device=device, requires_grad=True)
    extra: dict = {}

    def work():
        y, state = m(x, mode=case["mode"])
        y.sum().backward()
        extra["backend"] = state.backend  # the one that ran (the window path of the dense pattern: torch)

    return _with_cpu_time(work, extra)


def chunked_backends(device: str = "cpu") -> list[str]:
    """The backends the chunked mode is timed on: torch, and the fast one of the device where it runs."""
    if device == "cuda":
        return ["torch"] + (["triton"] if backends.triton_available() else [])
    return ["torch"] + (["numba"] if numba_runtime.kernel_available() else [])


def cases(
    sizes: list[int],
    patterns: list[str],
    heads: int = 4,
    head_dim: int = 64,
    repeats: int = 3,
    device: str = "cpu",
) -> list[dict]:
    out = []
    for n in sizes:
        base = {"kind": "solver", "n": n, "heads": heads, "head_dim": head_dim, "repeats": repeats}
        if device != "cpu":
            base["device"] = device
        out.append({**base, "mixer": "sdpa", "mode": "sdpa"})
        for p in patterns:
            if p == "dense_recurrence" and n > MAX_DENSE_PATTERN_N:
                continue
            for backend in chunked_backends(device):
                out.append({**base, "mixer": p, "mode": "chunked", "requested_backend": backend})
            if n <= MAX_DENSE_N:
                out.append({**base, "mixer": p, "mode": "dense"})
    return out


def run(sizes: list[int] | None = None, patterns: list[str] | None = None, progress=None, device: str = "cpu") -> dict:
    sizes, patterns = sizes or SIZES, patterns or PATTERNS
    results = []
    for case in cases(sizes, patterns, device=device):
        results.append(run_in_subprocess(case, CASE_MODULE))
        if progress:
            progress(results[-1])
    return {"benchmark": "solver", "device": device, "results": results, "summary": summarize(results)}


def _label(r: dict) -> str:
    """A row's way of computing: its mode, and for the chunked mode the backend it asked for (its
    ``backend`` is the one that ran: the window path of the dense pattern is torch's whatever is asked)."""
    return f"{r['mode']}:{r['requested_backend']}" if "requested_backend" in r else r["mode"]


def summarize(results: list[dict]) -> dict:
    t = {(r["mixer"], _label(r), r["n"]): r["time_s"] for r in results if "time_s" in r}
    cpu = {(r["mixer"], _label(r), r["n"]): r["cpu_s"] for r in results if "cpu_s" in r}
    mem = {(r["mixer"], _label(r), r["n"]): r["peak_mb"] for r in results if "peak_mb" in r}
    ns = sorted({r["n"] for r in results})
    summary: dict = {}
    for (mixer, mode, n), v in t.items():
        entry = summary.setdefault(f"{mixer}/{mode}", {})
        entry[f"time_s@{n}"] = round(v, 4)
        if (mixer, mode, n) in cpu:
            entry[f"cpu_s@{n}"] = round(cpu[(mixer, mode, n)], 4)
        if (mixer, "dense", n) in t and mode.startswith("chunked"):
            entry[f"dense_over_{mode}@{n}"] = round(t[(mixer, "dense", n)] / v, 2)
            if (mixer, "dense", n) in cpu and (mixer, mode, n) in cpu:
                entry[f"dense_over_{mode}_cpu@{n}"] = round(cpu[(mixer, "dense", n)] / cpu[(mixer, mode, n)], 2)
        if ("sdpa", "sdpa", n) in t:
            entry[f"over_sdpa@{n}"] = round(v / t[("sdpa", "sdpa", n)], 3)
        if (mixer, mode, n) in mem:
            entry[f"peak_mb@{n}"] = round(mem[(mixer, mode, n)], 1)
    for key, entry in summary.items():
        if f"time_s@{ns[0]}" in entry and f"time_s@{ns[-1]}" in entry and len(ns) > 1:
            entry[f"growth_{ns[-1]}/{ns[0]}"] = round(entry[f"time_s@{ns[-1]}"] / entry[f"time_s@{ns[0]}"], 2)
        if f"cpu_s@{ns[0]}" in entry and f"cpu_s@{ns[-1]}" in entry and len(ns) > 1:
            entry[f"growth_cpu_{ns[-1]}/{ns[0]}"] = round(entry[f"cpu_s@{ns[-1]}"] / entry[f"cpu_s@{ns[0]}"], 2)
    return summary


if __name__ == "__main__":
    case_main(prepare_solver_case)
