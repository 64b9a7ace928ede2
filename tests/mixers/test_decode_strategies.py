"""The single-token decode strategies against the general step (float64, up to rounding).

Structured recurrences: every cache records the strategy its steps take, chosen once from the
pattern and the coefficients (``structured.choose_decode``): ``FixedDistanceDecode``
(translation-invariant patterns with score softmaxes), ``NeighborSetDecode`` (lattices, Fenwick),
``GeneralDecode``; a step that autograd records runs the general step. Each strategy is compared
with the general step on the same tokens (prefill, steps, padding, branches). Mamba-2: its own
``forward_recurrent`` vs the family's ``DiagonalDecayMixer.forward_recurrent``.
"""

from __future__ import annotations

import pytest
import torch

from mixer_helpers import decode_tokens
from tokenmix.mixers import build_mixer
from tokenmix.mixers.base import first_parameter
from tokenmix.mixers.diagonal_decay import DiagonalDecayMixer
from tokenmix.mixers.structured import FixedDistanceDecode, GeneralDecode, NeighborSetDecode
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.models.model import Linear, RMSNorm
from tolerances import FLOAT64_EXACT, assert_close

PADDINGS = {"unpadded": None, "padded": [0, 5, 17]}


STEPS = {cls.name: cls for cls in (FixedDistanceDecode, NeighborSetDecode, GeneralDecode)}


@pytest.fixture
def steps(monkeypatch) -> dict[str, int]:
    """Counts the tokens each decode strategy's step decoded."""
    counts = dict.fromkeys(STEPS, 0)
    for strategy, cls in STEPS.items():
        original = cls.step

        def counted(self, *args, strategy=strategy, original=original):
            counts[strategy] += 1
            return original(self, *args)

        monkeypatch.setattr(cls, "step", counted)
    return counts


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("name", ["pow2", "sq1", "kth_order", "dense_recurrence", "first_order"])
def test_fixed_distance_step_matches_general_step(name, padding, steps):
    torch.manual_seed(0)
    m = build_mixer(name, 16, n_heads=2).double()
    x = torch.randn(3, 70, 16, dtype=torch.float64)
    start = PADDINGS[padding]
    assert m.init_state(3, start=start).strategy == "fixed_distance"
    with torch.no_grad():
        y_fast, s_fast = decode_tokens(m, x, start, prefill=40)
    assert steps == {"fixed_distance": 70, "neighbor_set": 0, "general": 0}  # every token, padded rows too
    assert s_fast.strategy == "fixed_distance" and "strategy=fixed_distance" in repr(s_fast)
    y_gen, s_gen = decode_tokens(m, x, start, prefill=40)  # parameters require grad: the general step
    assert steps == {"fixed_distance": 70, "neighbor_set": 0, "general": 70}
    assert_close(y_fast, y_gen.detach(), FLOAT64_EXACT, f"{name} {padding} outputs")
    assert s_fast.positions.tolist() == s_gen.positions.tolist()
    for key, t in s_fast.tensors().items():
        assert_close(t, s_gen.tensors()[key].detach(), FLOAT64_EXACT, f"{name} {padding} cache {key}")
    assert (s_fast.peak_positions, s_fast.peak_numel) == (s_gen.peak_positions, s_gen.peak_numel)
    with torch.no_grad():
        y_chunked, _ = m(x, m.init_state(3, dtype=x.dtype, start=start))
    assert_close(y_fast, y_chunked, FLOAT64_EXACT, f"{name} {padding} step vs chunked")


def test_fixed_distance_step_keeps_branches_valid(steps):
    """Stepping an older cache after a newer one was appended in place copies it first: both
    continuations equal a straight decode."""
    torch.manual_seed(1)
    m = build_mixer("pow2", 16, n_heads=2).double()
    x = torch.randn(1, 30, 16, dtype=torch.float64)
    alt = torch.randn(1, 16, dtype=torch.float64)
    with torch.no_grad():
        _, root = m(x[:, :20])
        y_a, a = m.step(x[:, 20], root)
        y_b, b = m.step(alt, root)  # root is no longer the latest cache on its storage
        y_a2, _ = m.step(x[:, 21], a)
        y_b2, _ = m.step(x[:, 21], b)
        straight, _ = m(x[:, :22])
        branched, _ = m(torch.cat([x[:, :20], alt[:, None], x[:, 21:22]], 1))
    assert steps["fixed_distance"] == 4 and steps["general"] == 0
    assert_close(torch.stack([y_a, y_a2], 1), straight[:, 20:22], FLOAT64_EXACT, "first branch")
    assert_close(torch.stack([y_b, y_b2], 1), branched[:, 20:22], FLOAT64_EXACT, "second branch")


