"""``tokenmix bench mixers``: forward+backward time of every registered mixer (its default fast mode)
at n = 512, 2048, 8192 (B = 2, H = 4, head dim 64), with torch SDPA causal attention as the baseline
column, and achieved model GFLOP/s against the machine's measured fp32 matmul GFLOP/s.

What is timed and counted (each case in a fresh process, best of ``repeats`` after a warm-up):
  * ``time_s``: the whole mixer, x [B, n, H K] -> y, y.sum() backward: its projections included.
  * ``core_time_s`` (mixers exposing ``mixing_core``: the linear-attention family): the mixing alone,
    the chunked kernel on the mixer's own features of x as leaves, o.sum() backward, i.e. the same
    kind of computation as the SDPA column, which times the bare attention kernel on q, k, v.
  * ``model_flops``: 3 x 2 x the derived mixing multiply-adds (``flops_per_token`` summed over the
    positions; forward + backward = 3 forwards); for SDPA 3 x 2 x B H K n (n + 1) (QKᵀ and PV over
    the causal half). Projections are not in it.
  * ``projection_flops``: 3 x 2 x the multiply-adds of the mixer's nn.Linear layers (B n in x out each).
Fractions of the measured matmul rate (``case_matmul_fp32_gflops``, a 2048^3 GEMM in the case's own
process just before its timings; ``matmul_fp32_gflops`` is the same GEMM once at the start, and
``chunk_matmul_fp32_gflops`` the rate of the chunked kernels' [64, 64] @ [64, 64] batches):
  * ``fraction_of_matmul_peak`` = model_flops / time_s: mixing FLOPs over the whole mixer's time.
    With H K = 256 the projections are 3-8x the mixing FLOPs of the first-order mixers, so this
    stays far below 1 even for a free mixing (kept: it is the number earlier runs reported).
  * ``core_fraction_of_matmul_peak`` = model_flops / core_time_s: the mixing kernel's efficiency.
  * ``mfu_with_projections`` = (model_flops + projection_flops) / time_s: every counted FLOP of the
    timed work (the usual model-FLOP utilisation).
Roofline (mixers exposing ``moved_values(n)``, the structured recurrences): the time the work could
take on this machine, ``roofline_s`` = bytes moved / ``case_stream_gbs`` (a STREAM triad measured in
the case's own process, like the matmul rate) + projection_flops / ``case_matmul_fp32_gflops``;
``over_roofline`` = time_s / roofline_s. ``cpu_per_wall`` = cpu_s / time_s, the cores kept busy
(2 on this machine when both work). ``busy`` > 0 starts that many single-threaded matmul loops for
the whole run, to measure the mixers under contention (the shared machine's usual state).
``device`` "cuda": every case (and the matmul and bandwidth rates) on the GPU, timed by CUDA events
(``bench/device.py``). The structured mixers' rows name the ``backend`` their calls ran on.
"""

from __future__ import annotations

import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn

from tokenmix.bench.device import time_on
from tokenmix.bench.settings import FULL_MIXER_SIZES
from tokenmix.bench.worker import case_main, run_in_subprocess
from tokenmix.mixers.registry import build_mixer, mixer_names

SIZES = list(FULL_MIXER_SIZES)
MAX_QUADRATIC_N = 8192  # O(n^2)-memory mixers beyond this are skipped
CASE_MODULE = "tokenmix.bench.mixers"  # each case runs as `python -m CASE_MODULE <json>`


def projection_flops(m: nn.Module, tokens: int) -> int:
    """3 x 2 x multiply-adds of every nn.Linear of m over ``tokens`` positions (forward + backward)."""
    macs = sum(mod.in_features * mod.out_features for mod in m.modules() if isinstance(mod, nn.Linear))
    return 3 * 2 * macs * tokens


