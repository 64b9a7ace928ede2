"""The candidate space of ``tokenmix design`` (module docstring of ``analysis/design.py``): the families
geom / poly / mix of f:EXPR patterns, the named patterns, windows and lattices, and the limits that keep
the space to something a person reads."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tokenmix.analysis.defaults import (
    DEFAULT_BASES,
    DEFAULT_MIX_BASES,
    DEFAULT_MIX_WINDOWS,
    DEFAULT_POWERS,
    DEFAULT_WINDOWS,
    FAMILIES,
)
from tokenmix.core.errors import InputError
from tokenmix.patterns import Pattern, get_pattern

NAMED = ("pow2", "sq1", "pow2_ce", "sq1_ce", "fenwick", "first_order")  # then window:M, then dense
# The candidate count and the denominators of rational bases keep the space and the f:EXPR specs (at
# most 256 characters) to something a person reads.
MAX_CANDIDATES = 400
MAX_DENOMINATOR = 1000


@dataclass(frozen=True)
class Candidate:
    """One point of the space: a pattern spec (``get_pattern(spec, cache_efficient)``) and its label."""

    name: str  # what tables show: pow2_ce, geom:1.5, geom:1.5_ce, mix:4+2, f:5**k
    family: str  # named | user | geom | poly | mix
    spec: str  # pattern spec without the _ce suffix (StructuredConfig.pattern)
    cache_efficient: bool  # the lattice variant (StructuredConfig.cache_efficient)
    formula: str = ""  # f(k) in words

    @property
    def variant(self) -> str:
        if self.cache_efficient:
            return "lattice"
        return "fenwick" if self.spec == "fenwick" else "exact"

    def pattern(self) -> Pattern:
        return get_pattern(self.spec, self.cache_efficient)


def _fmt(b: Fraction) -> str:
    return f"{float(b):g}" if b.denominator <= 100 else f"{b.numerator}/{b.denominator}"


def _ceil_ratio(num: str, den: str) -> str:
    """Integer-arithmetic ceil(num / den) as f:EXPR text."""
    return f"-((-{num})//{den})"


def geom_candidate(b: Fraction) -> Candidate:
    p, q = b.numerator, b.denominator
    expr = f"{p}**k" if q == 1 else _ceil_ratio(f"{p}**k", f"{q}**k")
    return Candidate(f"geom:{_fmt(b)}", "geom", f"f:{expr}", False, f"ceil({_fmt(b)}^k)")


def poly_candidate(p: int) -> Candidate:
    return Candidate(f"poly:{p}", "poly", f"f:k**{p}+1", False, f"k^{p}+1")


def mix_candidate(w: int, b: Fraction) -> Candidate:
    p, q = b.numerator, b.denominator
    ind = f"0**({w}//(k+1))"  # [k >= w]: w // (k + 1) is 0 exactly when k + 1 > w
    m = f"((k+1-{w})*{ind})"  # k - w + 1 from k = w on, 0 before (no negative power)
    tail = f"{w}*{p}**{m}" if q == 1 else _ceil_ratio(f"{w}*{p}**{m}", f"{q}**{m}")
    return Candidate(
        f"mix:{w}+{_fmt(b)}",
        "mix",
        f"f:(k+1)*(1-{ind})+{ind}*({tail})",
        False,
        f"k+1 for k<{w}, then ceil({w}*{_fmt(b)}^(k-{w - 1}))",
    )


def _lattice_of(c: Candidate) -> Candidate:
    return Candidate(c.name + "_ce", c.family, c.spec, True, c.formula)


def _has_lattice(c: Candidate) -> bool:
    try:
        c.pattern()
        get_pattern(c.spec, True)
    except InputError:
        return False
    return True


@dataclass(frozen=True)
class DesignSpace:
    """Which candidates a design run compares (see the module docstring for each family).

    Attributes:
        families: among ``FAMILIES``; the named patterns are always in.
        bases: b of geom (rational, > 1). powers: p of poly (integers >= 1).
        mix_windows / mix_bases: w and b of mix (every pair).
        windows: M of the named window:M rows.
        patterns: the user's specs (``--pattern``), each joining the space.
        lattice: add each family member's (and user f:EXPR's) lattice variant.
    """

    families: tuple[str, ...] = FAMILIES
    bases: tuple[Fraction, ...] = DEFAULT_BASES
    powers: tuple[int, ...] = DEFAULT_POWERS
    mix_windows: tuple[int, ...] = DEFAULT_MIX_WINDOWS
    mix_bases: tuple[Fraction, ...] = DEFAULT_MIX_BASES
    windows: tuple[int, ...] = DEFAULT_WINDOWS
    patterns: tuple[str, ...] = ()
    lattice: bool = True

    def __post_init__(self) -> None:
        for name in ("bases", "mix_bases"):  # 1.75 from Python code is read as written (7/4), not as a float
            values = []
            for b in getattr(self, name):
                try:
                    values.append(b if isinstance(b, Fraction) else Fraction(str(b)))
                except (ValueError, ZeroDivisionError):
                    raise InputError(f"a geometric base must be a number > 1, got {b!r}") from None
            object.__setattr__(self, name, tuple(values))
        for fam in self.families:
            if fam not in FAMILIES:
                raise InputError(f"unknown pattern family '{fam}'; known: {', '.join(FAMILIES)}")
        for b in (*self.bases, *self.mix_bases):
            if b <= 1:
                raise InputError(f"a geometric base must be a number > 1, got {b}")
            if b.denominator > MAX_DENOMINATOR:
                raise InputError(f"geometric base {b} has denominator {b.denominator}; at most {MAX_DENOMINATOR}")
        for what, values in (("poly power", self.powers), ("mix window", self.mix_windows), ("window", self.windows)):
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise InputError(f"a {what} must be an integer >= 1, got {v!r}")
        for p in self.powers:
            if p > 64:
                raise InputError(f"poly power {p} > 64: k^p + 1 passes every n from k = 2 on")

    def candidates(self) -> list[Candidate]:
        """Every candidate, named first, then the user's, then the families (order = merge priority)."""
        out = [Candidate(name, "named", name.removesuffix("_ce"), name.endswith("_ce")) for name in NAMED]
        out += [Candidate(f"window:{m}", "named", f"window:{m}", False) for m in self.windows]
        out.append(Candidate("dense", "named", "dense", False))
        for spec in self.patterns:
            base, ce = (spec[:-3], True) if spec.endswith("_ce") else (spec, False)
            c = Candidate(spec, "user", base, ce, base[2:] if base.startswith("f:") else "")
            c.pattern()  # a bad spec or f:EXPR is bad input, one line
            out.append(c)
            if not ce and base.startswith("f:") and self.lattice and _has_lattice(c):
                out.append(_lattice_of(c))
        fams: list[Candidate] = []
        if "geom" in self.families:
            fams += [geom_candidate(b) for b in self.bases]
        if "poly" in self.families:
            fams += [poly_candidate(p) for p in self.powers]
        if "mix" in self.families:
            fams += [mix_candidate(w, b) for w in self.mix_windows for b in self.mix_bases]
        for c in fams:
            try:
                c.pattern()
            except InputError as e:
                raise InputError(f"family member {c.name} (f(k) = {c.formula}) is not a pattern: {e}") from None
            out.append(c)
            if self.lattice:
                out.append(_lattice_of(c))  # f(0) = 1 and unbounded for every family (module docstring)
        if len(out) > MAX_CANDIDATES:
            raise InputError(
                f"the design space has {len(out)} candidates; at most {MAX_CANDIDATES} "
                "(use fewer bases, powers or windows)"
            )
        return out

    def settings(self) -> dict[str, Any]:
        """The space as JSON-ready values (bases as text)."""
        return {
            "families": list(self.families),
            "bases": [_fmt(b) for b in self.bases],
            "powers": list(self.powers),
            "mix_windows": list(self.mix_windows),
            "mix_bases": [_fmt(b) for b in self.mix_bases],
            "windows": list(self.windows),
            "patterns": list(self.patterns),
            "lattice": self.lattice,
        }


