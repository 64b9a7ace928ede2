"""The training harness: schedule and optimiser, a tiny run whose loss falls, resumable sweeps that
skip finished runs, atomic files, and zoology's max-over-learning-rates summary."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tokenmix.core.errors import InputError
from tokenmix.core.files import prepare_output_dir
from tokenmix.models import MixerModel, ModelConfig
from tokenmix.runs.synthetic import SyntheticRunConfig as RunConfig
from tokenmix.runs.synthetic import SyntheticTrainConfig as TrainConfig
from tokenmix.training import synthetic as harness
from tokenmix.training.optim import build_optimizer, param_groups
from tokenmix.training.schedule import warmup_cosine
from tokenmix.training.sweep import run_sweep
from tokenmix.training.synthetic import summarize, train_one

TINY_TRAIN = TrainConfig(
    lr=1e-2, steps=6, batch_size=8, warmup_steps=1, train_examples=32, val_examples=8, test_examples=16, eval_every=3
)


def tiny_run(mixer: str = "first_order", seed: int = 0, **train) -> RunConfig:
    return RunConfig(
        label=mixer,
        task="copy",
        task_args=dict(vocab_size=6, seq_len=8, copy_len=3, offset=4),
        model=dict(d_model=8, n_heads=2, mlp=False, layers=[mixer]),
        train=replace(TINY_TRAIN, **train),
        seed=seed,
    )


pytestmark = pytest.mark.usefixtures("one_thread")


def test_warmup_cosine_shape():
    assert warmup_cosine(0, 100, 10) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the cosine
    assert warmup_cosine(100, 100, 10, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(500, 100, 10, 0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="total_steps"):
        warmup_cosine(0, 0, 0)


def test_weight_decay_only_on_matrices():
    model = MixerModel(ModelConfig(vocab_size=10, d_model=8, layers=("pow2",), n_heads=2))
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n_unique = len({id(p) for p in model.parameters()})
    assert len(decay["params"]) + len(no_decay["params"]) == n_unique  # tied embedding counted once
    opt = build_optimizer(model, 1e-3, 0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_tiny_training_run_loss_falls():
    cfg = RunConfig(
        label="pow2",
        task="copy",
        task_args=dict(vocab_size=6, seq_len=12, copy_len=4, offset=4),
        model=dict(d_model=16, n_heads=2, mlp=False, layers=["pow2"]),
        train=TrainConfig(
            lr=1e-2,
            steps=120,
            batch_size=16,
            warmup_steps=5,
            train_examples=512,
            val_examples=64,
            test_examples=64,
            eval_every=20,
            early_stop_acc=1.01,
        ),
    )
    res = train_one(cfg)
    assert res["steps_done"] == 120 and res["stop_reason"] == "max_steps"
    assert res["train_loss_first"] > math.log(6) - 0.3  # starts near chance over the symbols
    assert res["train_loss_last"] < 0.6 * res["train_loss_first"]
    curve = [c["loss"] for c in res["curve"]]
    assert curve[-1] < curve[0]
    assert res["test_acc"] > 0.5  # chance is 1/4
    assert res["tokens_per_s"] > 0 and res["config"]["train"]["steps"] == 120


def test_early_stop_and_progress_total():
    seen = []
    res = train_one(tiny_run(steps=30, eval_every=3, early_stop_acc=0.0), on_steps=lambda k, c: seen.append((k, c)))
    assert res["stop_reason"] == "early_stop_acc" and res["steps_done"] == 3
    # the skipped budget is reported, credited, so progress completes and an ETA knows it was not trained
    assert seen == [(3, False), (27, True)]


def test_run_id_tracks_the_resolved_config():
    a, b = tiny_run(), tiny_run(lr=2e-2)
    assert a.run_id != b.run_id and a.run_id == tiny_run().run_id
    assert a.run_id.startswith("copy__first_order__d8__lr0.01__s0__")
    assert RunConfig.from_dict(json.loads(json.dumps(a.to_dict()))).run_id == a.run_id
    # defaults are resolved: spelling a default out does not change the id
    explicit = replace(a, task_args={**a.task_args, "vocab_size": 6})
    assert explicit.run_id == a.run_id


@pytest.fixture
def trained_ids(monkeypatch) -> list[str]:
    """The run ids ``harness.train_one`` is called with, in order (training still runs)."""
    calls: list[str] = []
    real = harness.train_one

    def counting(cfg, on_steps=None, device="cpu", **kw):
        calls.append(cfg.run_id)
        return real(cfg, on_steps, device, **kw)

    monkeypatch.setattr(harness, "train_one", counting)
    return calls


def test_sweep_resumes_without_retraining(tmp_path, trained_ids):
    calls = trained_ids
    configs = [tiny_run(m, s) for m in ("first_order", "pow2") for s in (0, 1)]
    out = tmp_path / "sweep"
    first = run_sweep(configs, out, progress=False)
    assert first.trained == 4 and first.skipped == 0 and len(calls) == 4
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")}
    assert len(mtimes) == 4

    second = run_sweep(configs, out, progress=False)
    assert second.trained == 0 and second.skipped == 4 and len(calls) == 4  # no training at all
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")} == mtimes
    assert [r["test_acc"] for r in second.results] == [r["test_acc"] for r in first.results]

    # a run killed before its result was written is redone, and only that one
    victim = out / "runs" / configs[2].run_id / "result.json"
    victim.unlink()
    third = run_sweep(configs, out, progress=False)
    assert third.trained == 1 and calls[-1] == configs[2].run_id

    # files: resolved configs, per-run JSON + CSV, sweep-level results; no temporary files left
    run_dir = out / "runs" / configs[0].run_id
    assert json.loads((run_dir / "config.json").read_text()) == configs[0].to_dict()
    assert (run_dir / "result.csv").read_text().splitlines()[0].startswith("run_id,label,task")
    assert len(json.loads((out / "results.json").read_text())) == 4
    assert len((out / "results.csv").read_text().splitlines()) == 5
    assert len(json.loads((out / "sweep.json").read_text())) == 4
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_same_seed_same_result():
    a, b = train_one(tiny_run()), train_one(tiny_run())
    assert a["test_acc"] == b["test_acc"] and a["train_loss_last"] == b["train_loss_last"]


def test_summary_chooses_the_learning_rate_by_validation_and_reports_test():
    def r(lr, seed, val, acc, stop="max_steps", curve=()):
        return {
            "label": "m",
            "task": "copy",
            "column": "copy",
            "d_model": 8,
            "lr": lr,
            "seed": seed,
            "best_val_acc": val,
            "test_acc": acc,
            "tokens_per_s": 1.0,
            "train_seconds": 1.0,
            "steps_done": 10,
            "stop_reason": stop,
            "curve": list(curve),
        }

    rising = [{"step": s, "val_acc": a} for s, a in ((5, 0.1), (10, 0.2), (15, 0.3), (20, 0.5))]
    # lr 1e-2 has the best mean *test* accuracy (0.7) but the worse validation (0.5 < 0.6): the
    # test set must not choose, so the row reports lr 1e-3 and its test mean 0.6
    results = [
        r(1e-3, 0, 0.6, 0.5, curve=rising),
        r(1e-3, 1, 0.6, 0.7),
        r(1e-3, 2, 0.6, 0.6, stop="early_stop_acc", curve=rising),
        r(1e-2, 0, 0.5, 0.9),
        r(1e-2, 1, 0.5, 0.6),
        r(1e-2, 2, 0.5, 0.6),
    ]
    (row,) = summarize(results)
    assert row["best_lr"] == 1e-3 and row["acc_mean"] == pytest.approx(0.6) and row["val_mean"] == pytest.approx(0.6)
    assert row["acc_std"] == pytest.approx(0.1) and row["n_seeds"] == 3
    assert row["acc_by_lr"] == {"0.001": pytest.approx(0.6), "0.01": pytest.approx(0.7)}
    assert row["val_by_lr"] == {"0.001": pytest.approx(0.6), "0.01": pytest.approx(0.5)}
    # one seed hit its step budget while its validation accuracy still climbed; the early-stopped one does not count
    assert row["still_rising"] == 1 and row["stopped_early"] == 1


def test_curve_still_rising():
    flat = [{"step": s, "val_acc": 0.25} for s in range(8)]
    late = flat[:6] + [{"step": 6, "val_acc": 0.3}, {"step": 7, "val_acc": 0.4}]
    assert not harness.curve_still_rising(flat) and harness.curve_still_rising(late)
    assert not harness.curve_still_rising(late[:3])  # too short to tell


def test_unwritable_output_dir_leaves_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="cannot write to output directory"):
        prepare_output_dir(blocker / "sub" / "dir")
    with pytest.raises(ValueError, match="cannot write to output directory"):
        run_sweep([tiny_run()], blocker, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    fresh = prepare_output_dir(tmp_path / "x" / "y")
    assert fresh.is_dir() and not list(fresh.iterdir())


def test_bad_runs_are_refused_before_anything_is_written(tmp_path):
    bad = [
        (replace(tiny_run(), model={"d_model": 8, "layers": ["nope"]}), "unknown mixer 'nope'"),
        (replace(tiny_run(), task="nope"), "unknown task 'nope'"),
        (replace(tiny_run(), task_args={"seq_len": 4, "copy_len": 3, "offset": 4}), "copy_len + offset <= seq_len"),
        (replace(tiny_run(), seed=TINY_TRAIN.test_seed), "collides"),
    ]
    for cfg, needle in bad:
        with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("+", r"\+")):
            run_sweep([tiny_run(seed=5), cfg], tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="twice"):
        run_sweep([tiny_run(), tiny_run()], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_parallel_workers_match_in_process(tmp_path):
    configs = [tiny_run("first_order", s) for s in (0, 1)]
    serial = run_sweep(configs, tmp_path / "a", progress=False)
    parallel = run_sweep(configs, tmp_path / "b", workers=2, threads=1, progress=False)
    assert [r["test_acc"] for r in serial.results] == [r["test_acc"] for r in parallel.results]
    assert [r["run_id"] for r in parallel.results] == [c.run_id for c in configs]
    assert Path(tmp_path / "b" / "results.csv").is_file()


def test_evaluate_counts_only_the_scored_answers():
    """Shallow questions are trained on but accuracy counts only the score_mask positions."""
    from tokenmix.tasks import TaskData

    model = MixerModel(ModelConfig(vocab_size=6, d_model=8, n_heads=2, mlp=False, layers=("first_order",)))
    inputs = torch.randint(0, 6, (4, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pred = model(inputs)[0].argmax(-1)
    labels = torch.full((4, 5), -100)
    labels[:, 1] = pred[:, 1]  # answered right
    labels[:, 3] = (pred[:, 3] + 1) % 6  # answered wrong
    every = TaskData(inputs, labels)
    deep = TaskData(inputs, labels, score_mask=labels.ne(-100) & (torch.arange(5) == 3))
    assert harness.evaluate(model, every) == pytest.approx(0.5)
    assert harness.evaluate(model, deep) == 0.0
    assert harness.evaluate(model, deep, batch_size=3) == 0.0  # sliced batches keep their masks
    with pytest.raises(ValueError, match="without an answer"):
        TaskData(inputs, labels, score_mask=torch.ones(4, 5, dtype=torch.bool))
    # answer groups: every answer of a group counts, scored or not, whatever the batch slicing
    groups = torch.full((4, 5), -1)
    groups[:, 1], groups[:2, 3], groups[2:, 3] = 0, 0, 1
    grouped = TaskData(inputs, labels, deep.score_mask, groups, ("easy", "hard"))
    for batch_size in (256, 3):
        by_group: dict[str, float] = {}
        assert harness.evaluate(model, grouped, batch_size=batch_size, by_group=by_group) == 0.0
        assert by_group == {"easy": pytest.approx(4 / 6), "hard": 0.0}
    with pytest.raises(ValueError, match="groups must index group_names"):
        TaskData(inputs, labels, groups=torch.zeros(4, 5, dtype=torch.long), group_names=("all",))
    with pytest.raises(ValueError, match="groups must index group_names"):
        TaskData(inputs, labels, groups=groups, group_names=("easy",))


def test_summary_and_report_give_accuracy_per_answer_group():
    from tokenmix.study.claims import cell_diagnostics

    runs = [
        {
            "label": "x",
            "task": "entity_tracking",
            "d_model": 8,
            "lr": 1e-3,
            "test_acc": acc,
            "best_val_acc": acc,
            "test_acc_by_group": {"depth 0": 1.0, "depth 1": acc},
            "tokens_per_s": 1.0,
            "train_seconds": 1.0,
            "steps_done": 10,
        }
        for acc in (0.5, 0.7)
    ]
    row = harness.summarize(runs)[0]
    assert row["acc_by_group"] == {"depth 0": 1.0, "depth 1": pytest.approx(0.6)}
    notes = cell_diagnostics(("x", "entity_tracking"), row, {}, [])
    assert any("by answer group" in w and "depth 0 100.0 %, depth 1 60.0 %" in w for w in notes)
    # results written before answer groups existed summarise without them
    old = [{k: v for k, v in r.items() if k != "test_acc_by_group"} for r in runs]
    assert harness.summarize(old)[0]["acc_by_group"] == {}


def test_sweep_trains_longest_budgets_first_and_reports_in_config_order(tmp_path, trained_ids):
    calls = trained_ids
    # short, long, short, long: trained long ones first (stable among equals), results in the given order
    configs = [
        tiny_run("first_order", 0, steps=3),
        tiny_run("first_order", 0, steps=6),
        tiny_run("pow2", 0, steps=3),
        tiny_run("pow2", 0, steps=6),
    ]
    outcome = run_sweep(configs, tmp_path / "sweep", progress=False)
    assert calls == [configs[i].run_id for i in (1, 3, 0, 2)]
    assert [r["run_id"] for r in outcome.results] == [c.run_id for c in configs]


def test_extra_test_lengths_score_the_same_checkpoint_at_other_lengths():
    """``train.test_lengths``: the checkpoint tested at other sequence lengths (the task's seq_len),
    reported per length and averaged per row; configs without it keep their run ids."""
    base = RunConfig(
        label="gdn",
        task="state_tracking",
        task_args=dict(group="parity", seq_len=8),
        model=dict(d_model=16, layers=["gated_deltanet"], n_heads=2, positions="none"),
        train=TrainConfig(steps=30, eval_every=10, train_examples=256, val_examples=64, test_examples=64, lr=3e-3),
    )
    assert "test_lengths" not in base.to_dict()["train"]
    cfg = replace(base, train=replace(base.train, test_lengths=(8, 32)))
    assert cfg.run_id != base.run_id and RunConfig.from_dict(cfg.to_dict()).train == cfg.train
    r = train_one(cfg)
    assert set(r["test_acc_at"]) == {"8", "32"}
    assert r["test_acc_at"]["8"] == pytest.approx(r["test_acc"])  # the same test set at the training length
    assert 0.0 <= r["test_acc_at"]["32"] <= 1.0
    row = summarize([r])[0]
    assert row["acc_at"] == r["test_acc_at"]
    learned = replace(cfg, model={**cfg.model, "positions": "learned", "max_seq_len": 16})
    with pytest.raises(ValueError, match="test length 32 > max_seq_len 16"):
        learned.validate()
    with pytest.raises(ValueError, match="test_lengths must be positive"):
        TrainConfig(test_lengths=(0,))


def test_answer_logits_equal_the_full_heads_answers_and_give_the_same_loss():
    """The harness runs the head on answer positions only; in float64 its logits are the full
    model's at those positions and its loss is the ignore_index cross-entropy of the full logits."""
    torch.manual_seed(0)
    task = RunConfig(
        label="x", task="assoc_recall", task_args=dict(vocab_size=64, seq_len=16, num_kv_pairs=2)
    ).task_config()
    data = task.build(6, seed=3)
    model = MixerModel(ModelConfig(vocab_size=64, d_model=8, n_heads=2, layers=("pow2", "attention"))).double()
    full, _ = model(data.inputs)
    logits, answered = harness.answer_logits(model, data.inputs, data.labels)
    assert answered.sum() == (data.labels != -100).sum() and logits.shape == (int(answered.sum()), 64)
    torch.testing.assert_close(logits, full[answered], rtol=1e-12, atol=1e-12)
    ref = torch.nn.functional.cross_entropy(full.flatten(0, 1), data.labels.flatten(), ignore_index=-100)
    got = torch.nn.functional.cross_entropy(logits, data.labels[answered])
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_learning_budget_stops_on_patience_in_steps_never_before_min_steps():
    """A gain is min_gain over the last gain (a slow climb counts once it adds up); patience counts
    steps since the last gain, and no run stops on patience before min_steps."""
    tc = TrainConfig(
        steps=10_000, eval_every=100, patience_steps=300, min_gain=0.02, min_steps=1000, early_stop_acc=0.99
    )
    b = harness.LearningBudget(tc)
    plateau = [(s, 0.05) for s in range(100, 1100, 100)]  # flat from the start
    assert all(b.observe(s, a) is None for s, a in plateau[:-1])  # past the patience, but before min_steps
    assert b.observe(*plateau[-1]) == "patience"  # step 1000: 900 steps since the gain at 100
    b = harness.LearningBudget(tc)
    climb = [(100 * i, 0.05 + 0.011 * i) for i in range(1, 12)]  # +1.1 points per validation
    assert all(b.observe(s, a) is None for s, a in climb)
    assert b.last_gain_step == 1100  # gains counted every second validation
    assert b.observe(1200, 0.20) is None and b.last_gain_step == 1200
    # stopped by the step budget with the last gain inside the patience window: still rising
    assert b.still_rising("max_steps", 1450, []) and not b.still_rising("max_steps", 1500, [])
    assert not b.still_rising("patience", 1450, [])
    assert b.observe(1300, 0.99) == "early_stop_acc"
    # the loss read too: a plateau of accuracy whose loss still falls (as before a transition) goes on
    tc = TrainConfig(steps=10_000, eval_every=100, patience_steps=300, min_gain=0.02, min_loss_gain=0.05, min_steps=0)
    b = harness.LearningBudget(tc)
    falling = [(100 * i, 0.24, 2.5 - 0.03 * i) for i in range(1, 11)]  # -0.05 nats every ~170 steps
    assert all(b.observe(*v) is None for v in falling)
    assert b.last_gain_step == 900  # 2.23 nats, 0.06 below the gain before
    flat = [(1000 + 100 * i, 0.24, 2.2) for i in range(1, 3)]
    assert [b.observe(*v) for v in flat] == [None, "patience"]
    # no patience rule: the curve's last quarter decides, as before budgets by learning
    flat = [{"step": s, "val_acc": 0.25} for s in range(8)]
    assert not harness.LearningBudget(TrainConfig()).still_rising("max_steps", 8, flat)


def test_run_records_its_learning_curve_steps_to_fractions_and_budget_fields():
    res = train_one(tiny_run(steps=12, eval_every=3, patience_steps=6, min_steps=9, early_stop_acc=1.01))
    assert [c["step"] for c in res["curve"]][:2] == [3, 6]
    assert all(set(c) == {"step", "loss", "val_acc", "val_loss"} and c["val_loss"] > 0 for c in res["curve"])
    best = res["best_val_acc"]
    first = next(c["step"] for c in res["curve"] if c["val_acc"] >= 0.5 * best)
    assert res["steps_to_half"] == first and res["steps_to_90"] >= first
    assert isinstance(res["still_rising"], bool)
    assert harness.steps_to_fraction([{"step": 5, "val_acc": 0.0}], 0.0, 0.5) is None
    # the budget fields are part of the run id only when set; old configs' validation patience converts
    plain, learned = tiny_run(), tiny_run(patience_steps=6, min_gain=0.01, min_steps=9)
    assert (
        not set(harness.SyntheticTrainConfig().__dict__)
        - set(plain.to_dict()["train"])
        - {"patience_steps", "min_gain", "min_loss_gain", "min_steps", "test_lengths", "pack_examples", "curriculum"}
    )
    assert plain.run_id != tiny_run(pack_examples=2).run_id
    assert plain.run_id != learned.run_id and RunConfig.from_dict(learned.to_dict()).train == learned.train
    old = plain.to_dict()
    old["train"]["patience"] = 4
    assert RunConfig.from_dict(old).train.patience_steps == 4 * plain.train.eval_every
    with pytest.raises(ValueError, match="min_gain must be in"):
        TrainConfig(min_gain=1.5)
    with pytest.raises(ValueError, match="patience_steps must be an integer"):
        TrainConfig(patience_steps=-1)


def test_score_loss_is_the_mean_cross_entropy_over_answers():
    torch.manual_seed(0)
    data = (
        RunConfig(label="x", task="assoc_recall", task_args=dict(vocab_size=64, seq_len=16, num_kv_pairs=2))
        .task_config()
        .build(10, seed=3)
    )
    model = MixerModel(ModelConfig(vocab_size=64, d_model=8, n_heads=2, layers=("attention",))).double()
    with torch.no_grad():
        full, _ = model(data.inputs)
    ref = torch.nn.functional.cross_entropy(full.flatten(0, 1), data.labels.flatten(), ignore_index=-100)
    for batch_size in (256, 3):
        got = harness.score(model, data, batch_size=batch_size)
        assert got.loss == pytest.approx(float(ref), rel=1e-9)
        assert got.acc == harness.evaluate(model, data)


@pytest.mark.parametrize("layers", ["short_conv,pow2_ce", "attention", "mamba2"])
def test_packed_examples_give_the_same_step(layers):
    """pack_examples = 4: four examples to a row, each a document of its own; the loss and every
    gradient equal those of one example per row (float64), so a packed run learns the same thing."""
    task = harness.make_task("assoc_recall", seq_len=16, num_kv_pairs=2, vocab_size=32)
    data = task.build(8, seed=0)
    cfg = ModelConfig(vocab_size=task.vocab_size, d_model=16, n_heads=2, layers=layers, max_seq_len=16)
    grads = {}
    for pack in (1, 4):
        torch.manual_seed(0)
        model = MixerModel(cfg).double()
        logits, answered = harness.answer_logits(model, data.inputs, data.labels, pack=pack)
        assert answered.shape == data.labels.shape  # the mask of the examples, packed or not
        loss = torch.nn.functional.cross_entropy(logits, data.labels[answered])
        loss.backward()
        grads[pack] = [loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for g1, g4 in zip(grads[1], grads[4], strict=True):
        torch.testing.assert_close(g4, g1, rtol=1e-10, atol=1e-12)
    with pytest.raises(InputError, match="multiple of pack_examples"):
        TrainConfig(batch_size=6, pack_examples=4)
