"""FoX (forgetting_attention), stick-breaking attention and PaTH attention: what the generic matrix
(test_mixer_matrix.py, test_left_padding.py) does not reach.

- limits that reduce them to known mixers (FoX with f = 1, PaTH with beta = 0 is attention / FoX);
- their A against explicit per-pair formulas in float64 (stick-breaking product, PaTH's product of
  Householder matrices), and PaTH's decode cache against its derivation (keys transformed to the
  last seen position);
- the config variants the generic matrix does not build (stick-breaking without attend_current,
  PaTH with the forget gate / beta in (0, 1)): modes agree, uneven continuation, left padding,
  gradcheck;
- the chunked training mode keeps O(T), not O(T^2), for the backward;
- their fla cross-checks (tokenmix.checks.attention_2025) through ``CROSSCHECKS``.
"""

from __future__ import annotations

import pytest
import torch
from test_left_padding import N_CHUNK, N_STEPS, STARTS, _check_against_solo_rows
from test_left_padding import T as PAD_T

from mixer_helpers import small_mixer
from tokenmix.checks import CROSSCHECKS, load_all_crosschecks
from tolerances import FLOAT64_EXACT, assert_close

NEW = ("forgetting_attention", "stickbreaking_attention", "path_attention")
VARIANTS = [
    ("stickbreaking_attention", dict(attend_current=False)),
    ("path_attention", dict(use_forget_gate=True)),
    ("path_attention", dict(use_forget_gate=True, allow_neg_eigval=False)),
]


def _strong_gates(m) -> None:
    """Push gates / betas away from their defaults so decays and transforms matter (in place)."""
    with torch.no_grad():
        for name in ("fgate", "beta_proj"):
            lin = getattr(m, name, None)
            if lin is not None:
                lin.weight.mul_(4.0)


# ---------------------------------------------------------------- limits
def test_fox_with_forget_gate_one_is_attention():
    attn = small_mixer("attention")
    fox = small_mixer("forgetting_attention")
    fox.load_state_dict(
        {
            **attn.state_dict(),
            "fgate.weight": torch.zeros_like(fox.fgate.weight),
            "fgate.bias": torch.full_like(fox.fgate.bias, 1e4),
        }
    )  # log f = logsigmoid(1e4) = 0
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    y_ref = attn(x, mode="dense")[0]
    for mode in fox.modes:
        assert_close(fox(x, mode=mode)[0], y_ref, FLOAT64_EXACT, f"FoX f=1 {mode} vs attention")


@pytest.mark.parametrize("gate", [False, True])
def test_path_with_beta_zero_is_attention_or_fox(gate):
    ref = small_mixer("forgetting_attention" if gate else "attention")
    _strong_gates(ref)
    path = small_mixer("path_attention", use_forget_gate=gate)
    with torch.no_grad():
        path.qkv.weight.copy_(ref.qkv.weight)
        path.out.weight.copy_(ref.out.weight)
        path.beta_proj.weight.zero_()
        path.beta_proj.bias.fill_(-1e4)  # beta = 2 sigmoid(-1e4) = 0: every H_t = I
        if gate:
            path.fgate.load_state_dict(ref.fgate.state_dict())
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    y_ref = ref(x, mode="dense")[0]
    for mode in path.modes:
        assert_close(
            path(x, mode=mode)[0], y_ref, FLOAT64_EXACT, f"PaTH beta=0 {mode} vs {'FoX' if gate else 'attention'}"
        )


def test_fox_gate_decays_attention_to_the_past():
    """A strongly forgetting gate (f -> 0) makes every row read only its own position."""
    fox = small_mixer("forgetting_attention")
    with torch.no_grad():
        fox.fgate.weight.zero_()
        fox.fgate.bias.fill_(-60.0)  # log f = -60: exp(-60) ~ 1e-26 per step back
    a = fox.materialize(torch.randn(1, 7, 12, dtype=torch.float64)).A
    assert_close(a, torch.eye(7, dtype=torch.float64).expand_as(a), 1e-20, "FoX with f ~ 0: A = I")


# ---------------------------------------------------------------- explicit formulas
@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_matrix_equals_the_product_formula(attend_current):
    m = small_mixer("stickbreaking_attention", attend_current=attend_current)
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    a = m.materialize(x).A  # [B, H, T, T]
    q, k, _ = m._project(x)
    z = torch.einsum("bihk,bjhk->bhij", q, k) / m.head_dim**0.5
    beta = torch.sigmoid(z)
    ref = torch.zeros_like(a)
    t = x.shape[1]
    for i in range(t):
        last = i if attend_current else i - 1  # the nearest visible key
        for j in range(last + 1):
            rest = torch.ones_like(beta[..., 0, 0])
            for l in range(j + 1, last + 1):
                rest = rest * (1 - beta[..., i, l])
            ref[..., i, j] = beta[..., i, j] * rest
    assert_close(a, ref, 1e-14, "stick-breaking A vs beta_ij prod_{j<l} (1 - beta_il)")
    assert (a.sum(-1) <= 1 + 1e-12).all(), "stick-breaking rows sum to at most 1"
    if not attend_current:
        assert (m(x, mode="chunked")[0][:, 0] == 0).all(), "the first query reads no key"


