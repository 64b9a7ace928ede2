"""Cost and cache accounting of every registered mixer: derived formulas against measurements.

Derived (from the mixer's own accounting methods, never measured):
    cache entries   cache_positions(n), past positions held at the peak of an n-token decode
    cache scalars   state_size(n) per batch element; bytes = scalars x element size
    per-token time  flops_per_token(n), multiply-adds of the mixing for the last token
    training FLOPs  forward mixing multiply-adds of an n-token sequence, sum_{t=1..n} flops_per_token(t)
                    (exact up to 2048 positions, a trapezoid sum over sampled positions beyond), plus
                    n x the weight-matrix multiply-adds per token (projections), times 3 for forward +
                    backward (the backward of a linear map costs two forwards)

Measured:
    cache           decode n tokens with ``mixer.step`` and read ``state.peak_positions`` /
                    ``state.peak_numel`` (the recurrent mode observes the state before every token)
    time            forward + backward of the training mode at several n, and a replay of the same
                    projection calls alone (the weight matrices' forward + backward on inputs of the
                    recorded shapes); the lengths take turns (two calls back to back each per
                    round, each on its own copy of the mixer), so all see the same load; the fastest of the repeats
                    (other processes only ever add time), on process CPU time by default; log-log
                    slopes fitted by least squares, from ``ASYMPTOTE_FROM`` on for kernels listed there

A mixer's time is projections (slope 1) plus mixing (the stated complexity: n x per-token growth,
e.g. slope 1.12 for O(log n) per token over 1k–16k). The whole time mixes the two in proportions
that depend on how efficiently each runs, so its slope lies between them; at short n the
projections dominate. So the mixing is timed on its own, as whole minus projections, and its
slope is judged against the theory (± ``SLOPE_TOLERANCE``); the whole slope is judged against the
projection-aware band between 1 and the derived mixing slope (widened by the same tolerance).
Nothing is fitted to the measurements beyond the one slope. A mixer is also flagged when a
measured cache differs from its derivation (any n).
"""

from __future__ import annotations

import copy
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from tokenmix.analysis.outputs import FIGURE_FORMATS, markdown_table, new_figure, save_figure, write_json
from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Mixer
from tokenmix.mixers.registry import build_mixer, get_mixer_spec, mixer_names
from tokenmix.runs.clocks import time_repeats

SLOPE_TOLERANCE = 0.15
# cpu: process CPU time (user + system), which time-slicing by other processes does not inflate;
# user: its user part (the computation without the kernel's page-fault handling); wall: wall time
CLOCKS = ("cpu", "user", "wall")
MAX_REPEATS = 25  # timed repeats per length at most (see time_forward_backward's min_total_s)
TURN_CALLS = 2  # timed calls of one length per turn (see _time_lengths)
SYS_SHARE_NOTE = 0.1  # a mixing flag names the page faults when system time reaches this share of CPU time
TRAINING_FLOPS_FACTOR = 3  # forward + backward of a linear map ~ 3 forwards
EXACT_SUM_POSITIONS = 2048  # training FLOPs are summed exactly over this many positions, sampled beyond
# Kernels that reach their stated asymptote only past some length: the slopes are judged on the
# timed lengths from there on (at least 3 of them, else on all), the full-range slopes are reported
# beside. Each entry gives the measurement that puts the start there, so it is not a fitted choice.
ASYMPTOTE_FROM: dict[str, tuple[int, str]] = {
    # measured on the bare kernel as this module times it (lengths in turns, CPU time, memory kept)
    "attention": (
        4096,
        "torch's CPU flash-attention kernel (SDPA, causal) works in tiles of 256 queries x 512 keys "
        "and its throughput keeps rising with n: alone (fwd+bwd, B=1, H=4, K=64, one thread) 42 "
        "GFLOP/s at n=1k, 52 at 2k, 58 at 4k, 62 at 8k, 63 at 16k; from 4k on it is within 10% of "
        "its 16k rate, below that the tiles' fixed costs bend the slope (bare kernel 1.86 over "
        "1k-16k, 1.93 over 4k-16k)",
    ),
    "path_attention": (
        4096,
        "its chunked mode's derived mixing rate (flops_per_token summed, over the mixing time; "
        "analyze cost, one thread, CPU time, 2026-12-05) is 18.6 GFLOP/s at n=1k, 24.5 at 2k, "
        "29.1 at 4k, 34.0 at 8k, 33.1 at 16k: below 4k the per-token work outside the O(n) "
        "logits (the UT/WY block form, O(C K), and the block transforms, O((G + N/G) K^2)) "
        "still weighs, from 4k on the rate is within 12% of its 16k rate (1.79 over 1k-16k, "
        "1.91 over 4k-16k)",
    ),
}


# ----------------------------------------------------------------------------- derived
def derived_training_flops(mixer: Mixer, ns: Sequence[int]) -> dict[int, float]:
    """Forward mixing multiply-adds of an n-token sequence, sum_{t=1..n} flops_per_token(t), per n.

    Exact (every t) up to ``EXACT_SUM_POSITIONS`` positions; beyond, flops_per_token is evaluated every
    s positions (s chosen so at most that many evaluations happen) and summed by the trapezoid rule,
    because some accounting methods cost O(t) per call (dense patterns).
    """
    n_max = max(ns)
    stride = max(1, math.ceil(n_max / EXACT_SUM_POSITIONS))
    ts = sorted(set(range(1, n_max + 1, stride)) | set(ns))
    f = np.array([float(mixer.flops_per_token(t)) for t in ts])
    t_arr = np.array(ts, dtype=np.float64)
    if stride == 1:
        cum = np.cumsum(f)
    else:
        # integral of the sampled staircase; the first position counts once
        cum = f[0] + np.concatenate([[0.0], np.cumsum(0.5 * (f[1:] + f[:-1]) * np.diff(t_arr))])
    at = dict(zip(ts, cum))
    return {n: float(at[n]) for n in ns}


