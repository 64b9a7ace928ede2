"""The one check of a user's seed: torch's generators take a 64-bit seed, and ``generate`` seeds row i
of a request with seed + i, so a seed must lie in [0, 2**63). Every command and the generation config
refuse any other in the same words (bad input: one line, exit 2)."""

from __future__ import annotations

from tokenmix.core.errors import InputError

SEED_LIMIT = 2**63


def check_seed(value: int, flag: str = "--seed") -> None:
    """Refuse a seed torch's generators cannot take (negative, or 2**63 and above), naming ``flag``."""
    if not 0 <= value < SEED_LIMIT:
        raise InputError(f"{flag} must be in [0, 2**63), got {value}")
