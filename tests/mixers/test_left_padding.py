"""Left-padded batches, for every registered mixer in every mode and for the model.

A batch whose rows start with start[b] padding positions (``init_state(..., start=start)``) must
give, for every real position, exactly what the row gives when run alone without padding; so must
the decode after it (token by token and a multi-token chunk). Padding outputs only need to be
finite. The padding inputs are random (and, in one test, huge), so a leak shows up as a difference.
"""

from __future__ import annotations

import pytest
import torch

from mixer_helpers import ALL_MIXERS, small_mixer
from tokenmix.checks.equivalence import small_overrides
from tokenmix.mixers.row_groups import RowGroupState
from tokenmix.models import MixerModel, ModelConfig, left_pad
from tolerances import FLOAT64_EXACT, assert_close

STARTS = (0, 3, 5, 2)  # leading padding per row: unpadded, longer and shorter than a chunk (4)
T = 11  # padded prefill length
N_STEPS, N_CHUNK = 3, 4  # the decode after the prefill: 3 single tokens, then a 4-token chunk
FLOAT32_LOGITS_ATOL = 1e-4


def _tol(m) -> float:
    """FLOAT64_EXACT for every mixer, reassociating chunked forms included: a padded row runs the
    same arithmetic as the row alone, only its chunks may start at other offsets (measured <= 1e-15)."""
    return FLOAT64_EXACT


def _run(m, x_prompt, x_next, state, mode):
    """Prefill x_prompt [B, T, D] in ``mode`` (skipped if T = 0), decode x_next [B, N_STEPS + N_CHUNK, D]:
    N_STEPS tokens by ``step``, then one chunk in ``mode``. Returns (prefill y, decode y, state)."""
    y = None
    if x_prompt.shape[1]:
        y, state = m(x_prompt, state, mode=mode)
    steps = []
    for i in range(N_STEPS):
        y_t, state = m.step(x_next[:, i], state)
        steps.append(y_t[:, None])
    y_c, state = m(x_next[:, N_STEPS:], state, mode=mode)
    return y, torch.cat(steps + [y_c], 1), state


def _check_against_solo_rows(m, x, x_next, starts, mode, what):
    """The padded batch x [B, T, D] (row b real from starts[b]) against every row run alone."""
    b = x.shape[0]
    state = m.init_state(b, x.device, x.dtype, start=starts)
    y, y_next, state = _run(m, x, x_next, state, mode)
    assert torch.isfinite(y).all(), f"{what}: non-finite output (padding outputs must be finite)"
    for row, s in enumerate(starts):
        y_solo, y_next_solo, _ = _run(m, x[row : row + 1, s:], x_next[row : row + 1], None, mode)
        if y_solo is not None:
            assert_close(y[row : row + 1, s:], y_solo, _tol(m), f"{what}: row {row} (start {s}) prefill")
        assert_close(y_next[row : row + 1], y_next_solo, _tol(m), f"{what}: row {row} (start {s}) decode")
    return y, y_next, state


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_padded_batch_equals_rows_alone_in_every_mode(name):
    m = small_mixer(name)
    for mode in m.modes:
        x = torch.randn(len(STARTS), T, m.d_model, dtype=torch.float64)
        x_next = torch.randn(len(STARTS), N_STEPS + N_CHUNK, m.d_model, dtype=torch.float64)
        _, _, state = _check_against_solo_rows(m, x, x_next, STARTS, mode, f"{name} {mode}")
        assert state.position == T + N_STEPS + N_CHUNK
        # every row holds no more than an unpadded sequence of the batch's length would
        assert state.peak_positions <= m.cache_positions(state.position), f"{name}: measured cache"
        assert state.peak_numel <= m.state_size(state.position), f"{name}: measured state scalars"


# The structured recurrence's variants that registration alone does not reach: gate-based
# coefficients on translation-invariant patterns (a shared table with per-row masks) and on the
# row-clock ones, and the Fenwick pattern (whose first table row holds a -1 slot).
STRUCTURED_VARIANTS = [
    *[
        ("pow2", dict(pattern=p, coefficients=c))
        for c in ("gate_softmax", "gate_l1")
        for p in ("pow2", "sq1", "window:3", "dense", "f:k+2", "first_order")
    ],
    ("pow2_ce", dict(coefficients="gate_softmax")),
    ("pow2", dict(pattern="fenwick")),
    ("pow2", dict(pattern="fenwick", coefficients="gate_l1")),
]


