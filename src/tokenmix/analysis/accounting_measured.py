"""Measured accounting of a mixer: its decode cache read from the state, and its training time.

    cache           decode n tokens with ``mixer.step`` and read ``state.peak_positions`` /
                    ``state.peak_numel`` (the recurrent mode observes the state before every token)
    time            forward + backward of the training mode at several n, and a replay of the same
                    projection calls alone (the weight matrices' forward + backward on inputs of the
                    recorded shapes); the lengths take turns (two calls back to back each per
                    round, each on its own copy of the mixer), so all see the same load; the fastest of the repeats
                    (other processes only ever add time), on process CPU time by default

What the numbers are compared with is ``accounting_derived.py``; the verdict, ``accounting.py``.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
from typing import Sequence

import torch
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Mixer
from tokenmix.runs.clocks import time_repeats

# cpu: process CPU time (user + system), which time-slicing by other processes does not inflate;
# user: its user part (the computation without the kernel's page-fault handling); wall: wall time
CLOCKS = ("cpu", "user", "wall")
MAX_REPEATS = 25  # timed repeats per length at most (see time_forward_backward's min_total_s)
TURN_CALLS = 2  # timed calls of one length per turn (see time_lengths)


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


def time_lengths(
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
