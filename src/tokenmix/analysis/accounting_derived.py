"""Derived accounting of a mixer: what its own accounting methods say it costs, never measured.

    cache entries   cache_positions(n), past positions held at the peak of an n-token decode
    cache scalars   state_size(n) per batch element; bytes = scalars x element size
    per-token time  flops_per_token(n), multiply-adds of the mixing for the last token
    training FLOPs  forward mixing multiply-adds of an n-token sequence, sum_{t=1..n} flops_per_token(t)
                    (exact up to 2048 positions, a trapezoid sum over sampled positions beyond), plus
                    n x the weight-matrix multiply-adds per token (projections), times 3 for forward +
                    backward (the backward of a linear map costs two forwards)

and the slope arithmetic the measurements are judged by: the log-log slope a stated complexity
implies, least-squares fits, the projection-aware band (``analysis/accounting.py`` explains it).
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from tokenmix.mixers.base import Mixer

SLOPE_TOLERANCE = 0.15
TRAINING_FLOPS_FACTOR = 3  # forward + backward of a linear map ~ 3 forwards
EXACT_SUM_POSITIONS = 2048  # training FLOPs are summed exactly over this many positions, sampled beyond


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


def slope_band(derived_mixing: float | None) -> tuple[float, float] | None:
    """Slopes a whole-mixer time may show: between the projections' 1 and the mixing's, +- the tolerance."""
    if derived_mixing is None:
        return None
    return min(1.0, derived_mixing) - SLOPE_TOLERANCE, max(1.0, derived_mixing) + SLOPE_TOLERANCE


def fitted_slopes(rows: Sequence[dict], complexity: str) -> dict:
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
