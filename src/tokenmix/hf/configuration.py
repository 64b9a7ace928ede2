"""``TokenmixConfig``: a tokenmix ``ModelConfig`` as a Hugging Face configuration (model_type "tokenmix").

The HF config is a carrier, not a second definition: it holds every ``ModelConfig`` field under the
same name (``layers`` as a list of registered mixer names, ``mixer_overrides`` as mixer name ->
config fields, ``vocab_size``, ``d_model``, ``n_heads``, ``mlp``, ``mlp_ratio``, ``dropout``,
``positions``, ``max_seq_len``) and ``to_model_config()`` gives the ``ModelConfig`` back, validated
exactly as tokenmix validates it (unknown mixers, bad override fields: ``InputError``). Only the
weight tying goes by Hugging Face's name, ``tie_word_embeddings`` (= ``ModelConfig.tie_weights``),
because transformers' loader reads that name to decide whether ``head.weight`` is stored.

Standard names that other code reads are aliases (``hidden_size`` = d_model, ``num_attention_heads``
= n_heads, ``max_position_embeddings`` = max_seq_len) or derived (``num_hidden_layers`` = the
number of layers). ``config.json`` always holds every tokenmix field, defaults included
(``to_diff_dict``), so an exported model does not change if tokenmix's defaults do. A config whose
weights would not fit in this machine's memory is refused (``InputError`` with the estimated size)
when it is made, before any layer is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import PretrainedConfig

from tokenmix.core.errors import InputError, shown
from tokenmix.models import ModelConfig
from tokenmix.runs.lm import check_field_types, check_mixer_overrides, check_model_memory

_DEFAULT = ModelConfig()
# ModelConfig field -> TokenmixConfig field (the same name but for the tying flag)
_FIELD_NAMES = {
    f.name: ("tie_word_embeddings" if f.name == "tie_weights" else f.name) for f in dataclasses.fields(ModelConfig)
}


class TokenmixConfig(PretrainedConfig):
    """Configuration of ``TokenmixForCausalLM`` / ``TokenmixModel``: a ``ModelConfig`` plus the special
    token ids (the tokenizer's document separator after ``tokenmix export``) and ``use_cache``.

    Build one from a ``ModelConfig`` with ``TokenmixConfig.from_model_config(cfg)``; fields can also
    be given directly (``TokenmixConfig(layers=["pow2", "attention"], d_model=64)``).
    """

    model_type = "tokenmix"
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "max_position_embeddings": "max_seq_len",
    }

    vocab_size: int = _DEFAULT.vocab_size
    d_model: int = _DEFAULT.d_model
    layers: list[str] | None = None  # None: ModelConfig's default layer list
    n_heads: int = _DEFAULT.n_heads
    mlp: bool = _DEFAULT.mlp
    mlp_ratio: int = _DEFAULT.mlp_ratio
    tie_word_embeddings: bool = _DEFAULT.tie_weights
    dropout: float = _DEFAULT.dropout
    positions: str = _DEFAULT.positions
    max_seq_len: int = _DEFAULT.max_seq_len
    mixer_overrides: dict[str, dict] | None = None
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        self.mixer_overrides = {k: dict(v) for k, v in (self.mixer_overrides or {}).items()}
        # a config.json asking for more than this machine holds (d_model=1000000000, layers="pow2*100000")
        # is refused with its estimated size before a layer list is expanded or a weight allocated,
        # as `train lm` refuses it
        fields = {name: getattr(self, hf_name) for name, hf_name in _FIELD_NAMES.items()}
        if not isinstance(self.layers, (str, list, tuple, type(None))):
            raise InputError(
                f"'config': model.layers must be a layer pattern or a list of names, got {shown(self.layers)}"
            )
        typed = {k: v for k, v in fields.items() if v is not None and k != "layers"}  # layers: also "pow2*3"
        check_field_types(ModelConfig, typed, "model", "config")
        check_model_memory(fields | {"layers": self.layers or _DEFAULT.layers}, 4, "its fp32 weights alone")
        if self.layers is None:
            self.layers = list(_DEFAULT.layers)
        elif isinstance(self.layers, str):  # "pow2*3,attention", as ModelConfig accepts
            self.layers = list(ModelConfig(layers=self.layers).layers)
        else:
            self.layers = list(self.layers)
        super().__post_init__(**kwargs)
        self.to_model_config()  # validate now: a bad field is refused when the config is made, not at the model

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layers)

    def to_model_config(self) -> ModelConfig:
        """The tokenmix ``ModelConfig`` these fields describe (validated: ``InputError`` on bad values)."""
        cfg = ModelConfig(
            **{
                name: getattr(self, hf_name)
                for name, hf_name in _FIELD_NAMES.items()
                if name not in ("layers", "mixer_overrides")
            },
            layers=tuple(self.layers),
            mixer_overrides={k: dict(v) for k, v in self.mixer_overrides.items()},
        )
        check_mixer_overrides(cfg)
        return cfg

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, **kwargs: Any) -> "TokenmixConfig":
        """The HF config of a tokenmix ``ModelConfig``; ``kwargs`` set the other fields (token ids, ...)."""
        fields = {hf_name: getattr(cfg, name) for name, hf_name in _FIELD_NAMES.items()}
        fields["layers"] = list(cfg.layers)
        return cls(**fields, **kwargs)

    def to_diff_dict(self) -> dict[str, Any]:
        """Every tokenmix field is kept, even at its default (transformers drops defaults from config.json)."""
        out = super().to_diff_dict()
        for hf_name in (*_FIELD_NAMES.values(), "use_cache"):
            out[hf_name] = getattr(self, hf_name)
        return out
