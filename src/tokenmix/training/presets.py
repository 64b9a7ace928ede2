"""Experiment presets: Python files under ``experiments/`` that build lists of ``RunConfig``.

``experiments/<name>.py`` defines a function ``<name>(extra_mixers=()) -> list[RunConfig]`` (zoology's
"experiments as Python configs"; sweeps are comprehensions). It may define ``DEFAULT_MIXERS``, the
rows it runs when their mixers are registered. ``load_preset`` accepts a preset name (looked up in
the repository's ``experiments/`` folder, then in ``./experiments``) or a path to such a file.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

from tokenmix.mixers.registry import mixer_names

PresetFn = Callable[..., list]


def experiments_dirs() -> list[Path]:
    """Folders searched for named presets: the repository's (source checkout), then the cwd's."""
    import tokenmix

    here = Path(tokenmix.__file__).resolve().parents[2] / "experiments"
    cwd = Path.cwd() / "experiments"
    return list(dict.fromkeys(p for p in (here, cwd) if p.is_dir()))


def preset_names() -> list[str]:
    names: list[str] = []
    for d in experiments_dirs():
        names += [p.stem for p in sorted(d.glob("*.py")) if not p.stem.startswith("_")]
    return list(dict.fromkeys(names))


def _resolve(spec: str) -> Path:
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"preset file '{spec}' not found")
        return path
    for d in experiments_dirs():
        path = d / f"{spec}.py"
        if path.is_file():
            return path
    known = ", ".join(preset_names()) or "(no experiments/ folder found)"
    raise ValueError(f"unknown preset '{spec}'; known presets: {known}")


def load_preset(spec: str) -> tuple[str, PresetFn, ModuleType]:
    """(name, function, module) of a preset given by name or file path."""
    path = _resolve(spec)
    name = path.stem
    mod_name = f"tokenmix_experiments_{name}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"cannot load preset file '{path}'")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"preset file '{path}' defines no function '{name}(extra_mixers=())'")
    return name, fn, module


def registered(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split mixer names into (registered, missing)."""
    known = set(mixer_names())
    return [n for n in names if n in known], [n for n in names if n not in known]
