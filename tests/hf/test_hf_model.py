"""The transformers face of tokenmix (tokenmix.hf), for every registered mixer: ``generate()`` through
``TokenmixCache`` gives tokenmix's own tokens (greedy on a left-padded batch, and sampled), never runs
the prefix again, the loss is the training loss, and save_pretrained / from_pretrained is bit-exact.

A new mixer joins by registering (the parametrisation is the registry). Models are tiny (vocab 40,
d_model 16, one layer + MLP) with an embedding of std 0.5, so that the logits (tied head) spread
enough for greedy and sampled choices to mean something.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from mixer_helpers import ALL_MIXERS
from tokenmix.checks.equivalence import small_overrides
from tokenmix.core.errors import InputError
from tokenmix.generation import SamplingConfig, generate
from tokenmix.hf import TokenmixCache, TokenmixConfig, TokenmixForCausalLM, TokenmixModel
from tokenmix.models import ModelConfig, left_pad

VOCAB = 40
NEW = 6

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_hf(layers: tuple[str, ...], dtype=torch.float32, **fields) -> TokenmixForCausalLM:
    overrides = {name: small_overrides(name) for name in set(layers)}
    cfg = ModelConfig(vocab_size=VOCAB, d_model=16, layers=layers, n_heads=2, mixer_overrides=overrides, **fields)
    torch.manual_seed(0)
    model = TokenmixForCausalLM(TokenmixConfig.from_model_config(cfg))
    with torch.no_grad():
        model.net.embed.weight.normal_(0, 0.5)
    return model.to(dtype).eval()


def prompts_of(lengths, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


class CallShapes:
    """Records the [B, T] of every forward that reaches the embedding (i.e. every model call)."""

    def __init__(self, model: TokenmixForCausalLM) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.net.embed.register_forward_hook(lambda _m, inp, _o: self.shapes.append(tuple(inp[0].shape)))

    def remove(self) -> None:
        self.handle.remove()


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_greedy_left_padded_batch_equals_tokenmix_and_never_reruns_the_prefix(name):
    """(a) greedy ``generate`` on left-padded prompts of lengths 2, 5, 3 = tokenmix's ``generate``,
    token for token; (e) after the one prefill [B, T], every forward gets [B, 1]."""
    model = tiny_hf((name,))
    prompts = prompts_of((2, 5, 3), seed=1)
    ids, start = left_pad(prompts)
    mask = (torch.arange(ids.shape[1])[None, :] >= start[:, None]).long()
    calls = CallShapes(model)
    try:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    finally:
        calls.remove()
    ours = generate(model.net, prompts, SamplingConfig(max_new_tokens=NEW, temperature=0.0))
    assert out[:, ids.shape[1] :].tolist() == ours, name
    assert calls.shapes == [tuple(ids.shape)] + [(len(prompts), 1)] * (NEW - 1), name


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_sampled_generation_equals_tokenmix(name):
    """(b) sampling, batch of one: transformers draws from the global generator after
    ``torch.manual_seed(s)``, tokenmix from ``Generator().manual_seed(s)`` (its row 0): the same
    stream, and both call ``torch.multinomial`` once per token on a [V] distribution.

    The distributions are bitwise equal: temperature 0.5 is a power of two, so transformers'
    ``softmax(x / 0.5)`` and tokenmix's ``softmax((x - max) / 0.5)`` compute the same ``exp``
    arguments (scaling by 2 commutes with rounding, and softmax subtracts the max itself); top-k
    masks the same tokens. Top-p is the same rule written with the sort the other way round (tokenmix
    drops a token when the mass ranked above it reaches p, transformers when the mass ranked below it
    with it is at most 1 - p): they could differ only for a token whose mass sits within rounding of
    the boundary, which the fixed seeds and prompts here do not produce (at p = 0.9 the margin is
    several percent)."""
    model = tiny_hf((name,))
    prompt = prompts_of((4,), seed=2)[0]
    knobs = dict(temperature=0.5, top_k=8, top_p=0.9)
    for seed in (3, 11):
        torch.manual_seed(seed)
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=True, **knobs)
        ours = generate(model.net, [prompt], SamplingConfig(max_new_tokens=NEW, seed=seed, **knobs))[0]
        assert out[0, len(prompt) :].tolist() == ours, (name, seed)


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_loss_with_labels_is_the_training_loss(name):
    """(c) labels = input ids (shifted inside, -100 ignored): the loss tokenmix training computes,
    ``cross_entropy(model(x[:, :-1]).float(), x[:, 1:])``; and gradients flow."""
    model = tiny_hf((name,))
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, VOCAB, (2, 9), generator=g)
    out = model(input_ids=x, labels=x)
    train_logits, _ = model.net(x[:, :-1])
    train_loss = F.cross_entropy(train_logits.float().flatten(0, 1), x[:, 1:].flatten())
    torch.testing.assert_close(out.loss, train_loss, rtol=2e-6, atol=0)  # T vs T-1 tokens: chunk rounding only
    # exactly the mean next-token NLL of the returned logits, over the positions whose label counts
    labels = x.clone()
    labels[0, :4] = -100
    labels[1, 7] = -100
    out = model(input_ids=x, labels=labels)
    nll = F.cross_entropy(out.logits[:, :-1].float().flatten(0, 1), x[:, 1:].flatten(), reduction="none")
    keep = labels[:, 1:].flatten() != -100
    torch.testing.assert_close(out.loss, nll[keep].mean(), rtol=1e-6, atol=0)
    out.loss.backward()
    assert model.net.embed.weight.grad is not None and torch.isfinite(model.net.embed.weight.grad).all()


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_save_and_load_round_trip_is_bit_exact(name, tmp_path):
    """(d) float64 weights through save_pretrained / AutoModelForCausalLM.from_pretrained: the same
    state dict (names, dtype, values), the tied head tied again, the same logits bit for bit."""
    model = tiny_hf((name,), dtype=torch.float64)
    model.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(back) is TokenmixForCausalLM
    assert back.config.to_model_config() == model.config.to_model_config()
    a, b = model.state_dict(), back.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.float64 and torch.equal(a[key], b[key]), (name, key)
    assert back.net.head.weight is back.net.embed.weight
    ids = torch.tensor(prompts_of((7, 7), seed=5))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, back(ids).logits), name


# ---------------------------------------------------------------------------------- one model
def test_hybrid_layers_keep_their_own_states_and_a_returned_cache_continues():
    """A hybrid (pattern cache + KV cache + recurrent state): the cache holds one tokenmix state per
    layer, counts the columns seen, and a second ``generate`` on a returned cache continues without
    running the first call's tokens again: the same tokens as one longer call."""
    model = tiny_hf(("pow2_ce", "attention", "mamba2"))
    prompts = prompts_of((3, 6), seed=6)
    ids, start = left_pad(prompts)
    mask = (torch.arange(ids.shape[1])[None, :] >= start[:, None]).long()
    once = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    cache = first.cache
    assert isinstance(cache, TokenmixCache) and len(cache) == 3
    # the last generated token has not been fed yet: the cache has seen the prompt and 3 new tokens
    assert cache.get_seq_length() == ids.shape[1] + 3
    pattern, kv, recurrent = cache.states
    assert kv.cached_positions() == ids.shape[1] + 3  # a KV cache: every position (padding masked)
    assert recurrent.cached_positions() == 0  # a fixed-size state
    assert all(s.position == cache.seen for s in (pattern, kv, recurrent))
    calls = CallShapes(model)
    try:
        seq = first.sequences
        more = model.generate(
            seq,
            attention_mask=torch.cat([mask, torch.ones(2, 4, dtype=torch.long)], 1),
            cache=cache,
            max_new_tokens=4,
            do_sample=False,
        )
    finally:
        calls.remove()
    assert torch.equal(more, once)
    assert calls.shapes == [(2, 1)] * 4  # the one pending token, then one per step: no prefix again
    assert "TokenmixCache(layers=3" in repr(cache)


