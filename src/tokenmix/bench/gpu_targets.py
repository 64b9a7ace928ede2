"""The GPU targets of issue 42 (docs/results.md, "GPU targets"), measured on one device in one process.

``python -m tokenmix.bench.gpu_targets --out FILE [--device cuda] [--small]`` writes one JSON:

    train   fwd+bwd seconds at B = 8, H = 16, T = 8192, D = 64 (``--small``: B 1, H 2, T 256, D 16):
              pow2_ce_core_<backend>  the pow2_ce mixer's mixing alone (scores, the softmax over
                                      {t} ∪ N(t), the solve) on q, k, v leaves, float32, by backend
              pow2_ce_mixer_<backend> the whole mixer (projections included), float32
              sdpa_flash_bf16         torch SDPA, causal, flash kernel forced, bfloat16 (flash takes
                                      no float32); sdpa_fp32 SDPA's own choice in float32
              fla_chunk_gla_<dtype>   fla's chunk_gla (if fla imports), float32 and bfloat16
    decode  ms per token at a 16k context (``--small``: 512), batch 1, no autograd:
              pow2_ce_step_<backend>  the mixer's step (projections, the lattice cache's host
                                      bookkeeping and the read), median of 64
              fla_fused_recurrent_gla_step  fla's one-token recurrent GLA step on a [B, H, K, V] state
    ratios  the targets' ratios: sdpa_flash_bf16 / pow2_ce_core_triton (target >= 3),
            pow2_ce_core_triton / fla_chunk_gla_float32 (target <= 1.5),
            pow2_ce_step_triton / fla_fused_recurrent_gla_step (target <= 1)

Every number is timed by CUDA events after warm-up calls (``bench/device.py``; the first call
compiles the Triton kernels). A measurement that fails (out of memory, a kernel missing) records
its error and the others still run. Not timed in a test (speed never is): scripts/gpu_check.sh
runs this.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tokenmix.bench.device import check_device, time_on, timed_call
from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_write_json
from tokenmix.mixers import build_mixer
from tokenmix.ops.pattern import backend as backends

FULL = dict(b=8, h=16, t=8192, d=64, context=16384)
SMALL = dict(b=1, h=2, t=256, d=16, context=512)
DECODE_STEPS = 64


def _best(fn: Callable[[], None], device: str, repeats: int = 3) -> float:
    return min(time_on(fn, repeats, device, warmup=2)["wall"])


def _leaves(shape, device, dtype, scale: float = 1.0) -> list[torch.Tensor]:
    return [(torch.randn(*shape, device=device) * scale).to(dtype).requires_grad_() for _ in range(3)]


def _clear(leaves) -> None:
    for z in leaves:
        z.grad = None


def pow2_ce_core(s: dict, device: str, backend: str) -> Callable[[], None]:
    """fwd+bwd of pow2_ce's mixing alone, on q, k, v [B, T, H, D] leaves: the mixer's own table,
    scores, coefficients and solve (its private pieces: the projections are what this leaves out)."""
    m = build_mixer("pow2_ce", s["h"] * s["d"], n_heads=s["h"], backend=backend).to(device)
    q, k, v = _leaves((s["b"], s["t"], s["h"], s["d"]), device, torch.float32)
    state = m.empty_state(s["b"], device, torch.float32)
    idx, plan = m._table(state, s["t"], device)
    valid, empty = idx >= 0, v.new_zeros(s["b"], 0, s["h"], s["d"])

    def fn() -> None:
        _clear((q, k, v))
        alpha, beta = m._coefficients(None, q, k, m._scores(q, k, idx, plan, backend), valid)
        backends.solve(backend, alpha, beta, idx, v, empty, m.config.chunk_size, plan.get).sum().backward()

    return fn


def pow2_ce_mixer(s: dict, device: str, backend: str) -> Callable[[], None]:
    m = build_mixer("pow2_ce", s["h"] * s["d"], n_heads=s["h"], backend=backend).to(device)
    x = torch.randn(s["b"], s["t"], s["h"] * s["d"], device=device, requires_grad=True)

    def fn() -> None:
        _clear((x, *m.parameters()))
        m(x)[0].sum().backward()

    return fn


def sdpa(s: dict, device: str, dtype: torch.dtype, flash: bool) -> Callable[[], None]:
    q, k, v = _leaves((s["b"], s["h"], s["t"], s["d"]), device, dtype)

    def fn() -> None:
        _clear((q, k, v))
        if not flash:  # torch's own choice of kernel
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            return
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    return fn


def _fla_gla():
    # fla-core is optional (the dev extra) and imports Triton: loaded when this benchmark runs
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    return chunk_gla, fused_recurrent_gla


def fla_chunk_gla(s: dict, device: str, dtype: torch.dtype) -> Callable[[], None]:
    chunk_gla, _ = _fla_gla()
    q, k, v = _leaves((s["b"], s["t"], s["h"], s["d"]), device, dtype, scale=0.5)
    g = F.logsigmoid(torch.randn(s["b"], s["t"], s["h"], s["d"], device=device) + 4).to(dtype).requires_grad_()

    def fn() -> None:
        _clear((q, k, v, g))
        chunk_gla(q, k, v, g)[0].float().sum().backward()

    return fn


@torch.no_grad()
def pow2_ce_step_ms(s: dict, device: str, backend: str) -> float:
    """Median ms of the mixer's decode step after a prefill of ``context`` tokens (batch 1)."""
    m = build_mixer("pow2_ce", s["h"] * s["d"], n_heads=s["h"], backend=backend).to(device)
    x = torch.randn(1, s["context"] + DECODE_STEPS + 2, s["h"] * s["d"], device=device)
    _, state = m(x[:, : s["context"]])
    holder = [state]

    def step(i: int) -> None:
        _, holder[0] = m.step(x[:, i], holder[0])

    step(s["context"])  # warm-up: the read kernel's compilation
    step(s["context"] + 1)
    times = [timed_call(lambda i=i: step(i), device)[0] for i in range(s["context"] + 2, x.shape[1])]
    return 1e3 * statistics.median(times)