def prepare_mixer_case(case: dict):
    n, h, hd, b = case["n"], case["heads"], case["head_dim"], case["batch"]
    device = case.get("device", "cpu")
    # the rate the fractions are taken against, measured in the case's own process seconds before its
    # timings: the shared machine's rate moves by up to 1.6x between runs minutes apart
    rate = {"case_matmul_fp32_gflops": matmul_gflops(device=device), "case_stream_gbs": stream_triad_gbs(device=device)}
    if case["mixer"] == "sdpa":
        q, k, v = (torch.randn(b, h, n, hd, device=device, requires_grad=True) for _ in range(3))

        def fn():
            _clear_grads((q, k, v))
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        return fn, {"model_flops": 3 * 2 * b * h * hd * n * (n + 1), **rate}
    m = build_mixer(case["mixer"], h * hd, n_heads=h).to(device)
    x = torch.randn(b, n, h * hd, device=device, requires_grad=True)
    extra: dict = {}

    def fn():
        _clear_grads((x, *m.parameters()))
        y, state = m(x)
        y.sum().backward()
        if getattr(state, "backend", None) is not None:  # the structured mixers record theirs
            extra["backend"] = state.backend

    flops = 3 * 2 * b * sum(m.flops_per_token(t) for t in range(1, n + 1, max(1, n // 256))) * max(1, n // 256)
    extra.update({"model_flops": flops, "projection_flops": projection_flops(m, b * n), **rate})
    if hasattr(m, "moved_values"):
        extra["moved_bytes"] = b * m.moved_values(n) * x.element_size()
    if hasattr(m, "mixing_core"):
        core, inputs = m.mixing_core(x)

        def core_fn():
            _clear_grads(z for z in inputs if z is not None)
            o, _ = core(*inputs)
            o.sum().backward()

        extra["core_time_s"] = min(time_on(core_fn, case.get("repeats", 2), device)["wall"])
    return fn, extra


def _clear_grads(leaves) -> None:
    """Every timed call starts without gradients, as a training step after zero_grad(set_to_none=True)
    does: otherwise each backward after the first also adds into the previous call's buffers."""
    for z in leaves:
        z.grad = None


def matmul_gflops(size: int = 2048, repeats: int = 3, device: str = "cpu") -> float:
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    best = min(time_on(lambda: a @ b, repeats, device)["wall"])
    return 2 * size**3 / best / 1e9


def chunk_matmul_gflops(chunk: int = 64, batch: int = 1024, repeats: int = 3, device: str = "cpu") -> float:
    """Rate of the chunked kernels' own matmul shape: ``batch`` products [C, C] @ [C, C] (C = chunk =
    head dim = 64, the rows of one n = 8192 call) into a preallocated output. The kernels' matmuls
    can run no faster than this, and the chunked form does 1.3-1.7x the recurrent FLOPs the model
    count has (C x C scores and their product with V), so 0.6-0.75 x this rate over
    ``matmul_fp32_gflops`` bounds their core fraction from above."""
    a, b = torch.randn(batch, chunk, chunk, device=device), torch.randn(batch, chunk, chunk, device=device)
    out = torch.empty(batch, chunk, chunk, device=device)
    best = min(time_on(lambda: torch.bmm(a, b, out=out), repeats, device)["wall"])
    return 2 * batch * chunk**3 / best / 1e9


def stream_triad_gbs(mib: int = 256, repeats: int = 3, device: str = "cpu") -> float:
    """Memory bandwidth, GB/s: a = b + s c over three fp32 arrays of ``mib`` MiB each (far beyond
    the caches), 3 x mib bytes moved per call, best of ``repeats`` (STREAM's triad)."""
    n = mib * 2**20 // 4
    a, b, c = torch.empty(n, device=device), torch.rand(n, device=device), torch.rand(n, device=device)
    best = min(time_on(lambda: torch.add(b, c, alpha=3.0, out=a), repeats, device)["wall"])
    return 3 * n * 4 / best / 1e9


_BUSY_LOOP = "import torch; torch.set_num_threads(1); a = torch.randn(512, 512)\nwhile True: a @ a"


def start_busy(count: int) -> list[subprocess.Popen]:
    """``count`` background processes, each a single-threaded matmul loop (stopped by the caller)."""
    return [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP]) for _ in range(count)]


def run(
    sizes: list[int] | None = None, mixers: list[str] | None = None, progress=None, busy: int = 0, device: str = "cpu"
) -> dict:
    busy_procs = start_busy(busy)
    try:
        out = _run(sizes, mixers, progress, device)
    finally:
        for proc in busy_procs:
            proc.kill()
            proc.wait()
    return {**out, "busy_processes": busy, "device": device}


def _run(sizes: list[int] | None, mixers: list[str] | None, progress, device: str = "cpu") -> dict:
    sizes = sizes or SIZES
    names = mixers or mixer_names()
    peak, chunk_rate = matmul_gflops(device=device), chunk_matmul_gflops(device=device)
    results = []
    for n in sizes:
        base = {"kind": "mixer", "n": n, "heads": 4, "head_dim": 64, "batch": 2, "repeats": 2}
        if device != "cpu":  # (CPU rows keep the fields they always had)
            base["device"] = device
        for name in ["sdpa"] + names:
            results.append(run_in_subprocess({**base, "mixer": name, "mode": "default"}, CASE_MODULE))
            r = results[-1]
            if "time_s" in r:
                case_peak = r["case_matmul_fp32_gflops"]  # every timed case measured its own
                r["gflops"] = r["model_flops"] / r["time_s"] / 1e9
                r["fraction_of_matmul_peak"] = r["gflops"] / case_peak
                if "projection_flops" in r:
                    r["mfu_with_projections"] = (
                        (r["model_flops"] + r["projection_flops"]) / r["time_s"] / 1e9 / case_peak
                    )
                if "core_time_s" in r:
                    r["core_gflops"] = r["model_flops"] / r["core_time_s"] / 1e9
                    r["core_fraction_of_matmul_peak"] = r["core_gflops"] / case_peak
                if "moved_bytes" in r:
                    r["roofline_s"] = r["moved_bytes"] / (r["case_stream_gbs"] * 1e9) + r["projection_flops"] / (
                        case_peak * 1e9
                    )
                    r["over_roofline"] = r["time_s"] / r["roofline_s"]
                r["cpu_per_wall"] = r["cpu_s"] / r["time_s"]
            if progress:
                progress(r)
    sdpa = {r["n"]: r["time_s"] for r in results if r["mixer"] == "sdpa" and "time_s" in r}
    summary = {}
    for r in results:
        if "time_s" in r and r["n"] in sdpa:
            row = summary.setdefault(r["mixer"], {})
            row[f"speedup_vs_sdpa@{r['n']}"] = round(sdpa[r["n"]] / r["time_s"], 2)
            row[f"matmul_peak_fraction@{r['n']}"] = round(r["fraction_of_matmul_peak"], 3)
            row[f"cpu_per_wall@{r['n']}"] = round(r["cpu_per_wall"], 2)
            if "roofline_s" in r:
                row[f"roofline_s@{r['n']}"] = round(r["roofline_s"], 3)
                row[f"over_roofline@{r['n']}"] = round(r["over_roofline"], 2)
            if "mfu_with_projections" in r:
                row[f"mfu_with_projections@{r['n']}"] = round(r["mfu_with_projections"], 3)
            if "core_time_s" in r:
                row[f"core_speedup_vs_sdpa@{r['n']}"] = round(sdpa[r["n"]] / r["core_time_s"], 2)
                row[f"core_matmul_peak_fraction@{r['n']}"] = round(r["core_fraction_of_matmul_peak"], 3)
    return {
        "benchmark": "mixers",
        "matmul_fp32_gflops": peak,
        "chunk_matmul_fp32_gflops": chunk_rate,
        "results": results,
        "summary": summary,
    }


if __name__ == "__main__":
    case_main(prepare_mixer_case)
