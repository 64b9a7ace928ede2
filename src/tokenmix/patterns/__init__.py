"""Pattern registry and spec parser.

Specs: ``pow2`` (f(k) = 2^k), ``sq1`` (f(k) = k^2 + 1), ``dense`` (all j < t), ``first_order``,
``window:M`` (m-th order, the M previous positions), ``fenwick``, ``f:EXPR`` for a user-supplied
strictly increasing f written in k (e.g. ``f:3**k``, ``f:k**3+1``), and a ``_ce`` suffix (or
``cache_efficient=True``) for the cache-efficient lattice variant of any translation-invariant f.
"""
from __future__ import annotations

import ast
import operator
from typing import Callable

from tokenmix.core.errors import InputError
from tokenmix.patterns.base import Pattern
from tokenmix.patterns.graph import shortest_paths
from tokenmix.patterns.translation import Fenwick, Lattice, TranslationInvariant, fenwick_level

__all__ = ["Pattern", "TranslationInvariant", "Lattice", "Fenwick", "fenwick_level", "get_pattern",
           "pattern_names", "parse_f", "shortest_paths", "pattern_report"]

_BUILTIN: dict[str, Callable[[], Pattern]] = {
    "pow2": lambda: TranslationInvariant(lambda k: 2**k, "pow2"),
    "sq1": lambda: TranslationInvariant(lambda k: k * k + 1, "sq1"),
    "dense": lambda: TranslationInvariant(lambda k: k + 1, "dense"),
    "first_order": lambda: TranslationInvariant(lambda k: k + 1, "first_order", max_levels=1),
    "fenwick": Fenwick,
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def parse_f(expr: str) -> Callable[[int], int]:
    """Parse an integer expression in ``k`` (+ - * ** // %, integer literals) into f(k); no eval."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        raise InputError(f"invalid pattern function 'f:{expr}': not an expression in k") from None

    def ev(node: ast.AST, k: int) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id == "k":
            return k
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left, k), ev(node.right, k))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand, k)
        raise InputError(f"invalid pattern function 'f:{expr}': only integers, k and + - * ** // % allowed")

    ev(tree, 0)  # surface syntax errors now, not at first use
    return lambda k: ev(tree, k)


def pattern_names() -> list[str]:
    return list(_BUILTIN) + ["window:M", "f:EXPR", "<name>_ce"]


def get_pattern(spec: str | Pattern, cache_efficient: bool = False) -> Pattern:
    """Build a pattern from its spec string (see module docstring)."""
    if isinstance(spec, Pattern):
        pat = spec
    else:
        if not isinstance(spec, str) or not spec:
            raise InputError(f"pattern spec must be a non-empty string, got {spec!r}")
        if spec.endswith("_ce"):
            spec, cache_efficient = spec[:-3], True
        if spec in _BUILTIN:
            pat = _BUILTIN[spec]()
        elif spec.startswith("window:"):
            try:
                m = int(spec.split(":", 1)[1])
            except ValueError:
                raise InputError(f"invalid pattern '{spec}': window size must be an integer") from None
            if m < 1:
                raise InputError(f"invalid pattern '{spec}': window size (order) must be >= 1")
            pat = TranslationInvariant(lambda k: k + 1, spec, max_levels=m)
        elif spec.startswith("f:"):
            pat = TranslationInvariant(parse_f(spec[2:]), spec)
        else:
            raise InputError(f"unknown pattern '{spec}'; known: {', '.join(pattern_names())}")
    if cache_efficient:
        if not isinstance(pat, TranslationInvariant):
            raise InputError(f"pattern '{pat.name}' has no cache-efficient variant (needs a translation-invariant f)")
        if pat.max_levels is not None or pat.name == "dense":
            raise InputError(f"pattern '{pat.name}' is already bounded or dense; the lattice variant is for "
                             "unbounded sparse f such as pow2 or sq1")
        pat = Lattice(pat)
    return pat


def pattern_report(pattern: Pattern, n: int, path_limit: int = 4096) -> dict:
    """The derived facts of a pattern at length n (shortest paths only up to ``path_limit``)."""
    if n < 1:
        raise InputError(f"n must be >= 1, got {n}")
    rep = {
        "pattern": pattern.name,
        "n": n,
        "neighbors_last_token": pattern.neighbors_per_token(n),
        "levels": pattern.n_levels(n),
        "nnz_B": pattern.nnz(n),
        "dense_nnz": n * (n - 1) // 2,
        "cache_size": pattern.cache_size(n),
    }
    if n <= path_limit:
        mx, mean = shortest_paths(pattern, n)
        rep["shortest_path_max"], rep["shortest_path_mean"] = mx, mean
    return rep