@torch.no_grad()
def fla_recurrent_step_ms(s: dict, device: str) -> float:
    """Median ms of fla's fused recurrent GLA on one token with a [B, H, K, V] state (batch 1)."""
    _, fused_recurrent_gla = _fla_gla()
    h, d = s["h"], s["d"]
    q, k, v = (torch.randn(1, 1, h, d, device=device) for _ in range(3))
    gk = F.logsigmoid(torch.randn(1, 1, h, d, device=device) + 4)
    state = torch.zeros(1, h, d, d, device=device)
    holder = [state]

    def step() -> None:
        _, holder[0] = fused_recurrent_gla(q, k, v, gk, initial_state=holder[0], output_final_state=True)

    return 1e3 * statistics.median(time_on(step, DECODE_STEPS, device, warmup=2)["wall"])


def _measure(out: dict, key: str, what: Callable[[], float]) -> None:
    try:
        out[key] = what()
    except Exception as e:  # a failed measurement is a result (recorded), the others still run
        out[key] = None
        out.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}"[:500]
        traceback.print_exc(file=sys.stderr)
    print(f"  {key}: {out[key]}", file=sys.stderr, flush=True)


def run(device: str = "cuda", small: bool = False, save: Callable[[dict], None] | None = None) -> dict:
    """Every measurement, the three targets' first (a run stopped by its time limit keeps them):
    ``save`` gets the result so far after each one."""
    s = SMALL if small else FULL
    fast = "triton" if device == "cuda" else "numba"
    train: dict = {}
    decode: dict = {}
    result = {
        "benchmark": "gpu_targets",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "shapes": s,
        "train_s": train,
        "decode_ms": decode,
        "ratios": {},
    }

    def measure(part: dict, key: str, what: Callable[[], float]) -> None:
        _measure(part, key, what)
        result["ratios"] = _ratios(train, decode, fast)
        if save is not None:
            save(result)

    cuda = device == "cuda"
    measure(train, f"pow2_ce_core_{fast}", lambda: _best(pow2_ce_core(s, device, fast), device))
    if cuda:
        measure(train, "sdpa_flash_bf16", lambda: _best(sdpa(s, device, torch.bfloat16, True), device))
        measure(train, "fla_chunk_gla_float32", lambda: _best(fla_chunk_gla(s, device, torch.float32), device))
    measure(decode, f"pow2_ce_step_{fast}", lambda: pow2_ce_step_ms(s, device, fast))
    if cuda:
        measure(decode, "fla_fused_recurrent_gla_step", lambda: fla_recurrent_step_ms(s, device))
    # the rest: the whole mixer, the torch backend (slow at 8k), the other references
    measure(train, f"pow2_ce_mixer_{fast}", lambda: _best(pow2_ce_mixer(s, device, fast), device))
    measure(train, "sdpa_fp32", lambda: _best(sdpa(s, device, torch.float32, False), device))
    if cuda:
        measure(train, "fla_chunk_gla_bfloat16", lambda: _best(fla_chunk_gla(s, device, torch.bfloat16), device))
    measure(train, "pow2_ce_core_torch", lambda: _best(pow2_ce_core(s, device, "torch"), device))
    measure(train, "pow2_ce_mixer_torch", lambda: _best(pow2_ce_mixer(s, device, "torch"), device))
    measure(decode, "pow2_ce_step_torch", lambda: pow2_ce_step_ms(s, device, "torch"))
    return result


def _ratios(train: dict, decode: dict, fast: str) -> dict:
    def ratio(a, b):
        return None if not a or not b else round(a / b, 3)

    core = train.get(f"pow2_ce_core_{fast}")
    return {
        "sdpa_flash_bf16_over_pow2_ce (target >= 3)": ratio(train.get("sdpa_flash_bf16"), core),
        "pow2_ce_over_fla_chunk_gla_fp32 (target <= 1.5)": ratio(core, train.get("fla_chunk_gla_float32")),
        "pow2_ce_step_over_fla_recurrent_step (target <= 1)": ratio(
            decode.get(f"pow2_ce_step_{fast}"), decode.get("fla_fused_recurrent_gla_step")
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="small shapes (a smoke run)")
    p.add_argument("--out", default="gpu_targets.json")
    args = p.parse_args(argv)
    try:
        device = check_device(args.device)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = run(device, args.small, save=lambda r: atomic_write_json(args.out, r, indent=1))
    print(json.dumps(result["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
