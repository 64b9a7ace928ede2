"""TTT-Linear (Sun et al. 2024, "Learning to (Learn at Test Time): RNNs with Expressive Hidden States"),
in fla-core's form (fla/ops/ttt/naive.py; ops/ttt_linear.py states it in full).

Per head (D = head_dim; q, k, v = W_qkv x_t, raw; eta_t = base_lr · sigmoid(w_etaᵀ x_t + b_eta) / D;
ln_w, ln_b [D] the inner LayerNorm's affine, learnable, shared with the post-norm as in fla), the hidden
state is a linear model z = k W + c trained online on the self-supervised loss
1/2 |ln_w ⊙ LN(k_s W + c) + ln_b - (v_s - k_s)|², by gradient descent over mini-batches of
``mini_batch_size`` tokens aligned to absolute positions (every gradient of a mini-batch at the same W, c):

    nabla_s = d loss_s / d z at z = k_s W_m + c_m,
    o_t = scale q_t W_m + c_m - eta_t sum_{s in m, s <= t} (scale q_t·k_s + 1) nabla_s,
    W_{m+1} = W_m - eta_last sum_{s in m} k_sᵀ nabla_s,   c_{m+1} = c_m - eta_last sum_{s in m} nabla_s,
    y_t = W_o [o_t + ln_w ⊙ LN(o_t) + ln_b]_heads,

with scale = D^-1/2 and the fast weights starting at zero (fla's default initial state).

(A, B) form (token view, B = 0) over the pseudo-values X = nabla [B, T, H, D]:

    A[t,s] = -e[t,s] (scale q_t·k_s + 1) (s <= t),  e[t,s] = eta_t in t's own mini-batch, else the
    closing eta of s's mini-batch;  O = A nabla + scale Q W_0 + c_0.

It is not a linear operator over v: the "solve" is the nonlinear block forward substitution that
produces nabla (mini-batch m's nabla is a LayerNorm backward at W_m, which sums all earlier nabla).
``materialize`` returns this A (zero initial state); the post-norm is pointwise, outside A.

Decode state (``TTTState``): the fast weight W [D, D] and bias c [D] per head; with mini_batch_size > 1
also the open mini-batch's gradient sums G [D, D], gb [D] (its tokens all read W, c, so they cannot be
folded into W before it closes). O(1) in n: H (D² + D), doubled when mini_batch_size > 1.

Modes: ``chunked`` (fla's dual form, one mini-batch at a time: O(T (b D + D²))), ``dense`` (the token
view through core.operator.solve_dense), ``recurrent`` (primal form, token by token). Left padding by
row groups: the mini-batch boundaries follow each row's own clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tokenmix.core.operator import MixOperator
from tokenmix.mixers.base import Linear, Mixer, MixerConfig, MixerState
from tokenmix.mixers.registry import register_mixer
from tokenmix.ops.ttt_linear import (
    TTTWeights,
    chunked_ttt_linear,
    dense_ttt_linear,
    post_norm,
    recurrent_ttt_linear,
    ttt_operator,
)


@dataclass(frozen=True)
class TTTLinearConfig(MixerConfig):
    mini_batch_size: int = 16  # b: tokens per inner gradient step (fla's default)
    base_lr: float = 1.0  # eta_base of eta_t = eta_base sigmoid(.) / D
    eps: float = 1e-6  # LayerNorm epsilon (inner loss and post-norm), fla's default

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_positive("mini_batch_size", "base_lr", "eps")


class TTTState(MixerState):
    """Fast weights ``W`` [B, H, D, D], ``c`` [B, H, D]; with mini_batch_size > 1 also the open
    mini-batch's gradient sums ``G`` [B, H, D, D], ``gb`` [B, H, D] (zero at a mini-batch boundary)."""

    def __init__(self, owner: str, batch_size: int, position: int, weights: TTTWeights) -> None:
        self.owner, self.batch_size, self.position, self.weights = owner, batch_size, position, weights

    def tensors(self) -> dict[str, Tensor]:
        return {name: t for name, t in self.weights._asdict().items() if t is not None}


