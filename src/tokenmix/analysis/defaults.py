"""Defaults of the analyses that the command line's help states, as plain constants: this module
imports neither torch nor matplotlib, so the parser can read it on every call (``tokenmix --help``
included) while the analyses themselves load only when a command runs."""

from __future__ import annotations

from fractions import Fraction

# cost accounting: a default that answers in about a minute on 2 cores; --full is the whole sweep
COST_QUICK_MIXERS = ("attention", "mamba2", "gla", "pow2", "pow2_ce", "sq1_ce")
COST_QUICK_TIME_N = (1024, 4096)
COST_FULL_TIME_N = (1024, 2048, 4096, 8192, 16384)  # with every registered mixer
COST_QUICK_MIN_TIME = 0.5
COST_FULL_MIN_TIME = 2.0

# expressivity
OPERATOR_GRAPH_LIMIT = 1024  # materialised-operator graphs: O(n^2) memory, up to O(n^3) time
GRAPH_PATH_LIMIT = 8192  # pattern graphs that are not translation-invariant (lattice, Fenwick)
DEFAULT_TABLE_N = (256, 512, 1024, 2048, 4096, 8192)

# design: the space of candidate patterns (analysis/design.py)
FAMILIES = ("geom", "poly", "mix")
DEFAULT_BASES = tuple(Fraction(6 + i, 4) for i in range(11))  # 1.5, 1.75, ..., 4
DEFAULT_POWERS = (2, 3, 4)
DEFAULT_MIX_WINDOWS = (2, 4, 8)
DEFAULT_MIX_BASES = (Fraction(2), Fraction(3))
DEFAULT_WINDOWS = (4, 16, 64)
