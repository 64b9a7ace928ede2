from __future__ import annotations

import pytest
import torch

from tokenmix.checks.equivalence import small_mixer  # noqa: F401  (test-size mixer, chunk size 4)
from tokenmix.mixers.registry import mixer_names


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield


ALL_MIXERS = mixer_names()
