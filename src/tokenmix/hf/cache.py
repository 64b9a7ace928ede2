"""``TokenmixCache``: tokenmix's per-layer decode states behind transformers' ``Cache`` interface.

A tokenmix model decodes through one ``MixerState`` per layer, each the mixer's own cache: a KV
cache for attention, the bounded pattern cache of the structured mixers (pow2_ce, sq1_ce), a
fixed-size recurrent state for mamba2 / gla / deltanet, row groups for left-padded batches... Their
sizes and layouts differ by mixer, so they cannot be the key/value tensors of transformers' cache
layers. This cache therefore holds the list of states as tokenmix made it (``states``) and the
number of token columns the model has consumed (``seen``, padding included: the length of the
``input_ids`` seen so far, which is what ``generate()`` compares with the prompt to slice off the
prefix). The model reads and replaces the states; nothing in transformers touches them.

What ``generate()`` (transformers 5.25, greedy and sampling) uses, and how this class answers:
    get_seq_length()          -> ``seen``: in ``_prefill`` a returned cache continues after its prefix
    is_compileable            -> False: no static cache, no auto-compile, no 4-D mask preparation
    is_croppable              -> False: no deferred stop check that would need a rollback
    crop / reorder_cache / batch_repeat_interleave / batch_select_indices
                              -> refused with ``InputError`` (assisted decoding, beam and contrastive
                                 search): a mixer state has no generic rollback or batch reordering,
                                 and a silent no-op would decode from the wrong state
The prefix is never re-run: ``prepare_inputs_for_generation`` keeps only the last token of each row
once the cache is filled, and the model steps every layer's state on it (``TokenmixForCausalLM``).

Created empty by the model at the prefill (``use_cache``), or by the caller (``TokenmixCache()``,
passed as ``cache=``) to keep it after ``generate`` returns.
"""

from __future__ import annotations

from transformers.cache_utils import Cache

from tokenmix.core.errors import InputError
from tokenmix.mixers.base import MixerState


class TokenmixCache(Cache):
    """Per-layer tokenmix decode states + the count of token columns consumed.

    Attributes:
        states: one ``MixerState`` per layer (None before the prefill).
        seen: token columns consumed so far, left padding included.
    """

    def __init__(self, states: list[MixerState] | None = None, seen: int = 0) -> None:
        # transformers' own layer list stays empty: the states below are the cache
        super().__init__(layers=[])
        self.states = states
        self.seen = seen

    def __repr__(self) -> str:
        return f"TokenmixCache(layers={len(self)}, seen={self.seen})"

    def __len__(self) -> int:
        return 0 if self.states is None else len(self.states)

    def advance(self, states: list[MixerState], new_tokens: int) -> None:
        """Take the states a forward returned after consuming ``new_tokens`` more columns."""
        self.states = states
        self.seen += new_tokens

    # ------------------------------------------------------------------ what generate() reads
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # no fixed maximum (a mixer's own bound, e.g. learned positions, is checked by the model)

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.states is not None

    @property
    def batch_size(self) -> int:
        return -1 if not self.states else self.states[0].batch_size

    def reset(self) -> None:
        self.states, self.seen = None, 0

    # --------------------------------------------------------- what a tokenmix state cannot do
    def update(self, *args, **kwargs):
        raise InputError("TokenmixCache holds tokenmix mixer states; key/value updates do not apply to it")

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise InputError(
                "TokenmixCache cannot drop tokens (assisted / speculative decoding): tokenmix mixer "
                "states have no rollback"
            )

    def _no_reordering(self, what: str):
        raise InputError(
            f"TokenmixCache cannot {what} (beam, contrastive or group search): tokenmix mixer states "
            "have no generic batch reordering; use greedy or sampled decoding with num_beams=1"
        )

    def reorder_cache(self, beam_idx) -> None:
        self._no_reordering("reorder its rows")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._no_reordering("repeat its rows")

    def batch_select_indices(self, indices) -> None:
        self._no_reordering("select rows")

    def early_initialization(self, *args, **kwargs) -> None:
        raise InputError("TokenmixCache is filled by the model's first forward; it has no static layout to initialize")
