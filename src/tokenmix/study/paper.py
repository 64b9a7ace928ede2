"""The paper's facts, stated once: Fagnou et al. (ICML 2026), Table 1 and the rows it compares.

Everything that quotes the paper (the compare table's "paper" columns, the claims, the default rows
of the presets, the analysis presets) imports it from here.
"""

from __future__ import annotations

from typing import Any

# framework.md §5.1 (Table 1 of the paper, as reproduced by the papernotes note), keyed by our names.
# The paper's "Diagonal SSM" row has O(1) time and cache per token and path n: a first-order B in the
# paper's own parameterisation, which is our ``first_order`` (the structured recurrence with the
# first-order pattern; ``kth_order`` is the same mixer with 4 sub-diagonals). ``diag_ssm`` (Mamba-1's
# selective scan with N states per channel) is framework §2.3's "diagonal SSM with state expansion N",
# O(N) per token, a different row: it has no paper numbers here.
PAPER_TABLE: dict[str, dict[str, Any]] = {
    "attention": {
        "structure": "Attention",
        "time": "O(n)",
        "cache": "O(n)",
        "path": "1",
        "copy": 100.00,
        "assoc_recall": 100.00,
        "multi_hop": 39.21,
    },
    "local_attention": {
        "structure": "Local attention",
        "time": "O(k)",
        "cache": "O(k)",
        "path": "∞",
        "copy": 23.75,
        "assoc_recall": 26.20,
        "multi_hop": 23.59,
    },
    "first_order": {
        "structure": "Diagonal SSM",
        "time": "O(1)",
        "cache": "O(1)",
        "path": "n",
        "copy": 42.98,
        "assoc_recall": 32.53,
        "multi_hop": 27.17,
    },
    "kth_order": {
        "structure": "k-th order recurrence",
        "time": "O(k)",
        "cache": "O(k)",
        "path": "n/k",
        "copy": 74.66,
        "assoc_recall": 41.12,
        "multi_hop": 39.08,
    },
    "dense_recurrence": {
        "structure": "Dense recurrence",
        "time": "O(n)",
        "cache": "O(n)",
        "path": "1",
        "copy": 100.00,
        "assoc_recall": 99.99,
        "multi_hop": 99.80,
    },
    "pow2": {
        "structure": "f(k) = 2^k",
        "time": "O(log n)",
        "cache": "O(n)",
        "path": "≤ log2 n",
        "copy": 92.63,
        "assoc_recall": 49.03,
        "multi_hop": 34.85,
    },
    "pow2_ce": {
        "structure": "f(k) = 2^k, cache-efficient",
        "time": "O(log n)",
        "cache": "O(log n)",
        "path": "—",
        "copy": 75.47,
        "assoc_recall": 52.59,
        "multi_hop": 38.63,
    },
    "sq1": {
        "structure": "f(k) = k²+1",
        "time": "O(√n)",
        "cache": "O(n)",
        "path": "≤ 4",
        "copy": 99.66,
        "assoc_recall": 53.61,
        "multi_hop": 35.68,
    },
    "sq1_ce": {
        "structure": "f(k) = k²+1, cache-efficient",
        "time": "O(√n)",
        "cache": "O(√n)",
        "path": "—",
        "copy": 91.59,
        "assoc_recall": 54.56,
        "multi_hop": 38.02,
    },
}
DIAGONAL_SSM = "first_order"  # our row for the paper's "Diagonal SSM"
PAPER_TASKS = ("copy", "assoc_recall", "multi_hop")


# the paper's rows in its table order: what the compare presets train when the mixers are registered
PAPER_ROWS = tuple(PAPER_TABLE)
# the recurrence patterns of framework §4.2-4.3's path/congestion table, and the attention mixers beside them
PAPER_PATTERNS = ("first_order", "window:4", "dense", "pow2", "pow2_ce", "sq1", "sq1_ce")
PAPER_ATTENTION = ("attention", "local_attention")
# the analysis presets' mixers: the paper's rows plus Mamba-1's diagonal SSM with state expansion (§2.3)
PAPER_MIXERS = (
    "attention",
    "local_attention",
    "diag_ssm",
    "first_order",
    "kth_order",
    "dense_recurrence",
    "pow2",
    "pow2_ce",
    "sq1",
    "sq1_ce",
)
