"""Hugging Face model classes around the one generic tokenmix model.

``TokenmixModel`` and ``TokenmixForCausalLM`` hold a ``MixerModel`` (as ``.net``, so weights are
``net.embed.weight``, ``net.blocks.0.mixer...``, ``net.head.weight``; ``model.net....`` in the
causal LM) and run it; there is no second implementation of any layer. What the wrappers add is the
Hugging Face calling convention:

    forward(input_ids [B, T], attention_mask [B, T'] | None, labels [B, T] | None, cache | None,
            use_cache, return_dict) -> CausalLMOutputWithPast(loss, logits [B, T, V], cache)

* Left padding. At the prefill (an empty cache), an ``attention_mask`` whose rows are zeros then
  ones gives ``start[b]`` = the number of leading zeros of row b, and the layer states come from
  ``MixerModel.init_states(B, start=start)``: every mixer then ignores the padding exactly (each
  row's logits are those of the row alone). Any other mask (a hole, right padding, an all-zero row,
  a value other than 0/1) is refused with one ``InputError`` line: a tokenmix state has no way to
  skip a position in the middle of a row. Later calls carry the mask transformers extends with
  ones; its length is checked, and its new columns when several come at once (a one-token step
  reads no mask value: no device sync per token).
* Packed sequences. ``position_ids`` that restart at 0 inside a row (transformers' convention for
  packing, as its data collators with flattening give) mark document starts: every document runs as
  if alone (``MixerModel.forward(..., packing=...)``), and a decode step at position 0 begins a new
  document in that row. Position ids that neither continue nor restart (a jump) are refused in one
  line. The loss of a packed batch: labels should be -100 at each document's first token.
* Decoding. The states live in a ``TokenmixCache`` (cache.py). A one-token call on a filled cache
  is ``MixerModel.step`` (recurrent mode), exactly what tokenmix's own ``generate`` runs, so
  ``model.generate`` gives tokenmix's tokens; a longer call continues in the default mode.
  ``generate()`` passes one token per row after the prefill: the prefix is never run again.
* Loss. ``labels`` follow the HF convention (labels = input ids, shifted here; -100 ignored) and
  the loss is the one tokenmix training computes: ``cross_entropy(logits.float(), next ids)``, the
  mean over the counted positions (or their sum / ``num_items_in_batch`` when the trainer passes it).
* Weights. ``MixerModel`` initialises itself (its own scheme: depth-scaled output projections,
  mixer-specific parameters such as ``A_log``), so ``_init_weights`` leaves modules alone, and the
  model is built on a real device, never on transformers' meta device: a mixer may make tensors at
  construction that are not parameters, and those would stay unallocated. ``from_pretrained`` then
  moves every weight that transformers hands over at an address that is not 64-byte aligned (its
  safetensors reads give such buffers) into fresh memory: MKL's kernels round differently on
  unaligned data (the same weights gave logits 2e-15 apart in float64), and a loaded model must
  compute exactly what ``tokenmix.runs.lm.load_run`` gives. A checkpoint that lacks a weight is
  refused (nothing would initialise it), and every weight has the one dtype the model is built
  in, as ``MixerModel(cfg).to(dtype)`` gives. Tying follows
  ``tie_word_embeddings`` (``ModelConfig.tie_weights``): the head shares the embedding and
  ``save_pretrained`` stores it once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast, ModelOutput

from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing
from tokenmix.hf.cache import TokenmixCache
from tokenmix.hf.configuration import TokenmixConfig
from tokenmix.mixers.base import MixerState
from tokenmix.models import MixerModel

IGNORE_INDEX = -100
ALIGNMENT = 64  # bytes: torch's CPU allocator aligns every tensor it allocates so


def left_padding(attention_mask: Tensor | None, batch: int, length: int) -> Tensor | None:
    """A prefill's ``attention_mask`` [B, T] -> start [B] long (leading zeros of each row), or None
    when no row is padded. Refuses (``InputError``) every mask that is not left padding."""
    if attention_mask is None:
        return None
    if tuple(attention_mask.shape) != (batch, length):
        raise InputError(
            f"attention_mask must have the shape of input_ids {(batch, length)} at the first call, "
            f"got {tuple(attention_mask.shape)}"
        )
    m = attention_mask
    if bool(((m != 0) & (m != 1)).any()):
        raise InputError("attention_mask must hold only 0 (padding) and 1 (token)")
    m = (m != 0).to(torch.int8)
    bad = (m[:, 1:] < m[:, :-1]).any(1)  # a 0 after a 1: a hole or right padding
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise InputError(
            f"attention_mask row {row} has a 0 after a 1: tokenmix models take left padding only "
            "(each row zeros, then ones; tokenizer.padding_side = 'left')"
        )
    start = length - m.sum(1, dtype=torch.long)
    if bool((start == length).any()):
        row = int(torch.nonzero(start == length)[0, 0])
        raise InputError(f"attention_mask row {row} is all zeros: every row needs at least one token")
    return start if bool(start.any()) else None


def _check_later_mask(attention_mask: Tensor | None, seen: int, batch: int, length: int) -> None:
    """A call on a filled cache: the mask spans what the cache saw plus the new columns, which are tokens."""
    if attention_mask is None:
        return
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, seen + length):
        raise InputError(
            f"attention_mask must cover the {seen} cached and {length} new columns "
            f"({(batch, seen + length)}), got {tuple(attention_mask.shape)}"
        )
    if length > 1 and not bool((attention_mask[:, seen:] == 1).all()):  # one token a step: no check, no sync
        raise InputError(
            "attention_mask: the columns after the cached prefix must all be 1 (padding goes only "
            "in front of the first call's tokens)"
        )


def document_starts(
    position_ids: Tensor | None, first: Tensor | int, batch: int, length: int, device: torch.device | str = "cpu"
) -> tuple[Tensor | None, Packing | None]:
    """transformers' packed-sequence convention -> tokenmix's: ``position_ids`` [B, T] that restart at 0
    where a document begins (and count up by one inside it) -> (rows whose first column begins a
    document [B] bool or None, the packing of the later columns or None).

    ``first`` [B] long (or one int for every row): the position each row's first column has when no
    document begins (the continuation of what the cache has seen; negative for left padding, whose
    columns are not read); ``device``: the batch's. Positions that simply continue (what ``generate``
    passes with every token) give (None, None) after one device sync."""
    if position_ids is None:
        return None, None
    first = torch.as_tensor(first, dtype=torch.long, device=device).expand(batch)
    pos = torch.as_tensor(position_ids)
    if pos.dim() == 1:
        pos = pos.expand(batch, -1)
    if tuple(pos.shape) != (batch, length) or pos.dtype not in (torch.int32, torch.int64):
        raise InputError(f"position_ids must be [batch, length] = {[batch, length]} integers, got {tuple(pos.shape)}")
    pos = pos.to(first.device).long()
    col = torch.arange(length, device=first.device)
    expected = first[:, None] + col  # [B, T]: the positions without a new document
    real = expected >= 0  # padding columns (at a padded prefill) are not read
    begins = real & (pos == 0) & (expected != 0)
    any_begins, any_jump = torch.stack([begins.any(), (real & (pos != expected)).any()]).tolist()  # one sync
    if not any_begins:
        if any_jump:
            raise InputError("position_ids must count up by one from each document's 0 (packed sequences)")
        return None, None
    first_real = real & ~F.pad(real[:, :-1], (1, 0))  # a row's first column read
    prev = torch.where(first_real, expected - 1, F.pad(pos[:, :-1], (1, 0)))  # the position before each column
    if bool((real & (pos != 0) & (pos != prev + 1)).any()):
        raise InputError("position_ids must count up by one from each document's 0 (packed sequences)")
    reset = begins[:, 0] if bool(begins[:, 0].any()) else None
    flags = begins.clone()
    flags[:, 0] = False
    return reset, (Packing.from_resets(flags) if bool(flags.any()) else None)


def run_mixer_model(
    net: MixerModel,
    input_ids: Tensor | None,
    attention_mask: Tensor | None,
    cache: TokenmixCache | None,
    use_cache: bool,
    head: bool = True,
    position_ids: Tensor | None = None,
) -> tuple[Tensor, TokenmixCache | None]:
    """The one forward both classes share: ids [B, T] -> (logits [B, T, V], or with ``head=False``
    the final-norm hidden states [B, T, D] (``MixerModel.features``); the cache holding the new states).

    An empty cache (or none) means a prefill: padding from the mask, states from ``init_states``
    (none at all for an unpadded batch, as tokenmix's ``generate`` does, so the arithmetic is the
    same). A filled cache means a continuation from its states: one token per row runs the
    recurrent step. ``position_ids`` that restart at 0 mark packed documents (``document_starts``):
    each runs as if alone, and a step whose position is 0 begins a new document in that row.

    Not in inference mode, though tokenmix's own loop is (docs/notes/design-measurements.md says what
    it saves): the logits and cache tensors go back to transformers, whose
    generation code and users update such tensors in place outside inference mode, which inference
    tensors refuse. ``generate`` runs it under ``no_grad``.
    """
    if input_ids is None:
        raise InputError("tokenmix models take input_ids (inputs_embeds is not supported)")
    if input_ids.dim() != 2:
        raise InputError(f"input_ids must be [batch, length], got {tuple(input_ids.shape)}")
    if cache is not None and not isinstance(cache, TokenmixCache):
        raise InputError(
            f"tokenmix models decode with a TokenmixCache (their mixers' own states), got {type(cache).__name__}"
        )
    b, t = input_ids.shape
    states: list[MixerState] | None
    device = input_ids.device
    if cache is None or cache.states is None:
        seen, mode = 0, None
        start = left_padding(attention_mask, b, t)
        states = net.init_states(b, start=start) if start is not None else None
        first = -start if start is not None else 0
    else:
        seen = cache.seen
        _check_later_mask(attention_mask, seen, b, t)
        states, mode = cache.states, ("recurrent" if t == 1 else None)
        state = next((s for s in states if s is not None), None)
        position = state.position if state is not None else 0
        first = position - (state.start if state is not None and state.start is not None else 0)
    reset, packing = document_starts(position_ids, first, b, t, device)
    if reset is not None:
        states = net.reset_states(states, reset)
    out, states = (net if head else net.features)(input_ids, states, mode, packing)
    if use_cache or cache is not None:
        cache = cache if cache is not None else TokenmixCache()
        cache.advance(states, t)
    return out, cache


def lm_loss(logits: Tensor, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """Next-token loss of logits [B, T, V] against labels [B, T] (the input ids, -100 where not counted):
    position t predicts labels[t + 1]. In float32, like tokenmix training."""
    if labels.shape != logits.shape[:2]:
        raise InputError(
            f"labels must have the shape of input_ids {tuple(logits.shape[:2])}, got {tuple(labels.shape)}"
        )
    pred = logits[:, :-1].float().flatten(0, 1)
    target = labels[:, 1:].to(logits.device).flatten()
    if num_items_in_batch is None:
        return F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX)
    return F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX, reduction="sum") / num_items_in_batch


def _refuse_unsupported(inputs_embeds, output_attentions, output_hidden_states) -> None:
    if inputs_embeds is not None:
        raise InputError("tokenmix models take input_ids (inputs_embeds is not supported)")
    if output_attentions:
        raise InputError("output_attentions is not available: most tokenmix mixers have no attention matrix")
    if output_hidden_states:
        raise InputError("output_hidden_states is not available; TokenmixModel gives the final hidden states")


class TokenmixPreTrainedModel(PreTrainedModel):
    """What both classes share: the config class, initialisation and loading policy (module docstring)."""

    config_class = TokenmixConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def _init_weights(self, module) -> None:
        """Nothing: ``MixerModel`` initialised every weight in its constructor, by its own scheme."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, output_loading_info: bool = False, **kwargs):
        """transformers' ``from_pretrained``; then a checkpoint that lacks a weight is refused
        (``_init_weights`` does nothing, so a missing weight would keep uninitialised memory), and
        every unaligned weight is copied to aligned memory (module docstring: Weights), into the same
        ``Parameter``, so ties stay."""
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        missing = sorted(info.get("missing_keys") or ())
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            raise InputError(f"'{pretrained_model_name_or_path}' lacks weights this tokenmix model needs: {shown}")
        with torch.no_grad():
            for p in model.parameters():
                if p.data_ptr() % ALIGNMENT:
                    p.data = p.data.clone()
        return (model, info) if output_loading_info else model

    def _run(
        self,
        net: MixerModel,
        input_ids: Tensor | None,
        attention_mask: Tensor | None,
        cache: TokenmixCache | None,
        use_cache: bool | None,
        position_ids: Tensor | None,
        head: bool = True,
    ) -> tuple[Tensor, TokenmixCache | None]:
        """``run_mixer_model`` with the config's ``use_cache`` default: (logits or hidden states, the
        cache to return, None unless ``use_cache``)."""
        use_cache = self.config.use_cache if use_cache is None else use_cache
        out, cache = run_mixer_model(net, input_ids, attention_mask, cache, use_cache, head, position_ids)
        return out, cache if use_cache else None

    def _returned(self, out: ModelOutput, return_dict: bool | None) -> ModelOutput | tuple:
        """``out`` or its tuple, as ``return_dict`` (default: the config's) asks."""
        return out if (return_dict if return_dict is not None else self.config.return_dict) else out.to_tuple()

    @classmethod
    def get_init_context(cls, *args, **kwargs):
        """transformers' construction contexts without its meta device (module docstring: Weights)."""
        return [
            c
            for c in super().get_init_context(*args, **kwargs)
            if not (isinstance(c, torch.device) and c.type == "meta")
        ]


