"""Mixing-matrix viewer: what every output of a layer depends on, drawn from its (A, B, R) form.

For a mixer and an input x [B, T, D] the layer's operator is materialised (``mixer.materialize``) and
shown per head:

    heatmaps of A, B (and R) and of the effective M = sum_g R_g (I - B_g)^{-1} A_g on a log|.|
        colour scale (exact zeros are blank: the structure is visible);
    the dependency graph of B for one position p: the positions whose outputs y_j reach y_p through
        chains of B-hops, laid out by hop count;
    the decay profile |M[i, i - d]| against the distance d (mean and max over i).

Inputs are random (seeded) or the layer inputs of a trained run for a text
(:mod:`tokenmix.analysis.run_inputs`). Figures are PNG and SVG through matplotlib's Agg backend.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.colors import Normalize
from torch import Tensor

from tokenmix.analysis.outputs import FIGURE_FORMATS, new_figure, save_figure, write_json
from tokenmix.core.errors import InputError
from tokenmix.core.operator import MAX_DENSE_T, MixOperator
from tokenmix.mixers.base import Mixer
from tokenmix.mixers.registry import build_mixer

LOG_RANGE_DECADES = 12.0  # colour scale of log10|.|: the data's range, at most 12 decades below the max
MAX_DRAWN_EDGES = 4000  # the dependency graph draws at most this many B-edges (dense B is a clique)
MAX_OPERATOR_BYTES = 2 * 2**30  # a materialised (A, B, R) larger than this is refused


def check_dense_length(n: int, what: str = "this analysis") -> None:
    """Refuse sequence lengths that cannot be materialised densely, naming the limit and the way out."""
    if n < 1:
        raise InputError(f"sequence length must be >= 1, got {n}")
    if n > MAX_DENSE_T:
        raise InputError(
            f"n = {n} is too long to materialise densely for {what} (limit {MAX_DENSE_T}); the structured "
            f"metrics still run at this length: tokenmix analyze expressivity --n {n} / tokenmix analyze cost"
        )


def operator_bytes(mixer: Mixer, n: int, batch: int = 1) -> int:
    """Bytes the materialised (A, B, R) of ``mixer`` take at length n, from a 2-token probe: the heads,
    state channels and readout do not depend on n, the [T, T] blocks grow as n^2."""
    p = next(mixer.parameters(), None)
    dtype = p.dtype if p is not None else torch.float64
    with torch.no_grad():
        probe = mixer.materialize(torch.zeros(1, 2, mixer.d_model, dtype=dtype))
    blocks = probe.A[0].numel() // 4  # heads x channels of one batch element
    mats = 3 if probe.R is not None else 2
    return mats * batch * blocks * n * n * probe.A.element_size()


def check_operator_memory(mixer: Mixer, n: int, what: str = "this analysis", batch: int = 1) -> None:
    """Refuse to materialise an operator larger than ``MAX_OPERATOR_BYTES`` (many heads x state channels)."""
    need = operator_bytes(mixer, n, batch)
    if need > MAX_OPERATOR_BYTES:
        raise InputError(
            f"materialising {type(mixer).__name__} at n = {n} for {what} needs {need / 2**30:.1f} GiB "
            f"(limit {MAX_OPERATOR_BYTES / 2**30:.0f} GiB: heads x state channels x n^2); use a smaller --n, "
            f"or the structured metrics: tokenmix analyze expressivity / tokenmix analyze cost"
        )


def build_analysis_mixer(
    name: str, d_model: int = 64, n_heads: int = 2, seed: int = 0, dtype: torch.dtype = torch.float64, **overrides
) -> Mixer:
    """A registered mixer with seeded initial weights, for analysis (no training)."""
    torch.manual_seed(seed)
    mixer = build_mixer(name, d_model, n_heads=n_heads, **overrides)
    return mixer.to(dtype).eval()


def random_input(mixer: Mixer, n: int, batch: int = 1, seed: int = 0) -> Tensor:
    """x [batch, n, D] ~ N(0, 1), seeded, in the mixer's dtype."""
    p = next(mixer.parameters(), None)
    dtype = p.dtype if p is not None else torch.float64
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, mixer.d_model, generator=gen, dtype=dtype)