def value_list(text: str, flag: str, integer: bool = False) -> tuple:
    """``--bases 1.5:4:0.25`` (start:stop:step, stop included) or ``2,3,4`` -> exact values
    (``Fraction``, or ``int`` with ``integer``); decimals are read exactly (0.1 is 1/10)."""

    def num(s: str):
        try:
            v = Fraction(s.strip())
        except (ValueError, ZeroDivisionError):
            raise InputError(f"{flag}: '{s.strip()}' is not a number (give a,b,c or start:stop:step)") from None
        if integer:
            if v.denominator != 1:
                raise InputError(f"{flag}: '{s.strip()}' is not an integer")
            return int(v)
        return v

    text = text.strip()
    if not text:
        raise InputError(f"{flag} is empty (give a,b,c or start:stop:step)")
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise InputError(f"{flag}: a range is start:stop:step, got '{text}'")
        lo, hi, step = (num(p) for p in parts)
        if step <= 0 or hi < lo:
            raise InputError(f"{flag}: a range needs step > 0 and stop >= start, got '{text}'")
        count = int((hi - lo) / step) + 1
        if count > MAX_CANDIDATES:
            raise InputError(f"{flag}: '{text}' has {count} values; at most {MAX_CANDIDATES}")
        return tuple(lo + i * step for i in range(count))
    return tuple(dict.fromkeys(num(p) for p in text.split(",") if p.strip()))