@pytest.mark.parametrize("padding", PADDINGS)
def test_mamba2_recurrent_matches_family_recurrence(padding):
    torch.manual_seed(2)
    m = build_mixer("mamba2", 16, n_heads=2, state_dim=4).double()
    x = torch.randn(3, 40, 16, dtype=torch.float64, requires_grad=True)
    start = PADDINGS[padding]
    y, s = decode_tokens(m, x, start, prefill=20)
    y_ref, s_ref = DiagonalDecayMixer.forward_recurrent(m, x, m.init_state(3, dtype=x.dtype, start=start))
    assert_close(y, y_ref, FLOAT64_EXACT, f"mamba2 {padding} outputs")
    assert_close(s.memory, s_ref.memory, FLOAT64_EXACT, f"mamba2 {padding} state")
    assert (s.position, s.peak_numel) == (s_ref.position, s_ref.peak_numel)
    params = [x, m.A_log, m.dt_bias, m.D, m.in_proj.weight]
    grads = torch.autograd.grad(y.square().sum(), params)
    grads_ref = torch.autograd.grad(y_ref.square().sum(), params)
    for p, g, g_ref in zip(("x", "A_log", "dt_bias", "D", "in_proj"), grads, grads_ref):
        assert_close(g, g_ref, FLOAT64_EXACT, f"mamba2 {padding} grad {p}")


@pytest.mark.parametrize("name", ["pow2", "pow2_ce", "attention", "mamba2"])
def test_numel_per_batch_counts_the_state_tensors(name):
    m = build_mixer(name, 16, n_heads=2)
    with torch.no_grad():
        _, state = m(torch.randn(2, 9, 16))
        _, state = m.step(torch.randn(2, 16), state)
    assert state.numel_per_batch() == sum(t[0].numel() for t in state.tensors().values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1, 224), (3, 70, 16), (8, 1, 200)])
def test_model_rms_norm_without_autograd_is_bitwise_nn_rms_norm(shape, dtype):
    torch.manual_seed(3)
    norm = RMSNorm(shape[-1]).to(dtype)
    torch.nn.init.normal_(norm.weight)
    x = 3 * torch.randn(*shape, dtype=dtype)
    reference = torch.nn.RMSNorm.forward(norm, x)
    with torch.no_grad():
        assert torch.equal(norm(x), reference)
    with torch.inference_mode():
        assert torch.equal(norm(x), reference)


def test_model_refuses_out_of_range_token_ids():
    model = MixerModel(ModelConfig(vocab_size=16, d_model=8, layers=("mamba2",), n_heads=2))
    for bad in (-1, 16):
        with pytest.raises(ValueError, match="out of range"):
            model(torch.tensor([[0, bad]]))
    model(torch.tensor([[0, 15]]))


def test_model_linear_transposed_weight_follows_weight_updates():
    torch.manual_seed(4)
    model = MixerModel(ModelConfig(vocab_size=32, d_model=16, layers=("attention", "pow2", "mamba2"), n_heads=2))
    assert all(type(m) is Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    lin = model.blocks[0].mlp.up
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        assert_close(lin(x), torch.nn.functional.linear(x, lin.weight), 1e-6, "transposed product")
        lin.weight.mul_(2.0)  # an in-place update (an optimizer step): the kept copy is remade
        assert_close(lin(x), torch.nn.functional.linear(x, lin.weight), 1e-6, "after an in-place update")
    assert "up.weight" in dict(model.blocks[0].mlp.named_parameters()) and not any(
        "_kept" in k for k in model.state_dict()
    )


def test_linear_decode_product_reads_a_parametrized_weight():
    """A parametrization (weight norm, spectral norm, ...) keeps the weight out of ``_parameters``:
    the decode product multiplies by the parametrized weight, not the raw one."""
    torch.manual_seed(7)
    lin = Linear(6, 5, bias=True).double()
    torch.nn.utils.parametrize.register_parametrization(lin, "weight", _Doubled())
    x = torch.randn(1, 1, 6, dtype=torch.float64)
    with torch.no_grad():
        assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), FLOAT64_EXACT, "parametrized")
        assert_close(lin.weight, 2 * lin.parametrizations.weight.original, FLOAT64_EXACT, "the weight doubled")