def materialize_mixer(mixer: Mixer, x: Tensor) -> MixOperator:
    """The mixer's (A, B[, R]) operator for x [B, T, D], validated (causal)."""
    check_dense_length(x.shape[1], f"materialising {type(mixer).__name__}")
    check_operator_memory(mixer, x.shape[1], "the matrix viewer", batch=x.shape[0])
    with torch.no_grad():
        op = mixer.materialize(x)
    return op.validate(atol=0.0)


def head_matrices(op: MixOperator, batch: int = 0, channel: int = 0) -> dict[str, Tensor]:
    """Per-head matrices [H, T, T] of one batch element: A, B, (R) of state channel ``channel``, and M."""
    if not 0 <= batch < op.A.shape[0]:
        raise InputError(f"batch index {batch} out of range [0, {op.A.shape[0]})")
    pick = (lambda t: t[batch, :, channel]) if op.has_state_axis else (lambda t: t[batch])
    if op.has_state_axis and not 0 <= channel < op.A.shape[2]:
        raise InputError(f"state channel {channel} out of range [0, {op.A.shape[2]})")
    out = {"A": pick(op.A), "B": pick(op.B)}
    if op.R is not None:
        out["R"] = pick(op.R)
    out["M"] = op.mixing_matrix()[batch]
    return {k: v.detach() for k, v in out.items()}


def log_magnitude(m: Tensor) -> np.ndarray:
    """log10|m| as a masked numpy array (exact zeros masked, shown blank)."""
    a = m.detach().abs().double().cpu().numpy()
    with np.errstate(divide="ignore"):
        return np.ma.masked_where(a == 0, np.log10(np.where(a == 0, 1.0, a)))


def _heads(op: MixOperator, heads: Sequence[int] | None) -> list[int]:
    n_heads = op.A.shape[1]
    hs = list(range(min(n_heads, 4))) if heads is None else list(heads)
    bad = [h for h in hs if not 0 <= h < n_heads]
    if bad or not hs:
        raise InputError(f"head index(es) {bad or '(none)'} out of range [0, {n_heads})")
    return hs


def plot_operator_heatmaps(
    op: MixOperator,
    out_dir: Path,
    stem: str = "matrices",
    *,
    title: str = "",
    heads: Sequence[int] | None = None,
    batch: int = 0,
    channel: int = 0,
    formats: Sequence[str] = FIGURE_FORMATS,
) -> list[Path]:
    """Grid: one row per head, columns A, B, (R), M; colour = log10|entry|, blank = exactly zero."""
    mats = head_matrices(op, batch, channel)
    hs = _heads(op, heads)
    names = list(mats)
    fig, axes = new_figure(len(hs), len(names), size=(3.4, 3.0))
    cmap = colormaps["viridis"].with_extremes(bad="white")
    for r, h in enumerate(hs):
        for c, name in enumerate(names):
            ax = axes[r][c]
            lm = log_magnitude(mats[name][h])
            top = float(lm.max()) if lm.count() else 0.0
            low = max(float(lm.min()) if lm.count() else top - 1.0, top - LOG_RANGE_DECADES)
            im = ax.imshow(lm, cmap=cmap, norm=Normalize(min(low, top - 1e-3), top), interpolation="nearest")
            label = name if not (op.has_state_axis and name != "M") else f"{name} (g={channel})"
            if not lm.count():
                ax.text(0.5, 0.5, f"{name} = 0", transform=ax.transAxes, ha="center", va="center", fontsize=11)
            ax.set_title(f"head {h}: {label}", fontsize=9)
            ax.set_xlabel("j (source)", fontsize=8)
            ax.set_ylabel("i (target)", fontsize=8)
            ax.tick_params(labelsize=7)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).set_label("log10 |entry|", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem, formats)


def _b_support(op: MixOperator, batch: int, head: int, channel: int | None) -> Tensor:
    """|B| [T, T] of one head: a given state channel, or the max over channels (None)."""
    b = op.B[batch, head].detach().abs()
    if op.has_state_axis:
        b = b.amax(0) if channel is None else b[channel]
    return b


