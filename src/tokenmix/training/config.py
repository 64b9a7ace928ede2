"""Typed run configuration for language modelling, with dotted overrides and named presets.

    RunConfig(model=ModelConfig, data=DataConfig, train=TrainConfig)

``apply_overrides(cfg, ["train.lr=3e-4", "model.d_model=256"])`` parses each value by the field's
declared type and rejects unknown keys. Lists/tuples take comma lists (``model.layers=pow2,attention``),
dicts take JSON or a dotted path inside (``model.mixer_overrides.pow2.chunk_size=32``). The resolved
config is written as JSON to every run directory; ``RunConfig.from_dict`` reads it back.
"""
from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field, fields, replace
from typing import Any

from tokenmix.data.prepare import DataConfig
from tokenmix.models import ModelConfig

PARALLEL = ("ddp", "fsdp")
PRECISIONS = ("fp32", "bf16", "auto")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class TrainConfig:
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
                raise ValueError(f"train.{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_windows", "final_eval_windows", "checkpoint_every", "threads", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"train.batch_size={self.batch_size} must be divisible by train.grad_accum={self.grad_accum}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be one of {PRECISIONS}, got '{self.precision}'")
        if self.parallel not in PARALLEL:
            raise ValueError(f"train.parallel must be one of {PARALLEL}, got '{self.parallel}'")
        if self.device not in DEVICES:
            raise ValueError(f"train.device must be one of {DEVICES}, got '{self.device}'")


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=256, layers=("pow2",) * 4, n_heads=4))
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return {s: _section_dict(getattr(self, s)) for s in ("model", "data", "train")}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        unknown = set(d) - {"model", "data", "train"}
        if unknown:
            raise ValueError(f"unknown config section(s) {sorted(unknown)}")
        sections = {}
        for f in fields(cls):
            sec_cls = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}[f.name]
            raw = d.get(f.name, {})
            known = {x.name for x in fields(sec_cls)}
            bad = sorted(set(raw) - known)
            if bad:
                raise ValueError(f"unknown config key(s) {[f'{f.name}.{b}' for b in bad]}")
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
            raise ValueError(f"expected a boolean (true/false), got '{text}'")
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
                raise ValueError(f"expected a JSON object, got '{text}'")
            return value
    except (ValueError, json.JSONDecodeError) as e:
        raise ValueError(f"override {key}: cannot parse '{text}' as {getattr(tp, '__name__', tp)}: {e}") from None
    raise ValueError(f"override {key}: fields of type {tp} cannot be set from the command line")


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Return ``cfg`` with ``section.field=value`` overrides applied (later ones win)."""
    sections = {s: _section_dict(getattr(cfg, s)) for s in ("model", "data", "train")}
    section_cls = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
    for item in overrides:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"override '{item}' must look like section.field=value (e.g. train.lr=3e-4)")
        parts = key.split(".")
        if parts[0] not in sections or len(parts) < 2:
            raise ValueError(f"unknown config key '{key}'; sections: model, data, train (e.g. train.lr=3e-4)")
        sec, name = parts[0], parts[1]
        hints = typing.get_type_hints(section_cls[sec])
        if name not in hints or name not in {f.name for f in fields(section_cls[sec])}:
            known = ", ".join(f"{sec}.{f.name}" for f in fields(section_cls[sec]))
            raise ValueError(f"unknown config key '{key}'; known keys: {known}")
        tp = hints[name]
        if len(parts) > 2:  # a dotted path into a dict field: model.mixer_overrides.pow2.chunk_size=32
            if typing.get_origin(tp) is not dict:
                raise ValueError(f"unknown config key '{key}': {sec}.{name} is not a dictionary")
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
    return RunConfig(**built)


# ------------------------------------------------------------------------------------------ presets
def preset_overrides(name: str) -> list[str]:
    """Named starting points (applied before ``--set`` overrides)."""
    presets = {
        # the built-in default: ~3.7 M parameters on the shipped excerpt, 300 steps x 2048 tokens; bf16
        # autocast only where the CPU has native bf16 (AMX: ~0.7 s of one core per step), else fp32 (AVX2-only
        # EPYC, 2 threads: 288 s of process CPU for the whole command, i.e. under 5 minutes even on one core)
        "default": ["train.precision=auto"],
        # Shakespeare-sized: 2.6 M parameters (4 x attention, learned positions, d_model 192), 4096-token BPE,
        # 1800 steps x 2048 tokens = 3.7 M tokens (2.6 epochs of the train split), sized to the 20-minute budget
        # (measurement: README). Development runs (one thread each, whole-split validation, bigram 2.424
        # bits/char), the same sizes and schedule with other layers:
        #   attention x4, learned positions   2.211 bits/char, ppl  94.7 (1.55x below the bigram's 146.5)
        #   pow2, attention, pow2, attention  2.246 bits/char, ppl 101.7 (1.44x)
        #   pow2 x4                            2.258 bits/char, ppl 104.1 (1.41x); d_model 128, 2500 steps: 2.256
        # and the earlier 5.2 M-parameter, 8192-token, 1000-step pow2 preset: 2.31 bits/char in the same time
        # (a smaller model sees more tokens). At context 128 attention learns text fastest per step; residual
        # dropout 0.1 / 0.2 (pow2 x4) was behind at step 1250, so none is used.
        "small": ["data.vocab_size=4096", "model.d_model=192", "model.layers=attention,attention,attention,attention",
                  "model.positions=learned", "model.max_seq_len=128",
                  "train.seq_len=128", "train.batch_size=16", "train.max_steps=1800", "train.warmup_steps=100",
                  "train.lr=3e-3", "train.precision=auto", "train.eval_every=250", "train.checkpoint_every=250",
                  "train.eval_windows=64"],
        # tests and smoke runs: seconds
        "tiny": ["data.vocab_size=300", "model.d_model=32", "model.n_heads=2", "model.layers=pow2,pow2",
                 "train.seq_len=32", "train.batch_size=4", "train.max_steps=20", "train.warmup_steps=2",
                 "train.eval_every=10", "train.checkpoint_every=10", "train.eval_windows=4", "train.log_every=5"],
    }
    if name not in presets:
        raise ValueError(f"unknown preset '{name}'; presets: {', '.join(presets)}")
    return presets[name]


def build_run_config(preset: str = "default", overrides: list[str] | None = None) -> RunConfig:
    return apply_overrides(RunConfig(), preset_overrides(preset) + list(overrides or []))


def with_vocab(cfg: RunConfig, vocab_size: int) -> RunConfig:
    """The model's vocabulary comes from the tokenizer, never from the command line."""
    return replace(cfg, model=replace(cfg.model, vocab_size=vocab_size))


__all__ = ["RunConfig", "TrainConfig", "DataConfig", "ModelConfig", "apply_overrides", "build_run_config",
           "parse_value", "preset_overrides", "with_vocab"]
