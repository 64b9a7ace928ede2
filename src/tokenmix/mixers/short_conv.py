"""Short causal depthwise convolution: the "short conv" that Mamba, Gated DeltaNet, Hyena and zoology's
MQAR recipe put in front of a sequence mixer, a token shift generalised to k taps.

Per channel c of C = n_heads · head_dim channels (the inner width, as in the other per-channel
mixers: with the default head_dim = d_model / n_heads, C = d_model), with u_t = W_in x_t [C] and
per-channel taps w [C, k] (k = ``kernel_size``), no bias and no activation:

    v_{t,c} = sum_{j=0}^{k-1} w[c, j] u_{t-j,c}          (u = 0 before the start)
    y_t = W_out v_t

Tap j reads j positions back (w[:, 0] is the current token). Kept linear so the (A, B) form is exact:
per channel, A[c, t, s] = w[c, t - s] for 0 <= t - s < k (a banded lower-triangular Toeplitz
matrix), B = 0. k = 1 is a per-channel scale; k = 2 with fixed taps (0, 1) is a one-token shift.
(Mamba's nn.Conv1d layout stores the same taps reversed: its weight[c, 0, i] is w[c, k-1-i].)

Initialisation: w[:, 0] = 1 and the past taps uniform in (-1/k, 1/k), so |sum_{j>=1} w[c, j]| <
(k-1)/k < 1 = w[c, 0]: the layer starts as W_out W_in x_t plus a small, random shift. The current
token dominates, so the block passes information through from the first step, while every past tap
gets gradient from the start. PyTorch's Conv1d default (uniform in (-1/sqrt(k), 1/sqrt(k)), which Mamba
keeps) gives no tap a preference and shrinks the signal to about 0.58 of its input at k = 4. That
suits a conv followed by a gate and an SSM, but not a conv used on its own as a mixer.

Modes: ``conv`` (training default: the causal depthwise convolution of ``ops/causal_conv.py`` over
the cached inputs and the segment, compiled where numba runs, torch's F.conv1d otherwise; O(T k)
per channel), ``dense`` (the banded A
through the one reference solver, cached inputs entering as its known right-hand side), and
``recurrent`` (token by token). Decode state: the inputs u of the last min(k - 1, position) positions,
oldest first: cache_positions(n) = min(k - 1, n - 1), state_size(n) = that times C.

Left padding (mixers/base.py), masked: the inputs u of padding positions are zeroed before any mode
sees them, so a real token reads exactly the zeros a solo row reads before its start (and padding
inputs get exactly zero gradient). Nothing here depends on the absolute position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.base import Linear, Mixer, MixerConfig, MixerState
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.causal_conv import causal_conv


@dataclass(frozen=True)
class ShortConvConfig(MixerConfig):
    kernel_size: int = 4  # k, taps per channel, the current token included

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.kernel_size, bool) or not isinstance(self.kernel_size, int) or self.kernel_size < 1:
            raise InputError(f"kernel_size must be an integer >= 1, got {self.kernel_size!r}")


class ConvWindow(MixerState):
    """The inputs u of the last min(position, k - 1) positions, oldest first.

    Attributes:
        inputs: [B, P, C] with P <= k - 1; position: tokens seen.
    """

    def __init__(self, owner: str, batch_size: int, position: int, inputs: Tensor) -> None:
        self.owner, self.batch_size, self.position = owner, batch_size, position
        self.inputs = inputs

    def tensors(self) -> dict[str, Tensor]:
        return {"inputs": self.inputs}

    def numel_per_batch(self) -> int:
        # from the shape: ``observe`` calls this before every decoded token
        return math.prod(self.inputs.shape[1:])

    def cached_positions(self) -> int:
        return int(self.inputs.shape[1])


def short_conv_init(channels: int, kernel_size: int) -> Tensor:
    """w [channels, k]: 1 on the current tap, uniform in (-1/k, 1/k) on the past ones (module docstring)."""
    w = torch.empty(channels, kernel_size).uniform_(-1.0 / kernel_size, 1.0 / kernel_size)
    w[:, 0] = 1.0
    return w


class ShortConv(Mixer):
    """Causal depthwise convolution of k taps per channel, between two linear maps."""

    modes = ("conv", "dense", "recurrent")
    time_complexity = "O(k)"  # per token: k taps per channel, independent of n
    cache_complexity = "O(k)"  # the last k - 1 inputs per channel

    def __init__(self, config: ShortConvConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        self.kernel_size = config.kernel_size
        self.channels = self.n_heads * self.head_dim
        self.in_proj = Linear(d_model, self.channels, bias=False)  # u = W_in x
        self.weight = nn.Parameter(short_conv_init(self.channels, config.kernel_size))  # w [C, k]
        self.out = Linear(self.channels, d_model, bias=False)

    # ---------------------------------------------------------------- shared pieces
    def _start(self, x: Tensor, state: ConvWindow | None) -> tuple[ConvWindow, Tensor]:
        """(state, u [B, T, C]) with the inputs of padding positions zeroed."""
        if state is None:
            state = self.empty_state(x.shape[0], x.device, x.dtype)
        u = self.in_proj(x)
        pad = state.padding(x.shape[1])  # [B, T]
        if pad is not None:
            u = u.masked_fill(pad[..., None], 0.0)
        return state, u

    def _finish(self, state: ConvWindow, u: Tensor, v: Tensor) -> tuple[Tensor, ConvWindow]:
        """Output projection of v [B, T, C] and the state holding the last positions of the cached
        inputs followed by the segment's u [B, T, C]."""
        t, cached = v.shape[1], state.inputs
        keep = min(self.kernel_size - 1, cached.shape[1] + t)
        # copies: a view would keep the whole segment alive for as long as the state lives
        kept = u[:, t - keep :].clone() if keep <= t else torch.cat([cached[:, cached.shape[1] - (keep - t) :], u], 1)
        new = ConvWindow(state.owner, state.batch_size, state.position + t, kept)
        return self.out(v), new.carry_over(state)

    def toeplitz(self, p: int, t: int) -> Tensor:
        """[C, T, P + T]: row t of the segment reads buffer position s with weight w[:, t + P - s] when
        0 <= t + P - s < k, else 0 (columns < P: the P cached positions before the segment)."""
        k = self.kernel_size
        lag = torch.arange(t, device=self.weight.device)[:, None] + p - torch.arange(p + t, device=self.weight.device)
        inside = (lag >= 0) & (lag < k)
        taps = self.weight[:, lag.clamp(0, k - 1)]  # [C, T, P + T]
        return taps * inside.to(taps.dtype)

    # ---------------------------------------------------------------- modes
    def forward_conv(self, x: Tensor, state: ConvWindow | None) -> tuple[Tensor, ConvWindow]:
        state, u = self._start(x, state)
        return self._finish(state, u, causal_conv(u, state.inputs, self.weight))

    def forward_dense(self, x: Tensor, state: ConvWindow | None) -> tuple[Tensor, ConvWindow]:
        state, u = self._start(x, state)
        b, t, _ = u.shape
        cached, p = state.inputs, state.cached_positions()
        full = self.toeplitz(p, t)  # [C, T, P + T]
        mix_a = full[:, :, p:].expand(b, -1, -1, -1)  # [B, C, T, T]
        # cached inputs are not part of the segment's operator: they enter as a known right-hand
        # side, read through the prefix columns of the band
        offset = torch.einsum("cts,bsc->btc", full[:, :, :p], cached)[..., None] if p else None
        v = solve_dense(MixOperator(mix_a, torch.zeros_like(mix_a)), u[..., None], offset=offset)[..., 0]
        return self._finish(state, u, v)

    def forward_recurrent(self, x: Tensor, state: ConvWindow | None) -> tuple[Tensor, ConvWindow]:
        """Token by token: read the cached inputs and the token's own, keep the last k - 1."""
        state, u = self._start(x, state)
        k, outs = self.kernel_size, []
        for s in range(x.shape[1]):
            state.observe()
            window = torch.cat([state.inputs, u[:, s : s + 1]], 1)  # [B, L, C], L = P + 1 <= k
            taps = self.weight[:, : window.shape[1]].flip(-1)  # [C, L]: w[:, L-1-i] for buffer i
            outs.append(torch.einsum("blc,cl->bc", window, taps))
            keep = min(k - 1, window.shape[1])
            state = ConvWindow(
                state.owner, state.batch_size, state.position + 1, window[:, window.shape[1] - keep :]
            ).carry_over(state)
        return self.out(torch.stack(outs, 1)), state

    # ---------------------------------------------------------------- surface
    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> ConvWindow:
        return ConvWindow(
            self.owner, batch_size, 0, torch.zeros(batch_size, 0, self.channels, device=device, dtype=dtype)
        )

    def materialize(self, x: Tensor) -> MixOperator:
        """A [B, C, T, T] = the banded Toeplitz w[c, t - s] per channel, B = 0, over the values u."""
        b, t, _ = x.shape
        mix_a = self.toeplitz(0, t).to(x.dtype).expand(b, -1, -1, -1)
        return MixOperator(mix_a, torch.zeros_like(mix_a))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: u [B, T, C, 1] (channels as heads of value dimension 1)."""
        return self.in_proj(x)[..., None]

    def mixing_core(self, x: Tensor):
        """(fn, inputs): the convolution of x's inputs u without the projections (for benchmarks);
        fn returns (v, None)."""
        u = self.in_proj(x).detach().requires_grad_()
        empty = u.new_zeros(u.shape[0], 0, self.channels)
        return (lambda uu: (causal_conv(uu, empty, self.weight), None)), (u,)

    def cache_positions(self, n: int) -> int:
        return min(max(n - 1, 0), self.kernel_size - 1)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.channels

    def flops_per_token(self, n: int) -> int:
        return self.channels * (self.cache_positions(n) + 1)  # one multiply-add per tap read, per channel


register_mixer(
    "short_conv",
    ShortConvConfig,
    family="convolution",
    ab_form="A = banded Toeplitz w_c(t - s) for 0 <= t - s < k (per channel), B = 0",
)(ShortConv)
