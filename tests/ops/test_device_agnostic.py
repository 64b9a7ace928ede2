"""Every registered mixer, every mode, and its decode step, on tensors that are not on the CPU.

The ``meta`` device has shapes and dtypes but no data: every host round trip on a meta tensor
(``.numpy()``, ``.item()``, ``.tolist()``, ``.cpu()``, ``int(t)``, ``bool(t)``, a numba call, which
reads through numpy) raises, where on a GPU it would stall the device or fail. Each case runs one
mixer on meta tensors; a case that meets a round trip fails naming it (file:line).

No case is marked as a known failure: the round trips the first audit found on these paths are
fixed (docs/notes/backends.md, section A); what remains there (packing and left padding, and
host-built tables uploaded per call, which ``meta`` does not see) is outside this matrix.

Cases per mixer: ``forward-<mode>`` (a fresh segment, autograd on: the training path),
``continue-<mode>`` (a second segment from the first one's state: a chunked prefill), ``step``
(two tokens from no state, autograd on: the step autograd records) and ``decode`` (no autograd: a
prefill through the recurrent mode, then tokens: the decode strategies' fast reads).
"""

from __future__ import annotations

import functools
import traceback

import pytest
import torch

from mixer_helpers import ALL_MIXERS, small_mixer
from tokenmix.mixers.registry import get_mixer_spec

pytestmark = pytest.mark.usefixtures("one_thread")

T = 11


class HostRoundTrip(Exception):
    """A mixer read data of a device tensor back to the host (the message names where)."""


def _cases(name: str) -> list[str]:
    modes = get_mixer_spec(name).cls.modes
    return [f"{kind}-{mode}" for mode in modes for kind in ("forward", "continue")] + ["step", "decode"]


def _params():
    return [pytest.param(name, case, id=f"{name}-{case}") for name in ALL_MIXERS for case in _cases(name)]


@functools.cache
def _meta_mixer(name: str):
    return small_mixer(name, dtype=torch.float32).to("meta")


def _run(m, case: str) -> None:
    x = torch.randn(2, T, m.d_model).to("meta")
    if case.startswith("forward-"):
        y, _ = m(x.requires_grad_(), mode=case.removeprefix("forward-"))
        assert y.shape == x.shape and y.device.type == "meta"
    elif case.startswith("continue-"):  # a second segment after the state of a first (chunked prefill)
        mode = case.removeprefix("continue-")
        _, state = m(x[:, :5], mode=mode)
        y, _ = m(x[:, 5:].requires_grad_(), state, mode=mode)
        assert y.shape == (2, T - 5, m.d_model) and y.device.type == "meta"
    elif case == "step":
        y, state = m.step(x[:, 0], None)
        y, state = m.step(x[:, 1], state)
        assert y.shape == (2, m.d_model) and y.device.type == "meta"
    else:
        with torch.no_grad():
            _, state = m(x[:, : T - 3], mode="recurrent")
            for s in range(T - 3, T):
                y, state = m.step(x[:, s], state)
        assert y.shape == (2, m.d_model) and y.device.type == "meta"


def _site(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "tokenmix" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{f.filename.rpartition('tokenmix/')[2]}:{f.lineno}: {f.line}"


@pytest.mark.parametrize("name,case", _params())
def test_runs_on_a_device_without_host_round_trips(name, case):
    m = _meta_mixer(name)
    try:
        _run(m, case)
    except (RuntimeError, TypeError, NotImplementedError) as e:
        if "meta" not in str(e):
            raise
        raise HostRoundTrip(f"{name} {case}: host round trip at {_site(e)} ({type(e).__name__}: {e})") from e
