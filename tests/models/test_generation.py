"""Cached generation: prefill + token-by-token decode through each mixer's state equals the
uncached full forward, for every registered mixer; batches of unequal prompts equal per-prompt runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mixer_helpers import ALL_MIXERS
from tokenmix.checks.equivalence import small_overrides
from tokenmix.generation import SamplingConfig, filter_logits, generate, generate_batch, sample_next
from tokenmix.models import MixerModel, ModelConfig

FLOAT32_DECODE_ATOL = 1e-4
VOCAB = 40

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(layers: tuple[str, ...], dtype=torch.float32) -> MixerModel:
    """Test-size model; chunk sizes (where a mixer has one) that do not divide the test lengths."""
    overrides = {name: small_overrides(name) for name in set(layers)}
    torch.manual_seed(0)
    model = MixerModel(ModelConfig(vocab_size=VOCAB, d_model=16, layers=layers, n_heads=2, mixer_overrides=overrides))
    return model.to(dtype).eval()


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_prefill_then_decode_equals_full_forward(name):
    model = tiny_model((name, name))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 13), generator=g)
    with torch.no_grad():
        full, _ = model(ids)  # uncached, default mode
        # prefill 6 tokens, decode 3 one at a time, a 2-token continuation chunk, then 2 more single tokens
        logits, states = model(ids[:, :6])
        got = [logits]
        for t in range(6, 9):
            step_logits, states = model.step(ids[:, t], states)
            got.append(step_logits[:, None])
        chunk_logits, states = model(ids[:, 9:11], states)
        got.append(chunk_logits)
        for t in range(11, 13):
            step_logits, states = model.step(ids[:, t], states)
            got.append(step_logits[:, None])
    got = torch.cat(got, 1)
    err = (got - full).abs().max().item()
    assert err <= FLOAT32_DECODE_ATOL, f"{name}: cached decode differs from the full forward by {err:.2e}"


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_unequal_prompts_batched_equal_one_by_one(name):
    model = tiny_model((name,), dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 5, 3, 1, 5)]
    cfg = SamplingConfig(max_new_tokens=4, temperature=1.0, top_k=20, top_p=0.95, seed=7)
    streamed: dict[int, list[int]] = {}
    batched = generate(model, prompts, cfg, on_token=lambda i, t: streamed.setdefault(i, []).append(t))
    for i, p in enumerate(prompts):
        alone = generate(model, [p], dataclasses.replace(cfg, seed=cfg.seed + i))[0]
        assert batched[i] == alone, f"{name}: prompt {i} differs when batched"
        assert streamed[i] == batched[i]
        assert len(alone) == 4 and all(0 <= t < VOCAB for t in alone)


def test_greedy_decode_follows_the_full_forward_argmax():
    model = tiny_model(("pow2", "pow2"))
    prompt = torch.tensor([[1, 2, 3, 4]])
    new = generate_batch(model, prompt, SamplingConfig(max_new_tokens=6, temperature=0.0))
    seq = torch.cat([prompt, new], 1)
    with torch.no_grad():
        full, _ = model(seq)
    assert torch.equal(full[0, 3:-1].argmax(-1), new[0])


def test_sampling_filters():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, True, False, True]]
    # probabilities ~ [0.64, 0.09, 0.24, 0.03]: p = 0.7 keeps the first two ranked tokens
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, True, False, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.5)).tolist() == [[False, True, True, True]]
    gens = [torch.Generator().manual_seed(0)]
    cfg = SamplingConfig(temperature=1.0, top_k=1)
    assert all(sample_next(logits, cfg, gens).item() == 0 for _ in range(5))
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1.0)


def test_stop_token_ends_a_sequence():
    model = tiny_model(("pow2",))
    prompt = [[5, 6, 7]]
    free = generate(model, prompt, SamplingConfig(max_new_tokens=8, temperature=0.0))[0]
    stop = free[2]
    cut = generate(model, prompt, SamplingConfig(max_new_tokens=8, temperature=0.0, stop_token=stop))[0]
    assert cut == free[: free.index(stop) + 1]


def test_learned_positions_refuse_a_request_past_max_seq_len():
    torch.manual_seed(0)
    model = MixerModel(
        ModelConfig(
            vocab_size=VOCAB, d_model=16, layers=("pow2", "attention"), n_heads=2, positions="learned", max_seq_len=12
        )
    ).eval()
    fits = generate(model, [[1, 2, 3]], SamplingConfig(max_new_tokens=9, temperature=0.0))[0]
    assert len(fits) == 9  # 3 + 9 = 12 positions: exactly the table
    calls = []
    with pytest.raises(ValueError, match=r"learned positions \(max_seq_len=12\)"):
        generate(model, [[1, 2, 3]], SamplingConfig(max_new_tokens=10), on_token=lambda i, t: calls.append(t))
    assert calls == []  # refused before any token was produced
    with pytest.raises(ValueError, match="max_seq_len=12"):
        generate_batch(model, torch.ones(1, 13, dtype=torch.long), SamplingConfig(max_new_tokens=0))
    # sinusoidal codes have no table to run off: the same request is fine
    sin = MixerModel(
        ModelConfig(vocab_size=VOCAB, d_model=16, layers=("pow2",), n_heads=2, positions="sinusoidal", max_seq_len=12)
    ).eval()
    assert len(generate(sin, [[1, 2, 3]], SamplingConfig(max_new_tokens=20, temperature=0.0))[0]) == 20
