"""The §4.2–4.3 table (``tokenmix analyze expressivity``): the metrics of ``analysis/expressivity.py`` for
the paper's pattern rows and for registered mixers (through their pattern when their operator graph is
exactly the pattern's, else through the materialised operator), each row with what the paper says."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from tokenmix.analysis import matrices
from tokenmix.analysis.defaults import DEFAULT_TABLE_N, GRAPH_PATH_LIMIT, OPERATOR_GRAPH_LIMIT
from tokenmix.analysis.expressivity import CommunicationGraph, operator_graph, operator_metrics, pattern_metrics
from tokenmix.core.errors import InputError
from tokenmix.core.operator import MixOperator
from tokenmix.mixers.registry import build_mixer, get_mixer_spec
from tokenmix.patterns import Pattern, get_pattern


def paper_expectation(key: str, n: int, offset: int, window: int | None = None) -> tuple[str, object]:
    """(what §4.2–4.3 says, predicate on a metrics record or None) for the rows of the table.

    ``window``: a local attention's window (positions attended, the current one included).
    """
    half = n // 2
    if key == "pow2":
        bound = (n - 1).bit_length()
        worst = max(bin(g).count("1") for g in range(1, half + 1))
        return (
            f"path = popcount(gap), max {bound}; congestion = popcount(L) = {bin(offset).count('1')}, "
            f"≤ log2 n (max over L ≤ n/2: {worst})",
            lambda r: (
                r["path_max"] == bound
                and r["congestion"] == bin(offset).count("1")
                and r.get("congestion_worst") == worst
                and worst <= math.log2(n)
            ),
        )
    if key == "sq1":
        return (
            "path ≤ 4; congestion ≤ 4",
            lambda r: r["path_max"] <= 4 and r["congestion"] <= 4 and r.get("congestion_worst", 0) <= 4,
        )
    if key in ("first_order", "window:1", "diag_ssm"):  # the paper's "diagonal SSM" row
        return (
            f"path = n − 1 = {n - 1}; congestion = L = {offset}",
            lambda r: r["path_max"] == n - 1 and r["congestion"] == offset,
        )
    if key.startswith("window:"):
        m = int(key.split(":")[1])
        return (
            f"path = ⌈(n − 1)/{m}⌉ = {-(-(n - 1) // m)}; congestion = ⌈L/{m}⌉ = {-(-offset // m)}",
            lambda r: r["path_max"] == -(-(n - 1) // m) and r["congestion"] == -(-offset // m),
        )
    if key in ("dense", "attention"):
        return "path 1; congestion 1", lambda r: r["path_max"] == 1 and r["congestion"] == 1
    if key == "local_attention":
        # window w = positions attended including the current one: one hop covers gaps up to w - 1
        reach = math.inf if window is None else window - 1
        path = "1" if n - 1 <= reach else "∞ (B = 0: nothing beyond the window in one layer)"
        cong = "1" if offset <= reach else "∞"
        return (
            f"path {path}; congestion {cong} (window {window})",
            lambda r: (
                (r["path_max"] == 1 if n - 1 <= reach else math.isinf(r["path_max"]))
                and (r["congestion"] == 1 if offset <= reach else math.isinf(r["congestion"]))
            ),
        )
    if key.endswith("_ce"):
        return "— (not in the paper's table)", None
    return "—", None


def _mixer_operator(name: str, n: int, seed: int, d_model: int, n_heads: int) -> tuple[object, MixOperator]:
    torch.manual_seed(seed)
    mixer = build_mixer(name, d_model, n_heads=n_heads).double().eval()
    x = torch.randn(1, n, d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    with torch.no_grad():
        return mixer, mixer.materialize(x).validate()


def mixer_pattern(
    name: str, seed: int = 0, d_model: int = 16, n_heads: int = 2, check_n: int = 33
) -> tuple[Pattern | None, object]:
    """(the mixer's pattern if its operator graph is exactly the pattern's graph at check_n, the mixer)."""
    mixer, op = _mixer_operator(name, check_n, seed, d_model, n_heads)
    pattern = getattr(mixer, "pattern", None)
    if not isinstance(pattern, Pattern):
        return None, mixer
    g_op = operator_graph(op, name)
    g_pat = CommunicationGraph.from_pattern(pattern, check_n)
    return (pattern if np.array_equal(g_op.distances(), g_pat.distances()) else None), mixer


def expressivity_table(
    patterns: Sequence[str],
    mixers: Sequence[str],
    ns: Sequence[int] = DEFAULT_TABLE_N,
    *,
    offset: int | None = None,
    layers: int = 4,
    operator_limit: int = OPERATOR_GRAPH_LIMIT,
    path_limit: int = GRAPH_PATH_LIMIT,
    seed: int = 0,
    d_model: int = 16,
    n_heads: int = 2,
    tol: float = 1e-3,
    progress=None,
) -> list[dict]:
    """One record per (row, n). ``offset`` None = n // 2 (copy the first half into the second).

    Registered mixers whose operator graph equals their pattern's graph use the pattern at every n
    (a mixer whose pattern is already a row is listed under that row's ``mixers``); other mixers are
    materialised and analysed up to ``operator_limit`` (rows beyond say so).
    """
    for n in ns:
        if n < 2:
            raise InputError(f"n must be >= 2 for pair metrics, got {n}")
    rows = _table_rows_of(patterns, mixers, seed, d_model, n_heads)
    records = []
    for row in rows:
        for n in ns:
            if progress is not None:
                progress(f"expressivity: {row['key']} n={n}")
            off = n // 2 if offset is None else offset
            if not 0 < off < n:
                raise InputError(f"copy offset must be in [1, n), got {off} for n = {n}")
            rec = _row_metrics(row, n, off, layers, operator_limit, path_limit, seed, d_model, n_heads, tol)
            records.append(_with_paper(rec, row, n, off))
    return records


def _table_rows_of(patterns: Sequence[str], mixers: Sequence[str], seed: int, d_model: int, n_heads: int) -> list[dict]:
    """The table's rows: one per pattern, then one per mixer whose pattern is not already a row."""
    rows: list[dict] = [
        {"key": p, "source": "pattern", "pattern": get_pattern(p), "mixers": [], "window": None} for p in patterns
    ]
    for name in mixers:
        get_mixer_spec(name)
        pat, mixer = mixer_pattern(name, seed, d_model, n_heads)
        window = getattr(getattr(mixer, "config", None), "window", None)
        same = next(
            (r for r in rows if pat is not None and r["pattern"] is not None and r["pattern"].name == pat.name), None
        )
        if same is not None:
            same["mixers"].append(name)
            continue
        rows.append(
            {
                "key": name,
                "source": "pattern" if pat is not None else "operator",
                "pattern": pat,
                "mixers": [name],
                "window": window,
                "mixer": mixer,
            }
        )
    return rows


def _row_metrics(
    row: dict,
    n: int,
    off: int,
    layers: int,
    operator_limit: int,
    path_limit: int,
    seed: int,
    d_model: int,
    n_heads: int,
    tol: float,
) -> dict:
    """One row's metrics at length n: through its pattern, its materialised operator, or why it is skipped."""
    key, pat = row["key"], row["pattern"]
    if pat is not None:
        rec = pattern_metrics(pat, n, off, layers, path_limit)
        rec["pattern"] = pat.name
        return rec
    # x4: the per-(head, channel) supports and distance matrices come on top of (A, B, R)
    if n <= operator_limit and 4 * matrices.operator_bytes(row["mixer"], n) <= matrices.MAX_OPERATOR_BYTES:
        _, op = _mixer_operator(key, n, seed, d_model, n_heads)
        return operator_metrics(op, key, off, layers, tol)
    if n <= operator_limit:
        return {
            "n": n,
            "offset": off,
            "method": f"skipped: the operator (heads x state channels x n^2) "
            f"would exceed {matrices.MAX_OPERATOR_BYTES / 2**30:.0f} GiB; pattern rows still run",
        }
    return {
        "n": n,
        "offset": off,
        "method": f"skipped: operator graphs are materialised only up to n = {operator_limit}; pattern rows still run",
    }


def _with_paper(rec: dict, row: dict, n: int, off: int) -> dict:
    """The record labelled with its row, and what the paper says with whether the metrics agree."""
    key, pat = row["key"], row["pattern"]
    rec.update(row=key, source=row["source"], mixers=row["mixers"])
    if row["window"] is not None:
        rec["window"] = row["window"]
    text, check = paper_expectation(pat.name if pat is not None else key, n, off, row["window"])
    rec["paper"] = text
    if check is not None and "path_max" in rec:
        rec["agrees"] = bool(check(rec))
    return rec
