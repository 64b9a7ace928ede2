"""Synthetic task generators: deterministic per seed, and each matches its spec on small cases
(answers recomputed independently from the generated inputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenmix.tasks import IGNORE_INDEX, make_task, masked_accuracy, task_names
from tokenmix.tasks.state_tracking import group_elements, group_table

SMALL = {
    "copy": dict(vocab_size=8, seq_len=16, copy_len=5, offset=7),
    "assoc_recall": dict(vocab_size=40, seq_len=32, num_kv_pairs=4),
    "multi_hop": dict(vocab_size=40, seq_len=32, num_chains=3, hops=3),
    "entity_tracking": dict(num_changes=3, num_chains=2, num_boxes=10, num_objects=5),
    "state_tracking": dict(group="S5", seq_len=12),
    "selective_copy": dict(vocab_size=10, seq_len=32, num_tokens_to_copy=4),
}


def test_every_task_has_a_small_case():
    assert set(task_names()) == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_deterministic_per_seed_and_in_vocab(name):
    task = make_task(name, **SMALL[name])
    a, b, c = task.build(50, seed=3), task.build(50, seed=3), task.build(50, seed=4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.inputs, c.inputs)
    assert a.inputs.shape == (50, task.length) and a.inputs.dtype == torch.long
    assert 0 <= int(a.inputs.min()) and int(a.inputs.max()) < task.model_vocab_size
    answers = a.labels[a.labels != IGNORE_INDEX]
    assert len(answers) > 0 and int(answers.min()) >= 0 and int(answers.max()) < task.model_vocab_size


def test_copy_targets_are_the_source_segment():
    task = make_task("copy", **SMALL["copy"])
    d = task.build(20, seed=0)
    s, shift = task.copy_len, task.shift
    for x, y in zip(d.inputs, d.labels):
        answer_pos = torch.nonzero(y != IGNORE_INDEX).flatten().tolist()
        assert answer_pos == list(range(shift, shift + s))
        assert torch.equal(y[shift : shift + s], x[:s])
        assert (x[s:] == 1).all() and (x[:s] >= 2).all()  # blanks carry nothing after the segment


def test_mqar_answers_are_the_bound_values():
    task = make_task("assoc_recall", **SMALL["assoc_recall"], random_non_queries=False)
    d = task.build(30, seed=1)
    v, kv = task.vocab_size, task.num_kv_pairs
    context = 2 * kv
    for x, y in zip(d.inputs.tolist(), d.labels.tolist()):
        keys, values = x[0:context:2], x[1:context:2]
        assert len(set(keys)) == kv and all(1 <= k < v // 2 for k in keys)
        assert len(set(values)) == kv and all(v // 2 <= val < v for val in values)
        bound = dict(zip(keys, values))
        answer_pos = [t for t, lab in enumerate(y) if lab != IGNORE_INDEX]
        assert len(answer_pos) == kv
        assert all(t >= context and (t - context) % 2 == 0 for t in answer_pos)  # even offsets after context
        assert sorted(x[t] for t in answer_pos) == sorted(keys)  # every key queried once
        for t in answer_pos:
            assert y[t] == bound[x[t]]
        filler = [x[t] for t in range(context, len(x)) if t not in answer_pos]
        assert set(filler) <= {0}


def test_mqar_queries_cluster_near_the_context_and_passes_repeat():
    task = make_task("assoc_recall", vocab_size=200, seq_len=128, num_kv_pairs=4, random_non_queries=False)
    d = task.build(300, seed=0)
    gaps = (torch.nonzero(d.labels != IGNORE_INDEX)[:, 1] - 8) // 2
    # power law a = 0.01: p(g) ∝ g^-0.99 over 60 slots puts far more queries in the first 10 slots
    assert (gaps < 10).float().mean() > 0.5
    two = make_task(
        "assoc_recall", vocab_size=64, seq_len=32, num_kv_pairs=4, num_passes=2, random_non_queries=False
    ).build(5, seed=0)
    assert torch.equal(two.inputs[:, :8], two.inputs[:, 8:16])
    noisy = make_task("assoc_recall", **SMALL["assoc_recall"]).build(30, seed=1)
    quiet = task.__class__(**SMALL["assoc_recall"], random_non_queries=False).build(30, seed=1)
    assert torch.equal(noisy.labels, quiet.labels)
    assert (noisy.inputs == 0).sum() < (quiet.inputs == 0).sum()  # filler replaced by random ids


@pytest.mark.parametrize("causal", [True, False])
def test_multi_hop_answer_follows_h_links(causal):
    task = make_task("multi_hop", **SMALL["multi_hop"], causal_order=causal)
    d = task.build(30, seed=2)
    h, c = task.hops, task.num_chains
    context = 2 * c * h
    for x, y in zip(d.inputs.tolist(), d.labels.tolist()):
        links = list(zip(x[0:context:2], x[1:context:2]))
        nxt = dict(links)
        assert len(nxt) == c * h  # keys distinct: a function
        answer_pos = [t for t, lab in enumerate(y) if lab != IGNORE_INDEX]
        assert len(answer_pos) == c
        for t in answer_pos:
            e = x[t]
            for _ in range(h):
                e = nxt[e]
            assert y[t] == e and e not in nxt  # exactly h hops to the chain's end
        if causal:  # every link's value was already defined as a key before it (or ends a chain)
            pos = {k: i for i, (k, _) in enumerate(links)}
            assert all(val not in pos or pos[val] < i for i, (_, val) in enumerate(links))


def test_multi_hop_shallow_queries_are_trained_not_scored():
    task = make_task("multi_hop", vocab_size=40, seq_len=32, num_chains=2, hops=3, shallow_queries=True)
    d = task.build(30, seed=4)
    plain = make_task("multi_hop", vocab_size=40, seq_len=32, num_chains=2, hops=3).build(30, seed=4)
    assert plain.score_mask is None and d.score_mask is not None
    context = 2 * task.num_chains * task.hops
    for x, y, scored in zip(d.inputs.tolist(), d.labels.tolist(), d.score_mask.tolist()):
        nxt = dict(zip(x[0:context:2], x[1:context:2]))
        asked = [t for t, lab in enumerate(y) if lab != IGNORE_INDEX]
        assert len(asked) == task.num_chains * task.hops
        hops_of = {}
        for t in asked:
            e, k = x[t], 0
            while e in nxt:
                e, k = nxt[e], k + 1
            assert y[t] == e  # every query's answer is its chain's end
            hops_of[t] = k
        assert sorted(hops_of.values()) == sorted(list(range(1, task.hops + 1)) * task.num_chains)
        assert [t for t in asked if scored[t]] == [t for t in asked if hops_of[t] == task.hops]
    # accuracy counts only the scored (h-hop) answers: a model right on every shallow query and
    # wrong on every deep one scores 0
    logits = torch.zeros(*d.labels.shape, task.vocab_size)
    shallow = (d.labels != IGNORE_INDEX) & ~d.score_mask
    logits[shallow, d.labels[shallow]] = 1.0
    assert masked_accuracy(logits, d.labels, d.scored) == (0, task.num_chains * 30)
    assert masked_accuracy(logits, d.labels)[0] == int(shallow.sum())


@pytest.mark.parametrize("ask_all", [False, True])
def test_entity_tracking_labels_are_final_contents_after_n_moves(ask_all):
    task = make_task("entity_tracking", **SMALL["entity_tracking"], ask_all_boxes=ask_all)
    d = task.build(30, seed=5)
    k, o = task.num_boxes, task.num_objects
    for x, y in zip(d.inputs.tolist(), d.labels.tolist()):
        content: dict[int, int] = {}
        depth: dict[int, int] = {}
        asked_depths = []
        for t, tok in enumerate(x):
            if task.put_base <= tok < task.move_base:
                box, obj = divmod(tok - task.put_base, o)
                content[box], depth[box] = obj, 0
            elif task.move_base <= tok < task.ask_base:
                dst, src = divmod(tok - task.move_base, k)
                assert src != dst and src in content  # moves only read boxes already filled
                content[dst], depth[dst] = content[src], depth[src] + 1
            else:
                box = tok - task.ask_base
                assert y[t] == 1 + content[box]
                asked_depths.append(depth[box])
        chains, n = task.num_chains, task.num_changes
        expected = sorted(list(range(n + 1)) * chains) if ask_all else [n] * chains  # every depth once per chain
        assert sorted(asked_depths) == expected
        assert sum(lab != IGNORE_INDEX for lab in y) == len(expected) and len(x) == task.seq_len


def test_entity_tracking_scores_only_the_deepest_questions():
    task = make_task("entity_tracking", **SMALL["entity_tracking"], ask_all_boxes=True, score_deepest=True)
    d = task.build(20, seed=1)
    k, o, n = task.num_boxes, task.num_objects, task.num_changes
    # every question's answer group is its depth (by hand); -1 where nothing is asked
    assert d.group_names == tuple(f"depth {i}" for i in range(n + 1))
    for x, scored, groups in zip(d.inputs.tolist(), d.score_mask.tolist(), d.groups.tolist()):
        depth: dict[int, int] = {}
        for t, tok in enumerate(x):
            if task.put_base <= tok < task.move_base:
                depth[(tok - task.put_base) // o] = 0
                assert groups[t] == -1
            elif task.move_base <= tok < task.ask_base:
                dst, src = divmod(tok - task.move_base, k)
                depth[dst] = depth[src] + 1
                assert groups[t] == -1
            else:
                assert scored[t] == (depth[tok - task.ask_base] == n)
                assert groups[t] == depth[tok - task.ask_base]
    assert int(d.score_mask.sum()) == 20 * task.num_chains
    with pytest.raises(ValueError, match="score_deepest needs ask_all_boxes"):
        make_task("entity_tracking", **SMALL["entity_tracking"], score_deepest=True)


@pytest.mark.parametrize("group", ["S5", "A4", "parity", "cyclic:5"])
def test_state_tracking_labels_are_true_compositions(group):
    task = make_task("state_tracking", group=group, seq_len=10)
    d = task.build(20, seed=0)
    perms = group_elements(group)
    order = group_table(group).shape[0]
    assert task.vocab_size == order == {"S5": 120, "A4": 12, "parity": 2, "cyclic:5": 5}[group]
    for x, y in zip(d.inputs.tolist(), d.labels.tolist()):
        if perms is None:  # cyclic: running sum mod m
            assert y == list(np.cumsum(x) % order)
            continue
        acc = tuple(range(len(perms[0])))
        for g, lab in zip(x, y):
            acc = tuple(perms[g][acc[i]] for i in range(len(acc)))  # apply the product so far, then g
            assert perms[lab] == acc


def test_s5_table_is_the_symmetric_group():
    perms = group_elements("S5")
    assert len(perms) == 120 and perms[0] == (0, 1, 2, 3, 4)
    table = group_table("S5")
    a, b = 17, 93
    assert perms[table[a, b]] == tuple(perms[a][perms[b][i]] for i in range(5))
    assert all(sorted(row) == list(range(120)) for row in table.tolist())  # Latin square


def test_selective_copy_targets_are_the_scattered_symbols_in_order():
    task = make_task("selective_copy", **SMALL["selective_copy"])
    d = task.build(20, seed=0)
    n = task.num_tokens_to_copy
    for x, y in zip(d.inputs.tolist(), d.labels.tolist()):
        scattered = x[: len(x) - n]
        symbols = [tok for tok in scattered if tok != task.blank]
        assert len(symbols) == n and x[len(x) - n] == task.copy_marker
        assert y[-n:] == symbols and all(lab == IGNORE_INDEX for lab in y[:-n])
        assert x[len(x) - n + 1 :] == symbols[:-1]  # teacher forcing after the copy marker


@pytest.mark.parametrize(
    "name,fields,needle",
    [
        ("assoc_recall", dict(seq_len=31, vocab_size=64), "seq_len even"),
        ("assoc_recall", dict(seq_len=64, vocab_size=64), "vocab_size > seq_len"),
        ("assoc_recall", dict(seq_len=32, vocab_size=64, num_kv_pairs=9), "2*num_kv_pairs*num_passes + 2*num_kv_pairs"),
        (
            "assoc_recall",
            dict(seq_len=32, vocab_size=64, num_kv_pairs=4, num_passes=4),
            "2*num_kv_pairs*num_passes + 2*num_kv_pairs",
        ),
        ("copy", dict(seq_len=16, copy_len=10), "copy_len + offset <= seq_len"),
        ("copy", dict(offset=0), "offset must be a positive integer"),
        ("multi_hop", dict(seq_len=32, num_chains=5, hops=3), "2*num_chains*hops + 2*num_queries"),
        ("multi_hop", dict(vocab_size=8, seq_len=64, num_chains=3, hops=2), "num_chains*(hops+1) <= vocab_size - 1"),
        ("entity_tracking", dict(num_changes=7, num_chains=2, num_boxes=15), "num_chains*(num_changes+1) <= num_boxes"),
        ("state_tracking", dict(group="Q8"), "unknown group"),
        ("selective_copy", dict(seq_len=32, num_tokens_to_copy=16), "seq_len >= 2*num_tokens_to_copy + 1"),
    ],
)
def test_impossible_sizes_name_the_constraint(name, fields, needle):
    with pytest.raises(ValueError) as err:
        make_task(name, **fields)
    assert needle in str(err.value) and name in str(err.value)


def test_unknown_task_and_field():
    with pytest.raises(ValueError, match="unknown task 'nope'; known tasks: copy"):
        make_task("nope")
    with pytest.raises(ValueError, match=r"has no field\(s\) \['kv'\]"):
        make_task("assoc_recall", kv=3)


def test_masked_accuracy_counts_answer_positions_only():
    labels = torch.tensor([[IGNORE_INDEX, 2, IGNORE_INDEX, 0]])
    logits = torch.zeros(1, 4, 3)
    logits[0, :, 2] = 1.0  # predicts 2 everywhere
    assert masked_accuracy(logits, labels) == (1, 2)


def _guess_accuracy(task, data, candidates_of, rng) -> float:
    """Accuracy of a guesser that picks uniformly among ``candidates_of(x)`` at every answer position."""
    correct = total = 0
    for x, y in zip(data.inputs.tolist(), data.labels.tolist()):
        cands = candidates_of(x)
        for lab in y:
            if lab != IGNORE_INDEX:
                correct += int(cands[rng.integers(len(cands))] == lab)
                total += 1
    return correct / total


def test_guessing_baselines_are_what_a_guesser_scores():
    """The baselines compare reports as 'guessing levels' are the accuracy of the guessers they name."""
    rng = np.random.default_rng(0)
    mqar = make_task("assoc_recall", vocab_size=64, seq_len=32, num_kv_pairs=4, random_non_queries=False)
    d = mqar.build(2000, seed=0)
    in_context = _guess_accuracy(mqar, d, lambda x: x[1:8:2], rng)  # one of the 4 values shown
    assert abs(in_context - mqar.baselines()["a value of the context"]) < 0.02
    uniform = _guess_accuracy(mqar, d, lambda x: list(range(32, 64)), rng)
    assert abs(uniform - mqar.baselines()["uniform value"]) < 0.01

    hop = make_task("multi_hop", vocab_size=64, seq_len=32, num_chains=3, hops=2)
    d = hop.build(2000, seed=0)

    def chain_ends(x):  # values of the context that are never a key: no lookup needed to find them
        keys, vals = x[0:12:2], x[1:12:2]
        return [v for v in vals if v not in keys]

    assert abs(_guess_accuracy(hop, d, chain_ends, rng) - hop.baselines()["a chain end of the context"]) < 0.02

    # the positional guess: the r-th answer is the r-th value of the context (queries tend to come in
    # the keys' order, as the query slots are drawn key by key with a power law); uniform slots: 1 / kv
    for power_a, above in ((0.01, True), (1.0, False)):
        task = make_task(
            "assoc_recall", vocab_size=64, seq_len=32, num_kv_pairs=4, random_non_queries=False, power_a=power_a
        )
        d = task.build(2000, seed=1)
        hits = [
            lab == x[2 * r + 1]
            for x, y in zip(d.inputs.tolist(), d.labels.tolist())
            for r, lab in enumerate(v for v in y if v != IGNORE_INDEX)
        ]
        by_rank = sum(hits) / len(hits)
        assert abs(by_rank - task.baselines()["the value of the pair ranked as the query"]) < 0.02
        assert (by_rank > 0.25 + 0.03) == above

    copy = make_task("copy", vocab_size=16, seq_len=32, copy_len=12, offset=20)
    d = copy.build(1000, seed=0)
    assert abs(_guess_accuracy(copy, d, lambda x: list(range(2, 16)), rng) - copy.baselines()["uniform symbol"]) < 0.01
    for name in SMALL:
        task = make_task(name, **SMALL[name])
        assert task.baselines() and all(0 < v <= 1 for v in task.baselines().values())
