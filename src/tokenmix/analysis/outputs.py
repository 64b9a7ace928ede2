"""Where analysis results go: output folders, JSON, Markdown tables and figures (matplotlib Agg).

Every ``tokenmix analyze`` subcommand writes ``<name>.json`` (the numbers), ``<name>.md`` (the same
as tables) and figures as PNG and/or SVG into one folder; ``tokenmix report`` reads such folders.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # files only, never a window; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_path, atomic_write_text, check_output_dir, prepare_output_dir  # noqa: E402

FIGURE_FORMATS = ("png", "svg")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def default_out_dir(kind: str, root: str | os.PathLike = "runs", prefix: str = "analyze") -> Path:
    """A fresh ``runs/<prefix>-<kind>-<YYYYmmdd-HHMMSS>[-k]`` folder (created)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{prefix}-{kind}-{stamp}"
    out, k = base, 1
    while out.exists() or out.is_symlink():
        k += 1
        out = Path(f"{base}-{k}")
    return prepare_output_dir(out)


def check_out_dir(path: str | os.PathLike | None) -> None:
    """Refuse (InputError) an output folder that could not be made or written, creating nothing:
    what every command that writes calls before its work (None: the default under ``runs/``)."""
    check_output_dir(Path(path) if path is not None else Path("runs"))


def prepare_out_dir(path: str | os.PathLike | None, kind: str) -> Path:
    """Create (or reuse) the output folder; None -> :func:`default_out_dir`. One InputError line when
    it cannot be made or written (a file in the way, a dangling link, /proc, no permission)."""
    if path is None:
        return default_out_dir(kind)
    return prepare_output_dir(path)


def check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    fmts = tuple(dict.fromkeys(f.strip().lower() for f in formats if f.strip()))
    bad = [f for f in fmts if f not in FIGURE_FORMATS]
    if bad or not fmts:
        raise InputError(f"figure format(s) {bad or '(none)'} not supported; choose from {FIGURE_FORMATS}")
    return fmts


def save_figure(fig, out_dir: Path, stem: str, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """The one figure writer: ``fig`` as ``out_dir/stem.<fmt>`` for each format, each file written
    atomically (a killed run leaves the old figure or the new one), then the figure is closed."""
    paths = []
    for fmt in check_formats(formats):
        p = Path(out_dir) / f"{stem}.{fmt}"
        with atomic_path(p, suffix=f".{fmt}") as tmp:
            fig.savefig(tmp, format=fmt, dpi=110)  # callers lay out with tight_layout
        paths.append(p)
    plt.close(fig)
    return paths


def _jsonable(obj: Any) -> Any:
    """Floats that JSON cannot hold (inf, nan) become strings; numpy/torch scalars become numbers."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    if isinstance(obj, Path):
        return str(obj)
    return obj


def json_text(data: Any) -> str:
    """JSON text of analysis results (inf/nan as strings, numpy scalars as numbers)."""
    return json.dumps(_jsonable(data), indent=2)


def write_json(path: Path, data: Any) -> Path:
    """Write JSON atomically, so a killed run leaves no half-written file."""
    return atomic_write_text(path, json_text(data) + "\n")


def plural(n: int, noun: str) -> str:
    """'1 section', '2 sections', '0 sections'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def fmt_value(v: Any, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isinf(v):
            return "∞"
        if math.isnan(v):
            return "nan"
        if v == int(v) and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.{digits}g}"
    return str(v)


def markdown_table(rows: Sequence[dict] | Sequence[Sequence[Any]], columns: Sequence[str] | None = None) -> str:
    """The one Markdown-table writer: rows of dicts (cells looked up by column, missing ones '—') or
    rows of cells in ``columns``' order -> a GitHub Markdown table ending in a newline."""
    if not rows:
        return "(no rows)\n"
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    cols = list(columns)
    cells = [[r.get(c) for c in cols] if isinstance(r, dict) else list(r) for r in rows]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in cells:
        lines.append("| " + " | ".join(fmt_value(v).replace("|", "\\|") for v in r) + " |")
    return "\n".join(lines) + "\n"


def text_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts -> an aligned plain-text table for the terminal."""
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    cells = [[fmt_value(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    head = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([head, "  ".join("-" * w for w in widths), *body])


def new_figure(n_rows: int = 1, n_cols: int = 1, size: tuple[float, float] = (5.0, 3.6)):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(size[0] * n_cols, size[1] * n_rows), squeeze=False)
    return fig, axes
