from __future__ import annotations

import dataclasses

import pytest
import torch

from tokenmix.core.registry import build_mixer, get_mixer_spec, mixer_names


def small_mixer(name: str, d_model: int = 12, n_heads: int = 2, **extra):
    """A registered mixer at test size, float64: chunk sizes that do not divide the test lengths."""
    spec = get_mixer_spec(name)
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    overrides = {"n_heads": n_heads, **getattr(spec.cls, "test_overrides", {})}
    if "chunk_size" in fields:
        overrides.setdefault("chunk_size", 4)
    overrides.update(extra)
    torch.manual_seed(0)
    m = build_mixer(name, d_model, **{k: v for k, v in overrides.items() if k in fields})
    return m.double()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield


ALL_MIXERS = mixer_names()
