"""Every registered mixer, every mode, and its decode step, on tensors that are not on the CPU.

The ``meta`` device has shapes and dtypes but no data: every host round trip on a meta tensor
(``.numpy()``, ``.item()``, ``.tolist()``, ``.cpu()``, ``int(t)``, ``bool(t)``, a numba call, which
reads through numpy) raises, where on a GPU it would stall the device or fail. Each case runs one
mixer on meta tensors; a case that meets a round trip fails naming it (file:line).

The round trips known today are marked ``xfail(strict=True)`` with the round trip as the reason
(docs/notes/backends.md lists them with their fixes). Strict: fixing one makes its case pass and
the test then asks for the mark to be removed; a case that meets a *different* round trip than its
mark names fails outright.

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


# round trip -> (the file:line fragment the failure must point at, why it is one)
GLA_SPLIT = (
    "ops/chunked_gla.py:",
    "int(bad.sum()) in _split_rows: chunk rows sorted into the factored / safe form on the host",
)
SSD_WIDE = ("ops/chunked_ssd.py:", "int(wide.sum()): whether any chunk needs the safe form, counted on the host")

# (mixer, mode) -> its round trip, met by a fresh segment and by a continued one alike
IN_MODE = {
    ("retnet", "chunked"): GLA_SPLIT,
    ("gla", "chunked"): GLA_SPLIT,
    ("hgrn2", "chunked"): GLA_SPLIT,
    ("mesa_net", "chunked"): GLA_SPLIT,
    ("mamba2", "chunked"): SSD_WIDE,
}
KNOWN: dict[tuple[str, str], tuple[str, str]] = {
    **{(name, f"{kind}-{mode}"): rt for (name, mode), rt in IN_MODE.items() for kind in ("forward", "continue")},
}


def _cases(name: str) -> list[str]:
    modes = get_mixer_spec(name).cls.modes
    return [f"{kind}-{mode}" for mode in modes for kind in ("forward", "continue")] + ["step", "decode"]


def _params():
    out = []
    for name in ALL_MIXERS:
        for case in _cases(name):
            known = KNOWN.get((name, case))
            marks = [pytest.mark.xfail(strict=True, raises=HostRoundTrip, reason=known[1])] if known else []
            out.append(pytest.param(name, case, known, marks=marks, id=f"{name}-{case}"))
    return out


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


@pytest.mark.parametrize("name,case,known", _params())
def test_runs_on_a_device_without_host_round_trips(name, case, known):
    m = _meta_mixer(name)
    try:
        _run(m, case)
    except (RuntimeError, TypeError, NotImplementedError) as e:
        if "meta" not in str(e):
            raise
        site = _site(e)
        if known is not None and known[0] not in site:
            pytest.fail(f"{name} {case}: a host round trip other than the known one ({known[1]}) at {site}")
        raise HostRoundTrip(f"{name} {case}: host round trip at {site} ({type(e).__name__}: {e})") from e
