"""ops/chunked_path.py: the blocked PaTH logits (``ChunkedPath``) against the token-by-token reference
(``sequential_path_scores``) in float64, values and gradients, and the reference against explicit
products of the Householder-like matrices."""

from __future__ import annotations

import math

import pytest
import torch

from tokenmix.ops.chunked_path import GROUP_TOKENS, ChunkedPath, group_blocks, sequential_path_scores
from tolerances import assert_close

B, H, K = 2, 2, 5
TOL = 1e-12

# (T, C, P, G): G None is the default group_blocks(T, C)
CASES = [
    (1, 4, 0, None),  # one token
    (7, 8, 0, None),  # one ragged block
    (8, 4, 0, None),  # one group of two full blocks
    (13, 4, 0, None),  # T not a multiple of C
    (13, 4, 5, None),  # a cache prefix
    (40, 3, 2, None),  # several row groups (N = 14, G = 4), the last one ragged
    (37, 2, 3, 1),  # one block per group: every earlier block through the group products
    (30, 5, 4, 3),  # a G that is no power of two
    (24, 4, 0, 2),  # groups that tile T exactly
]
IDS = [f"T{t}-C{c}-P{p}-G{g}" for t, c, p, g in CASES]


def _inputs(t: int, p: int, seed: int = 0, unit: bool = True, b: int = B, h: int = H) -> tuple[torch.Tensor, ...]:
    """q, k, w [b, T, h, K], beta [b, T, h] in (0, 2), cached keys [b, P, h, K], float64."""
    g = torch.Generator().manual_seed(seed)
    q, k, w = (torch.randn(b, t, h, K, generator=g, dtype=torch.float64) for _ in range(3))
    if unit:
        w = torch.nn.functional.normalize(w, dim=-1)
    beta = 2 * torch.rand(b, t, h, generator=g, dtype=torch.float64)
    cached = torch.randn(b, p, h, K, generator=g, dtype=torch.float64)
    return q, k, w, beta, cached


def _blocked_logits(blocked: ChunkedPath, p: int) -> torch.Tensor:
    """Every row group's blocks assembled into [B, H, T, P + T] (0 above the diagonal), checking each
    block's shape and its -inf above the diagonal on the way."""
    t, (b, h) = blocked.length, blocked.cached_keys.shape[:2]
    rows = []
    for i0 in range(0, t, blocked.group_tokens):
        i1 = min(i0 + blocked.group_tokens, t)
        blocks = blocked.rows(i0, i1)
        assert [j0 for j0, _ in blocks] == list(range(i0, i1, blocked.chunk_size))
        for j0, logits in blocks:
            j1 = min(j0 + blocked.chunk_size, i1)
            assert logits.shape == (b, h, j1 - j0, p + j1)
            causal = torch.arange(p + j1)[None, :] <= p + torch.arange(j0, j1)[:, None]  # [j1 - j0, P + j1]
            assert torch.isneginf(logits[..., ~causal]).all(), "keys after the query must be -inf"
            assert torch.isfinite(logits[..., causal]).all()
            rows.append(torch.nn.functional.pad(torch.where(causal, logits, 0.0), (0, t - j1)))
    return torch.cat(rows, 2)


