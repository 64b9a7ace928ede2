"""Analysis presets (``tokenmix report NAME``): which analyses run on which mixers at which sizes,
before the report is built from their folder."""

from __future__ import annotations

from tokenmix.study.paper import PAPER_MIXERS
from tokenmix.study.presets.base import AnalysisPlan, Preset, register_preset

QUICK = AnalysisPlan(
    matrix={"mixers": ("pow2", "sq1_ce", "attention"), "n": 48, "d_model": 32, "n_heads": 2},
    cost={
        "mixers": PAPER_MIXERS,
        "cache_ns": (16, 48),
        "time_ns": (256, 512, 1024),
        "d_model": 64,
        "n_heads": 2,
        "repeats": 1,
        "time_budget_s": 5.0,
        "decode_budget_s": 10.0,
        "judge_time": False,
    },
    expressivity={"ns": (256, 512, 1024), "all_mixers": False},
    norms={"mixers": PAPER_MIXERS, "n": 64, "gram_iters": 10, "d_model": 32, "n_heads": 2},
)
FULL = AnalysisPlan(
    matrix={"mixers": None, "n": 128, "d_model": 64, "n_heads": 2},
    cost={
        "mixers": None,
        "cache_ns": (64, 256, 1024),
        "time_ns": (1024, 2048, 4096, 8192, 16384),
        "d_model": 256,
        "n_heads": 4,
        "repeats": 3,
        "time_budget_s": 60.0,
        "decode_budget_s": 120.0,
        "threads": 1,
        "clock": "cpu",
        "min_time_s": 2.0,
    },  # as `tokenmix analyze cost` by default
    expressivity={"ns": (256, 512, 1024, 2048, 4096, 8192), "all_mixers": True},
    norms={"mixers": None, "n": 256, "gram_iters": 10, "d_model": 64, "n_heads": 2},
)

register_preset(
    Preset(
        name="quick",
        kind="analysis",
        build=lambda: QUICK,
        source=__name__,
        summary="a first look (about 2 CPU-minutes): the paper's structures at small n, timings shown but not judged",
    )
)
register_preset(
    Preset(
        name="full",
        kind="analysis",
        build=lambda: FULL,
        source=__name__,
        summary="every registered mixer, timing over n = 1k..16k and the §4.2-4.3 table to n = 8192",
    )
)
