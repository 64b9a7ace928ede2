"""Every mixer config refuses a size that is not > 0 (``MixerConfig.require_positive``) in one
InputError line naming the field: zero, negative and NaN alike, for every registered mixer's heads
and, where it has one, its chunk size (the Fenwick-level rows also want a power of two)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mixer_helpers import ALL_MIXERS
from tokenmix.core.errors import InputError
from tokenmix.mixers.registry import get_mixer_spec

BAD = [0, -1, math.nan]


@pytest.mark.parametrize("value", BAD, ids=["zero", "negative", "nan"])
@pytest.mark.parametrize("name", ALL_MIXERS)
def test_sizes_that_are_not_positive_are_refused(name, value):
    spec = get_mixer_spec(name)
    spec.make_config()  # the defaults pass
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    for field in ("n_heads", "chunk_size"):
        if field in fields:
            with pytest.raises(InputError, match=f"^{field} must be (a power of two )?> 0, got {value}$"):
                spec.make_config(**{field: value})
