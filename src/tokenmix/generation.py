"""Text generation through each mixer's own decode cache.

1. Prefill: the prompt goes through the model once in every mixer's default (fast) mode, which
   returns the per-layer decode states (KV cache, pattern cache, SSM state, ...).
2. Decode: one token at a time with ``model.step`` on those states; each mixer's cache stays as
   large as its own accounting says (``cache_positions`` / ``state_size``), not O(n) for all.

Batches of prompts of different lengths run as one left-padded batch: ``left_pad`` puts each
prompt at the end of a [B, T] row and ``model.init_states(B, start=start)`` tells every layer how
many leading positions of each row are padding. Every mixer then ignores them exactly (no key,
state write or pattern neighbour comes from a pad; position-dependent patterns and position codes
count from each row's first real token, see mixers/base.py), so each row's logits equal that prompt
run alone, and the decode steps the whole batch together.

Sampling is per sequence: row i of a request uses its own generator seeded with ``seed + i``, so a
prompt's continuation does not depend on which other prompts it was batched with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tokenmix.core.errors import InputError
from tokenmix.core.seeds import check_seed
from tokenmix.mixers.base import MixerState
from tokenmix.models import left_pad


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 200
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 0  # keep the k most likely tokens; 0 = all
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches p
    seed: int = 0
    stop_token: int | None = None  # end a sequence when it samples this token (kept in the output)

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "top_k", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise InputError(f"{name} must be an integer, got {v!r}")
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise InputError(f"{name} must be a finite number, got {v!r}")
        if self.max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        check_seed(self.seed, "seed")  # row i draws with seed + i: a 64-bit generator seed


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set to -inf every logit outside top-k and outside the top-p nucleus. logits: [B, V]."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the first always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: Tensor, cfg: SamplingConfig, generators: list[torch.Generator]) -> Tensor:
    """Next token per row: logits [B, V] -> ids [B] (row i draws from ``generators[i]``)."""
    if cfg.temperature == 0:
        return logits.argmax(-1)
    # the largest logit is moved to 0 before dividing: a tiny temperature then sends the others to
    # -inf (the greedy limit) instead of overflowing every logit to inf (and the softmax to NaN)
    logits32 = logits.float()
    scaled = (logits32 - logits32.amax(-1, keepdim=True)) / cfg.temperature
    probs = torch.softmax(filter_logits(scaled, cfg.top_k, cfg.top_p), dim=-1)
    probs = probs.cpu()
    return torch.stack([torch.multinomial(probs[i], 1, generator=generators[i])[0] for i in range(probs.shape[0])]).to(
        logits.device
    )


def position_limit(model) -> int | None:
    """Longest sequence (prompt + continuation) the model can place, or None when unbounded.

    Learned absolute positions end at ``max_seq_len``; sinusoidal codes and position-free models go on.
    """
    cfg = getattr(model, "cfg", None)
    if cfg is not None and getattr(cfg, "positions", "none") == "learned":
        return int(cfg.max_seq_len)
    return None


def check_fits(model, prompt_len: int, max_new_tokens: int) -> None:
    """Refuse, before any work, a request that would run past the model's learned positions."""
    limit = position_limit(model)
    if limit is not None and prompt_len + max_new_tokens > limit:
        raise InputError(
            f"prompt of {prompt_len} tokens + {max_new_tokens} new tokens exceeds this model's learned "
            f"positions (max_seq_len={limit}); shorten the prompt or ask for fewer tokens"
        )


@torch.no_grad()
def prefill(model, ids: Tensor, states: list[MixerState] | None = None) -> tuple[Tensor, list[MixerState]]:
    """Run the prompt ids [B, T] in each mixer's default mode (on ``states``, e.g. those of a
    left-padded batch); returns (logits [B, T, V], states)."""
    return model(ids, states)


def generate_batch(
    model,
    prompt: Tensor,
    cfg: SamplingConfig,
    seeds: list[int] | None = None,
    on_token: Callable[[int, int], None] | None = None,
    start: Tensor | None = None,
) -> Tensor:
    """Continue prompts [B, T] (T >= 1) by up to ``cfg.max_new_tokens`` tokens.

    ``start`` [B]: leading padding tokens of each row of a left-padded batch (``left_pad``); None
    when every row is a whole prompt. Returns the new ids [B, n] (n <= max_new_tokens; rows that
    hit ``stop_token`` are padded with it). ``on_token(row, token_id)`` is called as each token is
    chosen (streaming).
    """
    # inference mode (no version counters or autograd bookkeeping: a decode step is mostly such
    # per-op overhead at small batch); the ids are cloned out of it, as inference tensors refuse
    # in-place use outside inference mode
    with torch.inference_mode():
        new = _generate_batch(model, prompt, cfg, seeds, on_token, start)
    return new.clone()


def _generate_batch(
    model,
    prompt: Tensor,
    cfg: SamplingConfig,
    seeds: list[int] | None,
    on_token: Callable[[int, int], None] | None,
    start: Tensor | None,
) -> Tensor:
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise InputError(f"prompt ids must be [B, T] with T >= 1, got {tuple(prompt.shape)}")
    b = prompt.shape[0]
    check_fits(model, prompt.shape[1], cfg.max_new_tokens)
    seeds = seeds if seeds is not None else [cfg.seed + i for i in range(b)]
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    out: list[Tensor] = []
    if cfg.max_new_tokens == 0:
        return prompt.new_zeros(b, 0)
    states = model.init_states(b, start=start) if start is not None else None
    logits, states = prefill(model, prompt, states)
    next_logits = logits[:, -1]
    done = torch.zeros(b, dtype=torch.bool, device=prompt.device)
    for i in range(cfg.max_new_tokens):
        tok = sample_next(next_logits, cfg, generators)
        if cfg.stop_token is not None:
            tok = torch.where(done, torch.full_like(tok, cfg.stop_token), tok)
        out.append(tok)
        if on_token is not None:
            for row in range(b):
                if not bool(done[row]):
                    on_token(row, int(tok[row]))
        if cfg.stop_token is not None:
            done |= tok == cfg.stop_token
            if bool(done.all()):
                break
        if i + 1 < cfg.max_new_tokens:
            next_logits, states = model.step(tok, states)
    return torch.stack(out, 1)


def generate(
    model,
    prompts: list[list[int]],
    cfg: SamplingConfig,
    device: torch.device | str = "cpu",
    on_token: Callable[[int, int], None] | None = None,
) -> list[list[int]]:
    """Continue prompts of any lengths as one left-padded batch; each equals its prompt run alone.

    Prompt i samples with seed ``cfg.seed + i``. ``on_token(i, id)`` streams tokens with the index
    of the prompt they belong to.
    """
    if not prompts:
        return []
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise InputError(f"prompt {i} is empty; give at least one token")
        check_fits(model, len(p), cfg.max_new_tokens)
    ids, start = left_pad(prompts, pad_id=0, device=device)
    new = generate_batch(
        model,
        ids,
        cfg,
        seeds=[cfg.seed + i for i in range(len(prompts))],
        on_token=on_token,
        start=start if bool(start.any()) else None,
    )
    results = []
    for seq in new.tolist():
        if cfg.stop_token is not None and cfg.stop_token in seq:
            seq = seq[: seq.index(cfg.stop_token) + 1]
        results.append(seq)
    return results
