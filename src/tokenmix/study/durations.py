"""How long the long jobs take, stated once. README, ``tokenmix --help``, ``tokenmix check --help`` and
the presets' lines in ``tokenmix presets`` read this table; tests/test_durations.py fails when README
states another number.

Every entry is wall time on a quiet 2-core machine (the CI size), with where it comes from: measured
there, or estimated from the CPU time a run on a loaded machine used (CPU time hardly depends on the
load; wall time does). On a busy machine every job takes longer: the progress lines say so at the
start (core/progress.py). Light on purpose (no torch, no registry): the command line's parsers read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Duration:
    seconds: int  # wall seconds, quiet 2-core machine
    source: str  # the measurement (command, date) or the budget it is held to
    bound: str = "~"  # "~": measured, about; "≤": a budget the job is held to

    @property
    def text(self) -> str:
        """As stated everywhere: '~15 s', '~9 min', '≤ 90 min'."""
        if self.seconds < 60:
            amount = f"{self.seconds} s"
        else:
            amount = f"{round(self.seconds / 60)} min"
        return f"{self.bound}{amount}" if self.bound == "~" else f"{self.bound} {amount}"


DURATIONS: dict[str, Duration] = {
    # commands
    "compare quick": Duration(
        144,
        "tokenmix compare --out DIR (quick preset), 2026-12-06 on a quiet 2-core machine (1-min load 0.2 "
        "before): 2:24 wall, 280 CPU s in the parent and its 2 workers, 135 runs",
    ),
    "design": Duration(15, "tokenmix design --n 4096 --max-cache 32"),
    "list": Duration(3, "tokenmix list"),
    "check all": Duration(15, "tokenmix check --all"),
    "data prepare": Duration(60, "tokenmix data prepare --corpus shakespeare (download and BPE training)"),
    "train lm": Duration(300, "tokenmix train lm (default preset): 288 s (docs/results.md, LM table)"),
    "bench default": Duration(60, "analyze cost, bench solver, bench mixers at their defaults"),
    # the test suite
    "make test": Duration(
        375,
        "CI=true bash .ci/run in a fresh clone, 2026-12-06 on a quiet 2-core machine: 3227 passed, "
        "36 skipped (CUDA only) in 6:15 of pytest, 7:18 with the install",
    ),
    "fast tests": Duration(
        50,
        "pytest tests/core tests/patterns tests/ops, 2026-12-06 on a quiet 2-core machine: 927 tests, "
        "50 s wall, 52 CPU s",
    ),
    # compare presets (tokenmix presets)
    "compare recall": Duration(
        391,
        "tokenmix compare --preset recall --out DIR, 2026-12-06 on a quiet 2-core machine: 6:31 wall, "
        "765 CPU s, 27 runs",
    ),
    "compare depth": Duration(
        330,
        "tokenmix compare --preset depth --out DIR, 2026-12-06 on a quiet 2-core machine: 5:30 wall, "
        "644 CPU s, 72 runs",
    ),
    "compare depth_long": Duration(
        1096,
        "tokenmix compare --preset depth_long --out DIR, 2026-12-06 on a quiet 2-core machine: 18:16 wall, "
        "2058 CPU s, 15 runs",
    ),
    "compare state": Duration(3600, "its budget (study/presets/state.py)", "≤"),
    "compare frontier": Duration(
        5218,
        "tokenmix compare --preset frontier --out DIR, 2026-12-06 on a quiet 2-core machine (nothing else "
        "ran; 1-min load 0.7 before): 1:26:58 wall, 10 205 CPU s, 54 runs; its budget is 2 h "
        "(study/presets/frontier.py)",
    ),
    # lm presets
    "lm small": Duration(1200, "tokenmix train lm --preset small"),
}


def stated(key: str) -> str:
    """The duration of ``key`` as every text states it ('~9 min')."""
    return DURATIONS[key].text


__all__ = ["DURATIONS", "Duration", "stated"]
