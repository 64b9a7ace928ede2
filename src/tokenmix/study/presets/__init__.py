"""Every preset module, imported explicitly (one line each) so the list is readable; importing this
package registers them all. The mechanism: ``study/presets/base.py``."""

from tokenmix.study.presets.base import (
    KINDS,
    AnalysisPlan,
    Preset,
    compare_preset,
    get_preset,
    load_preset_file,
    presets,
    register_preset,
    registered,
)
from tokenmix.study.presets import quick  # compare: the paper's table at length 32
from tokenmix.study.presets import recall  # compare: quick's MQAR column to its plateau
from tokenmix.study.presets import paper  # compare: the full grid
from tokenmix.study.presets import depth  # compare: entity tracking vs layers
from tokenmix.study.presets import depth_long  # compare: depth's n = 3 column, long budget
from tokenmix.study.presets import state  # compare: parity and A5, tested at 4x the length
from tokenmix.study.presets import frontier  # compare: MQAR frontier at 64-256 (and the full grid)
from tokenmix.study.presets import lm  # lm: default, small, tiny
from tokenmix.study.presets import analysis  # analysis: quick, full

__all__ = [
    "KINDS",
    "AnalysisPlan",
    "Preset",
    "compare_preset",
    "get_preset",
    "load_preset_file",
    "presets",
    "register_preset",
    "registered",
]
