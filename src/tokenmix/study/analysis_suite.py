"""``tokenmix report PRESET``: run an analysis preset's analyses into one folder, then report it.

Each analysis writes its own sub-folder (``matrix-<mixer>/``, ``cost/``, ``expressivity/``,
``norms/``); ``analysis.report.build_report`` turns the folder into one HTML page and Markdown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from tokenmix.analysis.accounting import run_accounting
from tokenmix.analysis.expressivity_report import run_expressivity
from tokenmix.analysis.matrices import analyze_registered
from tokenmix.analysis.norms import run_norms
from tokenmix.analysis.outputs import default_out_dir, prepare_out_dir
from tokenmix.analysis.report import build_report
from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import mixer_names
from tokenmix.study.paper import PAPER_ATTENTION, PAPER_PATTERNS
from tokenmix.study.presets import AnalysisPlan, get_preset, presets

# mixers whose communication graph is one of PAPER_PATTERNS already: the expressivity table lists
# them once, as patterns
PATTERN_BACKED = {"first_order", "kth_order", "dense_recurrence", "pow2", "pow2_ce", "sq1", "sq1_ce"}


def _registered(wanted: Sequence[str] | None) -> list[str]:
    known = mixer_names()
    return list(known) if wanted is None else [m for m in wanted if m in known]


def run_analysis_plan(plan: AnalysisPlan, out_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """Run every analysis of ``plan`` into sub-folders of ``out_dir``; returns out_dir."""
    out_dir = Path(out_dir)
    say = progress or (lambda msg: None)
    mc = plan.matrix
    for name in _registered(mc["mixers"]):
        say(f"matrix: {name}")
        sub = prepare_out_dir(out_dir / f"matrix-{name}", "matrix")
        analyze_registered(name, mc["n"], sub, d_model=mc["d_model"], n_heads=mc["n_heads"], formats=("png",))
    cc = dict(plan.cost)
    run_accounting(
        _registered(cc.pop("mixers")), prepare_out_dir(out_dir / "cost", "cost"), formats=("png",), progress=say, **cc
    )
    ec = plan.expressivity
    mixers = _registered(None) if ec.get("all_mixers") else _registered(PAPER_ATTENTION)
    run_expressivity(
        prepare_out_dir(out_dir / "expressivity", "expressivity"),
        formats=("png",),
        patterns=PAPER_PATTERNS,
        mixers=[m for m in mixers if m not in PATTERN_BACKED],
        ns=ec["ns"],
        progress=say,
    )
    nc = dict(plan.norms)
    run_norms(
        _registered(nc.pop("mixers")), prepare_out_dir(out_dir / "norms", "norms"), formats=("png",), progress=say, **nc
    )
    return out_dir


def report(
    source: str,
    out_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    runs_root: str | Path = "runs",
) -> dict:
    """Report a run directory, or run an analysis preset into a fresh ``report-<preset>-<time>`` folder
    (under ``out_dir`` when given, so that nothing else is written; else under ``runs_root``) first
    and report that."""
    path = Path(source)
    if path.is_dir():
        return {"run_dir": path, **build_report(path, out_dir)}
    names = [p.name for p in presets("analysis")]
    if source in names:
        run_dir = default_out_dir(source, runs_root if out_dir is None else out_dir, prefix="report")
        run_analysis_plan(get_preset("analysis", source).build(), run_dir, progress)
        return {"run_dir": run_dir, **build_report(run_dir, out_dir, title=f"tokenmix report: preset '{source}'")}
    if path.exists():
        raise InputError(f"'{source}' is not a directory (expected a run directory or a preset: {', '.join(names)})")
    raise InputError(f"no run directory or preset '{source}' (presets: {', '.join(names)})")