@pytest.mark.parametrize(
    "mask, words",
    [
        ([[1, 0, 1, 1], [1, 1, 1, 1]], "row 0 has a 0 after a 1"),  # a hole
        ([[1, 1, 1, 1], [1, 1, 1, 0]], "row 1 has a 0 after a 1"),  # right padding
        ([[0, 0, 0, 0], [0, 1, 1, 1]], "row 0 is all zeros"),
        ([[0, 2, 1, 1], [1, 1, 1, 1]], "only 0 (padding) and 1"),
        ([[1, 1, 1], [1, 1, 1]], "shape of input_ids"),
    ],
)
def test_a_mask_that_is_not_left_padding_is_one_line_of_bad_input(mask, words):
    """In a forward and in ``generate`` (which drops an all-ones mask before the model sees it)."""
    model = tiny_hf(("pow2",))
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    calls = [lambda: model(ids, attention_mask=torch.tensor(mask))]
    if torch.tensor(mask).ne(1).any():
        calls.append(lambda: model.generate(ids, attention_mask=torch.tensor(mask), max_new_tokens=2))
    for call in calls:
        with pytest.raises(InputError, match=re.escape(words)) as e:
            call()
        assert "\n" not in str(e.value)


def test_left_padded_forward_logits_are_each_row_alone():
    model = tiny_hf(("pow2_ce", "attention"), dtype=torch.float64)
    prompts = prompts_of((3, 6), seed=7)
    ids, start = left_pad(prompts)
    mask = (torch.arange(ids.shape[1])[None, :] >= start[:, None]).long()
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        for b, p in enumerate(prompts):
            alone = model(torch.tensor([p])).logits[0]
            torch.testing.assert_close(batch[b, int(start[b]) :], alone, rtol=1e-10, atol=1e-12)


