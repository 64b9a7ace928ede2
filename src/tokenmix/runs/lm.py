"""The record of a language-model run: its typed config, dotted overrides, metrics and loading.

    LMRunConfig(model=ModelConfig, data=DataConfig, train=LMTrainConfig)

``apply_overrides(cfg, ["train.lr=3e-4", "model.d_model=256"])`` parses each value by the field's
declared type and rejects unknown keys. Lists/tuples take comma lists (``model.layers=pow2,attention``),
dicts take JSON or a dotted path inside (``model.mixer_overrides.pow2.chunk_size=32``). The resolved
config is written as JSON to every run directory; ``LMRunConfig.from_dict`` reads it back.

A run directory (written by ``training/lm.py``) holds ``config.json`` (the resolved LMRunConfig),
``tokenizer.json``, ``metrics.jsonl`` (one JSON object per optimizer step, plus validation and
baseline records), ``checkpoints/`` (``runs/checkpoint.py``), ``summary.json`` and, when
tensorboard is installed, ``tb/``. ``load_run`` gives back the config, the model with the latest
verified weights, and the tokenizer. Named starting points (``tiny``, ``small``, ...) are presets:
``study/presets``.
"""
from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from tokenmix.core.errors import InputError, MissingInput
from tokenmix.data.prepare import DataConfig
from tokenmix.data.tokenizer import load_tokenizer
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.runs.checkpoint import CheckpointError, latest_checkpoint, load_model_weights

PARALLEL = ("ddp", "fsdp")
PRECISIONS = ("fp32", "bf16", "auto")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class LMTrainConfig:
    seq_len: int = 128
    batch_size: int = 16          # sequences per optimizer step, over all ranks and accumulation micro-steps
    grad_accum: int = 1           # micro-steps per optimizer step
    max_steps: int = 300
    lr: float = 2e-3              # peak learning rate
    min_lr_ratio: float = 0.1     # the cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1     # on matrices and embeddings; never on norms and biases
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0        # max global grad norm; 0 disables clipping
    precision: str = "fp32"       # fp32 | bf16 (autocast; on CPU too) | auto (bf16 where matmuls have native
                                  # bf16: CUDA, or a CPU with AMX-BF16/AVX512-BF16; else fp32); resolved at start
    eval_every: int = 100         # steps between validation passes (and one at the end)
    eval_windows: int = 32        # validation windows per periodic pass; 0 = the whole split
    final_eval_windows: int = 0   # validation windows of the final pass (and its baselines); 0 = the whole split
    checkpoint_every: int = 100   # steps between checkpoints (and one at the end); 0 = only at the end
    keep_checkpoints: int = 2
    log_every: int = 10           # steps between console lines (metrics.jsonl gets every step)
    seed: int = 0
    parallel: str = "ddp"         # ddp | fsdp, used when launched with torchrun and world size > 1
    device: str = "auto"          # auto | cpu | cuda
    threads: int = 0              # torch intra-op threads; 0 = torch's default
    tensorboard: bool = True      # also write TensorBoard events when tensorboard is installed

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "grad_accum", "max_steps", "eval_every", "log_every", "keep_checkpoints"):
            if getattr(self, name) <= 0:
                raise InputError(f"train.{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_windows", "final_eval_windows", "checkpoint_every", "threads", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise InputError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise InputError(f"train.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise InputError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.batch_size % self.grad_accum:
            raise InputError(f"train.batch_size={self.batch_size} must be divisible by train.grad_accum={self.grad_accum}")
        if self.precision not in PRECISIONS:
            raise InputError(f"train.precision must be one of {PRECISIONS}, got '{self.precision}'")
        if self.parallel not in PARALLEL:
            raise InputError(f"train.parallel must be one of {PARALLEL}, got '{self.parallel}'")
        if self.device not in DEVICES:
            raise InputError(f"train.device must be one of {DEVICES}, got '{self.device}'")


@dataclass(frozen=True)
class LMRunConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=256, layers=("pow2",) * 4, n_heads=4))
    data: DataConfig = field(default_factory=DataConfig)
    train: LMTrainConfig = field(default_factory=LMTrainConfig)

    def to_dict(self) -> dict:
        return {s: _section_dict(getattr(self, s)) for s in ("model", "data", "train")}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "LMRunConfig":
        unknown = set(d) - {"model", "data", "train"}
        if unknown:
            raise InputError(f"unknown config section(s) {sorted(unknown)}")
        sections = {}
        for f in fields(cls):
            sec_cls = {"model": ModelConfig, "data": DataConfig, "train": LMTrainConfig}[f.name]
            raw = d.get(f.name, {})
            known = {x.name for x in fields(sec_cls)}
            bad = sorted(set(raw) - known)
            if bad:
                raise InputError(f"unknown config key(s) {[f'{f.name}.{b}' for b in bad]}")
            hints = typing.get_type_hints(sec_cls)
            sections[f.name] = sec_cls(**{k: _coerce_json(v, hints[k]) for k, v in raw.items()})
        return cls(**sections)


