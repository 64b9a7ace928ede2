"""Fixtures shared by the whole suite (the helpers tests import live beside this file: mixer_helpers.py,
crosscheck_assertions.py, lm_helpers.py, tolerances.py; pytest puts this folder on the path)."""

from __future__ import annotations

import os

import pytest
import torch

# Triton fixes at its first import whether it interprets its kernels (on CPU tensors) or compiles them
# for a GPU, and any module may import it first (the backends, fla's checks): decide here, before all.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors and tiny models run faster on one thread, and far faster on a loaded machine.
    A module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