def test_beam_search_and_foreign_caches_are_refused():
    model = tiny_hf(("pow2",))
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(InputError, match="num_beams=1"):
        model.generate(ids, num_beams=2, max_new_tokens=3, do_sample=False)
    from transformers import DynamicCache

    with pytest.raises(InputError, match="TokenmixCache"):
        model(ids, cache=DynamicCache())
    with pytest.raises(InputError, match="inputs_embeds"):
        model(inputs_embeds=torch.zeros(1, 3, 16))


def test_config_carries_the_whole_model_config(tmp_path):
    """Every ModelConfig field, at a value other than its default, through TokenmixConfig and its
    config.json; the auto classes know the model type; a bad field is refused when the config is made."""
    cfg = ModelConfig(
        vocab_size=50,
        d_model=24,
        layers=("pow2", "attention", "pow2"),
        n_heads=3,
        mlp=False,
        mlp_ratio=2,
        tie_weights=False,
        dropout=0.1,
        positions="learned",
        max_seq_len=64,
        mixer_overrides={"pow2": {"chunk_size": 8}},
    )
    changed = {
        f.name for f in dataclasses.fields(ModelConfig) if getattr(cfg, f.name) != getattr(ModelConfig(), f.name)
    }
    assert changed == {f.name for f in dataclasses.fields(ModelConfig)}
    hf = TokenmixConfig.from_model_config(cfg, eos_token_id=3)
    assert hf.to_model_config() == cfg
    assert (hf.hidden_size, hf.num_attention_heads, hf.num_hidden_layers, hf.max_position_embeddings) == (24, 3, 3, 64)
    hf.save_pretrained(tmp_path)
    back = AutoConfig.from_pretrained(tmp_path)
    assert type(back) is TokenmixConfig and back.to_model_config() == cfg and back.eos_token_id == 3
    # untied weights: the head is its own tensor, saved and loaded as such
    model = TokenmixForCausalLM(hf).eval()
    assert model.net.head.weight is not model.net.embed.weight
    model.save_pretrained(tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert loaded.net.head.weight is not loaded.net.embed.weight
    with pytest.raises(InputError, match="unknown mixer 'nope'"):
        TokenmixConfig(layers=["nope"])
    with pytest.raises(InputError, match="chunk_sizes"):
        TokenmixConfig(layers=["pow2"], mixer_overrides={"pow2": {"chunk_sizes": 8}})


def test_backbone_gives_the_hidden_states_the_head_reads(tmp_path):
    model = tiny_hf(("pow2_ce", "gla"), dtype=torch.float64)
    model.save_pretrained(tmp_path)
    backbone = AutoModel.from_pretrained(tmp_path)
    assert type(backbone) is TokenmixModel
    ids = torch.tensor(prompts_of((5,), seed=8))
    with torch.no_grad():
        hidden = backbone(ids).last_hidden_state
        assert torch.equal(hidden, model.net.features(ids)[0])
        assert torch.equal(backbone.net.head(hidden), model(ids).logits)


@pytest.mark.parametrize("name", ["pow2_ce", "sq1"])
def test_training_after_generate_works(name):
    """Generate, then train the same model object (as RL fine-tuning does): the tables the pattern
    mixers keep from the decode must not break the autograd forward (they would if the decode ran in
    inference mode)."""
    model = tiny_hf((name,))
    model.generate(torch.tensor([[1, 2, 3, 4, 5]]), max_new_tokens=4, do_sample=False)
    x = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    model.train()
    model(input_ids=x, labels=x).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_checkpoint_missing_a_weight_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_hf(("pow2",))
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights.pop("model.net.norm.weight")
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match="lacks weights this tokenmix model needs: model.net.norm.weight"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_packed_position_ids_run_each_document_alone_and_a_restart_resets_the_decode():
    """transformers' packing convention: position_ids restarting at 0 mark documents; each runs as if
    alone (also behind left padding), decoding on continues the last one, a step at position 0
    begins a new document; ids that jump are refused in one line."""
    model = tiny_hf(("pow2_ce", "attention", "mamba2"), dtype=torch.float64)
    docs = [prompts_of((2, 4), seed=1), prompts_of((1, 3, 2), seed=3)]  # the documents of each row
    ids = torch.tensor([sum(docs[0], []), sum(docs[1], [])])
    pos = torch.tensor([list(range(2)) + list(range(4)), [0] + list(range(3)) + list(range(2))])
    with torch.no_grad():
        out = model(ids, position_ids=pos, use_cache=True)
        for b, row in enumerate(docs):
            t0 = 0
            for doc in row:
                alone = model(torch.tensor([doc])).logits[0]
                torch.testing.assert_close(out.logits[b, t0 : t0 + len(doc)], alone, rtol=1e-10, atol=1e-12)
                t0 += len(doc)
        nxt = torch.tensor([[7], [9]])
        step = model(nxt, cache=out.cache, position_ids=torch.tensor([[4], [0]]), use_cache=True).logits[:, -1]
        on = model(torch.tensor([docs[0][-1] + [7]])).logits[0, -1]
        torch.testing.assert_close(step[0], on, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(step[1], model(torch.tensor([[9]])).logits[0, -1], rtol=1e-10, atol=1e-12)
        # behind left padding: the padded row's documents are still alone
        mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
        padded = torch.tensor([[0, 0] + docs[0][0] + [3, 4], sum(docs[1], [])])
        ppos = torch.tensor([[1, 1, 0, 1, 0, 1], pos[1].tolist()])
        logits = model(padded, attention_mask=mask, position_ids=ppos).logits
        torch.testing.assert_close(logits[0, 4:], model(torch.tensor([[3, 4]])).logits[0], rtol=1e-10, atol=1e-12)
    with pytest.raises(InputError, match="count up by one"):
        model(ids, position_ids=torch.tensor([[0, 1, 5, 6, 7, 8], pos[1].tolist()]))


@pytest.mark.parametrize(
    "fields,words",
    [
        ({"d_model": 1_000_000_000}, ["model too large", "GiB", "d_model=1000000000"]),
        ({"layers": "pow2*100000000"}, ["model too large", "100,000,000 layer(s)", "GiB"]),
        ({"vocab_size": "abc"}, ["vocab_size must be an integer"]),
        ({"layers": 5}, ["layers must be a layer pattern"]),
    ],
    ids=["d_model 10^9", "10^8 layers", "vocab str", "layers int"],
)
def test_an_exported_config_too_large_for_memory_is_refused_up_front(fields, words, tmp_path):
    """A config.json asking for a model this machine cannot hold is one InputError line naming the
    estimated size, before any layer list is expanded or weight allocated (as ``train lm`` refuses it)."""
    import json

    cfg = TokenmixConfig(layers=["pow2"], d_model=16, n_heads=2, vocab_size=VOCAB)
    cfg.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(written | fields))
    for load in (AutoConfig.from_pretrained, TokenmixConfig.from_pretrained):
        with pytest.raises(InputError) as err:
            load(tmp_path)
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
    with pytest.raises(InputError):
        AutoModelForCausalLM.from_pretrained(tmp_path)
