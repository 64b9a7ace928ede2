"""Language-model presets (``tokenmix train lm --preset NAME``): dotted overrides applied to the
``LMRunConfig`` defaults before any ``--set``. Measurements of each: docs/results.md; development runs:
docs/notes/lm-presets.md."""

from __future__ import annotations

from tokenmix.runs.lm import LMRunConfig, apply_overrides
from tokenmix.study.durations import stated
from tokenmix.study.presets.base import Preset, get_preset, register_preset

OVERRIDES: dict[str, list[str]] = {
    # the built-in default: ~3.7 M parameters on the shipped excerpt, 300 steps (notes: docs/notes/lm-presets.md)
    "default": ["train.precision=auto"],
    # Shakespeare-sized, 4 x attention, sized to a 20-minute budget (development runs: docs/notes/lm-presets.md)
    "small": [
        "data.vocab_size=4096",
        "model.d_model=192",
        "model.layers=attention,attention,attention,attention",
        "model.positions=learned",
        "model.max_seq_len=128",
        "train.seq_len=128",
        "train.batch_size=16",
        "train.max_steps=1800",
        "train.warmup_steps=100",
        "train.lr=3e-3",
        "train.precision=auto",
        "train.eval_every=250",
        "train.checkpoint_every=250",
        "train.eval_windows=64",
    ],
    # tests and smoke runs: seconds
    "tiny": [
        "data.vocab_size=300",
        "model.d_model=32",
        "model.n_heads=2",
        "model.layers=pow2,pow2",
        "train.seq_len=32",
        "train.batch_size=4",
        "train.max_steps=20",
        "train.warmup_steps=2",
        "train.eval_every=10",
        "train.checkpoint_every=10",
        "train.eval_windows=4",
        "train.log_every=5",
    ],
}
SUMMARIES = {
    "default": f"~3.7 M parameters on the shipped excerpt, 300 steps ({stated('train lm')})",
    "small": f"Shakespeare-sized: 4 x attention, 2.6 M parameters, 1800 steps ({stated('lm small')})",
    "tiny": "tests and smoke runs: two pow2 layers, 20 steps (seconds)",
}
for _name, _overrides in OVERRIDES.items():
    register_preset(
        Preset(
            name=_name, kind="lm", summary=SUMMARIES[_name], build=lambda o=tuple(_overrides): list(o), source=__name__
        )
    )


def build_run_config(preset: str = "default", overrides: list[str] | None = None) -> LMRunConfig:
    """The LM run config of ``preset`` with ``overrides`` (``section.field=value``) applied after it."""
    return apply_overrides(LMRunConfig(), get_preset("lm", preset).build() + list(overrides or []))


def preset_overrides(name: str) -> list[str]:
    """The dotted overrides a named LM preset applies."""
    return get_preset("lm", name).build()
