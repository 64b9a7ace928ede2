"""Layer inputs of a trained run for a text, so the matrix viewer can show what a trained mixer does.

A run directory is read, never written. A language-model run of ``tokenmix train lm`` (with
``checkpoints/latest.json``) is loaded by ``tokenmix.runs.lm.load_run``, which verifies its
checkpoint. Any other directory may hold the plain layout:
    config.json       the model fields under "model" (or "model_config"), or at the top level
                      (ModelConfig fields: vocab_size, d_model, layers, n_heads, ...)
    *.safetensors     weights of the generic model (model.safetensors preferred, else the newest one,
                      also looked for under checkpoints/ and checkpoints/*/)
    tokenizer.json    optional HF tokenizers file; without it the text is encoded as UTF-8 bytes,
                      which needs vocab_size >= 256
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from tokenmix.core.errors import InputError, MissingInput
from tokenmix.core.files import check_regular_file, read_json
from tokenmix.data.tokenizer import load_tokenizer
from tokenmix.models.model import MixerModel, ModelConfig
from tokenmix.runs.lm import (
    check_field_types,
    load_run,
)  # the LM run layout, with checkpoint verification

_CONFIG_KEYS = ("model", "model_config")


def _model_config(raw: dict, path: Path) -> ModelConfig:
    for key in _CONFIG_KEYS:
        if isinstance(raw.get(key), dict):
            raw = raw[key]
            break
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    picked = {k: v for k, v in raw.items() if k in fields}
    check_field_types(ModelConfig, picked, "model", path)
    if "layers" not in picked:
        raise InputError(
            f"{path} has no model 'layers' field (looked at the top level and under "
            f"{', '.join(repr(k) for k in _CONFIG_KEYS)}); is this a tokenmix run directory?"
        )
    if isinstance(picked["layers"], list):
        picked["layers"] = tuple(picked["layers"])
    return ModelConfig(**picked)


def _weights_file(run: Path) -> Path:
    preferred = run / "model.safetensors"
    if preferred.is_file():
        return preferred
    found = sorted(
        [
            *run.glob("*.safetensors"),
            *run.glob("checkpoints/*.safetensors"),
            *run.glob("checkpoints/*/model.safetensors"),
        ],
        key=lambda p: p.stat().st_mtime,
    )
    if not found:
        raise MissingInput(f"run directory '{run}' has no *.safetensors weights")
    return found[-1]


def load_run_model(run_dir: str | Path) -> tuple[MixerModel, Callable[[str], list[int]]]:
    """(model in eval mode with the run's weights, text -> token ids)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise MissingInput(f"run directory '{run}' does not exist")
    if (run / "checkpoints" / "latest.json").exists() or (run / "checkpoints" / "latest.json").is_symlink():
        loaded = load_run(run)  # (its config checked by the one config reader, read_run_config)
        return loaded.model, lambda text: loaded.tokenizer.encode(text).ids
    cfg_path = run / "config.json"
    if not (cfg_path.exists() or cfg_path.is_symlink()):
        raise MissingInput(f"run directory '{run}' has no config.json")
    raw = read_json(cfg_path, "run config", within=run)
    if not isinstance(raw, dict):
        raise InputError(f"'{cfg_path}' must hold a JSON object with the model's fields")
    cfg = _model_config(raw, cfg_path)
    model = MixerModel(cfg)
    weights_path = _weights_file(run)
    check_regular_file(weights_path, "weights file", within=run)
    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"weights file '{weights_path}' is unreadable ({why})") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not (cfg.tie_weights and k == "head.weight")]
    if missing or unexpected:
        raise InputError(
            f"weights in '{run}' do not match the model config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.eval()
    tok_path = run / "tokenizer.json"
    if tok_path.exists() or tok_path.is_symlink():
        tok = load_tokenizer(tok_path, within=run)
        encode = lambda text: tok.encode(text).ids  # noqa: E731
    elif cfg.vocab_size >= 256:
        encode = lambda text: list(text.encode("utf-8"))  # noqa: E731
    else:
        raise InputError(
            f"run '{run}' has no tokenizer.json and vocab_size {cfg.vocab_size} < 256 rules out byte encoding"
        )
    return model, encode


def check_text(text: str, what: str) -> None:
    """Refuse text that is not valid Unicode: a command-line argument holding invalid UTF-8 bytes
    arrives with them escaped as lone surrogates, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f" (byte 0x{ord(bad) - 0xDC00:02x})" if 0xDC80 <= ord(bad) <= 0xDCFF else ""
        raise InputError(f"{what} is not valid UTF-8 text{byte} at character {e.start}") from None


def layer_inputs(model: MixerModel, idx: Tensor) -> list[Tensor]:
    """The input x [B, T, D] of every layer's mixer (after its pre-norm) for token ids idx [B, T]."""
    captured: list[Tensor] = []
    hooks = [
        blk.mixer.register_forward_pre_hook(lambda mod, args: captured.append(args[0].detach())) for blk in model.blocks
    ]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in hooks:
            h.remove()
    return captured


def text_layer_input(run_dir: str | Path, text: str, layer: int) -> tuple[object, Tensor, str]:
    """(mixer of ``layer``, its input x [1, T, D] for ``text``, its registry name) from a trained run."""
    model, encode = load_run_model(run_dir)
    if not 0 <= layer < len(model.blocks):
        raise InputError(f"layer {layer} out of range: the run has {len(model.blocks)} layers")
    check_text(text, "--text")
    ids = encode(text)
    if not ids:
        raise InputError("the text encodes to no tokens")
    idx = torch.tensor([ids], dtype=torch.long)
    x = layer_inputs(model, idx)[layer]
    return model.blocks[layer].mixer, x, model.cfg.layers[layer]
