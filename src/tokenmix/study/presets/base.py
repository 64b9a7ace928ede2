"""One preset mechanism for every kind of job: a named, typed starting point in Python, shipped
inside the package (so a wheel has them), registered by the file that defines it.

    kind       build() returns                       run by
    compare    list[SyntheticRunConfig] (one sweep)  tokenmix compare --preset NAME
    lm         list[str] of dotted overrides         tokenmix train lm --preset NAME
    analysis   AnalysisPlan                          tokenmix report NAME

A preset is a ``Preset`` record; sweeps are comprehensions (zoology's experiments
as Python configs). ``tokenmix presets`` lists every one with its line. A compare preset may also come from a
user's own ``.py`` file (``load_preset_file``): it defines ``<stem>(extra_mixers=())`` returning the
runs, and optionally ``DEFAULT_MIXERS`` and ``NOTES``; it is the user's code, run as such.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import mixer_names

KINDS = ("compare", "lm", "analysis")


@dataclass(frozen=True)
class Preset:
    """A named starting point of one kind (see the module docstring for what ``build`` returns)."""

    name: str
    kind: str
    summary: str  # one line for `tokenmix presets`
    build: Callable[..., Any]
    notes: str = ""  # compare: the report's "about this preset" paragraph
    default_mixers: tuple[str, ...] = ()  # compare: rows run when their mixers are registered
    source: str = ""  # where it was defined (module or file)
    # compare: the preset's own report part, (out, study.cells.CompareCells, plots) -> study.report.ReportSection
    report_section: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"preset '{self.name}': kind must be one of {KINDS}, got '{self.kind}'")


@dataclass(frozen=True)
class AnalysisPlan:
    """What an analysis preset runs (``tokenmix report NAME``): keyword arguments of each analysis;
    ``mixers=None`` means every registered mixer."""

    matrix: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    expressivity: dict[str, Any] = field(default_factory=dict)
    norms: dict[str, Any] = field(default_factory=dict)


_PRESETS: dict[tuple[str, str], Preset] = {}


def register_preset(preset: Preset) -> Preset:
    key = (preset.kind, preset.name)
    if key in _PRESETS:
        raise InputError(f"{preset.kind} preset '{preset.name}' is registered twice")
    _PRESETS[key] = preset
    return preset


def presets(kind: str | None = None) -> list[Preset]:
    """Every registered preset (of one kind), in registration order."""
    return [p for (k, _), p in _PRESETS.items() if kind is None or k == kind]


def get_preset(kind: str, name: str) -> Preset:
    if (kind, name) not in _PRESETS:
        known = ", ".join(p.name for p in presets(kind)) or "(none)"
        raise InputError(f"unknown preset '{name}' (kind {kind}); known: {known}")
    return _PRESETS[(kind, name)]


def registered(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split mixer names into (registered, missing)."""
    known = set(mixer_names())
    return [n for n in names if n in known], [n for n in names if n not in known]


def preset_rows(defaults: Sequence[str], extra_mixers: Sequence[str] = ()) -> list[str]:
    """A preset's rows: its default mixers that are registered, then the extra ones (``--mixers``) it
    does not already have, in the order given."""
    return registered(defaults)[0] + [m for m in extra_mixers if m not in defaults]


def load_preset_file(path: str | Path) -> Preset:
    """A compare preset from a user's ``.py`` file (see the module docstring for its contract)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"preset file '{path}' not found")
    mod_name = f"tokenmix_user_preset_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise InputError(f"cannot load preset file '{path}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except InputError:
        sys.modules.pop(mod_name, None)
        raise
    except Exception as e:  # the user's code failed: their error, in one line with its place
        sys.modules.pop(mod_name, None)
        raise _user_error(path, e, "loading it") from None
    fn = getattr(module, path.stem, None)
    if not callable(fn):
        raise InputError(f"preset file '{path}' defines no function '{path.stem}(extra_mixers=())'")
    doc = (module.__doc__ or "").strip().splitlines()

    @functools.wraps(fn)
    def build(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError:
            raise
        except Exception as e:
            raise _user_error(path, e, f"{path.stem}()") from None

    return Preset(
        name=path.stem,
        kind="compare",
        summary=doc[0] if doc else f"from {path}",
        build=build,
        notes=getattr(module, "NOTES", ""),
        default_mixers=tuple(getattr(module, "DEFAULT_MIXERS", ())),
        source=str(path),
    )


def _user_error(path: Path, error: Exception, when: str) -> InputError:
    """A user's preset file failing as bad input: the exception's type and first line, at the line of
    that file where it arose (the innermost frame in the file; a SyntaxError's own line)."""
    target = path.resolve()
    line = None
    if isinstance(error, SyntaxError) and error.filename and Path(error.filename).resolve() == target:
        line, text = error.lineno, error.msg
    else:
        for frame, lineno in traceback.walk_tb(error.__traceback__):
            if Path(frame.f_code.co_filename).resolve() == target:
                line = lineno
        text = str(error)
    text = next((t.strip() for t in str(text).splitlines() if t.strip()), "")
    where = f"'{path}', line {line}" if line is not None else f"'{path}'"
    return InputError(f"preset file {where}: {when} raised {type(error).__name__}" + (f": {text}" if text else ""))


def compare_preset(spec: str) -> Preset:
    """A compare preset by name, or from a ``.py`` file given by path.

    Only a path runs a user's file (it ends in ``.py`` or contains a path separator): a bare name is
    looked up among the registered presets and nowhere else, never in the current directory.
    """
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        return load_preset_file(spec)
    return get_preset("compare", spec)
