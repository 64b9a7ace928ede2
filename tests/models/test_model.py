"""The one generic model: hybrids, cached decoding through every layer's state, bad input."""

from __future__ import annotations

import pytest
import torch

from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing
from tokenmix.models import MixerModel, ModelConfig, parse_layers
from tolerances import FLOAT64_EXACT, assert_close


def test_hybrid_decode_equals_full_forward():
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=50,
        d_model=16,
        n_heads=2,
        layers="pow2_ce,sq1*2,first_order",
        mixer_overrides={"sq1": {"chunk_size": 3}},
    )
    model = MixerModel(cfg).double()
    ids = torch.randint(0, 50, (2, 17))
    full, _ = model(ids)
    logits, states = model(ids[:, :6])  # prefill (fast mode)
    steps = [logits]
    for t in range(6, 11):  # token by token
        lt, states = model.step(ids[:, t], states)
        steps.append(lt[:, None])
    lt, states = model(ids[:, 11:], states)  # multi-token continuation
    steps.append(lt)
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-10


def test_weight_tying_and_params():
    model = MixerModel(ModelConfig(vocab_size=40, d_model=16, n_heads=2, layers=("pow2",)))
    assert model.head.weight is model.embed.weight
    assert model.num_params() > model.num_params(exclude_embedding=True)


def test_bad_layers_and_ids():
    with pytest.raises(ValueError, match="unknown mixer 'nope'"):
        parse_layers("pow2,nope")
    with pytest.raises(ValueError, match="repeat"):
        parse_layers("pow2*0")
    with pytest.raises(ValueError, match="d_model"):
        ModelConfig(d_model=0)
    model = MixerModel(ModelConfig(vocab_size=10, d_model=8, n_heads=2, layers=("pow2",)))
    with pytest.raises(ValueError, match="out of range"):
        model(torch.tensor([[3, 12]]))
    with pytest.raises(ValueError, match="layer states"):
        model(torch.tensor([[3]]), states=[None, None])


def test_dropout_only_in_train_mode():
    """Evaluation and generation see the deterministic model: in eval mode a dropout model computes
    what the same weights without dropout compute; in train mode it does not."""
    torch.manual_seed(0)
    base = dict(vocab_size=30, d_model=16, n_heads=2, layers=("pow2", "attention"))
    plain = MixerModel(ModelConfig(**base)).double()
    dropped = MixerModel(ModelConfig(**base, dropout=0.3)).double()
    dropped.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 30, (2, 9))
    want, _ = plain(ids)
    got, _ = dropped.eval()(ids)
    assert (got - want).abs().max() < 1e-12
    train_out, _ = dropped.train()(ids)
    assert (train_out - want).abs().max() > 1e-3
    with pytest.raises(ValueError, match="dropout"):
        ModelConfig(dropout=1.0)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_positions_continue_from_the_decode_state(positions):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=30, d_model=16, n_heads=2, layers="attention,pow2_ce", positions=positions, max_seq_len=32
    )
    model = MixerModel(cfg).double()
    ids = torch.randint(0, 30, (2, 12))
    full, _ = model(ids)
    logits, states = model(ids[:, :5])
    steps = [logits]
    for t in range(5, 12):
        lt, states = model.step(ids[:, t], states)
        steps.append(lt[:, None])
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-10
    # the codes do carry order: a shifted copy of the same tokens gives different logits at equal tokens
    ids2 = torch.full((1, 6), 3)
    out, _ = model(ids2)
    assert (out[0, 1:] - out[0, :-1]).abs().max() > 1e-6


def test_learned_positions_refuse_too_long_inputs():
    model = MixerModel(
        ModelConfig(vocab_size=10, d_model=8, n_heads=2, layers=("attention",), positions="learned", max_seq_len=4)
    )
    with pytest.raises(ValueError, match="max_seq_len=4"):
        model(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must be one of"):
        ModelConfig(positions="rope")
    assert model.num_params() - model.num_params(exclude_embedding=True) == 10 * 8 + 4 * 8


@pytest.mark.parametrize(
    "layers,positions", [("pow2_ce,attention", "learned"), ("gla,sq1_ce", "sinusoidal"), ("mamba2,log_linear", "none")]
)
def test_packed_batch_equals_documents_alone(layers, positions):
    """A packed batch: every document's logits equal the document run alone (positions restart at
    each document), decoding on continues each row's last document, and a step with ``reset`` equals
    a fresh decode of that row."""
    cfg = ModelConfig(vocab_size=50, d_model=16, n_heads=2, layers=layers, positions=positions, max_seq_len=32)
    model = MixerModel(cfg).double()
    ids = torch.randint(0, 50, (2, 13))
    packing = Packing.from_lengths([[1, 5, 7], [6, 7]])
    logits, states = model(ids, packing=packing)
    for b, t0, t1 in packing.row_documents():
        assert_close(logits[b, t0:t1], model(ids[b : b + 1, t0:t1])[0][0], FLOAT64_EXACT, f"row {b} [{t0}, {t1})")
    nxt = torch.randint(0, 50, (2,))
    on, states = model.step(nxt, states)
    for b in range(2):
        t0 = packing.documents(b)[-1][0]
        expected = model(torch.cat([ids[b, t0:], nxt[b : b + 1]])[None])[0][0, -1]
        assert_close(on[b], expected, FLOAT64_EXACT, f"decode after row {b}'s last document")
    again, _ = model.step(nxt, states, reset=torch.tensor([True, False]))
    assert_close(again[0], model(nxt[0:1, None])[0][0, 0], FLOAT64_EXACT, "a reset row decodes as a fresh one")


def test_packing_that_does_not_fit_the_batch_is_refused():
    model = MixerModel(ModelConfig(vocab_size=50, d_model=16, n_heads=2, layers="pow2"))
    with pytest.raises(InputError, match="packing covers"):
        model(torch.randint(0, 50, (2, 9)), packing=Packing.from_lengths([[4, 4], [8]]))
    with pytest.raises(InputError, match="reset must be"):
        model.step(torch.randint(0, 50, (2,)), model(torch.randint(0, 50, (2, 3)))[1], reset=torch.tensor([1, 0]))
