"""The one generic model: embedding (+ optional position embedding) -> L blocks
[norm -> mixer -> residual (-> norm -> MLP -> residual)] -> norm -> head. Any registered mixer per
layer, so hybrids are a layer list such as ``"pow2,pow2,attention,pow2"``.

Positions: mixers with B = 0 (attention) see their inputs as a set, and even pattern recurrences
only know *relative* order through their fixed offsets, so tasks such as copy at a fixed offset
need position information in the input. ``positions`` adds it at the embedding (the same for every
mixer, so comparisons stay fair): ``none``, ``learned`` (absolute, up to ``max_seq_len``) or
``sinusoidal`` (fixed, any length). Decoding continues at the position held by the layer states.

Left-padded batches (prompts of different lengths in one batch): ``init_states(B, start=start)``
with start[b] the number of padding tokens in front of row b gives states that make every layer
ignore the padding (mixers/base.py); position codes then count from each row's first real token
(t - start[b]; padding positions get code 0). Every real logit, and the decode after the prompt,
equals that row run alone::

    ids, start = left_pad(prompts, pad_id=0)                  # [B, T], [B]
    states = model.init_states(len(prompts), start=start)
    logits, states = model(ids, states)                       # prefill: logits[:, -1] is each row's next-token
    next_logits, states = model.step(next_ids, states)        # decode, one token per row

Decode without autograd: every linear layer (mixers' included) multiplies its few rows by a kept
transposed copy of its weight (``Linear``) and the norms run written out (``RMSNorm``): at batch 1
a step is matrix-vector products and per-op overhead, and both are cheaper so; same numbers up to
rounding (bitwise, for the norms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing, as_packing
from tokenmix.mixers.base import check_reset, padding_start
from tokenmix.mixers.linear import Linear
from tokenmix.mixers.registry import build_mixer, get_mixer_spec
from tokenmix.mixers.state import MixerState


def parse_layers(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"pow2,pow2,attention"`` or ``["pow2", ...]`` -> validated tuple of registered mixer names.

    ``"pow2*3,attention"`` repeats a name.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in items:
        name = raw.strip()
        reps = 1
        if "*" in name:
            name, _, r = name.partition("*")
            if not r.strip().isdigit() or int(r) < 1:
                raise InputError(f"invalid layer repeat '{raw}' (use NAME*COUNT with COUNT >= 1)")
            reps = int(r)
        if not name:
            raise InputError(f"empty mixer name in layer pattern {spec!r}")
        get_mixer_spec(name.strip())  # raises with the list of known mixers
        out += [name.strip()] * reps
    if not out:
        raise InputError("layer pattern is empty")
    return tuple(out)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    d_model: int = 128
    layers: tuple[str, ...] = ("pow2", "pow2")
    n_heads: int = 4
    mlp: bool = True
    mlp_ratio: int = 4
    tie_weights: bool = True
    dropout: float = 0.0  # residual dropout (embedding, each mixer and MLP output); train mode only
    positions: str = "none"  # none | learned | sinusoidal  (added to the token embedding)
    max_seq_len: int = 4096  # longest sequence with learned positions
    mixer_overrides: dict[str, dict] = field(default_factory=dict)  # mixer name -> config fields

    def __post_init__(self) -> None:
        for name, val in (
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("mlp_ratio", self.mlp_ratio),
        ):
            if val <= 0:
                raise InputError(f"model config: {name} must be > 0, got {val}")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"model config: dropout must be in [0, 1), got {self.dropout}")
        if self.positions not in POSITIONS:
            raise InputError(f"model config: positions must be one of {POSITIONS}, got '{self.positions}'")
        object.__setattr__(self, "layers", parse_layers(self.layers))


POSITIONS = ("none", "learned", "sinusoidal")


def sinusoidal_codes(pos: Tensor, d: int, dtype=torch.float32) -> Tensor:
    """Fixed sin/cos position codes (Vaswani et al. 2017) of integer positions pos [...]: [..., d]."""
    pos = pos.to(torch.float64)[..., None]
    freq = torch.exp(torch.arange(0, d, 2, device=pos.device, dtype=torch.float64) * (-math.log(10_000.0) / d))
    out = pos.new_zeros(*pos.shape[:-1], d)
    out[..., 0::2] = torch.sin(pos * freq)
    out[..., 1::2] = torch.cos(pos * freq[: d // 2])
    return out.to(dtype)


def sinusoidal_positions(start: int, length: int, d: int, device=None, dtype=torch.float32) -> Tensor:
    """Sinusoidal codes for positions start..start+length-1: [length, d]."""
    return sinusoidal_codes(torch.arange(start, start + length, device=device), d, dtype)


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int = 0, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Token id lists of any lengths -> (ids [B, T] left-padded with ``pad_id``, start [B] long).

    start[b] = T - len(sequences[b]), the padding in front of row b: what ``MixerModel.init_states``
    takes. The padding id's value never reaches a real logit.
    """
    if not sequences:
        raise InputError("left_pad: no sequences")
    t = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), t), pad_id, dtype=torch.long)
    for b, s in enumerate(sequences):
        if len(s):
            ids[b, t - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
    start = torch.tensor([t - len(s) for s in sequences], dtype=torch.long)
    return ids.to(device), start.to(device)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` over the last dimension; without autograd, the same arithmetic written out.

    On CPU, torch's rms_norm is a composite of the same ops (x² mean, + eps, rsqrt, two products)
    plus dtype round trips and checks, about twice as many dispatches: at batch 1 (a decode step)
    the dispatches are the cost. Bitwise equal to ``nn.RMSNorm`` (tests/mixers/test_decode_strategies.py);
    with autograd the torch op runs, so training is unchanged.
    """

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or self.weight is None or len(self.normalized_shape) != 1:
            return super().forward(x)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        # in place on the fresh [..., 1] intermediate: no allocation, the same values
        return x * x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_() * self.weight


class MLP(nn.Module):
    def __init__(self, d: int, ratio: int) -> None:
        super().__init__()
        self.up = Linear(d, ratio * d, bias=False)
        self.down = Linear(ratio * d, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, name: str) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model)
        overrides = {"n_heads": cfg.n_heads, **cfg.mixer_overrides.get(name, {})}
        self.mixer = build_mixer(name, cfg.d_model, **overrides)
        self.norm2 = RMSNorm(cfg.d_model) if cfg.mlp else None
        self.mlp = MLP(cfg.d_model, cfg.mlp_ratio) if cfg.mlp else None
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else None

    def forward(
        self, x: Tensor, state: MixerState | None, mode: str | None, packing: Packing | None = None
    ) -> tuple[Tensor, MixerState]:
        y, state = self.mixer(self.norm1(x), state, mode, packing)
        x = x + self._dropped(y)
        if self.mlp is not None:
            x = x + self._dropped(self.mlp(self.norm2(x)))
        return x, state

    def _dropped(self, y: Tensor) -> Tensor:
        return y if self.drop is None else self.drop(y)


class MixerModel(nn.Module):
    """Token ids [B, T] -> logits [B, T, vocab]; per-layer decode states for generation."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else None
        self.blocks = nn.ModuleList(Block(cfg, name) for name in cfg.layers)
        self.norm = RMSNorm(cfg.d_model)
        self.head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        # GPT-2 style: scale the projections that write into the residual stream by depth
        for name, p in self.named_parameters():
            if name.endswith(("out.weight", "down.weight", "o_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * len(cfg.layers)))
        if cfg.tie_weights:
            self.head.weight = self.embed.weight

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def init_states(
        self,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        start: Tensor | Sequence[int] | None = None,
    ) -> list[MixerState]:
        """One empty decode state per layer (device and dtype default to the model's parameters).

        Args:
            start: [B] integers, the leading padding tokens of each row of a left-padded batch
                (``left_pad``); None or all zeros = no padding. The first forward with these states
                (the prefill) must contain every row's whole padding.
        """
        p = next(self.parameters())
        device = p.device if device is None else device
        dtype = p.dtype if dtype is None else dtype
        start = padding_start(start, batch_size, device)  # validated once, with the message naming it
        return [block.mixer.init_state(batch_size, device, dtype, start) for block in self.blocks]

    def forward(
        self,
        idx: Tensor,
        states: list[MixerState] | None = None,
        mode: str | None = None,
        packing: Packing | Tensor | None = None,
    ) -> tuple[Tensor, list[MixerState]]:
        """Token ids [B, T] -> (logits [B, T, vocab], the layers' states after the segment).

        ``packing``: document boundaries inside the rows (``core/packing.py``): every layer runs each
        document as if alone (the first continuing ``states``), and positions restart at each document.
        """
        h, states = self.features(idx, states, mode, packing)
        return self.head(h), states

    def features(
        self,
        idx: Tensor,
        states: list[MixerState] | None = None,
        mode: str | None = None,
        packing: Packing | Tensor | None = None,
    ) -> tuple[Tensor, list[MixerState]]:
        """Token ids [B, T] -> (the normed last hidden states [B, T, D] that ``head`` maps to logits, states).

        For losses that read a few positions only (a synthetic task's answers): ``head(h[mask])``
        gives exactly those positions' logits without the [B, T, vocab] tensor, which at a vocabulary
        of 8192 would cost more than the whole model on CPU.
        """
        if idx.dim() != 2:
            raise InputError(f"expected token ids [B, T], got {tuple(idx.shape)}")
        lo, hi = torch.aminmax(idx) if idx.numel() else (0, 0)  # one reduction: a decode step pays this per token
        if int(lo) < 0 or int(hi) >= self.cfg.vocab_size:
            raise InputError(f"token id out of range [0, {self.cfg.vocab_size})")
        states = states if states is not None else [None] * len(self.blocks)
        if len(states) != len(self.blocks):
            raise InputError(f"got {len(states)} layer states for {len(self.blocks)} layers")
        packing = as_packing(packing, idx.shape[0], idx.shape[1], idx.device)
        x = self.embed(idx)
        if self.cfg.positions != "none":
            x = x + self._position_codes(states, idx.shape[1], x, packing)
        if self.drop is not None:
            x = self.drop(x)
        new_states = []
        for block, st in zip(self.blocks, states):
            x, st = block(x, st, mode, packing)
            new_states.append(st)
        return self.norm(x), new_states

    def _position_codes(
        self, states: list[MixerState | None], t: int, x: Tensor, packing: Packing | None = None
    ) -> Tensor:
        """[T, D] codes of the segment's positions, continuing after what the states have seen;
        [B, T, D] for a left-padded or packed batch, whose rows count from their own first real token
        and restart at each document."""
        state = next((s for s in states if s is not None), None)
        first = 0 if state is None else state.position
        pos = torch.arange(first, first + t, device=x.device)  # [T]
        padded = state is not None and state.start is not None
        if packing is not None:
            pos = (pos[None, :] - packing.begins(first, state.start if padded else None)).clamp(min=0)
        elif padded:
            pos = (pos[None, :] - state.start[:, None]).clamp(min=0)  # [B, T], padding at 0
        if self.pos_embed is None:
            return sinusoidal_codes(pos, self.cfg.d_model, x.dtype)
        if packing is not None:
            last = int(pos.max()) + 1
        else:
            last = first + t - (state.min_start if padded else 0)  # one past the largest position coded
        if last > self.cfg.max_seq_len:
            raise InputError(
                f"sequence reaches position {last} but the model's learned positions stop at "
                f"max_seq_len={self.cfg.max_seq_len}"
            )
        return self.pos_embed(pos)

    def step(
        self, idx_t: Tensor, states: list[MixerState] | None, reset: Tensor | None = None
    ) -> tuple[Tensor, list[MixerState]]:
        """Decode one token per sequence: idx_t [B] -> logits [B, vocab]; ``reset`` [B] bool: rows
        whose token begins a new document (every layer's state restarts fresh there)."""
        if reset is not None:
            states = self.reset_states(states, reset)
        logits, states = self.forward(idx_t.unsqueeze(1), states, mode="recurrent")
        return logits.squeeze(1), states

    def reset_states(self, states: list[MixerState] | None, reset: Tensor) -> list[MixerState] | None:
        """The layers' states in which rows ``reset`` ([B] bool) begin a new document: every layer's
        state restarts fresh in those rows (``Mixer.reset_rows``)."""
        if states is None:
            return None
        batch = next((s.batch_size for s in states if s is not None), len(reset))
        rows = check_reset(reset, batch, next(self.parameters()).device)
        return [block.mixer.reset_rows(st, rows) for block, st in zip(self.blocks, states)]

    def num_params(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            n -= self.embed.weight.numel() + (self.pos_embed.weight.numel() if self.pos_embed is not None else 0)
        return n