def projection_flops_per_token(mixer: Mixer) -> int:
    """Multiply-adds per token of the mixer's weight matrices (projections, gates, short convolutions):
    every entry of a parameter with >= 2 dimensions is used once per token."""
    return sum(p.numel() for p in mixer.parameters() if p.dim() >= 2)


def derived_costs(mixer: Mixer, ns: Sequence[int], dtype_bytes: int = 4) -> list[dict]:
    """Derived accounting at each n: cache entries, scalars, bytes, per-token and training FLOPs.

    ``training_mixing_flops`` counts the mixing only (what the complexity strings describe);
    ``training_flops`` adds the projections, which grow like n and dominate at short lengths, so it
    is what a measured time is compared with.
    """
    mixing = derived_training_flops(mixer, ns)
    proj = projection_flops_per_token(mixer)
    rows = []
    for n in ns:
        numel = int(mixer.state_size(n))
        rows.append(
            {
                "n": int(n),
                "cache_positions": int(mixer.cache_positions(n)),
                "cache_numel": numel,
                "cache_bytes": numel * dtype_bytes,
                "flops_per_token": float(mixer.flops_per_token(n)),
                "projection_flops_per_token": float(proj),
                "training_mixing_flops": mixing[n] * TRAINING_FLOPS_FACTOR,
                "training_flops": (mixing[n] + n * proj) * TRAINING_FLOPS_FACTOR,
            }
        )
    return rows


_GROWTH_EXPONENTS = {
    "1": 0.0,
    "n": 1.0,
    "n^2": 2.0,
    "n**2": 2.0,
    "n²": 2.0,
    "sqrtn": 0.5,
    "sqrt(n)": 0.5,
    "√n": 0.5,
    "n^0.5": 0.5,
    "n^(1/2)": 0.5,
    "n^1.5": 1.5,
    "n^(3/2)": 1.5,
}
_LOG_FORMS = {"logn", "log2n", "log₂n", "log(n)", "log2(n)"}


def per_token_growth(complexity: str):
    """Parse a per-token complexity string like 'O(log n)' into a function n -> growth, or None.

    Constants in other letters (m, k, w, d, N: window, order, head or state size) do not grow with n.
    """
    m = re.fullmatch(r"\s*O\((.*)\)\s*", complexity or "")
    if not m:
        return None
    body = m.group(1).replace(" ", "")
    if body in _LOG_FORMS:
        return lambda n: math.log2(n)
    if body in _GROWTH_EXPONENTS:
        e = _GROWTH_EXPONENTS[body]
        return lambda n: float(n) ** e
    if "n" not in body:  # O(m), O(d^2), O(N d): bounded in n
        return lambda n: 1.0
    return None


