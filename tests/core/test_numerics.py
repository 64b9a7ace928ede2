"""Issue 20's numerical and pattern-parser items, one test each (each failed before its fix):

3. ChaCAL's learned discount gamma never rounds to 1 (it did for gamma_logit >= 17 in float32, and
   every mode returned NaN);
4. the float32 Gram-iteration bound is an upper bound on the exact spectral norm (it fell up to
   ~3e-7 relative below it);
5. attention's backward is finite for inputs scaled by 1e5 in float32 (the fused SDPA backward gave
   NaN);
6, 9. ``f:EXPR`` patterns whose values explode, divide by zero, take negative powers, or nest too deep
   are refused at once with an ``InputError`` (they hung, or raised ZeroDivisionError / RecursionError);
7. ``window:M`` with an absurd M is refused naming the limit (it hung once the cache size was asked).
"""

from __future__ import annotations

import copy

import pytest
import torch

from lm_helpers import within
from tokenmix.analysis.norms import gram_spectral_bound
from tokenmix.cli.main import main
from tokenmix.core.errors import InputError
from tokenmix.mixers import build_mixer
from tokenmix.mixers.chacal import GAMMA_MARGIN
from tokenmix.patterns import F_MAX_BITS, MAX_WINDOW, get_pattern, parse_f


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest deviation of a from the float64 reference, relative to the reference's largest entry."""
    return float((a.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max())


# ----------------------------------------------------------------------------- item 3
@pytest.mark.parametrize("mode", ["chunked", "dense", "recurrent"])
def test_chacal_gamma_saturated_logit_stays_finite_in_every_mode(mode):
    """gamma_logit 20 and 40 (sigmoid rounds to exactly 1 in float32): gamma <= 1 - eps, and the
    outputs and gradients are finite and agree with the same layer in float64."""
    torch.manual_seed(0)
    m = build_mixer("chacal", d_model=8, n_heads=2, chunk_size=4)
    with torch.no_grad():
        m.gamma_logit.copy_(torch.tensor([20.0, 40.0]))
    assert float(m.gamma.detach().max()) <= 1.0 - GAMMA_MARGIN * (1 - 1e-6)
    m64 = copy.deepcopy(m).double()
    x = torch.randn(2, 11, 8)
    x32, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    y32, _ = m(x32, mode=mode)
    y64, _ = m64(x64, mode=mode)
    w = torch.randn_like(y64)
    (y32 * w.float()).sum().backward()
    (y64 * w).sum().backward()
    assert torch.isfinite(y32).all() and torch.isfinite(x32.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    assert _rel(y32, y64) < 1e-5
    assert _rel(x32.grad, x64.grad) < 1e-4
    assert _rel(m.qkv.weight.grad, m64.qkv.weight.grad) < 1e-4


# ----------------------------------------------------------------------------- item 4
def test_gram_bound_in_float32_is_never_below_the_exact_norm():
    """Low-rank float32 matrices, where the iteration converges to the norm itself: the bound must
    not fall below the exact norm of the float32 entries (SVD in float64), and stays within 1e-6."""
    gaps = []
    for seed in range(60):
        gen = torch.Generator().manual_seed(seed)
        r = 1 + seed % 3
        w = (torch.randn(16, r, generator=gen) @ torch.randn(r, 8, generator=gen)).float()
        bound = gram_spectral_bound(w, 10)
        assert bound.dtype == torch.float32
        exact = float(torch.linalg.matrix_norm(w.double(), ord=2))
        gaps.append(float(bound) / exact - 1.0)
    assert min(gaps) >= 0.0, f"bound below the exact norm by {-min(gaps):.3g} (relative)"
    assert max(gaps[0::3]) < 1e-6  # rank 1: converged, so the margin is all that separates them


# ----------------------------------------------------------------------------- item 5
@pytest.mark.parametrize("name", ["attention", "local_attention"])
@pytest.mark.parametrize("state", ["none", "padded", "prefix"])
def test_attention_backward_is_finite_for_inputs_scaled_by_1e5(state, name):
    """float32, inputs x 1e5 (scores ~1e10): the gradients are finite and match float64 (local
    attention's banded blocks go through the same guarded call)."""
    torch.manual_seed(0)
    m = build_mixer(name, d_model=16, n_heads=2, **({"window": 6} if name == "local_attention" else {}))
    m64 = copy.deepcopy(m).double()
    x = torch.randn(2, 40, 16) * 1e5
    grads = []
    for mixer, xs in ((m, x.clone()), (m64, x.double())):
        xs.requires_grad_()
        if state == "prefix":
            _, cache = mixer(xs[:, :5].detach())
            y, _ = mixer(xs[:, 5:], cache)
        else:
            y, _ = mixer(xs, mixer.init_state(2, start=[0, 3]) if state == "padded" else None)
        w = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).view_as(y)
        (y * w.to(y.dtype)).sum().backward()
        grads.append((xs.grad, mixer.qkv.weight.grad, mixer.out.weight.grad))
    for g32, g64 in zip(*grads):
        assert torch.isfinite(g32).all()
        assert _rel(g32, g64) < 1e-4


# ----------------------------------------------------------------------------- items 6 and 9
@pytest.mark.parametrize(
    "spec, match",
    [
        ("f:9**9**9", f"limited to {F_MAX_BITS} bits"),
        ("f:2**2**k", f"at k = 12: .*limited to {F_MAX_BITS} bits"),
        ("f:k**k**k+1", f"at k = 5: .*limited to {F_MAX_BITS} bits"),
        ("f:10**(10**k)", f"at k = 4: .*limited to {F_MAX_BITS} bits"),
        ("f:k//0", "division by zero"),
        ("f:k%0+1", "division by zero"),
        ("f:k**-1", "negative exponent"),
        ("f:" + "+".join(["k"] * 2000), "characters, at most"),
        ("f:" + "-" * 200 + "k", "nested deeper than"),
        ("f:" + "k+" * 100 + "1", "nested deeper than"),
        ("f:" + "2**" * 80 + "k", "nested deeper than"),
    ],
)
def test_f_expressions_that_explode_or_fail_are_refused_at_once(spec, match):
    with within(1.0):  # 1 s of CPU time, not of the clock
        with pytest.raises(InputError, match=match):
            get_pattern(spec).n_levels(1 << 20)


def test_f_expressions_within_the_limits_still_work():
    """The bounds refuse only what is absurd: fast-growing f keep their values exactly."""
    assert [parse_f("2**(k*k)")(k) for k in (0, 1, 2, 63)] == [1, 2, 16, 2**3969]
    assert parse_f("k**k+k+1")(63) == 63**63 + 64
    assert parse_f("(-1)**(2**4000)+k")(5) == 6  # |base| <= 1: any exponent, computed directly
    assert get_pattern("f:3**k").distances(100) == [1, 3, 9, 27, 81]


def test_f_expression_via_the_command_line_is_one_line_exit_2(capsys):
    with within(5.0):
        rc = main(["patterns", "--pattern", "f:9**9**9", "--n", "16"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"{F_MAX_BITS} bits" in err


# ----------------------------------------------------------------------------- item 7 (patterns)
def test_absurd_window_is_refused_naming_the_limit():
    with within(1.0):
        with pytest.raises(InputError, match=str(MAX_WINDOW)):
            get_pattern("window:1000000000000")
        with pytest.raises(InputError, match=str(MAX_WINDOW)):
            get_pattern(f"window:{MAX_WINDOW + 1}")
        assert get_pattern(f"window:{MAX_WINDOW}").n_levels(100) == 99
