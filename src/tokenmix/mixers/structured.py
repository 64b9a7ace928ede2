"""The structured higher-order recurrence of the paper (any pattern of ``tokenmix.patterns``).

Per head, with q_t, k_t, v_t projections of the layer input:

    y_t = alpha_t v_t + sum_{j in N(t)} beta_{t,j} y_j,        out_t = W_o [y_t]_heads

(A, B) form: A = diag(alpha), B[t, j] = beta_{t,j} on the pattern N(t) (strictly lower).
Coefficients, normalised over {t} ∪ N(t) so every y_t is a convex (or L1-bounded) combination:
    softmax  -- softmax of the scores q_t . k_j / sqrt(K) (alpha from the self score q_t . k_t);
    gate_softmax / gate_l1 -- per-level gates from the input as in H-LRU: logits g_t in R^{L+1}
        (slot 0 = self, slot w+1 = level w), softmax, or tanh then L1 normalisation (signed).

Modes: ``chunked`` (training default: chunked sparse triangular solve, ops/pattern_solve.py),
``dense`` (materialise A, B and call the reference solver), ``recurrent`` (token by token with a
cache that evicts a position as soon as no later token reads it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.core.registry import register_mixer
from tokenmix.mixers.base import Mixer, MixerConfig
from tokenmix.mixers.pattern_cache import PatternCache
from tokenmix.ops.pattern_solve import chunked_pattern_solve
from tokenmix.patterns import Lattice, Pattern, TranslationInvariant, get_pattern

COEFFICIENTS = ("softmax", "gate_softmax", "gate_l1")
_GATHER_BLOCK_ELEMS = 1 << 22  # gathered neighbour keys per score block (bounds memory at O(T |N|) overall)


@dataclass(frozen=True)
class StructuredConfig(MixerConfig):
    pattern: str = "pow2"          # see tokenmix.patterns: pow2, sq1, dense, first_order, window:M, fenwick, f:EXPR
    cache_efficient: bool = False  # use the lattice variant (Prop. 4.12)
    coefficients: str = "softmax"  # softmax | gate_softmax | gate_l1
    max_levels: int = 32           # level slots of the gate-based coefficients
    chunk_size: int = 64           # C of the chunked solve

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coefficients not in COEFFICIENTS:
            raise ValueError(f"coefficients must be one of {COEFFICIENTS}, got '{self.coefficients}'")
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {self.chunk_size}")
        if self.max_levels <= 0:
            raise ValueError(f"max_levels must be > 0, got {self.max_levels}")
        get_pattern(self.pattern, self.cache_efficient)  # validate now, with a clear message


def _complexities(p: Pattern) -> tuple[str, str]:
    if isinstance(p, Lattice):
        base = p.base.name
        return {"pow2": ("O(log n)", "O(log n)"), "sq1": ("O(sqrt n)", "O(sqrt n)")}.get(base, ("O(f^-1(n))", "O(f^-1(n))"))
    if isinstance(p, TranslationInvariant):
        if p.max_levels is not None:
            return ("O(1)", "O(1)") if p.max_levels == 1 else ("O(m)", "O(m)")
        return {"pow2": ("O(log n)", "O(n)"), "sq1": ("O(sqrt n)", "O(n)"), "dense": ("O(n)", "O(n)")}.get(
            p.name, ("O(f^-1(n))", "O(n)"))
    return ("O(log n)", "O(log n)")


class StructuredRecurrence(Mixer):
    config_cls = StructuredConfig
    modes = ("chunked", "dense", "recurrent")

    def __init__(self, config: StructuredConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        self.pattern = get_pattern(config.pattern, config.cache_efficient)
        h, k = self.n_heads, self.head_dim
        self.qkv = nn.Linear(d_model, 3 * h * k, bias=False)
        self.out = nn.Linear(h * k, d_model, bias=False)
        self.gates = nn.Linear(d_model, h * (config.max_levels + 1)) if config.coefficients != "softmax" else None

    @property
    def time_complexity(self) -> str:  # type: ignore[override]
        return _complexities(self.pattern)[0]

    @property
    def cache_complexity(self) -> str:  # type: ignore[override]
        return _complexities(self.pattern)[1]

    # ---------------------------------------------------------------- shared pieces
    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        return q, k, v  # each [B, T, H, K]

    def _coefficients(self, x: Tensor, q: Tensor, k: Tensor, kbuf: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
        """alpha [B, T, H], beta [B, T, H, W] for the segment; idx [T, W] buffer positions (-1 none)."""
        valid = idx >= 0  # [T, W]
        b, t, h, _ = q.shape
        w = idx.shape[1]
        if self.gates is None:
            scale = 1.0 / math.sqrt(self.head_dim)
            s_self = (q * k).sum(-1) * scale  # [B, T, H]
            if 2 * w >= kbuf.shape[1]:
                # (nearly) every earlier position is a neighbour: one q @ k^T matmul is cheapest
                full = torch.einsum("bthk,bshk->bths", q, kbuf) * scale  # [B, T, H, P+T]
                s_nb = full.gather(-1, idx.clamp(min=0)[None, :, None, :].expand(b, t, h, w))
            else:
                # sparse patterns: gather only the neighbours' keys, in query blocks so that the
                # gathered [B, block, W, H, K] tensor stays bounded (never O(T^2))
                block = max(1, _GATHER_BLOCK_ELEMS // max(1, b * w * h * q.shape[-1]))
                # (index_select: its backward is one index_add, much cheaper than advanced indexing's)
                s_nb = torch.cat([torch.einsum("bthk,btwhk->bthw", q[:, s : s + block], kbuf.index_select(
                    1, idx[s : s + block].clamp(min=0).reshape(-1)).view(b, min(block, t - s), w, h, q.shape[-1]))
                                  for s in range(0, t, block)], 1) * scale
            logits = torch.cat([s_self[..., None], s_nb], -1)
            mode = "softmax"
        else:
            if w > self.config.max_levels:
                raise ValueError(f"pattern '{self.pattern.name}' needs {w} level slots at this length but "
                                 f"max_levels={self.config.max_levels}; raise max_levels")
            g = self.gates(x).view(b, t, h, self.config.max_levels + 1)
            logits = g[..., : w + 1]
            mode = "softmax" if self.config.coefficients == "gate_softmax" else "l1"
        mask = torch.cat([valid.new_ones(valid.shape[0], 1), valid], 1)[None, :, None, :]  # [1, T, 1, W+1]
        if mode == "softmax":
            coef = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
        else:
            gt = torch.tanh(logits) * mask
            coef = gt / (gt.abs().sum(-1, keepdim=True) + 1e-6)
        return coef[..., 0], coef[..., 1:] * valid[None, :, None, :]

    def _segment(self, x: Tensor, state: PatternCache | None):
        """Everything the modes share for a segment: projections, buffer indices, coefficients."""
        b, t, _ = x.shape
        q, k, v = self._project(x)
        if state is None:
            state = self.init_state(b, x.device, x.dtype)
        t0 = state.position
        p = state.cached_positions()
        tab = self.pattern.neighbor_table(t0, t0 + t).to(x.device)  # absolute positions
        in_seg = tab >= t0
        idx = torch.where(in_seg, tab - t0 + p, state.slots(torch.where(in_seg, torch.full_like(tab, -1), tab)))
        kbuf = torch.cat([state.keys, k], 1)
        alpha, beta = self._coefficients(x, q, k, kbuf, idx)
        return state, q, k, v, idx, alpha, beta

    def _finish(self, state: PatternCache, k: Tensor, y: Tensor, t: int) -> tuple[Tensor, PatternCache]:
        t0 = state.position
        all_pos = torch.cat([state.positions, torch.arange(t0, t0 + t)])
        new = state.select(self.pattern.needed(t0 + t), torch.cat([state.keys, k], 1),
                           torch.cat([state.values, y], 1), all_pos, t0 + t)
        return self.out(y.flatten(2)), new

    # ---------------------------------------------------------------- modes
    def forward_chunked(self, x: Tensor, state: PatternCache | None):
        state, q, k, v, idx, alpha, beta = self._segment(x, state)
        y = chunked_pattern_solve(alpha, beta, idx, v, state.values, self.config.chunk_size)
        return self._finish(state, k, y, x.shape[1])

    def forward_dense(self, x: Tensor, state: PatternCache | None):
        state, q, k, v, idx, alpha, beta = self._segment(x, state)
        b, t, h, _ = v.shape
        p = state.cached_positions()
        mix_a, mix_b = self._dense_ab(alpha, beta, idx, p)
        # positions read from the cache enter as a known right-hand side (the initial state)
        from_cache = (idx >= 0) & (idx < p)
        offset = torch.einsum("bthw,btwhv->bthv", beta * from_cache[None, :, None, :],
                              state.values[:, idx.clamp(min=0).clamp(max=max(p - 1, 0))]) if p else None
        y = solve_dense(MixOperator(mix_a, mix_b), v, offset=offset)
        return self._finish(state, k, y, t)

    def _dense_ab(self, alpha: Tensor, beta: Tensor, idx: Tensor, p: int) -> tuple[Tensor, Tensor]:
        b, t, h = alpha.shape
        inside = idx >= p
        col = torch.where(inside, idx - p, torch.zeros_like(idx))  # [T, W]
        mix_b = alpha.new_zeros(b, h, t, t).scatter_add(
            -1, col[None, None].expand(b, h, t, idx.shape[1]), (beta * inside[None, :, None, :]).transpose(1, 2))
        mix_a = torch.diag_embed(alpha.transpose(1, 2))
        return mix_a, mix_b

    def forward_recurrent(self, x: Tensor, state: PatternCache | None):
        """Token-by-token reference: read N(t) from the cache, write y_t, evict what no later token reads."""
        b, t, _ = x.shape
        if state is None:
            state = self.init_state(b, x.device, x.dtype)
        q, k, v = self._project(x)
        ys = []
        for s in range(t):
            state.observe()
            pos = state.position
            nb = torch.as_tensor(self.pattern.neighbor_table(pos, pos + 1)[0], device=x.device)
            slot = state.slots(nb)  # [W], -1 = none
            kbuf = torch.cat([state.keys, k[:, s : s + 1]], 1)
            alpha, beta = self._coefficients(x[:, s : s + 1], q[:, s : s + 1], k[:, s : s + 1], kbuf, slot[None])
            y_nb = state.values[:, slot.clamp(min=0)] if len(state.positions) else v.new_zeros(b, len(slot), *v.shape[2:])
            y_t = alpha[:, 0, :, None] * v[:, s] + torch.einsum("bhw,bwhv->bhv", beta[:, 0], y_nb)
            ys.append(y_t)
            keys_all = torch.cat([state.keys, k[:, s : s + 1]], 1)
            vals_all = torch.cat([state.values, y_t[:, None]], 1)
            all_pos = torch.cat([state.positions, torch.tensor([pos])])
            keep = self.pattern.needed(pos + 1)
            state = state.select(keep, keys_all, vals_all, all_pos, pos + 1)
        return self.out(torch.stack(ys, 1).flatten(2)), state

    # ---------------------------------------------------------------- surface
    def init_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> PatternCache:
        h, k = self.n_heads, self.head_dim
        return PatternCache(self.owner, batch_size, 0, torch.zeros(0, dtype=torch.long),
                            torch.zeros(batch_size, 0, h, k, device=device, dtype=dtype),
                            torch.zeros(batch_size, 0, h, k, device=device, dtype=dtype))

    def materialize(self, x: Tensor) -> MixOperator:
        state, q, k, v, idx, alpha, beta = self._segment(x, None)
        return MixOperator(*self._dense_ab(alpha, beta, idx, 0))

    def values(self, x: Tensor) -> Tensor:
        """The inputs X the operator mixes: v [B, T, H, K]."""
        return self._project(x)[2]

    def cache_positions(self, n: int) -> int:
        return self.pattern.cache_size(n)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.n_heads * 2 * self.head_dim  # a key and an output per position

    def flops_per_token(self, n: int) -> int:
        w = self.pattern.neighbors_per_token(n)
        return self.n_heads * (w + 1) * 2 * self.head_dim  # scores + weighted sum


_AB = "A = diag(alpha), B on the pattern (softmax over {t} ∪ N(t))"
for _name, _kw in {
    "pow2": dict(pattern="pow2"),
    "sq1": dict(pattern="sq1"),
    "pow2_ce": dict(pattern="pow2", cache_efficient=True),
    "sq1_ce": dict(pattern="sq1", cache_efficient=True),
    "kth_order": dict(pattern="window:4"),
    "dense_recurrence": dict(pattern="dense"),
    "first_order": dict(pattern="first_order"),
}.items():
    register_mixer(_name, StructuredConfig, family="structured recurrence", ab_form=_AB, **_kw)(StructuredRecurrence)
