"""Cost and cache accounting of every registered mixer: derived formulas against measurements.

Derived: cache entries, cache scalars, per-token time and training FLOPs from the mixer's own accounting
methods, never measured (``accounting_derived.py`` lists each). Measured: the decode cache read from the
state after an n-token decode, and the training time at several n with the projections replayed alone,
the lengths taking turns under the same load (``accounting_measured.py`` says how); log-log slopes
fitted by least squares, from ``ASYMPTOTE_FROM`` on for kernels listed there.

A mixer's time is projections (slope 1) plus mixing (the stated complexity: n x per-token growth,
e.g. slope 1.12 for O(log n) per token over 1k–16k). The whole time mixes the two in proportions
that depend on how efficiently each runs, so its slope lies between them; at short n the
projections dominate. So the mixing is timed on its own, as whole minus projections, and its
slope is judged against the theory (± ``SLOPE_TOLERANCE``); the whole slope is judged against the
projection-aware band between 1 and the derived mixing slope (widened by the same tolerance).
Nothing is fitted to the measurements beyond the one slope. A mixer is also flagged when a
measured cache differs from its derivation (any n).

The rooms: ``accounting_derived.py`` (the formulas and the slope arithmetic), ``accounting_measured.py``
(decoding and timing), ``accounting_report.py`` (table, figures, cost.json / cost.md); this module
accounts one mixer (``account_mixer``: derived beside measured, then the verdict) and runs them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from tokenmix.analysis.accounting_derived import SLOPE_TOLERANCE, derived_costs, fitted_slopes, slope_band
from tokenmix.analysis.accounting_measured import keep_freed_memory, measure_decode_cache, time_lengths
from tokenmix.analysis.accounting_report import plot_accounting, write_accounting
from tokenmix.analysis.outputs import FIGURE_FORMATS
from tokenmix.mixers.base import Mixer
from tokenmix.mixers.registry import build_mixer, get_mixer_spec, mixer_names

SYS_SHARE_NOTE = 0.1  # a mixing flag names the page faults when system time reaches this share of CPU time
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

    _account_cache(mixer, cache_ns, derived, predicted, decode_budget_s, seed, result)
    mixer.train()
    timing = (batch, repeats, seed, time_budget_s, clock, min_time_s)
    _account_time(mixer, time_ns, derived, predicted, timing, threads, keep_memory, result)
    fit, fit_n = _fit_slopes(name, mixer, result, fit_from, judge_time)
    _flag(mixer, result, fit, fit_n, judge_time, clock)
    return result


def _account_cache(
    mixer: Mixer, cache_ns: Sequence[int], derived: dict, predicted, budget_s: float, seed: int, result: dict
) -> None:
    """Decode every n of ``cache_ns`` (in eval mode) and put measured beside derived into ``result["cache"]``;
    a length predicted past ``budget_s`` is skipped, as are the longer ones."""
    last = None
    mixer.eval()
    for n in sorted(cache_ns):
        if last is not None and predicted(last[0], last[1], n) > budget_s:
            result["skipped"].append({"what": "decode", "n": n, "why": f"predicted > {budget_s:g} s budget"})
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


def _account_time(
    mixer: Mixer,
    time_ns: Sequence[int],
    derived: dict,
    predicted,
    timing: tuple,
    threads: int | None,
    keep_memory: bool,
    result: dict,
) -> None:
    """Time every n of ``time_ns`` into ``result["time"]`` (``time_lengths``; ``timing``: its batch, repeats,
    seed, budget, clock and minimum time) on ``threads`` torch threads, restored afterwards."""
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    result["threads"] = torch.get_num_threads()
    try:
        with keep_freed_memory(keep_memory) as kept:
            time_lengths(mixer, sorted(time_ns), result, derived, predicted, *timing)
        result["memory_kept"] = kept.active
    finally:
        torch.set_num_threads(threads_before)


def _fit_slopes(
    name: str, mixer: Mixer, result: dict, fit_from: int | None, judge_time: bool
) -> tuple[list, int | None]:
    """``result["slope"]``: the slopes over the lengths judged (from ``fit_from``, or the mixer's
    ``ASYMPTOTE_FROM`` entry, on) and the full-range ones beside; returns those lengths' rows and their start."""
    fit_n, fit_why = (fit_from, "given") if fit_from is not None else ASYMPTOTE_FROM.get(name, (None, None))
    rows = result["time"]
    fit = [r for r in rows if fit_n is None or r["n"] >= fit_n]
    if fit_n is not None and len(fit) < 3:  # too few lengths past the asymptote's start: fit them all
        fit, fit_why = rows, f"fewer than 3 timed lengths >= {fit_n}: fitted over all ({fit_why})"
        fit_n = None
    result["slope"] = fitted_slopes(fit, mixer.time_complexity)
    full = fitted_slopes(rows, mixer.time_complexity)
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
    return fit, fit_n


def _flag(mixer: Mixer, result: dict, fit: list, fit_n: int | None, judge_time: bool, clock: str) -> None:
    """``result["flags"]``: a cache that differs from its derivation, and (``judge_time``) slopes off the theory."""
    s = result["slope"]
    rows = result["time"]
    mixing_pts = [r for r in fit if r.get("mixing_seconds", 0) > 0]
    if any(not r["match"] for r in result["cache"]):
        bad = [r["n"] for r in result["cache"] if not r["match"]]
        result["flags"].append(f"cache: measured differs from derived at n = {bad}")
    over = f" over n >= {fit_n}" if fit_n is not None else ""
    band = slope_band(s["derived_mixing"])
    s["band"] = list(band) if band is not None else None
    enough = len(fit) >= 3  # timed lengths judged
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
        out = write_accounting(results, out_dir, kwargs, figures, complete=last)
    return out
