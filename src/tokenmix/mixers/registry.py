"""Mixer registry: name -> (module class, config class, preset defaults).

Several names may share one class with different presets (``pow2`` and ``sq1`` are both the
structured mixer). Registering is all a new mixer needs to join the test matrix, ``tokenmix list``
and ``tokenmix check``.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from tokenmix.core.errors import InputError

_REGISTRY: dict[str, "MixerSpec"] = {}


@dataclass(frozen=True)
class MixerSpec:
    name: str
    cls: type
    config_cls: type
    defaults: dict[str, Any] = field(default_factory=dict)
    family: str = ""  # the kind of operator it computes ("linear attention"): what ``tokenmix list`` groups by
    ab_form: str = ""

    def make_config(self, **overrides: Any):
        fields = {f.name for f in dataclasses.fields(self.config_cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise InputError(f"mixer '{self.name}' has no config field(s) {unknown}; known: {sorted(fields)}")
        return self.config_cls(**{**self.defaults, **overrides})


def register_mixer(name: str, config_cls: type, *, family: str, ab_form: str, **defaults: Any):
    """Class decorator: ``@register_mixer("pow2", StructuredConfig, family=..., ab_form=..., pattern="pow2")``."""

    def deco(cls: type) -> type:
        if name in _REGISTRY:
            raise InputError(f"mixer name '{name}' registered twice")
        _REGISTRY[name] = MixerSpec(name, cls, config_cls, dict(defaults), family, ab_form)
        cls.config_cls = config_cls  # stated once, here: build_mixer's import-path escape hatch reads it
        return cls

    return deco


def unregister_mixer(name: str) -> MixerSpec:
    """Remove a registered name (a throw-away mixer a test registered); returns its spec."""
    if name not in _REGISTRY:
        raise InputError(f"unknown mixer '{name}'; known mixers: {', '.join(_REGISTRY)}")
    return _REGISTRY.pop(name)


def mixer_names() -> list[str]:
    return list(_REGISTRY)


def families() -> list[str]:
    """The families of the registered mixers, in order of first registration (one meaning of
    "family" in the package: a mixer's checks module, ``tokenmix.checks.family_module_name``, is its
    family's; a kernel base shared across families is named for what it computes)."""
    return list(dict.fromkeys(spec.family for spec in _REGISTRY.values()))


def get_mixer_spec(name: str) -> MixerSpec:
    if name not in _REGISTRY:
        raise InputError(f"unknown mixer '{name}'; known mixers: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def build_mixer(name: str, d_model: int, **overrides: Any):
    """Build a registered mixer by name for model width ``d_model``; ``overrides`` set config fields.

    A name containing a dot is an import path ``package.module.Class`` (escape hatch for outside
    code); such a class must accept ``(config, d_model)`` and define ``config_cls``.
    """
    if "." in name:
        mod_name, _, cls_name = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError) as e:
            raise InputError(f"cannot import mixer class '{name}': {e}") from None
        return cls(cls.config_cls(**overrides), d_model)
    spec = get_mixer_spec(name)
    return spec.cls(spec.make_config(**overrides), d_model)
