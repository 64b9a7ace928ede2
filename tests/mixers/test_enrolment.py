"""Enrolling a mixer by the README's "Adding a mixer" steps is all it takes to join the checks.

A throw-away mixer (a causal moving average of two tokens, v_t = (u_t + u_{t-1}) / 2 per channel,
with exact ``shift``, ``dense`` and ``recurrent`` modes) is registered with ``register_mixer`` for
the duration of one test, and then:
(a) passes the generic mixer matrix (tests/mixers/test_mixer_matrix.py's checks, run on its name);
(b) gets a cross-check from a family checks module that only has to exist in a folder of the
    ``tokenmix.checks`` package: discovery imports it, and the discovery test's assertions
    (tests/checks/test_crosschecks.py) pick the check up and run it; a mixer of that family without a
    check fails them, naming the mixer;
(c) shows in ``tokenmix list --json``.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from test_mixer_matrix import check_mixer
from torch import Tensor

import tokenmix.checks
from crosscheck_assertions import assert_crosscheck_passes, assert_crosschecked, assert_declaration
from tokenmix.checks import CROSSCHECKS, family_modules, load_all_crosschecks
from tokenmix.cli.main import main
from tokenmix.core.operator import MixOperator, solve_dense
from tokenmix.mixers.base import Mixer, MixerConfig
from tokenmix.mixers.linear import Linear
from tokenmix.mixers.registry import get_mixer_spec, mixer_names, register_mixer, unregister_mixer
from tokenmix.mixers.state import MixerState

NAME, FAMILY = "moving_average", "moving average"


@dataclass(frozen=True)
class MovingAverageConfig(MixerConfig):
    pass


class PreviousInput(MixerState):
    """The input u of the last position (none before the first token): prev [B, P, C], P <= 1."""

    def __init__(self, owner: str, batch_size: int, position: int, prev: Tensor) -> None:
        self.owner, self.batch_size, self.position, self.prev = owner, batch_size, position, prev

    def tensors(self) -> dict[str, Tensor]:
        return {"prev": self.prev}

    def cached_positions(self) -> int:
        return int(self.prev.shape[1])


class MovingAverage(Mixer):
    """v_t = (u_t + u_{t-1}) / 2 per channel (u_{-1} = 0), u = W_in x, y = W_out v: A = (I + S) / 2, B = 0."""

    config_cls = MovingAverageConfig
    modes = ("shift", "dense", "recurrent")
    time_complexity = "O(1)"
    cache_complexity = "O(1)"

    def __init__(self, config: MovingAverageConfig, d_model: int) -> None:
        super().__init__(config, d_model)
        self.channels = self.n_heads * self.head_dim
        self.in_proj = Linear(d_model, self.channels, bias=False)
        self.out = Linear(self.channels, d_model, bias=False)

    def _start(self, x: Tensor, state: PreviousInput | None) -> tuple[PreviousInput, Tensor]:
        return (self.empty_state(x.shape[0], x.device, x.dtype) if state is None else state), self.in_proj(x)

    def _finish(self, state: PreviousInput, u: Tensor, v: Tensor) -> tuple[Tensor, PreviousInput]:
        new = PreviousInput(state.owner, state.batch_size, state.position + u.shape[1], u[:, -1:].clone())
        return self.out(v), new.carry_over(state)

    def forward_shift(self, x: Tensor, state: PreviousInput | None) -> tuple[Tensor, PreviousInput]:
        state, u = self._start(x, state)
        p = state.cached_positions()
        lagged = F.pad(torch.cat([state.prev, u], 1), (0, 0, 1, 0))[:, p : p + u.shape[1]]  # u_{t-1}
        return self._finish(state, u, 0.5 * (u + lagged))

    def forward_dense(self, x: Tensor, state: PreviousInput | None) -> tuple[Tensor, PreviousInput]:
        state, u = self._start(x, state)
        op = self.materialize(x)
        offset = None
        if state.cached_positions():  # the cached input enters row 0 as a known right-hand side
            offset = F.pad(0.5 * state.prev, (0, 0, 0, u.shape[1] - 1))[..., None]
        return self._finish(state, u, solve_dense(op, u[..., None], offset=offset)[..., 0])

    def forward_recurrent(self, x: Tensor, state: PreviousInput | None) -> tuple[Tensor, PreviousInput]:
        state, u = self._start(x, state)
        outs = []
        for s in range(u.shape[1]):
            state.observe()
            prev = state.prev[:, 0] if state.cached_positions() else torch.zeros_like(u[:, s])
            outs.append(0.5 * (u[:, s] + prev))
            state = PreviousInput(state.owner, state.batch_size, state.position + 1, u[:, s : s + 1]).carry_over(state)
        return self.out(torch.stack(outs, 1)), state

    def empty_state(self, batch_size: int, device="cpu", dtype=torch.float32) -> PreviousInput:
        return PreviousInput(
            self.owner, batch_size, 0, torch.zeros(batch_size, 0, self.channels, device=device, dtype=dtype)
        )

    def materialize(self, x: Tensor) -> MixOperator:
        """A [B, C, T, T] = (I + S) / 2 (S the sub-diagonal shift), B = 0, over the values u."""
        b, t, _ = x.shape
        eye = torch.eye(t, dtype=x.dtype, device=x.device)
        mix_a = 0.5 * (eye + eye.roll(1, 0).tril(-1))  # row t: 1/2 at columns t and t - 1
        mix_a = mix_a.expand(b, self.channels, t, t)
        return MixOperator(mix_a, torch.zeros_like(mix_a))

    def cache_positions(self, n: int) -> int:
        return min(max(n - 1, 0), 1)

    def state_size(self, n: int) -> int:
        return self.cache_positions(n) * self.channels

    def flops_per_token(self, n: int) -> int:
        return self.channels * (self.cache_positions(n) + 1)


CHECKS_MODULE = '''
    """Cross-checks of the moving-average family against the explicit formula."""
    import torch
    import torch.nn.functional as F

    from tokenmix.checks import register_crosscheck
    from tokenmix.checks.common import mixer_case, outputs_in_pieces
    from tokenmix.checks.tolerances import FLOAT64_ABS_TOL, max_abs_err


    @register_crosscheck("moving_average", "explicit formula (u_t + u_(t-1)) / 2", "float64 max abs",
                         FLOAT64_ABS_TOL, per_mode=(".output", ".pieces"))
    def moving_average_vs_formula():
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            m, x = mixer_case("moving_average", 0, dtype=torch.float64)
            u = m.in_proj(x)
            return outputs_in_pieces(m, x, 0.5 * (u + F.pad(u, (0, 0, 1, 0))[:, :-1]), metric=max_abs_err)
'''


@pytest.fixture
def enrolled():
    """The throw-away mixer, registered for one test (README "Adding a mixer", step 1)."""
    register_mixer(NAME, MovingAverageConfig, family=FAMILY, ab_form="A = (I + S) / 2 per channel, B = 0")(
        MovingAverage
    )
    try:
        yield NAME
    finally:
        unregister_mixer(NAME)
    assert NAME not in mixer_names()


@pytest.fixture
def checks_folder(tmp_path, monkeypatch):
    """An empty folder on the ``tokenmix.checks`` package's path, standing for src/tokenmix/checks/;
    what a test adds there is unloaded, with its registrations, afterwards."""
    monkeypatch.setattr(tokenmix.checks, "__path__", [*tokenmix.checks.__path__, str(tmp_path)])
    try:
        yield tmp_path
    finally:
        CROSSCHECKS.pop(NAME, None)
        for path in tmp_path.glob("*.py"):
            sys.modules.pop(f"tokenmix.checks.{path.stem}", None)
        sys.path_importer_cache.pop(str(tmp_path), None)


def test_enrolled_mixer_joins_the_mixer_matrix(enrolled):
    check_mixer(enrolled)


def test_enrolled_mixer_joins_crosscheck_discovery(enrolled, checks_folder):
    unchecked = f"{NAME}_unchecked"
    register_mixer(unchecked, MovingAverageConfig, family=FAMILY, ab_form="as moving_average")(MovingAverage)
    try:
        # no checks module for the family yet: nothing is required of its mixers
        assert FAMILY not in family_modules() and assert_crosschecked(NAME) == []
        # README step 3: the family's checks module with one register_crosscheck; discovery finds it
        (checks_folder / "moving_average.py").write_text(textwrap.dedent(CHECKS_MODULE).lstrip(), encoding="utf-8")
        importlib.invalidate_caches()
        load_all_crosschecks()
        module = family_modules()[FAMILY].__name__
        assert module == "tokenmix.checks.moving_average"
        (check,) = assert_crosschecked(NAME)
        assert check.module == module and check.reference.startswith("explicit formula")
        assert_declaration(check)
        assert_crosscheck_passes(check)
        # a mixer of a family with a checks module but without a cross-check fails, named
        with pytest.raises(AssertionError, match=f"{unchecked} .* has no registered cross-check"):
            assert_crosschecked(unchecked)
    finally:
        unregister_mixer(unchecked)


def test_enrolled_mixer_shows_in_list(enrolled, capsys):
    assert main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    row = rows[NAME]
    assert row["family"] == get_mixer_spec(NAME).family == FAMILY
    assert row["modes"] == list(MovingAverage.modes)
    assert row["cache_positions@1024"] == 1 and row["state_scalars@1024(d=16)"] == 16
    assert [f["name"] for f in row["config"]] == ["n_heads", "head_dim"]