@register_mixer(
    "ttt_linear",
    TTTLinearConfig,
    family="test-time training",
    ab_form="B = 0 over the pseudo-values nabla: A[t,s] = -e[t,s] (scale q_t·k_s + 1); "
    "nabla from the nonlinear mini-batch inner loop",
)
class TTTLinear(Mixer):
    modes = ("chunked", "dense", "recurrent")
    time_complexity = "O(1)"  # per token: O(H D²) on the fast weights, independent of n
    cache_complexity = "O(1)"  # W, c (and the open mini-batch's sums) per head
    pads_by_row_groups = True  # mini-batches are aligned to each row's own clock t - start
    test_overrides = {"mini_batch_size": 4}

    def __init__(self, config: TTTLinearConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        h, d = self.n_heads, self.head_dim
        self.qkv = Linear(d_model, 3 * h * d, bias=False)
        self.eta_proj = Linear(d_model, h)
        self.ln_w = nn.Parameter(torch.ones(h, d))
        self.ln_b = nn.Parameter(torch.zeros(h, d))
        self.out = Linear(h * d, d_model, bias=False)
        self.scale = d**-0.5

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q, k, v [B, T, H, D], eta [B, T, H]."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        eta = self.config.base_lr * torch.sigmoid(self.eta_proj(x)) / self.head_dim
        return q, k, v, eta

    def _run(self, fn, x: Tensor, state: TTTState | None) -> tuple[Tensor, TTTState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        q, k, v, eta = self._project(x)
        cfg = self.config
        o, weights = fn(
            q, k, v, eta, self.ln_w, self.ln_b, self.scale, cfg.eps, cfg.mini_batch_size, state.weights, state.position
        )
        y = self.out(post_norm(o, self.ln_w, self.ln_b, cfg.eps).flatten(2))
        return y, TTTState(self.owner, b, state.position + t, weights).carry_over(state)

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: TTTState | None) -> tuple[Tensor, TTTState]:
        return self._run(chunked_ttt_linear, x, state)

    def forward_dense(self, x: Tensor, state: TTTState | None) -> tuple[Tensor, TTTState]:
        return self._run(dense_ttt_linear, x, state)

    def forward_recurrent(self, x: Tensor, state: TTTState | None) -> tuple[Tensor, TTTState]:
        b, t, _ = x.shape
        state = self.empty_state(b, x.device, x.dtype) if state is None else state
        ys = []
        for i in range(t):  # observe before each token, as the other recurrent modes
            state.observe()
            y, state = self._run(recurrent_ttt_linear, x[:, i : i + 1], state)
            ys.append(y)
        return torch.cat(ys, 1), state

    # ---------------------------------------------------------------- surface
    def empty_state(
        self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> TTTState:
        h, d = self.n_heads, self.head_dim
        w = torch.zeros(batch_size, h, d, d, device=device, dtype=dtype)
        c = torch.zeros(batch_size, h, d, device=device, dtype=dtype)
        acc = (None, None) if self.config.mini_batch_size == 1 else (torch.zeros_like(w), torch.zeros_like(c))
        return TTTState(self.owner, batch_size, 0, TTTWeights(w, c, *acc))

    def materialize(self, x: Tensor) -> MixOperator:
        """A [B, H, T, T], B = 0 over the pseudo-values nabla of ``x`` [B, T, D] (zero initial weights)."""
        q, k, _, eta = self._project(x)
        return ttt_operator(q, k, eta, self.scale, self.config.mini_batch_size)

    def state_size(self, n: int) -> int:
        per = self.n_heads * (self.head_dim * self.head_dim + self.head_dim)  # W and c
        return per if self.config.mini_batch_size == 1 else 2 * per  # + G and gb

    def flops_per_token(self, n: int) -> int:
        # per head: z = k W (D²), the write kᵀ nabla (D²), the read q (W - eta G) (D², plus D² for
        # eta G when b > 1), the LayerNorm backward and post-norm O(D) (~8 D)
        d = self.head_dim
        return self.n_heads * ((3 if self.config.mini_batch_size == 1 else 4) * d * d + 8 * d)