class _Doubled(torch.nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 2 * w


def test_input_check_reads_the_first_parameter_in_parameters_order():
    for name in ("pow2", "mamba2", "attention", "gated_deltanet"):
        m = build_mixer(name, 16, n_heads=2)
        assert first_parameter(m) is next(m.parameters())
    assert first_parameter(torch.nn.ReLU()) is None
    nested = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(2, 3)))
    assert first_parameter(nested) is next(nested.parameters())


def test_fixed_distance_step_leaves_a_tracked_cache_to_autograd(steps):
    """Frozen weights, a prefill whose input requires grad: the cache is tracked, so the steps
    after it take the general (recorded) step, and gradients reach the prefill through them."""
    torch.manual_seed(5)
    m = build_mixer("pow2", 16, n_heads=2).double().requires_grad_(False)
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    prompt = x[:, :9].clone().requires_grad_(True)
    _, state = m(prompt)
    ys = []
    for i in range(9, 12):
        y_t, state = m.step(x[:, i], state)
        ys.append(y_t)
    assert steps["fixed_distance"] == 0 and steps["general"] == 3 and state.strategy == "fixed_distance"
    full, _ = m(x)
    assert_close(torch.stack(ys, 1).detach(), full[:, 9:], FLOAT64_EXACT, "steps after a tracked prefill")
    (grad,) = torch.autograd.grad(torch.stack(ys, 1).sum(), prompt)
    assert grad.abs().sum() > 0


def test_mamba2_decode_without_autograd_follows_parameter_updates():
    torch.manual_seed(6)
    m = build_mixer("mamba2", 16, n_heads=2, state_dim=4).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(2):  # the second time after an in-place update of A_log (the kept -exp(A_log) is remade)
            y, s = decode_tokens(m, x, None, prefill=5)
            y_ref, s_ref = DiagonalDecayMixer.forward_recurrent(m, x, m.init_state(2, dtype=x.dtype))
            assert_close(y, y_ref, FLOAT64_EXACT, "mamba2 no-grad outputs")
            assert_close(s.memory, s_ref.memory, FLOAT64_EXACT, "mamba2 no-grad state")
            m.A_log.add_(0.5)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize(
    "name,overrides",
    [("pow2_ce", {}), ("sq1_ce", {}), ("pow2", {"pattern": "fenwick"})],
    ids=["pow2_ce", "sq1_ce", "fenwick"],
)
def test_lattice_step_matches_general_step(name, overrides, padding, steps):
    """200 tokens (the slot-stable storage fills and is compacted many times) against the general
    step and the chunked mode; the cache holds the same positions with the same entries."""
    torch.manual_seed(0)
    m = build_mixer(name, 16, n_heads=2, **overrides).double()
    x = torch.randn(3, 240, 16, dtype=torch.float64)
    start = PADDINGS[padding]
    assert m.init_state(3).strategy == "neighbor_set"
    with torch.no_grad():
        y_fast, s_fast = decode_tokens(m, x, start, prefill=40)
    # every token of every row group (a padded batch runs its three rows as three groups)
    assert steps["neighbor_set"] == (240 if padding == "unpadded" else 240 * 3 - sum(PADDINGS[padding]))
    assert steps["general"] == 0 and steps["fixed_distance"] == 0
    taken = steps["neighbor_set"]
    y_gen, s_gen = decode_tokens(m, x, start, prefill=40)  # parameters require grad: the general step
    assert steps["neighbor_set"] == taken and steps["general"] == taken
    assert_close(y_fast, y_gen.detach(), FLOAT64_EXACT, f"{name} {padding} outputs")
    if padding == "unpadded":  # (a padded lattice batch runs by row groups, each its own cache)
        assert s_fast.positions.tolist() == s_gen.positions.tolist()
        for key, t in s_fast.tensors().items():
            assert_close(t, s_gen.tensors()[key].detach(), FLOAT64_EXACT, f"{name} {padding} cache {key}")
    assert (s_fast.peak_positions, s_fast.peak_numel) == (s_gen.peak_positions, s_gen.peak_numel)
    with torch.no_grad():
        y_chunked, s_chunked = m(x, m.init_state(3, dtype=x.dtype, start=start))
        assert_close(y_fast, y_chunked, FLOAT64_EXACT, f"{name} {padding} step vs chunked")
        more = torch.randn(3, 9, 16, dtype=torch.float64)  # a chunk after the decode reads the slotted cache
        y_more, _ = m(more, s_fast)
        y_ref, _ = m(more, s_chunked)
    assert_close(y_more, y_ref, FLOAT64_EXACT, f"{name} {padding} chunk after the lattice decode")


