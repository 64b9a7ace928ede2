"""The mixers every generic test runs over, and the test-size mixer they build."""

from __future__ import annotations

from tokenmix.checks.equivalence import small_mixer
from tokenmix.mixers.registry import mixer_names

ALL_MIXERS = mixer_names()

__all__ = ["ALL_MIXERS", "small_mixer"]
