"""``tokenmix bench mixers``: forward+backward time of every registered mixer (its default fast mode)
at n = 512, 2048, 8192 (B = 2, H = 4, head dim 64), with torch SDPA causal attention as the baseline
column, and achieved model GFLOP/s against the machine's measured fp32 matmul GFLOP/s.

Model FLOPs per mixer = 3 x (forward mixing multiply-adds x 2) from the derived
``flops_per_token``, summed over positions; projections are excluded (they are the same for all).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from tokenmix.bench.worker import run_in_subprocess
from tokenmix.core.registry import build_mixer, mixer_names

SIZES = [512, 2048, 8192]
MAX_QUADRATIC_N = 8192  # O(n^2)-memory mixers beyond this are skipped


def prepare_mixer_case(case: dict):
    n, h, hd, b = case["n"], case["heads"], case["head_dim"], case["batch"]
    if case["mixer"] == "sdpa":
        q, k, v = (torch.randn(b, h, n, hd, requires_grad=True) for _ in range(3))

        def fn():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        return fn, {"model_flops": 3 * 2 * b * h * hd * n * (n + 1)}
    m = build_mixer(case["mixer"], h * hd, n_heads=h)
    x = torch.randn(b, n, h * hd, requires_grad=True)

    def fn():
        y, _ = m(x)
        y.sum().backward()
    flops = 3 * 2 * b * sum(m.flops_per_token(t) for t in range(1, n + 1, max(1, n // 256))) * max(1, n // 256)
    return fn, {"model_flops": flops}


def matmul_gflops(size: int = 2048, repeats: int = 3) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(sizes: list[int] | None = None, mixers: list[str] | None = None, progress=None) -> dict:
    sizes = sizes or SIZES
    names = mixers or mixer_names()
    peak = matmul_gflops()
    results = []
    for n in sizes:
        base = {"kind": "mixer", "n": n, "heads": 4, "head_dim": 64, "batch": 2, "repeats": 2}
        for name in ["sdpa"] + names:
            results.append(run_in_subprocess({**base, "mixer": name, "mode": "default"}))
            r = results[-1]
            if "time_s" in r:
                r["gflops"] = r["model_flops"] / r["time_s"] / 1e9
                r["fraction_of_matmul_peak"] = r["gflops"] / peak
            if progress:
                progress(r)
    sdpa = {r["n"]: r["time_s"] for r in results if r["mixer"] == "sdpa" and "time_s" in r}
    summary = {}
    for r in results:
        if "time_s" in r and r["n"] in sdpa:
            summary.setdefault(r["mixer"], {})[f"speedup_vs_sdpa@{r['n']}"] = round(sdpa[r["n"]] / r["time_s"], 2)
            summary[r["mixer"]][f"matmul_peak_fraction@{r['n']}"] = round(r["fraction_of_matmul_peak"], 3)
    return {"benchmark": "mixers", "matmul_fp32_gflops": peak, "results": results, "summary": summary}
