"""Cross-checks of the convolution family (the short causal convolution, mixers/short_conv.py) against
independent formulas.

* An explicit loop of the definition, v_{t,c} = sum_{j=0}^{k-1} w[c, j] u_{t-j,c} (u = 0 before the
  start), scalar taps position by position, from the mixer's own parameters.
* Mamba's layout: ``nn.Conv1d(C, C, k, groups=C, padding=k-1)`` whose output is cropped to the first
  T positions, with the taps stored reversed (its weight[c, 0, i] = w[c, k-1-i]): the other common
  way to write the same layer, so a tap-order or alignment slip in the mixer shows here.

Both in float64; metric, stated in each label: max relative error max|ours - ref| / max|ref|. Every
mode of the registered mixer runs on uneven segments with the state carried (the first shorter than
k - 1, so a state holding fewer than k - 1 positions is continued), for several kernel sizes; the
reference runs on the whole sequence at once. Keys: ``k=<k> <mode>.output`` (the first segment),
``k=<k> <mode>.continued.output`` (the rest) and ``k=<k> <mode>.state`` (the cached inputs against the
last min(k - 1, T) inputs u).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from tokenmix.checks import register_crosscheck
from tokenmix.checks.tolerances import FLOAT64_CONV_REL_TOL, max_rel_err
from tokenmix.mixers.base import Mixer
from tokenmix.mixers.registry import build_mixer

D_MODEL, HEADS = 12, 3
KERNEL_SIZES = (1, 2, 4, 7)
SEGMENTS = (2, 1, 9, 5)  # 17 tokens; the first segment is shorter than k - 1 for k = 4 and 7
PER_MODE = (".output", ".continued.output", ".state")


def conv_loop(w: Tensor, u: Tensor) -> Tensor:
    """The definition, literally: w [C, k], u [B, T, C] -> v [B, T, C]."""
    b, t, c = u.shape
    v = torch.zeros_like(u)
    for s in range(t):
        for j in range(w.shape[1]):
            if s - j >= 0:
                v[:, s] += w[:, j] * u[:, s - j]
    return v


def conv_mamba_layout(w: Tensor, u: Tensor) -> Tensor:
    """Mamba's depthwise nn.Conv1d(padding=k-1), cropped to T, taps reversed: w [C, k], u [B, T, C]."""
    c, k = w.shape
    layer = nn.Conv1d(c, c, k, groups=c, padding=k - 1, bias=False).to(u.dtype)
    with torch.no_grad():
        layer.weight.copy_(w.flip(-1)[:, None, :])
    return layer(u.transpose(1, 2))[..., : u.shape[1]].transpose(1, 2)


def _against(
    reference: Callable[[Tensor, Tensor], Tensor],
    kernel_sizes: Sequence[int] = KERNEL_SIZES,
    segments: Sequence[int] = SEGMENTS,
) -> dict[str, float]:
    """Every mode of short_conv, for each kernel size, against ``reference(w, u) -> v`` on the whole sequence."""
    out = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for i, k in enumerate(kernel_sizes):
            torch.manual_seed(i)
            m: Mixer = build_mixer("short_conv", D_MODEL, n_heads=HEADS, kernel_size=k).double()
            m.weight.normal_()  # taps of comparable size (the initialisation favours the current token)
            x = torch.randn(2, sum(segments), D_MODEL, dtype=torch.float64)
            u = x @ m.in_proj.weight.T
            y_ref = reference(m.weight, u) @ m.out.weight.T
            state_ref = u[:, u.shape[1] - min(k - 1, u.shape[1]) :]
            first = segments[0]
            for mode in m.modes:
                ys, state, t0 = [], None, 0
                for size in segments:
                    y, state = m(x[:, t0 : t0 + size], state, mode=mode)
                    ys.append(y)
                    t0 += size
                y = torch.cat(ys, 1)
                out[f"k={k} {mode}.output"] = max_rel_err(y[:, :first], y_ref[:, :first])
                out[f"k={k} {mode}.continued.output"] = max_rel_err(y[:, first:], y_ref[:, first:])
                out[f"k={k} {mode}.state"] = (
                    max_rel_err(state.inputs, state_ref) if k > 1 else float(state.inputs.numel() != 0)
                )
    return out


@register_crosscheck(
    "short_conv",
    "explicit loop v_t = sum_j w[c, j] u_{t-j}",
    "float64 max rel",
    FLOAT64_CONV_REL_TOL,
    per_mode=PER_MODE,
)
def short_conv_vs_loop() -> dict[str, float]:
    return _against(conv_loop)


@register_crosscheck(
    "short_conv",
    "nn.Conv1d(padding=k-1) in Mamba's reversed layout",
    "float64 max rel",
    FLOAT64_CONV_REL_TOL,
    per_mode=PER_MODE,
)
def short_conv_vs_mamba_conv1d() -> dict[str, float]:
    return _against(conv_mamba_layout)