class TokenmixModel(TokenmixPreTrainedModel):
    """Backbone (``AutoModel``): ids [B, T] -> the final-norm hidden states [B, T, D] that the head maps
    to logits (``MixerModel.features``). The head's weight stays in ``net`` (tied to the embedding,
    or stored) so that a causal-LM checkpoint loads into the backbone and back unchanged."""

    _tied_weights_keys = {"net.head.weight": "net.embed.weight"}

    def __init__(self, config: TokenmixConfig) -> None:
        super().__init__(config)
        # one dtype for every weight, as ``MixerModel(cfg).to(dtype)`` gives: transformers builds
        # under the dtype it loads (torch's default dtype), but a mixer may make a parameter in
        # float32 by name, which would then hold a float64 checkpoint's values rounded
        self.net = MixerModel(config.to_model_config()).to(torch.get_default_dtype())
        self.post_init()

    def get_input_embeddings(self):
        return self.net.embed

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        past_key_values: TokenmixCache | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        cache: TokenmixCache | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        position_ids: Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        _refuse_unsupported(inputs_embeds, output_attentions, output_hidden_states)
        cache = cache if cache is not None else past_key_values
        hidden, cache = self._run(self.net, input_ids, attention_mask, cache, use_cache, position_ids, head=False)
        return self._returned(BaseModelOutputWithPast(last_hidden_state=hidden, cache=cache), return_dict)