def dependency_levels(
    op: MixOperator, position: int, head: int = 0, batch: int = 0, channel: int | None = None
) -> dict[int, int]:
    """Positions j whose output y_j reaches y_position through B-hops -> fewest hops (BFS, 0 = itself)."""
    t = op.A.shape[-1]
    if not 0 <= position < t:
        raise InputError(f"position {position} out of range [0, {t})")
    if not 0 <= head < op.A.shape[1]:
        raise InputError(f"head {head} out of range [0, {op.A.shape[1]})")
    nz = (_b_support(op, batch, head, channel) != 0).cpu().numpy()
    levels = {position: 0}
    queue = deque([position])
    while queue:
        u = queue.popleft()
        for v in np.nonzero(nz[u])[0].tolist():
            if v not in levels:
                levels[v] = levels[u] + 1
                queue.append(v)
    return dict(sorted(levels.items()))


def plot_dependency_graph(
    op: MixOperator,
    position: int,
    out_dir: Path,
    stem: str = "dependency",
    *,
    head: int = 0,
    batch: int = 0,
    channel: int | None = None,
    title: str = "",
    formats: Sequence[str] = FIGURE_FORMATS,
) -> tuple[list[Path], dict[int, int]]:
    """Draw the B-dependency graph of ``position``: x = position, y = hops from it, edges = B entries."""
    levels = dependency_levels(op, position, head, batch, channel)
    bmag = _b_support(op, batch, head, channel).cpu().numpy()
    fig, axes = new_figure(1, 1, size=(8.0, 3.8))
    ax = axes[0][0]
    edges = [(u, v) for u in levels for v in np.nonzero(bmag[u])[0].tolist() if v in levels]
    drawn = edges[:MAX_DRAWN_EDGES]
    wmax = max((bmag[u, v] for u, v in drawn), default=1.0) or 1.0
    for u, v in drawn:
        ax.plot([u, v], [levels[u], levels[v]], color="tab:blue", lw=0.8, alpha=0.15 + 0.75 * float(bmag[u, v]) / wmax)
    xs, ys = list(levels), list(levels.values())
    ax.scatter(xs, ys, s=14, c=ys, cmap="plasma", zorder=3)
    ax.scatter([position], [0], s=60, marker="*", color="red", zorder=4, label=f"position {position}")
    ax.set_xlim(-0.5, op.A.shape[-1] - 0.5)
    ax.invert_yaxis()
    ax.set_xlabel("position j")
    ax.set_ylabel("B-hops from the chosen position")
    depth = max(ys)
    note = (
        "B = 0: no recurrent dependency"
        if len(levels) == 1
        else f"{len(levels) - 1} earlier positions within {depth} hops"
    )
    if len(drawn) < len(edges):
        note += f" ({len(drawn)} of {len(edges)} edges drawn)"
    ax.set_title((title + "\n" if title else "") + f"B-dependency graph, head {head}: {note}", fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return save_figure(fig, out_dir, stem, formats), levels


def decay_profile(op: MixOperator, batch: int = 0) -> dict[str, np.ndarray]:
    """|M[i, i - d]| against the distance d: ``mean`` and ``max`` over i, each [H, T] (d = 0..T-1)."""
    m = op.mixing_matrix()[batch].detach().abs().double()  # [H, T, T]
    t = m.shape[-1]
    mean = np.zeros((m.shape[0], t))
    mx = np.zeros((m.shape[0], t))
    for d in range(t):
        diag = torch.diagonal(m, offset=-d, dim1=-2, dim2=-1)  # [H, T - d]
        mean[:, d] = diag.mean(-1).cpu().numpy()
        mx[:, d] = diag.amax(-1).cpu().numpy()
    return {"mean": mean, "max": mx}


def plot_decay_profile(
    op: MixOperator,
    out_dir: Path,
    stem: str = "decay",
    *,
    batch: int = 0,
    heads: Sequence[int] | None = None,
    title: str = "",
    formats: Sequence[str] = FIGURE_FORMATS,
) -> tuple[list[Path], dict[str, np.ndarray]]:
    prof = decay_profile(op, batch)
    fig, axes = new_figure(1, 1, size=(6.0, 3.8))
    ax = axes[0][0]
    d = np.arange(prof["mean"].shape[1])
    for h in _heads(op, heads):
        for key, style in (("mean", "-"), ("max", ":")):
            vals = np.where(prof[key][h] > 0, prof[key][h], np.nan)  # zeros cannot be drawn on a log axis
            ax.plot(d, vals, style, lw=1.2, color=f"C{h % 10}", label=f"head {h} {key}")
    ax.set_yscale("log")
    ax.set_xlabel("distance d = i - j")
    ax.set_ylabel("|M[i, i - d]|")
    ax.set_title((title + "\n" if title else "") + "decay profile (mean and max over i)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem, formats), prof


def operator_summary(op: MixOperator) -> dict:
    """Shape and sparsity facts of an operator (whole batch)."""
    t = op.A.shape[-1]
    lower = t * (t + 1) // 2
    summary = {
        "T": t,
        "heads": op.A.shape[1],
        "state_channels": op.A.shape[2] if op.has_state_axis else 1,
        "has_readout": op.R is not None,
        "nnz_A_per_head": float((op.A != 0).sum()) / (op.A.shape[0] * op.A.shape[1]),
        "nnz_B_per_head": float((op.B != 0).sum()) / (op.B.shape[0] * op.B.shape[1]),
        "B_is_zero": bool((op.B == 0).all()),
    }
    m = op.mixing_matrix()
    summary["M_density"] = float((m != 0).sum()) / (m.shape[0] * m.shape[1] * lower)
    return summary


def analyze_matrix(
    mixer: Mixer,
    x: Tensor,
    out_dir: Path,
    *,
    name: str = "",
    position: int | None = None,
    heads: Sequence[int] | None = None,
    channel: int = 0,
    dep_head: int = 0,
    formats: Sequence[str] = FIGURE_FORMATS,
    input_note: str = "random N(0, 1) input",
) -> dict:
    """Materialise, draw heatmaps / dependency graph / decay profile, write ``matrix.json``; return it."""
    op = materialize_mixer(mixer, x)
    t = x.shape[1]
    position = t - 1 if position is None else position
    label = name or type(mixer).__name__
    title = f"{label}, T = {t}, {input_note}"
    files = plot_operator_heatmaps(op, out_dir, "matrices", title=title, heads=heads, channel=channel, formats=formats)
    dep_files, levels = plot_dependency_graph(
        op, position, out_dir, "dependency", head=dep_head, title=title, formats=formats
    )
    decay_files, prof = plot_decay_profile(op, out_dir, "decay", heads=heads, title=title, formats=formats)
    result = {
        "mixer": label,
        "input": input_note,
        "time_complexity": getattr(mixer, "time_complexity", "?"),
        "cache_complexity": getattr(mixer, "cache_complexity", "?"),
        "summary": operator_summary(op),
        "dependency": {
            "position": position,
            "head": dep_head,
            "hops": {str(k): v for k, v in levels.items()},
            "reached": len(levels) - 1,
            "max_hops": max(levels.values()),
        },
        "decay_profile": {"mean": prof["mean"].tolist(), "max": prof["max"].tolist()},
        "figures": [p.name for p in files + dep_files + decay_files],
    }
    write_json(Path(out_dir) / "matrix.json", result)
    return result


def analyze_registered(
    name: str, n: int, out_dir: Path, *, d_model: int = 64, n_heads: int = 2, seed: int = 0, **kwargs
) -> dict:
    """:func:`analyze_matrix` for a registered mixer name on a seeded random input of length n."""
    check_dense_length(n, "the matrix viewer")
    mixer = build_analysis_mixer(name, d_model, n_heads, seed)
    return analyze_matrix(
        mixer,
        random_input(mixer, n, seed=seed),
        out_dir,
        name=name,
        input_note=f"random N(0, 1) input, seed {seed}",
        **kwargs,
    )