@pytest.mark.parametrize("gate", [False, True])
def test_path_matrix_and_cache_equal_the_householder_products(gate):
    m = small_mixer("path_attention", use_forget_gate=gate)
    _strong_gates(m)
    x = torch.randn(1, 8, 12, dtype=torch.float64)
    q, k, _ = m._project(x)
    w, beta, logf = m.transforms(x)
    b, t, h, kd = q.shape
    eye = torch.eye(kd, dtype=torch.float64)
    hmat = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # [B, T, H, K, K]

    def prod(i: int, j: int) -> torch.Tensor:  # H_i H_{i-1} ... H_{j+1}, [B, H, K, K]
        out = eye.expand(b, h, kd, kd)
        for s in range(i, j, -1):
            out = out @ hmat[:, s]
        return out

    logits = torch.full((b, h, t, t), float("-inf"), dtype=torch.float64)
    for i in range(t):
        for j in range(i + 1):
            logits[..., i, j] = torch.einsum("bhk,bhkl,bhl->bh", q[:, i], prod(i, j), k[:, j]) / kd**0.5
            if gate:
                logits[..., i, j] += logf[:, j + 1 : i + 1].sum(1)
    assert_close(m.materialize(x).A, torch.softmax(logits, -1), 1e-13, "PaTH A vs explicit products")
    expected = torch.stack([torch.einsum("bhkl,bhl->bhk", prod(t - 1, j), k[:, j]) for j in range(t)], 1)
    for mode in m.modes:
        _, state = m(x, mode=mode)
        assert_close(state.keys, expected, 1e-13, f"PaTH {mode} cache: keys = H_(t-1) ... H_(j+1) k_j")
        assert (state.gates is not None) == gate


def test_derived_cache_sizes():
    h, k = 2, 6
    fox, sb = small_mixer("forgetting_attention"), small_mixer("stickbreaking_attention")
    path, path_fox = small_mixer("path_attention"), small_mixer("path_attention", use_forget_gate=True)
    assert [fox.cache_positions(n) for n in (1, 2, 10)] == [0, 1, 9]
    assert fox.state_size(10) == 9 * h * (2 * k + 1)
    assert sb.state_size(10) == path.state_size(10) == 9 * h * 2 * k
    assert path_fox.state_size(10) == 9 * h * (2 * k + 1)
    for m in (fox, sb, path):
        assert (m.time_complexity, m.cache_complexity) == ("O(n)", "O(n)")


# ---------------------------------------------------------------- variants outside the generic matrix
@pytest.mark.parametrize("name,cfg", VARIANTS, ids=[f"{n}-{c}" for n, c in VARIANTS])
def test_variant_modes_continuation_and_padding(name, cfg):
    m = small_mixer(name, **cfg)
    _strong_gates(m)
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    y_ref, s_ref = m(x, mode=m.modes[0])
    for mode in m.modes:
        y, s = m(x, mode=mode)
        assert_close(y, y_ref, FLOAT64_EXACT, f"{name} {cfg} {mode} output")
        for key, val in s.tensors().items():
            assert_close(val, s_ref.tensors()[key], FLOAT64_EXACT, f"{name} {cfg} {mode} state[{key}]")
        pieces, state, t0 = [], None, 0
        for i, size in enumerate([3, 1, 5, 4]):
            y_p, state = m(x[:, t0 : t0 + size], state, mode=mode if i % 2 == 0 else "recurrent")
            pieces.append(y_p)
            t0 += size
        assert_close(torch.cat(pieces, 1), y_ref, FLOAT64_EXACT, f"{name} {cfg} continuation via {mode}")
        xp = torch.randn(len(STARTS), PAD_T, 12, dtype=torch.float64)
        x_next = torch.randn(len(STARTS), N_STEPS + N_CHUNK, 12, dtype=torch.float64)
        _check_against_solo_rows(m, xp, x_next, STARTS, mode, f"{name} {cfg} {mode} padded")


@pytest.mark.parametrize("name,cfg", VARIANTS, ids=[f"{n}-{c}" for n, c in VARIANTS])
def test_variant_gradcheck_through_state(name, cfg):
    m = small_mixer(name, d_model=4, n_heads=2, **cfg)
    xa = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    xb = torch.randn(1, 2, 4, dtype=torch.float64, requires_grad=True)
    for mode in m.modes:

        def f(xa, xb):
            ya, s = m(xa, mode=mode)
            yb, s = m(xb, s, mode=mode)
            return torch.cat([ya, yb], 1)

        assert torch.autograd.gradcheck(f, (xa, xb), eps=1e-6, atol=1e-6), f"{name} {cfg} gradcheck in {mode}"


# ---------------------------------------------------------------- memory of the chunked training mode
@pytest.mark.parametrize("name", NEW)
def test_chunked_training_memory_is_linear(name):
    """What autograd keeps for the backward of the chunked mode grows linearly in T (the query blocks
    are checkpointed: O(C n) peak, recomputed block by block), the dense mode's quadratically."""
    m = small_mixer(name, chunk_size=8)

    def saved(mode: str, t: int) -> int:
        sizes = []

        def pack(z):
            sizes.append(z.numel())
            return z

        x = torch.randn(1, t, 12, dtype=torch.float64, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda z: z):
            m(x, mode=mode)
        return sum(sizes)

    assert saved("chunked", 128) <= 2.2 * saved("chunked", 64), "chunked: saved tensors grow faster than T"
    assert saved("dense", 128) >= 3.5 * saved("dense", 64), "dense: expected [T, T] weights to be kept"


# ---------------------------------------------------------------- fla cross-checks
load_all_crosschecks()


@pytest.mark.parametrize("name", NEW)
def test_fla_crosschecks_pass(name):
    checks = CROSSCHECKS.get(name, [])
    assert any(label.startswith("fla naive_") for label, _, _ in checks), f"{name}: no fla cross-check registered"
    modes = small_mixer(name).modes
    for label, fn, tol in checks:
        errors = fn()
        too_large = {q: e for q, e in errors.items() if not e <= tol}
        assert not too_large, f"{name} vs {label}: errors above {tol:.0e}: {too_large}"
        assert all(any(q.endswith(f"{mode}.{kind}") for q in errors) for mode in modes for kind in ("output", "pieces"))