def fit_loglog_slope(ns: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log y against log n (None with fewer than 2 usable points)."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y and y > 0 and n > 0]
    if len(pts) < 2:
        return None
    x = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def stated_slope(complexity: str, ns: Sequence[int]) -> float | None:
    """Log-log slope over ``ns`` of n x growth(n) for the stated per-token complexity."""
    g = per_token_growth(complexity)
    return None if g is None else fit_loglog_slope(ns, [n * g(n) for n in ns])


# ----------------------------------------------------------------------------- measured
def measure_decode_cache(mixer: Mixer, n: int, batch: int = 1, seed: int = 0) -> dict:
    """Decode n tokens with ``mixer.step``; the measured peaks and the seconds per token."""
    if n < 1:
        raise InputError(f"decode length must be >= 1, got {n}")
    p = next(mixer.parameters(), None)
    dtype = p.dtype if p is not None else torch.float32
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(n, batch, mixer.d_model, generator=gen, dtype=dtype)
    state = None
    with torch.no_grad():
        mixer.step(xs[0], None)  # untimed: the first call of a compiled kernel in a process compiles it
    start = time.perf_counter()
    with torch.no_grad():
        for t in range(n):
            _, state = mixer.step(xs[t], state)
    elapsed = time.perf_counter() - start
    if state.position != n:
        raise RuntimeError(f"{type(mixer).__name__}: state position {state.position} after {n} decoded tokens")
    return {
        "n": n,
        "peak_positions": int(state.peak_positions),
        "peak_numel": int(state.peak_numel),
        "seconds_per_token": elapsed / n,
        "seconds": elapsed,
    }


class ProjectionCall:
    """One call of a projection module seen during a forward: the module and its input's layout."""

    def __init__(self, module: nn.Module, shape: tuple[int, ...], dtype: torch.dtype, requires_grad: bool) -> None:
        self.module, self.shape, self.dtype, self.requires_grad = module, shape, dtype, requires_grad


def projection_modules(mixer: Mixer) -> list[nn.Module]:
    """Leaf modules holding a weight matrix (a parameter with >= 2 dimensions): the projections and
    gates that :func:`projection_flops_per_token` counts. Parameters of the mixer itself (decay
    tables such as diag_ssm's A_log) are not projections: the work they take part in is mixing."""
    return [
        m
        for m in mixer.modules()
        if m is not mixer
        and not any(True for _ in m.children())
        and any(p.dim() >= 2 for p in m.parameters(recurse=False))
    ]


class _ProjectionRecorder:
    """Context manager recording every projection call of the forwards run inside it."""

    def __init__(self, mixer: Mixer) -> None:
        self.mixer, self.calls, self._handles = mixer, [], []

    def _hook(self, module, args) -> None:
        if len(args) != 1 or not isinstance(args[0], Tensor):
            raise TypeError(
                f"projection {type(module).__name__} called with {len(args)} positional inputs; "
                "only single-tensor projections can be replayed"
            )
        a = args[0]
        self.calls.append(ProjectionCall(module, tuple(a.shape), a.dtype, a.requires_grad))

    def __enter__(self) -> list[ProjectionCall]:
        self._handles = [m.register_forward_pre_hook(self._hook) for m in projection_modules(self.mixer)]
        return self.calls

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()


def record_projection_calls(mixer: Mixer, x: Tensor) -> list[ProjectionCall]:
    """Run one forward of the training mode on x [B, T, D] and record every projection call, in order."""
    with _ProjectionRecorder(mixer) as calls:
        mixer(x)
    return calls


def projection_replay(calls: Sequence[ProjectionCall], seed: int = 0):
    """fn() running forward + backward of every recorded projection call on fresh inputs of the same
    shapes (and input gradients where the original input required them), and setup() clearing the
    gradients it leaves; nothing of the mixing runs. Inputs and output gradients are made here, so
    fn() times only the projections' own work."""
    gen = torch.Generator().manual_seed(seed)
    jobs = []
    for c in calls:
        inp = torch.randn(c.shape, generator=gen, dtype=c.dtype).requires_grad_(c.requires_grad)
        with torch.no_grad():
            out_shape = c.module(inp).shape
        jobs.append((c.module, inp, torch.randn(out_shape, generator=gen, dtype=c.dtype)))

    def fn() -> None:
        for module, inp, grad in jobs:
            module(inp).backward(grad)

    def setup() -> None:
        for module, inp, _ in jobs:
            module.zero_grad(set_to_none=True)
            inp.grad = None

    return fn, setup


def _share(sys_s: float, user_s: float) -> float:
    """System part of a call's CPU time, both parts from the same getrusage reading (so <= 1)."""
    return sys_s / (sys_s + user_s) if sys_s + user_s > 0 else 0.0


class keep_freed_memory:
    """Context manager: freed memory stays in the process while timing (glibc: large blocks from the
    heap instead of mmap, no trimming), as a caching allocator keeps it; elsewhere a no-op.

    Why: by default glibc serves every block above its mmap threshold (32 MB at most) with a fresh
    mapping and unmaps it on free, so each call of a long sequence faults its buffers in again,
    zero-filled. That cost grows with the buffer sizes, not with the computation (system time,
    plus the first-touch misses it causes in user time; docs/notes/design-measurements.md).
    ``active`` says whether it applied. On exit the defaults come back and the heap is trimmed.
    """

    _M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameters (malloc.h)
    _DEFAULT_TRIM, _DEFAULT_MMAP_MAX = 128 * 1024, 65536

    def __init__(self, enabled: bool = True) -> None:
        self.enabled, self.active, self._libc = enabled, False, None

    def __enter__(self) -> "keep_freed_memory":
        if not self.enabled:
            return self
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            self.active = bool(libc.mallopt(self._M_MMAP_MAX, 0)) and bool(
                libc.mallopt(self._M_TRIM_THRESHOLD, 2**31 - 1)
            )
            self._libc = libc
        except (OSError, AttributeError):  # not glibc: the allocator is left as it is
            self.active = False
        return self

    def __exit__(self, *exc) -> None:
        if self._libc is not None:
            self._libc.mallopt(self._M_MMAP_MAX, self._DEFAULT_MMAP_MAX)
            self._libc.mallopt(self._M_TRIM_THRESHOLD, self._DEFAULT_TRIM)
            self._libc.malloc_trim(0)
            self._libc = None


class LengthTimer:
    """Forward (training mode) + backward of sum(y) at one length n, and of its projections alone,
    one timed call at a time, so that several lengths can be timed in turns under the same load.

    Construction runs the warm-up (the first warm-up call records the projection calls for the
    replay, :func:`projection_replay`). Each :meth:`once` times the whole mixer, then the replay,
    back to back so both see the same load; gradients are cleared outside the timing.
    :meth:`result` keeps the fastest call per clock (other processes only ever add time); see
    :func:`time_forward_backward` for its fields.
    """

    def __init__(
        self,
        mixer: Mixer,
        n: int,
        batch: int = 1,
        warmup: int = 1,
        seed: int = 0,
        clock: str = "cpu",
        projections: bool = True,
    ) -> None:
        if clock not in CLOCKS:
            raise InputError(f"clock must be one of {CLOCKS}, got '{clock}'")
        self.mixer, self.n, self.clock = mixer, n, clock
        p = next(mixer.parameters(), None)
        dtype = p.dtype if p is not None else torch.float32
        gen = torch.Generator().manual_seed(seed)
        self._x0 = torch.randn(batch, n, mixer.d_model, generator=gen, dtype=dtype)  # [B, n, D]
        self._box: dict[str, Tensor] = {}
        self._proj = None
        if projections:
            self._setup_whole()
            with _ProjectionRecorder(mixer) as calls:
                if warmup > 0:  # the first warm-up call records the projections: no extra forward
                    self._whole()
                else:
                    mixer(self._box["x"])
            warmup = max(warmup - 1, 0)
            self._proj = projection_replay(calls, seed=seed)
            self._proj[1]()
            self._proj[0]()  # the replay's own warm-up (cheap: projections only)
        keys = ("wall", "cpu", "user", "sys")
        self.whole_t: dict[str, list[float]] = {k: [] for k in keys}
        self.proj_t: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(warmup):
            self.once(record=False)

    def _setup_whole(self) -> None:
        self.mixer.zero_grad(set_to_none=True)
        self._box["x"] = self._x0.clone().requires_grad_()

    def _whole(self) -> None:
        y, _ = self.mixer(self._box["x"])
        y.sum().backward()

    def once(self, record: bool = True) -> None:
        """One timed call of the whole mixer, then one of the projection replay."""
        w = time_repeats(self._whole, 1, warmup=0, setup=self._setup_whole)
        pr = time_repeats(self._proj[0], 1, warmup=0, setup=self._proj[1]) if self._proj is not None else None
        # release this length's gradients now: lengths timed in turns would otherwise all hold theirs
        self.mixer.zero_grad(set_to_none=True)
        self._box.pop("x", None)
        if self._proj is not None:
            self._proj[1]()
        if record:
            for k in self.whole_t:
                self.whole_t[k] += w[k]
                if pr is not None:
                    self.proj_t[k] += pr[k]

    @property
    def calls(self) -> int:
        return len(self.whole_t["cpu"])

    @property
    def best(self) -> float:
        """The fastest timed call so far on the clock (inf before the first)."""
        return min(self.whole_t[self.clock], default=math.inf)

    def done(self, repeats: int, min_total_s: float = 0.0) -> bool:
        """At least ``repeats`` timed calls, and (up to ``MAX_REPEATS``) ``min_total_s`` on the clock."""
        if self.calls < repeats:
            return False
        return self.calls >= MAX_REPEATS or sum(self.whole_t[self.clock]) >= min_total_s

    def result(self) -> dict:
        whole_t, proj_t, clock = self.whole_t, self.proj_t, self.clock
        if not whole_t["cpu"]:
            raise RuntimeError(f"n={self.n}: no timed call yet")
        # the user/system split is tick-sampled: take both parts from the fastest call on the exact
        # CPU total (the minimum of the sampled user times alone would be biased low), unless the
        # user clock is the one judged: then its own fastest call, so user_seconds == seconds
        ref = "user" if clock == "user" else "cpu"
        fastest = min(range(len(whole_t[ref])), key=lambda i: whole_t[ref][i])
        out = {
            "n": self.n,
            "clock": clock,
            "seconds": min(whole_t[clock]),
            "median_seconds": statistics.median(whole_t[clock]),
            "all_seconds": whole_t[clock],
            "wall_seconds": min(whole_t["wall"]),
            "cpu_seconds": min(whole_t["cpu"]),
            "user_seconds": whole_t["user"][fastest],
            "sys_share": _share(whole_t["sys"][fastest], whole_t["user"][fastest]),
            "mode": self.mixer.modes[0],
            "threads": torch.get_num_threads(),
        }
        if self._proj is not None:
            pf = min(range(len(proj_t[ref])), key=lambda i: proj_t[ref][i])
            out["projection_seconds"] = min(proj_t[clock])
            out["projection_all_seconds"] = proj_t[clock]
            out["projection_user_seconds"] = proj_t["user"][pf]
            out["mixing_seconds"] = out["seconds"] - out["projection_seconds"]
            out["mixing_user_seconds"] = out["user_seconds"] - out["projection_user_seconds"]
        return out


def time_forward_backward(
    mixer: Mixer,
    n: int,
    batch: int = 1,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    clock: str = "cpu",
    projections: bool = True,
    min_total_s: float = 0.0,
) -> dict:
    """Forward (training mode) + backward of sum(y) at length n, and of its projections alone
    (one :class:`LengthTimer` run to completion).

    Each repeat times the whole mixer, then (``projections``) a replay of its projection calls
    (:func:`projection_replay`, recorded during the first warm-up), back to back so both see the
    same load. At least ``repeats`` repeats run, more (up to ``MAX_REPEATS``) while the whole
    mixer's timed calls add up to less than ``min_total_s`` on ``clock``: the fastest of many
    cheap calls is a steadier estimate on a loaded machine, and long calls need few.
    Per clock the fastest repeat is kept (other processes only ever add time):
    ``seconds`` / ``projection_seconds`` on ``clock`` (see ``CLOCKS``), and ``wall_seconds``,
    ``cpu_seconds``, ``user_seconds`` (+ ``projection_user_seconds``) beside them. ``sys_share`` is
    the system part of the fastest call's CPU time (page faults of freshly mapped buffers).
    ``mixing_seconds`` = seconds - projection_seconds: the time of everything that is not a weight
    matrix (scores, gates, the solve or scan, layout copies), which is what the stated complexity
    describes; it can come out <= 0 when the mixing is within the noise of the projections.
    """
    timer = LengthTimer(mixer, n, batch=batch, warmup=warmup, seed=seed, clock=clock, projections=projections)
    while not timer.done(repeats, min_total_s):
        timer.once()
    return timer.result()


def slope_band(derived_mixing: float | None) -> tuple[float, float] | None:
    """Slopes a whole-mixer time may show: between the projections' 1 and the mixing's, +- the tolerance."""
    if derived_mixing is None:
        return None
    return min(1.0, derived_mixing) - SLOPE_TOLERANCE, max(1.0, derived_mixing) + SLOPE_TOLERANCE


def _slopes(rows: Sequence[dict], complexity: str) -> dict:
    """Log-log slopes over the timed rows: measured whole / mixing (CPU and user time), derived
    FLOPs (whole and mixing), the stated complexity's, and the theory judged against (the stated
    one, or the derived mixing FLOPs' where the string does not parse)."""
    tn = [r["n"] for r in rows]
    mixing_pts = [(r["n"], r["mixing_seconds"]) for r in rows if r.get("mixing_seconds", 0) > 0]
    user_pts = [(r["n"], r["mixing_user_seconds"]) for r in rows if "mixing_user_seconds" in r]
    stated = stated_slope(complexity, tn) if len(tn) >= 2 else None
    derived_mixing = fit_loglog_slope(tn, [r["derived_mixing_flops"] for r in rows])
    return {
        "measured": fit_loglog_slope(tn, [r["seconds"] for r in rows]),
        "measured_mixing": fit_loglog_slope([p[0] for p in mixing_pts], [p[1] for p in mixing_pts]),
        "mixing_points": len(mixing_pts),
        # diagnostic: the mixing on user CPU time, without the kernel's page-fault handling
        "measured_mixing_user": fit_loglog_slope([p[0] for p in user_pts], [p[1] for p in user_pts]),
        "derived": fit_loglog_slope(tn, [r["derived_training_flops"] for r in rows]),
        "derived_mixing": derived_mixing,
        "stated": stated,
        "theory": stated if stated is not None else derived_mixing,
        "n_range": [min(tn), max(tn)] if tn else None,
    }


# ----------------------------------------------------------------------------- per mixer
def account_mixer(
    name: str,
    *,
    cache_ns: Sequence[int] = (16, 64, 256),
    time_ns: Sequence[int] = (),
    d_model: int = 256,
    n_heads: int = 4,
    batch: int = 1,
    repeats: int = 3,
    time_budget_s: float = 30.0,
    decode_budget_s: float = 30.0,
    seed: int = 0,
    judge_time: bool = True,
    threads: int | None = None,
    clock: str = "cpu",
    min_time_s: float = 0.0,
    fit_from: int | None = None,
    keep_memory: bool = True,
    mixer: Mixer | None = None,
) -> dict:
    """Derived vs measured cache (every n of ``cache_ns``) and time (``time_ns``) of one mixer.

    Time is judged twice. The *mixing* time (whole minus the replayed projections, see
    :func:`time_forward_backward`) must have the theory's slope ± ``SLOPE_TOLERANCE``: the theory
    slope is that of n x the stated per-token complexity over the timed lengths (1 for O(1), 1.12
    for O(log n) over 1k–16k, 1.5 for O(sqrt n), 2 for O(n)). The *whole* time must lie in the
    projection-aware band between the projections' 1 and the derived mixing slope, ± the tolerance.

    A length whose predicted cost (the last measurement scaled by the derived FLOPs) exceeds the
    budget is skipped and listed under ``skipped``: larger n are not attempted once one is too slow.
    ``judge_time=False`` reports the slopes without flagging them (short lengths, where fixed
    per-call overheads dominate and no FLOP count predicts the time). ``threads`` sets torch's
    intra-op threads for the timing (restored afterwards); ``clock`` is one of ``CLOCKS``: "cpu"
    (process CPU time, the steady one on a shared machine; use one thread, or spin-waits are
    counted), "user" or "wall". ``min_time_s``: cheap lengths are repeated until their timed calls
    add up to this many seconds (see :func:`time_forward_backward`). ``fit_from``: judge the slopes
    on the timed lengths >= this one (default: the mixer's ``ASYMPTOTE_FROM`` entry, else all); the
    full-range slopes are kept beside (``measured_full``, ``measured_mixing_full``).
    ``keep_memory``: time with freed memory kept in the process (:class:`keep_freed_memory`), so
    the page faults of buffers mapped afresh on every call do not enter the slopes.
    """
    spec = get_mixer_spec(name)
    if mixer is None:
        torch.manual_seed(seed)
        mixer = build_mixer(name, d_model, n_heads=n_heads).float()
    all_ns = sorted(set(cache_ns) | set(time_ns))
    derived = {r["n"]: r for r in derived_costs(mixer, all_ns or [1], dtype_bytes=4)}
    result: dict = {
        "mixer": name,
        "family": spec.family,
        "time_complexity": mixer.time_complexity,
        "cache_complexity": mixer.cache_complexity,
        "mode": mixer.modes[0],
        "d_model": mixer.d_model,
        "n_heads": mixer.n_heads,
        "head_dim": mixer.head_dim,
        "clock": clock,
        "cache": [],
        "time": [],
        "skipped": [],
        "flags": [],
    }

    def predicted(prev_n: int, prev_s: float, n: int) -> float:
        prev_f, f = derived[prev_n]["training_flops"], derived[n]["training_flops"]
        return prev_s * max(n / prev_n, f / prev_f if prev_f > 0 else n / prev_n)

    last = None
    mixer.eval()
    for n in sorted(cache_ns):
        if last is not None and predicted(last[0], last[1], n) > decode_budget_s:
            result["skipped"].append({"what": "decode", "n": n, "why": f"predicted > {decode_budget_s:g} s budget"})
            continue
        meas = measure_decode_cache(mixer, n, seed=seed)
        d = derived[n]
        result["cache"].append(
            {
                "n": n,
                "derived_positions": d["cache_positions"],
                "measured_positions": meas["peak_positions"],
                "derived_numel": d["cache_numel"],
                "measured_numel": meas["peak_numel"],
                "derived_bytes": d["cache_bytes"],
                "measured_bytes": meas["peak_numel"] * 4,
                "match": d["cache_positions"] == meas["peak_positions"] and d["cache_numel"] == meas["peak_numel"],
                "decode_seconds_per_token": meas["seconds_per_token"],
            }
        )
        last = (n, meas["seconds"])
    mixer.train()
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    result["threads"] = torch.get_num_threads()
    try:
        with keep_freed_memory(keep_memory) as kept:
            _time_lengths(
                mixer,
                sorted(time_ns),
                result,
                derived,
                predicted,
                batch,
                repeats,
                seed,
                time_budget_s,
                clock,
                min_time_s,
            )
        result["memory_kept"] = kept.active
    finally:
        torch.set_num_threads(threads_before)
    fit_n, fit_why = (fit_from, "given") if fit_from is not None else ASYMPTOTE_FROM.get(name, (None, None))
    rows = result["time"]
    fit = [r for r in rows if fit_n is None or r["n"] >= fit_n]
    if fit_n is not None and len(fit) < 3:  # too few lengths past the asymptote's start: fit them all
        fit, fit_why = rows, f"fewer than 3 timed lengths >= {fit_n}: fitted over all ({fit_why})"
        fit_n = None
    result["slope"] = _slopes(fit, mixer.time_complexity)
    full = _slopes(rows, mixer.time_complexity)
    s = result["slope"]
    s.update(
        {
            "judged": judge_time,
            "fit_from": fit_n,
            "fit_why": fit_why,
            # the whole range, reported beside the judged fit (the same when no asymptote start applies)
            "measured_full": full["measured"],
            "measured_mixing_full": full["measured_mixing"],
            "theory_full": full["theory"],
            "n_range_full": full["n_range"],
        }
    )
    tn = [r["n"] for r in fit]
    mixing_pts = [r for r in fit if r.get("mixing_seconds", 0) > 0]
    if any(not r["match"] for r in result["cache"]):
        bad = [r["n"] for r in result["cache"] if not r["match"]]
        result["flags"].append(f"cache: measured differs from derived at n = {bad}")
    over = f" over n >= {fit_n}" if fit_n is not None else ""
    band = slope_band(s["derived_mixing"])
    s["band"] = list(band) if band is not None else None
    enough = len(tn) >= 3
    if judge_time and enough and s["theory"] is not None:
        bad = [r["n"] for r in rows if "mixing_seconds" in r and not r["mixing_seconds"] > 0]
        if bad:
            result["flags"].append(f"mixing: not above the projections' time at n = {bad}")
        if (
            s["measured_mixing"] is not None
            and len(mixing_pts) >= 3
            and abs(s["measured_mixing"] - s["theory"]) > SLOPE_TOLERANCE
        ):
            why = ""
            sys_max = max((r.get("sys_share", 0.0) for r in fit), default=0.0)
            user = s["measured_mixing_user"]
            if clock == "cpu" and sys_max >= SYS_SHARE_NOTE and user is not None:
                # say when the departure is the kernel's page faults rather than the computation
                why = (
                    f"; system time up to {sys_max:.0%} of the CPU time (page faults of freshly mapped "
                    f"buffers), mixing slope on user time {user:.2f}"
                )
            result["flags"].append(
                f"mixing: fitted slope {s['measured_mixing']:.2f}{over}, theory "
                f"{s['theory']:.2f} (±{SLOPE_TOLERANCE}){why}"
            )
    if (
        judge_time
        and enough
        and s["measured"] is not None
        and band is not None
        and not band[0] <= s["measured"] <= band[1]
    ):
        result["flags"].append(
            f"whole: fitted slope {s['measured']:.2f}{over} outside [{band[0]:.2f}, {band[1]:.2f}] "
            f"(projections 1, mixing {s['derived_mixing']:.2f}, ±{SLOPE_TOLERANCE})"
        )
    if (
        judge_time
        and s["stated"] is not None
        and s["derived_mixing"] is not None
        and abs(s["stated"] - s["derived_mixing"]) > SLOPE_TOLERANCE
    ):
        result["flags"].append(
            f"stated: '{mixer.time_complexity}' implies slope {s['stated']:.2f} but the "
            f"derived mixing FLOPs give {s['derived_mixing']:.2f}"
        )
    return result


def _time_lengths(
    mixer: Mixer,
    ns: Sequence[int],
    result: dict,
    derived: dict,
    predicted,
    batch: int,
    repeats: int,
    seed: int,
    budget_s: float,
    clock: str,
    min_time_s: float,
) -> None:
    """Time the lengths ns in turns, skipping those whose predicted time exceeds the budget.

    First every length in increasing order gets its warm-up and one timed call, which decides from
    the previous length whether the next is attempted; then the lengths take turns, ``TURN_CALLS``
    timed calls back to back each per round, until each has its repeats (and ``min_time_s``). Timed in turns,
    every length
    sees the same mix of load over the run, so a busy minute on the shared machine cannot bend the
    slope by slowing one end of the range only. Each length times its own copy of the mixer (same
    weights): mixers keep per-shape state (the structured mixer's pattern plans, a few shapes at
    most), which a training run at one length builds once, and which lengths in turns would
    otherwise rebuild on every call.
    """
    timers: list[LengthTimer] = []
    last = None
    for n in ns:
        if last is not None and predicted(last[0], last[1], n) > budget_s:
            result["skipped"].append({"what": "time", "n": n, "why": f"predicted > {budget_s:g} s budget"})
            continue
        timer = LengthTimer(copy.deepcopy(mixer), n, batch=batch, seed=seed, clock=clock)
        timer.once()
        timers.append(timer)
        # the budget is on the timing clock: with CPU time the lengths attempted do not depend on the load
        last = (n, timer.best)
    loads: dict[int, list[float]] = {t.n: [os.getloadavg()[0]] for t in timers}
    while pending := [t for t in timers if not t.done(repeats, min_time_s)]:
        for t in pending:
            # TURN_CALLS back to back: after another length's call the heap's free blocks are cut to
            # other sizes, and the first call may grow it (fresh pages, faults); the next one reuses
            # the blocks of the same shapes, as every call of a training run at one length does
            for _ in range(TURN_CALLS):
                if t.done(repeats, min_time_s):
                    break
                t.once()
                loads[t.n].append(os.getloadavg()[0])
    for t in timers:
        meas = t.result()
        d = derived[t.n]
        row = {k: v for k, v in meas.items() if k not in ("mode", "threads", "clock")}
        # other processes' demand while this length was timed (1-min average, sampled after each call)
        row["load_1min"] = statistics.mean(loads[t.n])
        row["load_1min_range"] = [min(loads[t.n]), max(loads[t.n])]
        row["repeats"] = len(meas["all_seconds"])
        if "mixing_seconds" in meas:
            row["mixing_share"] = meas["mixing_seconds"] / meas["seconds"]
        row.update(
            {
                "derived_training_flops": d["training_flops"],
                "derived_mixing_flops": d["training_mixing_flops"],
                "derived_flops_per_token": d["flops_per_token"],
            }
        )
        result["time"].append(row)


def _slope_cell(value: float | None, judged: bool = True) -> float | str | None:
    """A slope for the table: 2 decimals (the tolerance is 0.15), marked when it is not judged."""
    if value is None:
        return None
    return round(value, 2) if judged else f"{value:.2f} (not judged)"


def accounting_rows(results: Sequence[dict]) -> list[dict]:
    """One summary row per mixer for the flag table: complexity, theory slope, measured slopes, flags.

    ``mixing share`` is the mixing's fraction of the whole time at the shortest and longest timed n;
    ``fit n`` the lengths the slopes are fitted and judged over (from ``ASYMPTOTE_FROM`` on where a
    kernel has an entry; the full-range mixing slope is then shown beside);
    ``mixing slope (user)`` the mixing slope on user CPU time and ``sys share@max n`` the system
    part of the CPU time at the longest n, which tell page-fault costs from the computation's own.
    """
    rows = []
    for r in results:
        s = r["slope"]
        judged = s["judged"]
        times = r["time"]
        share = [t["mixing_share"] for t in times if "mixing_share" in t]
        rows.append(
            {
                "mixer": r["mixer"],
                "time/token": r["time_complexity"],
                "cache": r["cache_complexity"],
                "theory slope": _slope_cell(s.get("theory")),
                "mixing slope": _slope_cell(s.get("measured_mixing"), judged),
                "whole slope": _slope_cell(s["measured"], judged),
                "whole band": f"{s['band'][0]:.2f}–{s['band'][1]:.2f}" if s.get("band") else "—",
                "FLOPs slope": _slope_cell(s["derived"]),
                "mixing share": f"{share[0]:.2f}→{share[-1]:.2f}" if share else "—",
                "mixing slope (user)": _slope_cell(s.get("measured_mixing_user")),  # a diagnostic, never judged
                "sys share@max n": round(times[-1]["sys_share"], 2) if times and "sys_share" in times[-1] else None,
                "fit n": f"{s['n_range'][0]}–{s['n_range'][1]}" if s["n_range"] else "—",
                # the whole timed range, when the judged fit starts later (ASYMPTOTE_FROM)
                "full-range mixing slope": (
                    f"{s['measured_mixing_full']:.2f} over {s['n_range_full'][0]}–"
                    f"{s['n_range_full'][1]} (theory {s['theory_full']:.2f})"
                    if s.get("fit_from") is not None
                    and s.get("measured_mixing_full") is not None
                    and s.get("theory_full") is not None
                    else "same"
                ),
                "cache n": ",".join(str(c["n"]) for c in r["cache"]) or "—",
                "cache match": all(c["match"] for c in r["cache"]) if r["cache"] else None,
                "entries@max n": r["cache"][-1]["measured_positions"] if r["cache"] else None,
                "flags": "; ".join(r["flags"]) or "ok",
            }
        )
    return rows


def plot_accounting(results: Sequence[dict], out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """cache.(png|svg): derived lines vs measured markers; time.(png|svg): measured vs scaled derived FLOPs."""
    files: list[Path] = []
    fig, axes = new_figure(1, 2, size=(5.6, 4.2))
    ax_b, ax_p = axes[0]
    for i, r in enumerate(results):
        if not r["cache"]:
            continue
        color = f"C{i % 10}"
        ns = [c["n"] for c in r["cache"]]
        ax_b.plot(ns, [c["derived_bytes"] for c in r["cache"]], "-", color=color, lw=1, label=r["mixer"])
        ax_b.plot(ns, [c["measured_bytes"] for c in r["cache"]], "o", color=color, ms=4, mfc="none")
        pos = [(n, c["derived_positions"], c["measured_positions"]) for n, c in zip(ns, r["cache"])]
        if any(p[1] > 0 for p in pos):
            ax_p.plot([p[0] for p in pos], [max(p[1], 0.5) for p in pos], "-", color=color, lw=1, label=r["mixer"])
            ax_p.plot([p[0] for p in pos], [max(p[2], 0.5) for p in pos], "o", color=color, ms=4, mfc="none")
    for ax, what in ((ax_b, "decode state bytes per sequence (float32)"), (ax_p, "cached positions (> 0 only)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (decoded tokens)")
        ax.set_title(f"{what}\nline = derived, circle = measured", fontsize=9)
        if ax.has_data():
            ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    files += save_figure(fig, out_dir, "cache", formats)

    timed = [r for r in results if len(r["time"]) >= 2]
    if timed:
        fig, axes = new_figure(1, 2, size=(6.0, 4.6))
        panels = (
            (axes[0][0], "seconds", "derived_training_flops", "measured", "whole mixer", "derived training FLOPs"),
            (
                axes[0][1],
                "mixing_seconds",
                "derived_mixing_flops",
                "measured_mixing",
                "mixing (whole − projections)",
                "derived mixing FLOPs",
            ),
        )
        for ax, key, flops_key, slope_key, what, derived_what in panels:
            for i, r in enumerate(timed):
                pts = [(t["n"], t[key], t[flops_key]) for t in r["time"] if t.get(key, 0) > 0]
                if len(pts) < 2:
                    continue
                color = f"C{i % 10}"
                ns, secs, flops = (np.array([p[k] for p in pts], dtype=float) for k in range(3))
                slope = r["slope"].get(slope_key)
                label = r["mixer"] + (f" ({slope:.2f})" if slope is not None else "")
                ax.plot(ns, secs, "o-", color=color, ms=4, lw=1, label=label)
                if (flops > 0).all():
                    scale = math.exp(float(np.mean(np.log(secs) - np.log(flops))))  # match at the geometric mean
                    ax.plot(ns, flops * scale, "--", color=color, lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("n (sequence length)")
            ax.set_ylabel(f"forward + backward seconds ({timed[0].get('clock', 'cpu')} clock)")
            ax.set_title(f"{what}: measured (solid, slope)\nvs {derived_what}, scaled (dashed)", fontsize=9)
            if ax.has_data():
                ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        files += save_figure(fig, out_dir, "time", formats)
    return files


def run_accounting(
    names: Sequence[str] | None, out_dir: Path, *, formats: Sequence[str] = FIGURE_FORMATS, progress=None, **kwargs
) -> dict:
    """:func:`account_mixer` for each name (default: every registered mixer); writes cost.json/.md + plots.

    cost.json and cost.md are rewritten after every mixer, so an interrupted run keeps what it measured.
    """
    names = list(names) if names else mixer_names()
    for n in names:
        get_mixer_spec(n)  # unknown names fail before any work
    results: list[dict] = []
    out: dict = {}
    for k, name in enumerate(names):
        if progress is not None:
            progress(f"cost: {name}")
        results.append(account_mixer(name, **kwargs))
        last = k == len(names) - 1
        figures = plot_accounting(results, out_dir, formats) if last else []
        out = _write_accounting(results, out_dir, kwargs, figures, complete=last)
    return out


def _write_accounting(results: list[dict], out_dir: Path, settings: dict, figures: list[Path], complete: bool) -> dict:
    rows = accounting_rows(results)
    threads = sorted({r["threads"] for r in results if r["time"]}) or [torch.get_num_threads()]
    clocks = sorted({r["clock"] for r in results if r["time"]}) or ["cpu"]
    loads = [t["load_1min"] for r in results for t in r["time"] if "load_1min" in t]
    out = {
        "kind": "cost",
        "complete": complete,
        "slope_tolerance": SLOPE_TOLERANCE,
        "training_flops_factor": TRAINING_FLOPS_FACTOR,
        "settings": {k: v for k, v in settings.items() if k != "mixer"},
        "threads": threads[0] if len(threads) == 1 else threads,
        "clock": "/".join(clocks),
        "load_1min_range": [min(loads), max(loads)] if loads else None,
        "cpus": os.cpu_count(),
        "memory_kept": sorted({r.get("memory_kept", False) for r in results if r["time"]}),
        "summary": rows,
        "mixers": results,
        "figures": [p.name for p in figures],
    }
    write_json(Path(out_dir) / "cost.json", out)
    load = f"1-min load {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} CPUs" if loads else "no timing"
    kept = {r.get("memory_kept", False) for r in results if r["time"]}
    memory = (
        "freed memory kept in the process (no page faults of buffers mapped afresh per call)"
        if kept == {True}
        else "freed memory returned to the OS (page faults of fresh buffers included)"
        if kept == {False}
        else "freed memory kept for some mixers only"
    )
    md = [
        "# Cost and cache accounting: derived vs measured",
        "",
        "Cache: decode n tokens with `step`, compare the measured `peak_positions` / `peak_numel` with the "
        "derived `cache_positions(n)` / `state_size(n)` (bytes at float32). Time: forward + backward of "
        "the training mode, and a replay of the same projection calls alone; the fastest of the repeats "
        f"on the {'/'.join(clocks)} clock ('cpu' = process CPU time, which time-slicing by other "
        "processes does not inflate); the lengths are timed in turns, so each sees the same load. *Mixing* = "
        "whole minus projections. The theory slope is that of n x the stated per-token complexity over "
        "the fitted n (`fit n`); the mixing slope must be within "
        f"±{SLOPE_TOLERANCE} of it, the whole slope within the projection-aware band (between the "
        f"projections' 1 and the derived mixing slope, ±{SLOPE_TOLERANCE}). The FLOPs slope is the "
        "derived prediction of the whole slope (projections and mixing weighted by multiply-adds, not "
        "by how fast each runs). A slope marked 'not judged' comes from short lengths where fixed "
        f"per-call overheads dominate. {'/'.join(map(str, threads))} torch thread(s), {load}, {memory}.",
        "",
        markdown_table(rows),
    ]
    starts = [
        f"- **{r['mixer']}** judged over n >= {r['slope']['fit_from']}: {r['slope']['fit_why']}."
        for r in results
        if r["slope"].get("fit_from") is not None
    ]
    if starts:
        md += [
            "",
            "Slopes judged from a later length on (the kernel reaches its asymptote there; the "
            "full-range mixing slope is in the table):",
        ]
        for line in starts:  # one paragraph each (the report's Markdown subset has no lists)
            md += ["", line]
    if not complete:
        md.insert(2, "_Partial: the run is still going or was interrupted._\n")
    tmp = Path(out_dir) / "cost.md.tmp"
    tmp.write_text("\n".join(md))
    tmp.replace(Path(out_dir) / "cost.md")
    return out