def _section_dict(obj: Any) -> dict:
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def _coerce_json(value: Any, tp: Any) -> Any:
    """Values read back from JSON: lists become tuples where the field is a tuple."""
    if typing.get_origin(tp) is tuple and isinstance(value, list):
        return tuple(value)
    return value


# ------------------------------------------------------------------------------------------ overrides
def parse_value(text: str, tp: Any, key: str) -> Any:
    """Parse ``text`` as a value of type ``tp`` (int, float, bool, str, tuple[str, ...], dict)."""
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise InputError(f"expected a boolean (true/false), got '{text}'")
        if tp is int:
            return int(text)
        if tp is float:
            return float(text)
        if tp is str:
            return text
        if origin is tuple:
            return tuple(s.strip() for s in text.split(",") if s.strip())
        if origin is dict or tp is dict:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise InputError(f"expected a JSON object, got '{text}'")
            return value
    except (ValueError, json.JSONDecodeError) as e:
        raise InputError(f"override {key}: cannot parse '{text}' as {getattr(tp, '__name__', tp)}: {e}") from None
    raise InputError(f"override {key}: fields of type {tp} cannot be set from the command line")


def apply_overrides(cfg: LMRunConfig, overrides: list[str]) -> LMRunConfig:
    """Return ``cfg`` with ``section.field=value`` overrides applied (later ones win)."""
    sections = {s: _section_dict(getattr(cfg, s)) for s in ("model", "data", "train")}
    section_cls = {"model": ModelConfig, "data": DataConfig, "train": LMTrainConfig}
    for item in overrides:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"override '{item}' must look like section.field=value (e.g. train.lr=3e-4)")
        parts = key.split(".")
        if parts[0] not in sections or len(parts) < 2:
            raise InputError(f"unknown config key '{key}'; sections: model, data, train (e.g. train.lr=3e-4)")
        sec, name = parts[0], parts[1]
        hints = typing.get_type_hints(section_cls[sec])
        if name not in hints or name not in {f.name for f in fields(section_cls[sec])}:
            known = ", ".join(f"{sec}.{f.name}" for f in fields(section_cls[sec]))
            raise InputError(f"unknown config key '{key}'; known keys: {known}")
        tp = hints[name]
        if len(parts) > 2:  # a dotted path into a dict field: model.mixer_overrides.pow2.chunk_size=32
            if typing.get_origin(tp) is not dict:
                raise InputError(f"unknown config key '{key}': {sec}.{name} is not a dictionary")
            target = sections[sec].setdefault(name, {})
            target = dict(target)
            sections[sec][name] = target
            node = target
            for p in parts[2:-1]:
                node[p] = dict(node.get(p, {}))
                node = node[p]
            try:
                node[parts[-1]] = json.loads(text)
            except json.JSONDecodeError:
                node[parts[-1]] = text
            continue
        sections[sec][name] = parse_value(text, tp, key)
    built = {}
    for sec, values in sections.items():
        hints = typing.get_type_hints(section_cls[sec])
        built[sec] = section_cls[sec](**{k: _coerce_json(v, hints[k]) for k, v in values.items()})
    return LMRunConfig(**built)


def with_vocab(cfg: LMRunConfig, vocab_size: int) -> LMRunConfig:
    """The model's vocabulary comes from the tokenizer, never from the command line."""
    return replace(cfg, model=replace(cfg.model, vocab_size=vocab_size))


# ------------------------------------------------------------------------------------ reading runs
def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.is_file() else []


@dataclass
class LoadedRun:
    config: LMRunConfig
    model: MixerModel
    tokenizer: object
    checkpoint: Path
    meta: dict


def read_run_config(run_dir: str | Path) -> LMRunConfig:
    """The resolved config a run directory was trained with (its ``config.json``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MissingInput(f"run directory '{run_dir}' does not exist")
    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        raise MissingInput(f"'{run_dir}' is not a run directory (no config.json)")
    try:
        return LMRunConfig.from_dict(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as e:
        raise InputError(f"'{cfg_path}' is not valid JSON ({e})") from None


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """The run's config, its model with the latest checkpoint's weights (verified), and its tokenizer."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise CheckpointError(f"run directory '{run_dir}' has no checkpoint yet")
    model = MixerModel(cfg.model)
    meta = load_model_weights(ckpt, model)
    model.to(device).eval()
    tok = load_tokenizer(run_dir / "tokenizer.json")
    if tok.get_vocab_size() != cfg.model.vocab_size:
        raise InputError(f"'{run_dir}/tokenizer.json' has {tok.get_vocab_size()} tokens but the model "
                         f"{cfg.model.vocab_size}")
    return LoadedRun(cfg, model, tok, ckpt, meta)


__all__ = ["LMRunConfig", "LMTrainConfig", "DataConfig", "LoadedRun", "ModelConfig", "apply_overrides", "load_run",
           "parse_value", "read_metrics", "read_run_config", "with_vocab"]
