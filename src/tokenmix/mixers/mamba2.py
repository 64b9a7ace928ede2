"""Mamba-2 / SSD (Dao & Gu 2024, "Transformers are SSMs"): a scalar data-dependent decay per head
with state expansion N, i.e. masked linear attention with q = C, k = B, v = x·dt.

Per head h (P = head_dim channels x_t [P], shared B_t, C_t [N] as with one group), state S [N, P]:

    dt_t = softplus(w_hᵀ x_t + dt_bias_h),   a_t = exp(-dt_t exp(A_log_h)) in (0, 1),
    S_t  = a_t S_{t-1} + B_t (dt_t x_t)ᵀ,     o_t = S_tᵀ C_t (+ D_h x_t),     y_t = W_o [o_t]_heads.

This is fla's ``naive_recurrent_simple_gla(q=C, k=B, v=x·dt, g=log a, scale=1.0)`` and mamba-ssm's
``ssd_minimal_discrete`` (which stores S transposed, [P, N]). The short convolution and output gate
of the full Mamba-2 block are left to other layers; the D skip is optional (``d_skip``) and, being
pointwise in time, is not part of the mixing operator.

(A, B) forms over the values X = x·dt (mixers/diagonal_decay.py), with G_t = sum_{s<=t} log a_s:
    token view:        B = 0, A = (C Bᵀ ⊙ exp(G_t - G_j)) for j <= t   (1-semiseparable mask);
    first-order view:  per state channel n, A_n = diag(B_{·,n}), B_n[t, t-1] = a_t (one decay shared by
                       all n), R_n = diag(C_{·,n}).
Chunked form: ops/chunked_ssd.py, the SSD kernel with B_t, C_t shared by the heads (one group): one
score matrix C Bᵀ per chunk for all heads, with the per-head decays factored out as row scalings
(it hands chunks whose decay span would over/underflow to ops/chunked_gla.py's exact safe form).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import Linear, MixerConfig, kept_derived
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer, LinearFeatures, MatrixState
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.chunked_ssd import chunked_ssd


@dataclass(frozen=True)
class SelectiveSSMConfig(MixerConfig):
    """Fields shared by the selective SSMs (mamba2, diag_ssm)."""

    state_dim: int = 16  # N, the state expansion (d_state)
    chunk_size: int = 64  # C of the chunked form
    d_skip: bool = True  # add D_h x_t to the output
    dt_min: float = 1e-3  # initial softplus(dt_bias) range (log-uniform, as in Mamba-2)
    dt_max: float = 1e-1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("state_dim", "chunk_size")
        if not 0 < self.dt_min <= self.dt_max:
            raise InputError(f"dt_min must be > 0 and <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")


@dataclass(frozen=True)
class Mamba2Config(SelectiveSSMConfig):
    """Mamba-2 / SSD: the selective-SSM fields, with Mamba-2's larger state expansion.

    N = 64 rather than Mamba-1's 16: state expansion is what SSD's matmul form was made to afford
    (Mamba-2 uses N = 64-256; mamba-ssm's default is 128), and at head dim 64 it gives each head the
    same [64, 64] state as linear attention, retnet and gla, so these mixers are compared at equal
    state size. At N = 16 the chunked kernel does ~3x the recurrence's FLOPs (the C x C products cost
    the same whatever N), at N = 64 ~1.6x.
    """

    state_dim: int = 64


def inverse_softplus_dt(n: int, dt_min: float, dt_max: float) -> Tensor:
    """dt_bias [n] with softplus(dt_bias) log-uniform in [dt_min, dt_max] (Mamba's initialisation)."""
    dt = torch.exp(torch.empty(n).uniform_(math.log(dt_min), math.log(dt_max)))
    return dt + torch.log(-torch.expm1(-dt))


@register_mixer(
    "mamba2",
    Mamba2Config,
    family="state space model",
    ab_form="B = 0 token view: A = C Bᵀ ⊙ exp(G_t - G_j) / first-order state view: "
    "A_n = diag(B_n), B_n = a_t shift (shared), R_n = diag(C_n)",
)
class Mamba2(DiagonalDecayMixer):
    reassociates = True  # the chunked form factors prod a_s as exp(G_i - G_j)
    packing_modes = ("chunked",)  # chunked_ssd takes the document starts, as chunked_gla does
    test_overrides = {"state_dim": 4}

    def __init__(self, config: Mamba2Config, d_model: int) -> None:
        super().__init__(config, d_model)
        h, p, n = self.n_heads, self.head_dim, config.state_dim
        self.state_heads, self.key_dim, self.value_dim, self.has_decay = h, n, p, True
        self.in_proj = Linear(d_model, h * p + 2 * n + h, bias=False)  # x, B, C, dt
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(h, config.dt_min, config.dt_max))
        self.D = nn.Parameter(torch.ones(h)) if config.d_skip else None
        self.out = Linear(h * p, d_model, bias=False)

    def _mix_chunked(
        self, f: LinearFeatures, s0: Tensor | None, doc_starts: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """SSD over all heads at once: q and k are C and B broadcast over the heads, [:, :, 0] is the shared one."""
        return chunked_ssd(f.q[:, :, 0], f.k[:, :, 0], f.v, f.g, f.scale, s0, self.config.chunk_size, doc_starts)

    def mixing_core(self, x: Tensor):
        """(fn, inputs): the SSD mixing of x without the projections (C, B as [B, T, N] leaves)."""
        f = self._features(x)
        leaves = tuple(z.detach().requires_grad_(z.requires_grad) for z in (f.q[:, :, 0], f.k[:, :, 0], f.v, f.g))
        scale, chunk = f.scale, self.config.chunk_size
        return (lambda c, b, v, g: chunked_ssd(c, b, v, g, scale, None, chunk)), leaves

    def forward_recurrent(self, x: Tensor, state: MatrixState | None) -> tuple[Tensor, MatrixState]:
        """Token by token, the base's recurrence (ops/recurrent_gla.gla_step) written for one
        shared B_t, C_t: they broadcast over the heads instead of being expanded to [B, T, H, N],
        and the readout S_tᵀ C_t is a broadcast product and sum, where gla_step's einsum would copy
        the expanded C_t. Same numbers up to rounding; segments with padding tokens take the
        base's masked path.
        """
        b, t, _ = x.shape
        if state is not None and state.padding(t) is not None:
            return super().forward_recurrent(x, state)
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        h, p, n = self.n_heads, self.head_dim, self.config.state_dim
        xs, bs, cs, dt = self.in_proj(x).split([h * p, n, n, h], dim=-1)
        xs = xs.view(b, t, h, p)
        dt = F.softplus(dt + self.dt_bias)  # [B, T, H]
        decay = torch.mul(dt, self._minus_a()).exp_()  # a_t = exp(-dt_t exp(A_log)) [B, T, H]
        v = xs * dt.unsqueeze(-1)  # x·dt [B, T, H, P]
        # per token, shaped to broadcast against S [B, H, N, P]: a_t [B, H, 1, 1], B_t and C_t
        # [B, 1, N, 1], v_t [B, H, 1, P]; unbound once (as recurrent_gla: indexing token i would make
        # autograd scatter each token's gradient into a full-size zero tensor), a view for one token
        shapes = ((decay, (h, 1, 1)), (bs, (1, n, 1)), (cs, (1, n, 1)), (v, (h, 1, p)))
        if t == 1:
            tokens = [tuple(z.view(b, *shape) for z, shape in shapes)]
        else:
            tokens = zip(*(z.reshape(b, t, *shape).unbind(1) for z, shape in shapes))
        outs = []
        for a_t, b_t, c_t, v_t in tokens:
            state.observe()
            memory = torch.addcmul(state.memory * a_t, b_t, v_t)  # S_t = a_t S_{t-1} + B_t (dt_t x_t)ᵀ
            outs.append((memory * c_t).sum(2))  # o_t = S_tᵀ C_t [B, H, P]
            state = MatrixState(state.owner, b, state.position + 1, memory).carry_over(state)
        o = outs[0].unsqueeze(1) if t == 1 else torch.stack(outs, 1)  # [B, T, H, P]
        skip = self.D
        if skip is not None:
            o = torch.addcmul(o, skip.view(h, 1), xs)  # + D_h x_t
        return self.out(o.flatten(2)), state

    def _minus_a(self) -> Tensor:
        """-exp(A_log) [H], the continuous-time decay rates (negated). Without autograd it is kept
        from one decode step to the next, remade when A_log changes (another tensor or an in-place
        update): two tensor ops fewer per token, the same values."""
        a_log = self.A_log
        if torch.is_grad_enabled() or a_log.is_inference():
            return a_log.exp().neg()
        return kept_derived(self, "_kept_minus_a", a_log, lambda a: a.exp().neg())

    def _features(self, x: Tensor) -> LinearFeatures:
        """q = C, k = B [B, T, H, N] (shared by the heads), v = x·dt [B, T, H, P], g = log a [B, T, H]."""
        b, t, _ = x.shape
        h, p, n = self.n_heads, self.head_dim, self.config.state_dim
        xs, bs, cs, dt = self.in_proj(x).split([h * p, n, n, h], dim=-1)
        xs = xs.view(b, t, h, p)
        dt = F.softplus(dt + self.dt_bias)  # [B, T, H] > 0
        g = -dt * self.A_log.exp()  # log a_t <= 0
        q, k = cs[:, :, None, :].expand(b, t, h, n), bs[:, :, None, :].expand(b, t, h, n)
        skip = None if self.D is None else self.D[:, None] * xs
        return LinearFeatures(q, k, xs * dt[..., None], g, 1.0, skip)