@torch.no_grad()
def test_lattice_step_keeps_branches_valid(steps):
    """Two continuations of one lattice cache (the second finds its storage written past it and
    copies first) and a later step of the first: all equal straight runs."""
    torch.manual_seed(1)
    m = build_mixer("sq1_ce", 16, n_heads=2).double()
    x = torch.randn(1, 60, 16, dtype=torch.float64)
    alt = torch.randn(1, 16, dtype=torch.float64)
    _, root = m(x[:, :40])
    y_a, a = m.step(x[:, 40], root)
    y_b, b = m.step(alt, root)
    ys_a, ys_b = [y_a], [y_b]
    for i in range(41, 60):
        y, a = m.step(x[:, i], a)
        ys_a.append(y)
        y, b = m.step(x[:, i], b)
        ys_b.append(y)
    straight, _ = m(x)
    branched, _ = m(torch.cat([x[:, :40], alt[:, None], x[:, 41:]], 1))
    assert steps["neighbor_set"] == 40 and steps["general"] == 0
    assert_close(torch.stack(ys_a, 1), straight[:, 40:], FLOAT64_EXACT, "first branch")
    assert_close(torch.stack(ys_b, 1), branched[:, 40:], FLOAT64_EXACT, "second branch")


@pytest.mark.parametrize(
    "name,overrides,strategy",
    [
        ("pow2", {}, "fixed_distance"),
        ("first_order", {}, "fixed_distance"),
        ("pow2_ce", {}, "neighbor_set"),
        ("pow2", {"pattern": "fenwick"}, "neighbor_set"),
        ("pow2", {"coefficients": "gate_softmax"}, "general"),
        ("sq1_ce", {"coefficients": "gate_l1"}, "general"),
    ],
)
def test_every_strategy_equals_the_general_step(name, overrides, strategy, steps):
    """Each (pattern, coefficients) pair decodes by its strategy without autograd and by the general
    step with it: the same outputs and caches in float64, and the strategy is in the state."""
    torch.manual_seed(7)
    m = build_mixer(name, 16, n_heads=2, **overrides).double()
    x = torch.randn(2, 50, 16, dtype=torch.float64)
    with torch.no_grad():
        y_fast, s_fast = decode_tokens(m, x, None, prefill=10)
    assert s_fast.strategy == strategy and steps[strategy] == 50
    y_gen, s_gen = decode_tokens(m, x, None, prefill=10)
    assert steps["general"] == 50 + (50 if strategy == "general" else 0)
    assert_close(y_fast, y_gen.detach(), FLOAT64_EXACT, f"{name} {overrides} outputs")
    assert s_fast.positions.tolist() == s_gen.positions.tolist()
    for key, t in s_fast.tensors().items():
        assert_close(t, s_gen.tensors()[key].detach(), FLOAT64_EXACT, f"{name} {overrides} cache {key}")


def test_bench_decode_reports_each_caches_strategy():
    from tokenmix.bench.decode import decode_mixers

    rows = decode_mixers(["pow2", "sq1_ce", "attention"], [16], heads=2, head_dim=4, steps=3, block=2)
    assert {r["mixer"]: r["strategy"] for r in rows} == {
        "pow2": "fixed_distance",
        "sq1_ce": "neighbor_set",
        "attention": "KVCache",
    }
