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

__all__ = [
    "Pattern",
    "TranslationInvariant",
    "Lattice",
    "Fenwick",
    "fenwick_level",
    "get_pattern",
    "pattern_names",
    "parse_f",
    "shortest_paths",
    "pattern_report",
]

_BUILTIN: dict[str, Callable[[], Pattern]] = {
    "pow2": lambda: TranslationInvariant(lambda k: 2**k, "pow2"),
    "sq1": lambda: TranslationInvariant(lambda k: k * k + 1, "sq1"),
    "dense": lambda: TranslationInvariant(lambda k: k + 1, "dense"),
    "first_order": lambda: TranslationInvariant(lambda k: k + 1, "first_order", max_levels=1),
    "fenwick": Fenwick,
}

# Limits on ``f:EXPR`` (user input; every bound is checked before the work it guards is done).
# A distance of f is a number of positions, so a value past 2^F_MAX_BITS is useless (no sequence is
# that long) and only costs time and memory: 9**9**9 alone would be a 370-million-digit integer.
# 4096 bits still admit every f whose first 64 values (checked up front for monotonicity) are at most
# 2^4096, e.g. k**k (f(63) ~ 2^377) or 2**(k*k) (f(63) = 2^3969), and keep each step to microseconds.
F_MAX_BITS = 4096
F_MAX_CHARS = 256  # an expression in k longer than this is not a pattern anyone means
F_MAX_DEPTH = 64  # nesting of operators; also keeps the recursive evaluation far from Python's limit
# window:M keeps M distances, and a decoder caches M positions per layer (2 GiB per layer and
# sequence at 512 floats a position for M = 2^20): a larger window does not fit, use 'dense'.
MAX_WINDOW = 2**20


class _Refused(InputError):
    """A value f would compute is refused (too large, a division by zero, a negative power); ``parse_f``
    adds the expression and the k at which it happened."""


def _show(expr: str) -> str:
    """The expression as messages quote it: 'f:EXPR', cut short if long (a message stays one line)."""
    expr = "".join(c if c.isprintable() else "?" for c in expr)
    return f"'f:{expr}'" if len(expr) <= 60 else f"'f:{expr[:57]}...'"


def _checked(value: int) -> int:
    """``value`` if its magnitude is within F_MAX_BITS bits, else refused naming the limit."""
    if value.bit_length() > F_MAX_BITS:
        raise _Refused(
            f"a value of {value.bit_length()} bits; values (and intermediate results) are limited to {F_MAX_BITS} bits"
        )
    return value


def _power(base: int, exp: int) -> int:
    """base ** exp, refused *before* it is computed when the result would pass F_MAX_BITS bits.

    |base| >= 2 gives |base|^exp >= 2^((bits(base) - 1) exp), a lower bound on the result's size that
    costs nothing; |base| <= 1 has a result of size <= 1 for any exponent, computed directly (pow
    with a huge exponent would still square its way through every bit of it).
    """
    if exp < 0:
        raise _Refused(f"negative exponent in {base}**{exp} (f must be integer-valued)")
    if base in (0, 1, -1):
        return 1 if exp == 0 else (base if exp % 2 else abs(base))
    if exp > F_MAX_BITS or (abs(base).bit_length() - 1) * exp > F_MAX_BITS:
        raise _Refused(
            f"{base}**{exp} has more than {F_MAX_BITS} bits; values (and intermediate results) are "
            f"limited to {F_MAX_BITS} bits"
        )
    return _checked(base**exp)


def _divide(op: Callable[[int, int], int], a: int, b: int) -> int:
    if b == 0:
        raise _Refused(f"division by zero ({a} {'//' if op is operator.floordiv else '%'} 0)")
    return op(a, b)


_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: _checked(a + b),
    ast.Sub: lambda a, b: _checked(a - b),
    ast.Mult: lambda a, b: _checked(a * b),  # operands have <= F_MAX_BITS bits: cheap to compute first
    ast.Pow: _power,
    ast.FloorDiv: lambda a, b: _divide(operator.floordiv, a, b),
    ast.Mod: lambda a, b: _divide(operator.mod, a, b),
}


def _depth(tree: ast.AST) -> int:
    """Nesting depth of an expression tree, walked without recursion (a deep tree is the input)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def parse_f(expr: str) -> Callable[[int], int]:
    """Parse an integer expression in ``k`` (+ - * ** // %, integer literals) into f(k); no eval.

    Everything about the expression is user input, so every way it can fail is an ``InputError``: a
    syntax error, a division by zero, a negative exponent (a float), a value past ``F_MAX_BITS`` bits
    (refused before it is computed: ``f:9**9**9`` or ``f:2**2**k`` would otherwise take minutes and
    gigabytes), an expression longer than ``F_MAX_CHARS`` or nested deeper than ``F_MAX_DEPTH`` (which
    would otherwise end in a RecursionError). The returned f raises the same way for the k it is given.
    """
    if len(expr) > F_MAX_CHARS:
        raise InputError(
            f"invalid pattern function {_show(expr)}: {len(expr)} characters, at most {F_MAX_CHARS} allowed"
        )
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        raise InputError(f"invalid pattern function {_show(expr)}: not an expression in k") from None
    if _depth(tree) > F_MAX_DEPTH:
        raise InputError(f"invalid pattern function {_show(expr)}: nested deeper than {F_MAX_DEPTH} levels")

    def ev(node: ast.AST, k: int) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return _checked(node.value)
        if isinstance(node, ast.Name) and node.id == "k":
            return k
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left, k), ev(node.right, k))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand, k)
        raise InputError(f"invalid pattern function {_show(expr)}: only integers, k and + - * ** // % allowed")

    def f(k: int) -> int:
        try:
            return ev(tree, k)
        except _Refused as e:
            raise InputError(f"pattern function {_show(expr)} at k = {k}: {e}") from None

    f(0)  # surface syntax errors now, not at first use
    return f


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
            if m < 1 or m > MAX_WINDOW:
                raise InputError(
                    f"invalid pattern '{spec}': window size (order) must be in 1..{MAX_WINDOW} "
                    "(a longer window does not fit in memory; use 'dense')"
                )
            pat = TranslationInvariant(lambda k: k + 1, spec, max_levels=m)
        elif spec.startswith("f:"):
            pat = TranslationInvariant(parse_f(spec[2:]), spec)
        else:
            raise InputError(f"unknown pattern '{spec}'; known: {', '.join(pattern_names())}")
    if cache_efficient:
        if not isinstance(pat, TranslationInvariant):
            raise InputError(f"pattern '{pat.name}' has no cache-efficient variant (needs a translation-invariant f)")
        if pat.max_levels is not None or pat.name == "dense":
            raise InputError(
                f"pattern '{pat.name}' is already bounded or dense; the lattice variant is for "
                "unbounded sparse f such as pow2 or sq1"
            )
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
