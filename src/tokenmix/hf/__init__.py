"""Hugging Face integration: tokenmix models as transformers models (optional extra ``tokenmix[hf]``).

    TokenmixConfig        configuration.py  a ModelConfig as a PretrainedConfig (model_type "tokenmix")
    TokenmixModel         modeling.py       backbone over the one MixerModel (AutoModel)
    TokenmixForCausalLM   modeling.py       causal LM over the same MixerModel (AutoModelForCausalLM)
    TokenmixCache         cache.py          the per-layer tokenmix decode states as a transformers Cache
    export_run            export.py         a tokenmix LM run -> a folder from_pretrained reads offline

Importing this package registers the three classes with ``AutoConfig`` / ``AutoModel`` /
``AutoModelForCausalLM`` (below, in plain sight), as ``import fla`` does for fla's models::

    import tokenmix.hf
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder)

``import tokenmix`` alone registers nothing and stays free of torch and transformers.

This floor sits beside training / analysis / bench: it uses core, mixers, models, generation,
runs and data; only cli (and bench) use it.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from tokenmix.hf.cache import TokenmixCache
from tokenmix.hf.configuration import TokenmixConfig
from tokenmix.hf.modeling import TokenmixForCausalLM, TokenmixModel, TokenmixPreTrainedModel

AutoConfig.register(TokenmixConfig.model_type, TokenmixConfig, exist_ok=True)
AutoModel.register(TokenmixConfig, TokenmixModel, exist_ok=True)
AutoModelForCausalLM.register(TokenmixConfig, TokenmixForCausalLM, exist_ok=True)

__all__ = ["TokenmixCache", "TokenmixConfig", "TokenmixForCausalLM", "TokenmixModel", "TokenmixPreTrainedModel"]