@pytest.mark.parametrize(
    "name,overrides", STRUCTURED_VARIANTS, ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o in STRUCTURED_VARIANTS]
)
def test_structured_variants_padded_batch_equals_rows_alone(name, overrides):
    m = small_mixer(name, **overrides)
    for mode in m.modes:
        x = torch.randn(len(STARTS), T, m.d_model, dtype=torch.float64)
        x_next = torch.randn(len(STARTS), N_STEPS + N_CHUNK, m.d_model, dtype=torch.float64)
        _check_against_solo_rows(m, x, x_next, STARTS, mode, f"{name} {overrides} {mode}")
        # and a decode that starts from an empty state, token by token, equals the dense mode
        y_dense, _ = m(x, None, mode="dense")
        state, steps = None, []
        for i in range(T):
            y_t, state = m.step(x[:, i], state)
            steps.append(y_t)
        assert_close(torch.stack(steps, 1), y_dense, _tol(m), f"{name} {overrides}: steps from empty")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_padding_content_never_reaches_real_outputs(name):
    """Huge values in the padding slots (and a different random draw) leave every real output unchanged."""
    m = small_mixer(name)
    starts = (4, 0, 7)
    x = torch.randn(len(starts), 10, m.d_model, dtype=torch.float64)
    x_next = torch.randn(len(starts), N_STEPS + N_CHUNK, m.d_model, dtype=torch.float64)
    garbage = x.clone()
    for row, s in enumerate(starts):
        garbage[row, :s] = 1e6 * torch.randn(s, m.d_model, dtype=torch.float64)
    for mode in m.modes:
        runs = []
        for inputs in (x, garbage):
            state = m.init_state(len(starts), dtype=torch.float64, start=starts)
            y, y_next, _ = _run(m, inputs, x_next, state, mode)
            assert torch.isfinite(y).all(), f"{name} {mode}: non-finite padding output"
            runs.append((y, y_next))
        (y, y_next), (y_g, y_next_g) = runs
        for row, s in enumerate(starts):
            assert_close(y_g[row, s:], y[row, s:], _tol(m), f"{name} {mode}: row {row} real outputs")
        assert_close(y_next_g, y_next, _tol(m), f"{name} {mode}: decode after garbage padding")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_row_of_only_padding_starts_at_the_decode(name):
    """start[b] = T: the row's first real token is the first decoded one."""
    m = small_mixer(name)
    starts = (6, 2)
    x = torch.randn(2, 6, m.d_model, dtype=torch.float64)
    x_next = torch.randn(2, N_STEPS + N_CHUNK, m.d_model, dtype=torch.float64)
    _check_against_solo_rows(m, x, x_next, starts, m.modes[0], f"{name}")


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_start_of_zeros_is_the_ordinary_state(name):
    m = small_mixer(name)
    state = m.init_state(3, dtype=torch.float64, start=torch.zeros(3, dtype=torch.long))
    assert state.start is None and type(state) is type(m.empty_state(3, dtype=torch.float64))


def test_padding_mechanism_is_declared():
    """Row groups only where the arithmetic follows each row's clock; masks everywhere else."""
    grouped = {n for n in ALL_MIXERS if isinstance(small_mixer(n).init_state(2, start=[0, 1]), RowGroupState)}
    assert grouped == {
        "pow2_ce",
        "sq1_ce",
        "log_linear",
        "log_linear_mamba2",
        "log_linear_gated_deltanet",
        "ttt_linear",
    }


@pytest.mark.parametrize("name", ["attention", "pow2_ce", "gla"])
def test_bad_start_is_refused(name):
    m = small_mixer(name)
    x = torch.randn(2, 5, m.d_model, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"start .*shape \[batch_size\] = \[2\], got \(3,\)"):
        m.init_state(2, start=[0, 1, 2])
    with pytest.raises(ValueError, match=r"start .*shape \[batch_size\] = \[2\], got \(2, 1\)"):
        m.init_state(2, start=torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="start .*must be >= 0, got -1 for row 1"):
        m.init_state(2, start=[0, -1])
    with pytest.raises(ValueError, match="start .*must be integers"):
        m.init_state(2, start=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="start .*is 6 for row 1 but the first segment has only 5 positions"):
        m(x, m.init_state(2, dtype=torch.float64, start=[0, 6]))
    with pytest.raises(ValueError, match="the prefill must contain every row's whole padding"):
        m.step(x[:, 0], m.init_state(2, dtype=torch.float64, start=[2, 0]))
    m(x, m.init_state(2, dtype=torch.float64, start=[0, 5]))  # start = T is allowed


# ---------------------------------------------------------------- the model
def _tiny_model(layers: tuple[str, ...], positions: str, dtype=torch.float32) -> MixerModel:
    """Test-size model, chunk sizes (where a mixer has one) that do not divide the test lengths."""
    overrides = {name: small_overrides(name) for name in set(layers)}
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40,
        d_model=16,
        layers=layers,
        n_heads=2,
        positions=positions,
        max_seq_len=24,
        mixer_overrides=overrides,
    )
    return MixerModel(cfg).to(dtype).eval()


