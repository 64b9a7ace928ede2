"""The record of a language-model run: its typed config, dotted overrides, metrics and loading.

    LMRunConfig(model=ModelConfig, data=DataConfig, train=LMTrainConfig)

``apply_overrides(cfg, ["train.lr=3e-4", "model.d_model=256"])`` parses each value by the field's
declared type and rejects unknown keys. Lists/tuples take comma lists (``model.layers=pow2,attention``),
dicts take JSON or a dotted path inside (``model.mixer_overrides.pow2.chunk_size=32``). The resolved
config is written as JSON to every run directory; ``LMRunConfig.from_dict`` reads it back, and
``merge_config`` puts a partial document of the same shape over a config (``train lm --config FILE``);
both check it with one function (sections, keys, JSON types), so a hand-edited file fails in one line.

A run directory (written by ``training/lm.py``, claimed as ``runs/lm_folder.py`` says) holds
``config.json`` (the resolved LMRunConfig), ``tokenizer.json``, ``metrics.jsonl`` (one JSON object per
optimizer step, plus validation and baseline records), ``checkpoints/`` (``runs/checkpoint.py``),
``summary.json`` and, with ``train.tensorboard=true`` and tensorboard installed, ``tb/``. ``load_run``
gives back the config, the model with the weights of the newest checkpoint that verifies (saying on
stderr when a newer one did not), and the tokenizer. A config is refused when its model cannot fit in
this machine's memory (``check_model_memory``, estimated on the meta device before anything is
allocated). Named starting points (``tiny``, ``small``, ...) are presets: ``study/presets``.
"""

from __future__ import annotations

import json
import math
import sys
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from tokenmix.core.errors import InputError, MissingInput, shown
from tokenmix.core.files import MAX_JSON_BYTES, parse_json, read_json, read_text_file
from tokenmix.core.memory import available_memory
from tokenmix.data.prepare import DataConfig
from tokenmix.data.tokenizer import load_tokenizer
from tokenmix.mixers.registry import get_mixer_spec
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.models.model import Block
from tokenmix.runs.checkpoint import CheckpointError, load_model_weights, newest_valid_checkpoint