class TokenmixForCausalLM(TokenmixPreTrainedModel, GenerationMixin):
    """Causal LM (``AutoModelForCausalLM``): the ``MixerModel`` of ``self.model.net``, head included.

    ``generate()`` works through ``TokenmixCache`` (greedy and sampling; beam search is refused).
    """

    def __init__(self, config: TokenmixConfig) -> None:
        super().__init__(config)
        self.model = TokenmixModel(config)
        self.post_init()

    @property
    def net(self) -> MixerModel:
        """The tokenmix model itself (``tokenmix.generation`` and ``tokenmix`` tools take it)."""
        return self.model.net

    def get_input_embeddings(self):
        return self.model.net.embed

    def get_output_embeddings(self):
        return self.model.net.head

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """No ``DynamicCache``: the forward makes its ``TokenmixCache`` at the prefill."""
        return False

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        past_key_values: TokenmixCache | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        cache: TokenmixCache | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | Tensor | None = None,
        position_ids: Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """``cache`` is transformers 5's name for ``past_key_values`` (``generate`` passes ``cache``);
        either is taken. Other keyword arguments transformers may pass (``cache_position``, ...) are
        not needed and are ignored."""
        _refuse_unsupported(inputs_embeds, output_attentions, output_hidden_states)
        cache = cache if cache is not None else past_key_values
        logits, cache = self._run(self.model.net, input_ids, attention_mask, cache, use_cache, position_ids)
        loss = lm_loss(logits, labels, num_items_in_batch) if labels is not None else None
        return self._returned(CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache), return_dict)