def _both(q, k, w, beta, cached, c, g) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(logits, keys) of the blocked form and of the reference (scaled like the blocked form)."""
    scale = 1.0 / math.sqrt(K)
    blocked = ChunkedPath.build(q, k, w, beta, cached, c, scale, group_size=g)
    scores, keys = sequential_path_scores(q, k, w, beta, cached)
    return (_blocked_logits(blocked, cached.shape[1]), blocked.keys()), (scores * scale, keys)


@pytest.mark.parametrize("t,c,p,g", CASES, ids=IDS)
def test_blocked_logits_and_keys_equal_the_reference(t, c, p, g):
    q, k, w, beta, cached = _inputs(t, p)
    blocked = ChunkedPath.build(q, k, w, beta, cached, c, group_size=g)
    assert blocked.group_size == (group_blocks(t, c) if g is None else g)
    if (t, c) == (40, 3):
        assert -(-t // blocked.group_tokens) > 2, "the case must reach several row groups"
    (logits, keys), (ref_logits, ref_keys) = _both(q, k, w, beta, cached, c, g)
    assert_close(logits, ref_logits, TOL, f"T={t} C={c} P={p} G={g}: logits")
    assert_close(keys, ref_keys, TOL, f"T={t} C={c} P={p} G={g}: transformed keys")


@pytest.mark.parametrize("t,c,p,g", [CASES[i] for i in (3, 4, 5, 6)], ids=[IDS[i] for i in (3, 4, 5, 6)])
def test_blocked_gradients_equal_the_reference(t, c, p, g):
    inputs = [z.requires_grad_() for z in _inputs(t, p, seed=1)]
    gen = torch.Generator().manual_seed(2)
    proj_logits = torch.randn(B, H, t, p + t, generator=gen, dtype=torch.float64)
    proj_keys = torch.randn(B, p + t, H, K, generator=gen, dtype=torch.float64)
    grads = []
    for logits, keys in _both(*inputs, c, g):
        loss = (logits * proj_logits).sum() + (keys * proj_keys).sum()
        grads.append(torch.autograd.grad(loss, inputs))
    for name, got, ref in zip(("q", "k", "w", "beta", "cached"), *grads):
        assert ref.numel() == 0 or ref.abs().max() > 0, f"d{name}: the reference gradient must not vanish"
        assert_close(got, ref, TOL, f"T={t} C={c} P={p} G={g}: d{name}")


def test_blocked_gradcheck():
    """Any w (not only unit vectors) defines H = I - beta w wᵀ, so every input can be perturbed freely."""
    inputs = tuple(z.requires_grad_() for z in _inputs(5, 1, seed=3, unit=False, b=1, h=1))

    def f(q, k, w, beta, cached):
        blocked = ChunkedPath.build(q, k, w, beta, cached, 2, 0.5, group_size=2)
        return _blocked_logits(blocked, 1), blocked.keys()

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)


def test_reference_equals_explicit_products():
    t, p = 5, 2
    q, k, w, beta, cached = _inputs(t, p, seed=4)
    eye = torch.eye(K, dtype=torch.float64)
    hmat = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # [B, T, H, K, K]

    def prod(i: int, j: int) -> torch.Tensor:  # H_i H_{i-1} ... H_{j+1} (j may be a cached key < 0)
        out = eye.expand(B, H, K, K)
        for s in range(i, max(j, -1), -1):
            out = out @ hmat[:, s]
        return out

    buf = torch.cat([cached, k], 1)  # cached key m sits at j = m - P, its products stop at token 0
    scores, keys = sequential_path_scores(q, k, w, beta, cached)
    expected = torch.zeros(B, H, t, p + t, dtype=torch.float64)
    for i in range(t):
        for m in range(p + i + 1):
            expected[..., i, m] = torch.einsum("bhk,bhkl,bhl->bh", q[:, i], prod(i, m - p), buf[:, m])
    assert_close(scores, expected, TOL, "reference logits vs explicit products")
    expected_keys = torch.stack([torch.einsum("bhkl,bhl->bhk", prod(t - 1, m - p), buf[:, m]) for m in range(p + t)], 1)
    assert_close(keys, expected_keys, TOL, "reference keys vs explicit products")


def test_group_blocks():
    assert group_blocks(1, 4) == 1  # one block
    assert group_blocks(8, 4) == 2  # N = 2: both levels of the walk run
    assert group_blocks(64 * 16, 64) == 4  # N = 16: sqrt(N)
    assert group_blocks(64 * 17, 64) == 4  # ceil(sqrt(17)) = 5 -> the power of two below
    assert group_blocks(64 * 1000, 64) == GROUP_TOKENS // 64  # a row group holds at most GROUP_TOKENS queries
    for t, c in [(13, 4), (100, 3), (1000, 1), (4096, 64)]:
        g = group_blocks(t, c)
        assert g & (g - 1) == 0 and 1 <= g <= -(-t // c)