def _padded_generation_errors(model: MixerModel, prompts: list[list[int]], cont: torch.Tensor) -> float:
    """Left-padded prefill, 3 decode steps and a 2-token chunk vs the uncached full forward of each
    row alone (prompt + continuation): the largest logit difference over real positions."""
    ids, start = left_pad(prompts, pad_id=7)
    t = ids.shape[1]
    with torch.no_grad():
        states = model.init_states(len(prompts), start=start)
        logits, states = model(ids, states)
        got = [logits]
        for i in range(3):
            step_logits, states = model.step(cont[:, i], states)
            got.append(step_logits[:, None])
        chunk_logits, states = model(cont[:, 3:], states)
        got = torch.cat(got + [chunk_logits], 1)
        err = 0.0
        for row, p in enumerate(prompts):
            full, _ = model(torch.cat([torch.tensor(p), cont[row]])[None])
            err = max(err, (got[row, t - len(p) :] - full[0]).abs().max().item())
    return err


@pytest.mark.parametrize("positions", ["none", "learned", "sinusoidal"])
@pytest.mark.parametrize("name", ALL_MIXERS)
def test_model_padded_generation_equals_rows_alone(name, positions):
    model = _tiny_model((name, name), positions)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 40, (n,), generator=g).tolist() for n in (9, 4, 6, 1)]
    cont = torch.randint(0, 40, (len(prompts), 5), generator=g)
    err = _padded_generation_errors(model, prompts, cont)
    assert err <= FLOAT32_LOGITS_ATOL, f"{name} ({positions}): padded generation differs by {err:.2e}"


def test_model_hybrid_padded_generation_float64():
    """Every padding mechanism in one stack (masks, row groups, the window path), exact in float64."""
    model = _tiny_model(
        ("pow2_ce", "attention", "dense_recurrence", "gated_deltanet", "log_linear", "hlru"), "learned", torch.float64
    )
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 40, (n,), generator=g).tolist() for n in (3, 10, 7)]
    cont = torch.randint(0, 40, (len(prompts), 5), generator=g)
    assert _padded_generation_errors(model, prompts, cont) <= FLOAT64_EXACT


def test_model_padding_api_errors():
    model = _tiny_model(("attention",), "learned")
    with pytest.raises(ValueError, match=r"start .*shape \[batch_size\] = \[2\]"):
        model.init_states(2, start=[1, 2, 3])
    with pytest.raises(ValueError, match="start .*>= 0"):
        model.init_states(2, start=[-2, 0])
    states = model.init_states(2, start=[0, 4])
    with pytest.raises(ValueError, match="first segment has only 3 positions"):
        model(torch.zeros(2, 3, dtype=torch.long), states)
    ids, start = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and start.tolist() == [0, 2]
    with pytest.raises(ValueError, match="no sequences"):
        left_pad([])
    # learned positions count from each row's first real token: a row padded to 30 positions with 20
    # real ones fits max_seq_len = 24, one with 25 real ones does not
    ids = torch.zeros(2, 30, dtype=torch.long)
    model(ids, model.init_states(2, start=[10, 20]))
    with pytest.raises(ValueError, match="max_seq_len=24"):
        model(ids, model.init_states(2, start=[5, 20]))


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_padded_gradients_equal_rows_alone(name):
    """Backward of every mode: padding inputs get exactly zero gradient from the real outputs (a leak
    of any size, however small its effect on values, shows here), and the real inputs' and the
    parameters' gradients are the sums of the rows' own."""
    m = small_mixer(name)
    starts = (0, 3, 6)
    x0 = torch.randn(len(starts), 9, m.d_model, dtype=torch.float64)
    w = torch.randn(len(starts), 9, m.d_model, dtype=torch.float64)
    real = torch.arange(9)[None, :, None] >= torch.tensor(starts)[:, None, None]  # [B, T, 1]
    names = [n for n, _ in m.named_parameters()]
    for mode in m.modes:
        m.zero_grad()
        x = x0.clone().requires_grad_()
        y, _ = m(x, m.init_state(len(starts), dtype=torch.float64, start=starts), mode=mode)
        (y * w * real).sum().backward()
        grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
        pad_grad = x.grad.masked_select(~real).abs().max().item()
        assert pad_grad == 0.0, f"{name} {mode}: padding inputs get gradient {pad_grad:.1e} from real outputs"
        m.zero_grad()
        x_solo = []
        for row, s in enumerate(starts):
            xs = x0[row : row + 1, s:].clone().requires_grad_()
            ys, _ = m(xs, mode=mode)
            (ys * w[row : row + 1, s:]).sum().backward()
            x_solo.append(xs.grad[0])
        solo = [p.grad if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
        for row, s in enumerate(starts):
            assert_close(x.grad[row, s:], x_solo[row], _tol(m) * 10, f"{name} {mode}: dx row {row}")
        for pname, g, g_solo in zip(names, grads, solo):
            assert_close(g, g_solo, _tol(m) * 10, f"{name} {mode}: d{pname}")
