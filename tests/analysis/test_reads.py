"""``tokenmix analyze reads``: on hand-built operators with known answers, the diagnostic puts the
weight where the operator reads (a layer reading the value position exactly: weight 1 there, "reads
the value"; one that keeps each query to itself: weight 1 on the query, "holds the query's own input";
one that spreads each query over other positions: "relays"), the accuracy split
gives 100 % on the one-hop class for a model right exactly there, and the command writes its files
from a real (tiny) trained run."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from tokenmix.analysis.reads import layer_reads, read_split
from tokenmix.core.operator import MixOperator
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.models.reads import layer_hops
from tokenmix.runs.synthetic import SyntheticRunConfig, SyntheticTrainConfig
from tokenmix.tasks import IGNORE_INDEX, make_task
from tokenmix.training.sweep import run_sweep

pytestmark = pytest.mark.usefixtures("one_thread")

TASK = dict(vocab_size=40, seq_len=32, num_kv_pairs=4, power_a=1.0, random_non_queries=False)


def _model() -> MixerModel:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, d_model=8, n_heads=2, mlp=False, layers=("short_conv", "dense_recurrence"))
    return MixerModel(cfg).double()


def _oracle(data, target: str):
    """materialize() of an operator whose row q reads the value position alone (``value``), keeps q
    itself (``query``), or spreads evenly over the earlier positions other than the value's
    window (``spread``: a relay)."""

    def materialize(x):
        n, t = data.inputs.shape
        a = torch.zeros(n, 2, t, t, dtype=x.dtype)
        a[:, :, torch.arange(t), torch.arange(t)] = 1.0
        for i, (inputs, labels) in enumerate(zip(data.inputs.tolist(), data.labels.tolist())):
            for q, label in enumerate(labels):
                if label == IGNORE_INDEX or target == "query":
                    continue
                a[i, :, q, q] = 0.0
                v = inputs.index(inputs[q]) + 1
                if target == "value":
                    a[i, :, q, v] = 1.0
                else:
                    others = [j for j in range(q) if not v - 1 <= j < v + 3]
                    a[i, :, q, others] = 1.0 / len(others)
        return MixOperator(a, torch.zeros_like(a))

    return materialize


@pytest.mark.parametrize(
    "target, part, verdict",
    [
        ("value", "value", ": reads the value"),
        ("query", "query", "holds the query's own input"),
        ("spread", "rest", "relays"),
    ],
)
def test_the_weight_lands_where_the_operator_reads(target, part, verdict):
    model = _model()
    data = make_task("assoc_recall", **TASK).build(16, 1)
    model.blocks[1].mixer.materialize = _oracle(data, target)
    (reads,) = layer_reads(model, data, 4, [1])
    for heads in (reads.by_head, reads.readable):  # dense recurrence: every value read in one hop
        assert all(h[part] == pytest.approx(1.0) for h in heads)
    assert reads.readable_queries == 16 * 4
    assert verdict in reads.verdict()
    assert sum(word in reads.verdict() for word in (": reads the value", "holds the query", "relays")) == 1


class _OneHot(torch.nn.Module):
    """A head whose 'features' are the answers themselves: logits one-hot on them."""

    def forward(self, h):
        return torch.nn.functional.one_hot(h.clamp_min(0), 40).double()


def test_the_split_scores_a_model_right_exactly_on_the_one_hop_class(monkeypatch):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, d_model=8, n_heads=2, mlp=False, layers=("short_conv", "sq1"))
    model = MixerModel(cfg).double()
    task = make_task("assoc_recall", **TASK)
    data = task.build(64, 2)
    classes = task.answer_reads(data, layer_hops(model.blocks[1].mixer, 32), 4)
    right = torch.where(classes == 0, data.labels, torch.zeros_like(data.labels))  # wrong (0) elsewhere
    monkeypatch.setattr(model, "features", lambda idx: (right, None))
    monkeypatch.setattr(model, "head", _OneHot())
    split = read_split(model, task, data, "sq1")
    assert split["source in one hop"]["acc"] == 1.0 and split["source in one hop"]["share"] > 0
    assert all(split[c]["acc"] in (0.0, None) for c in ("window in one hop", "within two hops", "not read"))
    assert sum(v["share"] for v in split.values()) == pytest.approx(1.0)


def test_the_command_reads_a_trained_run(tmp_path):
    cfg = SyntheticRunConfig(
        label="sq1",
        task="assoc_recall",
        task_args=TASK,
        model=dict(d_model=8, n_heads=2, mlp=False, layers=["short_conv", "sq1"]),
        train=replace(
            SyntheticTrainConfig(), steps=4, batch_size=4, train_examples=16, val_examples=8, test_examples=8
        ),
    )
    outcome = run_sweep([cfg], tmp_path / "sweep", progress=False)
    result = outcome.results[0]
    assert set(result["test_reads"]["share"]) == {
        "source in one hop",
        "window in one hop",
        "within two hops",
        "not read",
    }
    run = tmp_path / "sweep" / "runs" / cfg.run_id
    out = tmp_path / "reads"
    cmd = [sys.executable, "-m", "tokenmix", "analyze", "reads", str(run), "--examples", "8", "--out", str(out)]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)["reads"]
    assert [layer["layer"] for layer in payload["layers"]] == [1]
    assert (out / "reads.json").is_file() and (out / "reads.png").stat().st_size > 0
    (run / "model.safetensors").write_bytes(b"not a checkpoint")
    bad = subprocess.run([*cmd[:-2], "--out", str(tmp_path / "r2")], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "safetensors" in bad.stderr