PARALLEL = ("ddp", "fsdp")
MAX_THREADS = 1024  # train.threads at most: more than any machine has cores (torch accepts any count, then starts them)
PRECISIONS = ("fp32", "bf16", "auto")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class LMTrainConfig:
    seq_len: int = 128
    batch_size: int = 16  # sequences per optimizer step, over all ranks and accumulation micro-steps
    grad_accum: int = 1  # micro-steps per optimizer step
    max_steps: int = 300
    lr: float = 2e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1  # on matrices and embeddings; never on norms and biases
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    precision: str = "fp32"  # fp32 | bf16 (autocast; on CPU too) | auto (bf16 where matmuls have native
    # bf16: CUDA, or a CPU with AMX-BF16/AVX512-BF16; else fp32); resolved at start
    eval_every: int = 100  # steps between validation passes (and one at the end)
    eval_windows: int = 32  # validation windows per periodic pass; 0 = the whole split
    final_eval_windows: int = 0  # validation windows of the final pass (and its baselines); 0 = the whole split
    checkpoint_every: int = 100  # steps between checkpoints (and one at the end); 0 = only at the end
    keep_checkpoints: int = 2
    log_every: int = 10  # steps between console lines (metrics.jsonl gets every step)
    seed: int = 0
    parallel: str = "ddp"  # ddp | fsdp, used when launched with torchrun and world size > 1
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    # also write TensorBoard events (tb/); off by default, since tensorboard is in none of the extras
    tensorboard: bool = False
    # packed rows: the windows still cut the stream, but no state or attention crosses a document's
    # separator (each document is computed as if alone; docs/packing.md)
    pack: bool = False

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):  # a config.json edited by hand may hold anything
            v, tp = getattr(self, f.name), hints[f.name]
            ok = (
                isinstance(v, bool)
                if tp is bool
                else isinstance(v, int) and not isinstance(v, bool)
                if tp is int
                else isinstance(v, (int, float)) and not isinstance(v, bool)
                if tp is float
                else isinstance(v, tp)
            )
            if not ok:
                raise InputError(f"train.{f.name} must be {getattr(tp, '__name__', tp)}, got {v!r}")
            if tp is float and not math.isfinite(v):
                raise InputError(f"train.{f.name} must be a finite number, got {v}")
        for name in ("seq_len", "batch_size", "grad_accum", "max_steps", "eval_every", "log_every", "keep_checkpoints"):
            if getattr(self, name) <= 0:
                raise InputError(f"train.{name} must be > 0, got {getattr(self, name)}")
        for name in (
            "warmup_steps",
            "eval_windows",
            "final_eval_windows",
            "checkpoint_every",
            "threads",
            "grad_clip",
            "weight_decay",
        ):
            if getattr(self, name) < 0:
                raise InputError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.threads > MAX_THREADS:
            raise InputError(f"train.threads must be <= {MAX_THREADS}, got {self.threads}")
        if self.lr <= 0:
            raise InputError(f"train.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise InputError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InputError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.eps <= 0:
            raise InputError(f"train.eps must be > 0, got {self.eps}")
        if not 0 <= self.seed < 2**32:
            raise InputError(f"train.seed must be in [0, 2**32), got {self.seed}")
        if self.batch_size % self.grad_accum:
            raise InputError(
                f"train.batch_size={self.batch_size} must be divisible by train.grad_accum={self.grad_accum}"
            )
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

    def __post_init__(self) -> None:
        check_model_ranges(self.model)
        check_mixer_overrides(self.model)
        if self.model.positions == "learned" and self.train.seq_len > self.model.max_seq_len:
            raise InputError(
                f"train.seq_len={self.train.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}, "
                "where the learned positions stop; raise model.max_seq_len or lower train.seq_len"
            )

    def to_dict(self) -> dict:
        return {s: _section_dict(getattr(self, s)) for s in ("model", "data", "train")}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> "LMRunConfig":
        """A config from its JSON form; a missing field takes its section class's default."""
        sec_cls = _section_classes()
        return cls(**{sec: sec_cls[sec](**values) for sec, values in _section_values(d, where).items()})


def _section_classes() -> dict[str, type]:
    return {"model": ModelConfig, "data": DataConfig, "train": LMTrainConfig}


def _section_values(d: Any, where: str) -> dict[str, dict]:
    """The fields of each section of a config's JSON form, checked (an object of objects, known
    sections and keys, JSON types of the fields) and with lists turned into tuples where the field
    is a tuple; sections the document lacks are empty. One checker for config.json and --config."""
    if not isinstance(d, dict):
        raise InputError(f"'{where}' must hold a JSON object with model, data and train sections")
    unknown = set(d) - {"model", "data", "train"}
    if unknown:
        raise InputError(f"'{where}': unknown config section(s) {sorted(unknown)}; sections: model, data, train")
    out = {}
    for name, sec_cls in _section_classes().items():
        raw = d.get(name, {})
        if not isinstance(raw, dict):
            raise InputError(f"'{where}': section '{name}' must be a JSON object, got {type(raw).__name__}")
        bad = sorted(set(raw) - {x.name for x in fields(sec_cls)})
        if bad:
            raise InputError(f"'{where}': unknown config key(s) {[f'{name}.{b}' for b in bad]}")
        check_field_types(sec_cls, raw, name, where)
        hints = typing.get_type_hints(sec_cls)
        out[name] = {k: _coerce_json(v, hints[k]) for k, v in raw.items()}
    return out


def merge_config(base: LMRunConfig, d: Any, where: str) -> LMRunConfig:
    """``base`` with the fields of a (possibly partial) config document ``d`` put over it: what
    ``train lm --config FILE`` does, so that a file need only name what differs from the preset."""
    values = _section_values(d, where)
    return LMRunConfig(**{sec: replace(getattr(base, sec), **values[sec]) for sec in values})


def read_config_file(path: str | Path) -> dict:
    """The JSON document of a config file (``--config``), refused in one line when it is missing,
    no regular file, not UTF-8 or not JSON (``core.files.read_json``)."""
    return read_json(path, "config file")


def check_model_ranges(model: ModelConfig) -> None:
    """The ranges of the ModelConfig fields its own checks leave open (a config.json edited by hand,
    ``--set``): refused here, before a model is built, rather than by torch halfway through a run."""
    if model.max_seq_len < 1:
        raise InputError(f"model.max_seq_len must be >= 1, got {model.max_seq_len}")


def check_mixer_overrides(model: ModelConfig) -> None:
    """Every ``model.mixer_overrides`` entry names a mixer of ``model.layers`` and fields it has
    (an override nothing reads would be silently ignored)."""
    overrides = model.mixer_overrides
    check_override_types(overrides)
    for name, values in overrides.items():
        if name not in model.layers:
            raise InputError(
                f"model.mixer_overrides.{name}: mixer '{name}' is not in model.layers "
                f"({','.join(dict.fromkeys(model.layers))}), so the override would do nothing"
            )
        get_mixer_spec(name).make_config(**values)  # unknown fields or bad values: InputError


def check_override_types(overrides: Any) -> None:
    """Each ``model.mixer_overrides`` entry names a registered mixer (InputError naming the known
    ones) and holds a dictionary whose values have the JSON types of that mixer's config fields, so
    that a mixer config never compares a string with a number."""
    if not isinstance(overrides, dict):
        raise InputError(f"model.mixer_overrides must be a dictionary (mixer name -> fields), got {overrides!r}")
    for name, values in overrides.items():
        spec = get_mixer_spec(name)
        if not isinstance(values, dict):
            raise InputError(f"model.mixer_overrides.{name} must be a dictionary of config fields, got {values!r}")
        _check_types(spec.config_cls, values, f"model.mixer_overrides.{name}")


# ------------------------------------------------------------------------------------ memory
def _layer_counts(spec: Any) -> dict[str, int] | None:
    """``"pow2*3,attention"`` -> {"pow2": 3, "attention": 1} without expanding the repeats; None
    where the pattern is malformed (``parse_layers`` then says what is wrong)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    counts: dict[str, int] = {}
    for raw in items:
        if not isinstance(raw, str):
            return None
        name, star, reps = raw.strip().partition("*")
        if star and not reps.strip().isdigit():
            return None
        name = name.strip()
        counts[name] = counts.get(name, 0) + (int(reps) if star else 1)
    return counts


def estimate_parameters(model: dict[str, Any], vocab_size: int | None = None) -> float | None:
    """Parameters of the ``MixerModel`` that the ModelConfig fields ``model`` describe, counted
    without allocating anything: one block per distinct mixer built on the meta device, times its
    count (``model["layers"]`` may hold ``NAME*COUNT`` repeats, not expanded here). ``math.inf``
    when a single tensor would exceed what torch can address; None when it cannot be estimated.
    """
    counts = _layer_counts(model.get("layers", ()))
    if not counts:
        return None
    fields_ = dict(model)
    d = fields_.get("d_model")
    if not isinstance(d, int) or d <= 0:
        return None
    vocab = vocab_size if vocab_size is not None else fields_.get("vocab_size", 256)
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        return None  # (ModelConfig refuses it)
    total = float(vocab * d) * (1 if fields_.get("tie_weights", True) else 2) + d  # embedding (+ head), final norm
    if fields_.get("positions") == "learned":
        total += float(fields_.get("max_seq_len", 0)) * d
    for name, count in counts.items():
        one = ModelConfig(**{**fields_, "layers": (name,), "vocab_size": 1})  # bad fields: their InputError
        try:
            with torch.device("meta"):
                block = Block(one, name)
        except RuntimeError as e:
            if "overflow" in str(e):
                return math.inf
            return None  # a mixer that cannot be built on the meta device: no estimate
        total += float(count) * sum(p.numel() for p in block.parameters())
    return total


def check_model_memory(model: dict[str, Any], bytes_per_param: int, what: str, vocab_size: int | None = None) -> None:
    """Refuse (InputError) a model whose ``bytes_per_param`` bytes a parameter exceed the memory
    available; ``what`` says what those bytes are."""
    check_override_types(model.get("mixer_overrides", {}))  # before a mixer is built from them
    params = estimate_parameters(model, vocab_size)
    avail = available_memory()
    if params is None or avail is None:
        return
    need = params * bytes_per_param
    if need <= avail:
        return
    n_layers = sum((_layer_counts(model.get("layers", ())) or {}).values())
    vocab = vocab_size if vocab_size is not None else model.get("vocab_size", 256)
    if math.isfinite(params):
        amount = f"about {params:.3g} parameters, which need about {need / 2**30:,.0f} GiB"
    else:  # a block too large to build even on the meta device: the embedding alone says how large
        embedding = float(vocab) * model["d_model"]
        amount = (
            f"tensors too large to address (the embedding alone {embedding:.3g} parameters, which need "
            f"about {embedding * bytes_per_param / 2**30:,.0f} GiB)"
        )
    size = (
        f"model.d_model={model.get('d_model')}, {n_layers:,} layer(s) and a {vocab:,}-token vocabulary give "
        f"{amount} for {what} ({bytes_per_param} bytes a parameter)"
    )
    raise InputError(
        f"model too large for this machine: {size}, but {avail / 2**30:,.1f} GiB of memory is "
        "available; lower model.d_model, the layer count or the vocabulary size"
    )


def check_batch_memory(train: LMTrainConfig) -> None:
    """Refuse (InputError) a global batch whose token ids alone (int64) exceed the memory available:
    a lower bound of what a step needs, so that an absurd train.batch_size or train.seq_len is refused
    before training rather than by the allocator."""
    need = float(train.batch_size) * (train.seq_len + 1) * 8
    avail = available_memory()
    if avail is not None and need > avail:
        raise InputError(
            f"train.batch_size={train.batch_size:,} windows of train.seq_len={train.seq_len:,} tokens "
            f"need about {need / 2**30:,.1f} GiB for their token ids alone, but {avail / 2**30:,.1f} GiB "
            "of memory is available; lower train.batch_size or train.seq_len"
        )


def _section_dict(obj: Any) -> dict:
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def _has_type(value: Any, tp: Any) -> bool:
    """Whether a JSON value can stand for a config field of type ``tp`` (int, float, bool, str,
    tuple[str, ...], dict); other annotations are not checked here."""
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    origin = typing.get_origin(tp)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if origin in (typing.Union, types.UnionType):
        return any(value is None if arg is type(None) else _has_type(value, arg) for arg in typing.get_args(tp))
    return True


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join("null" if arg is type(None) else _type_name(arg) for arg in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return "a list of names"
    if typing.get_origin(tp) is dict or tp is dict:
        return "a JSON object"
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def check_field_types(cls: type, values: dict, section: str, where: str | Path) -> None:
    """Refuse (InputError naming the field) a value of the wrong JSON type for a config dataclass
    field, before the dataclass compares or iterates it; unknown keys are left to the loader."""
    _check_types(cls, values, f"'{where}': {section}")


def _check_types(cls: type, values: dict, label: str) -> None:
    """InputError '<label>.<field> must be <type>, got <value>' for the first value of the wrong type."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        tp = hints.get(key)
        if tp is not None and not _has_type(value, tp):
            raise InputError(f"{label}.{key} must be {_type_name(tp)}, got {shown(value)}")


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
            value = parse_json(text, f"override {key}")
            if not isinstance(value, dict):
                raise InputError(f"expected a JSON object, got '{text}'")
            return value
    except (ValueError, json.JSONDecodeError) as e:
        raise InputError(f"override {key}: cannot parse '{text}' as {getattr(tp, '__name__', tp)}: {e}") from None
    raise InputError(f"override {key}: fields of type {tp} cannot be set from the command line")


def _parse_override(item: str) -> tuple[str, list[str], Any]:
    """One ``section.field[.key...]=value`` override: (section, the dotted key's parts, the value
    parsed by the field's type; for a path into a dict field, the JSON value or the text). Refuses
    (InputError) a malformed item, an unknown section or field, and a value of the wrong type."""
    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise InputError(f"override '{item}' must look like section.field=value (e.g. train.lr=3e-4)")
    parts = key.split(".")
    section_cls = _section_classes()
    if parts[0] not in section_cls or len(parts) < 2:
        raise InputError(f"unknown config key '{key}'; sections: model, data, train (e.g. train.lr=3e-4)")
    sec, name = parts[0], parts[1]
    hints = typing.get_type_hints(section_cls[sec])
    if name not in hints or name not in {f.name for f in fields(section_cls[sec])}:
        known = ", ".join(f"{sec}.{f.name}" for f in fields(section_cls[sec]))
        raise InputError(f"unknown config key '{key}'; known keys: {known}")
    tp = hints[name]
    if len(parts) == 2:
        value = parse_value(text, tp, key)
        if tp is float and not math.isfinite(value):
            raise InputError(f"{key} must be a finite number, got {text.strip()}")
        return sec, parts, value
    # a dotted path into a dict field: model.mixer_overrides.pow2.chunk_size=32
    if typing.get_origin(tp) is not dict:
        raise InputError(f"unknown config key '{key}': {sec}.{name} is not a dictionary")
    try:
        return sec, parts, parse_json(text, f"override {key}")
    except InputError:
        return sec, parts, text


def check_overrides(overrides: list[str]) -> None:
    """Refuse (InputError) a malformed override, an unknown key or a value of the wrong type, each
    alone: what can be said before the preset and the data are read (``train lm`` and ``data
    prepare`` call it first). Ranges that depend on other fields are checked by ``apply_overrides``."""
    for item in overrides:
        _parse_override(item)


def apply_overrides(cfg: LMRunConfig, overrides: list[str]) -> LMRunConfig:
    """Return ``cfg`` with ``section.field=value`` overrides applied (later ones win)."""
    sections = {s: _section_dict(getattr(cfg, s)) for s in ("model", "data", "train")}
    section_cls = _section_classes()
    for item in overrides:
        sec, parts, value = _parse_override(item)
        name = parts[1]
        if len(parts) == 2:
            sections[sec][name] = value
            continue
        target = dict(sections[sec].get(name) or {})
        sections[sec][name] = target
        node = target
        for p in parts[2:-1]:
            node[p] = dict(node.get(p, {}))
            node = node[p]
        node[parts[-1]] = value
    # before ModelConfig expands "pow2*100000000" into that many names: a model whose weights alone
    # cannot be held in memory is refused here, with the sizes that decide it
    check_model_memory(sections["model"], 4, "its fp32 weights alone")
    built = {}
    for sec, values in sections.items():
        hints = typing.get_type_hints(section_cls[sec])
        built[sec] = section_cls[sec](**{k: _coerce_json(v, hints[k]) for k, v in values.items()})
    cfg = LMRunConfig(**built)
    check_batch_memory(cfg.train)
    return cfg


def model_differences(a: ModelConfig, b: ModelConfig) -> list[str]:
    """``model.FIELD A vs B`` for every field that changes the weights' names or shapes (all but
    dropout; max_seq_len only under learned positions): why a checkpoint of ``a`` cannot start ``b``."""
    diffs = []
    for f in fields(ModelConfig):
        if f.name == "dropout" or (f.name == "max_seq_len" and "learned" not in (a.positions, b.positions)):
            continue
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            show = (lambda v: ",".join(v)) if f.name == "layers" else repr
            diffs.append(f"model.{f.name} {show(va)} vs {show(vb)}")
    return diffs


def bigram_verdict(ppl: float, bigram_ppl: float) -> str:
    """``better than`` / ``worse than the bigram``, in words with both perplexities and the factor
    between them, so that a loss worse than the baseline can never read like an improvement."""
    if not (math.isfinite(ppl) and math.isfinite(bigram_ppl)) or ppl <= 0 or bigram_ppl <= 0:
        return f"no bigram comparison (perplexity {ppl:.2f}, bigram {bigram_ppl:.2f})"
    if ppl < bigram_ppl:
        return f"better than the bigram (perplexity {ppl:.2f} vs {bigram_ppl:.2f}, {bigram_ppl / ppl:.2f}x lower)"
    if ppl > bigram_ppl:
        return f"worse than the bigram (perplexity {ppl:.2f} vs {bigram_ppl:.2f}, {ppl / bigram_ppl:.2f}x higher)"
    return f"level with the bigram (perplexity {ppl:.2f})"


def resolve_device(name: str, flag: str = "--device") -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` as the device a command runs on; ``cuda`` without a usable
    CUDA device is bad input (one line), not a torch traceback halfway through loading."""
    if name not in DEVICES:
        raise InputError(f"{flag} must be one of {', '.join(DEVICES)}, got '{name}'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise InputError(f"{flag} cuda: CUDA is not available ({why}); use {flag} cpu or {flag} auto")
    return torch.device(name)


def with_vocab(cfg: LMRunConfig, vocab_size: int) -> LMRunConfig:
    """The model's vocabulary comes from the tokenizer, never from the command line."""
    return replace(cfg, model=replace(cfg.model, vocab_size=vocab_size))


# ------------------------------------------------------------------------------------ reading runs
def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's metrics.jsonl (none when there is no such file; one that is no regular
    file of the run folder is refused); a line that is not a JSON object (the last line of a killed
    run, cut mid-write) is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not (path.exists() or path.is_symlink()):
        return []
    out = []
    for line in read_text_file(
        path, "metrics file", max_bytes=MAX_JSON_BYTES, within=run_dir, errors="replace"
    ).splitlines():
        try:
            rec = parse_json(line, "a metrics record")
        except InputError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


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
    if not run_dir.exists():
        raise MissingInput(f"run directory '{run_dir}' does not exist")
    if not run_dir.is_dir():
        raise MissingInput(f"'{run_dir}' is not a run directory (it is a file, not a folder)")
    cfg_path = run_dir / "config.json"
    if not (cfg_path.exists() or cfg_path.is_symlink()):
        raise MissingInput(f"'{run_dir}' is not a run directory (no config.json)")
    return LMRunConfig.from_dict(read_json(cfg_path, "run config", within=run_dir), str(cfg_path))


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """The run's config, its model with the latest checkpoint's weights (verified), and its tokenizer."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    ckpt, _, skipped = newest_valid_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise CheckpointError(f"run directory '{run_dir}' has no checkpoint yet")
    for why in skipped:
        print(f"tokenmix: warning: {why}; using {ckpt.name}, the newest valid checkpoint", file=sys.stderr)
    model = MixerModel(cfg.model)
    meta = load_model_weights(ckpt, model)
    model.to(device).eval()
    tok = load_tokenizer(run_dir / "tokenizer.json", within=run_dir)
    if tok.get_vocab_size() != cfg.model.vocab_size:
        raise InputError(
            f"'{run_dir}/tokenizer.json' has {tok.get_vocab_size()} tokens but the model {cfg.model.vocab_size}"
        )
    return LoadedRun(cfg, model, tok, ckpt, meta)


__all__ = [
    "LMRunConfig",
    "LMTrainConfig",
    "DataConfig",
    "LoadedRun",
    "ModelConfig",
    "apply_overrides",
    "available_memory",
    "bigram_verdict",
    "check_batch_memory",
    "check_mixer_overrides",
    "check_model_memory",
    "check_model_ranges",
    "check_override_types",
    "estimate_parameters",
    "load_run",
    "merge_config",
    "model_differences",
    "parse_value",
    "read_config_file",
    "read_metrics",
    "read_run_config",
    "resolve_device",
    "with_vocab",
]
