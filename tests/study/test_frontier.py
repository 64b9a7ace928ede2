"""The frontier presets and their report part: the sweep's shape, measured state = derived state per
point, the table / plots / findings from a tiny real sweep, and the verdict logic."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenmix.runs.synthetic import CurriculumPhase
from tokenmix.study.cells import CompareCells
from tokenmix.study.frontier import (
    NATURAL,
    FrontierPoint,
    LayerState,
    frontier_column,
    frontier_findings,
    frontier_section,
    pareto_front,
    parse_column,
    row_layer_state,
)
from tokenmix.study.presets import frontier as F
from tokenmix.study.presets import get_preset
from tokenmix.training.sweep import run_sweep, validate_sweep

pytestmark = pytest.mark.usefixtures("one_thread")


def _grid(cells, train=F.TRAIN) -> F.FrontierGrid:
    return F.FrontierGrid(
        256, F.MODEL, tuple(cells), 4, (1e-2,), (0,), train, length_scaling=-1.0, base_length=16, curriculum_steps=2
    )


def test_frontier_preset_follows_its_protocol():
    runs = validate_sweep(get_preset("compare", "frontier").build())
    assert {r.label for r in runs} == set(F.DEFAULT_MIXERS)
    natural = [r for r in runs if r.column_name.endswith(NATURAL)]
    taught = [r for r in runs if not r.column_name.endswith(NATURAL)]
    assert len(taught) == len(F.DEFAULT_MIXERS) * len(F.SEEDS) and len(F.SEEDS) == 3
    # the one-hop curriculum for every row; the rows whose layer reads every position in one hop train
    # on MQAR throughout (their one-hop instances are MQAR), the others have a natural run besides
    every = {"attention", "gated_deltanet", "log_linear_mamba2", "log_linear_gated_deltanet"}
    assert {r.label for r in natural} == set(F.DEFAULT_MIXERS) - every and len(natural) == 3 * (11 - len(every))
    for r in taught:
        phases = r.train.curriculum
        assert phases == (() if r.label in every else (CurriculumPhase(F.CURRICULUM_STEPS, "one_hop"),))
    assert all(not r.train.curriculum for r in natural)
    for r in taught + [replace(r, column=r.column_name[: -len(NATURAL)]) for r in natural]:
        n, d = parse_column(r.column_name)
        assert (n, d) == (64, 64)  # the main cell
        task = r.task_config()
        assert (task.seq_len, task.vocab_size, task.num_kv_pairs) == (n, F.VOCAB, n // F.PAIRS_PER_LENGTH)
        assert task.power_a == 1.0 and not task.random_non_queries  # uniform gaps, no random filler ids
        model = r.model_config()
        assert model.d_model == d and model.positions == "none"
        assert model.layers == (F.CONV, r.label, F.CONV, r.label)
        assert r.train.test_lengths == (128, 256) and F.VOCAB > 256
        # budget by learning: a floor past the plateau, a patience with a minimum gain, a maximum
        assert r.train.steps == F.MAX_STEPS > r.train.min_steps == F.MIN_STEPS > 0
        assert r.train.patience_steps == F.PATIENCE_STEPS > 0 and r.train.min_gain == F.MIN_GAIN > 0
        assert r.train.min_loss_gain == F.MIN_LOSS_GAIN > 0
    long = validate_sweep(get_preset("compare", "frontier_long").build())
    local = next(r for r in long if r.label == "local_attention").model_config()
    assert local.mixer_overrides["local_attention"]["window"] == F.LOCAL_WINDOW
    assert {parse_column(r.column_name.removesuffix(NATURAL)) for r in long} == set(F.LONG_CELLS)
    assert {r.train.test_lengths for r in long if r.task_config().seq_len == 256} == {()}
    full = validate_sweep(get_preset("compare", "frontier_full").build(["rg_lru"]))
    full = [r for r in full if not r.column_name.endswith(NATURAL)]
    assert {parse_column(r.column_name)[0] for r in full} == {64, 128, 256, 512}
    assert {r.task_config().vocab_size for r in full} == {8192}
    assert {r.task_config().power_a for r in full} == {0.01}
    assert {r.train.steps * parse_column(r.column_name)[0] for r in full} == {F.FULL_TRAIN.steps * 64}  # equal tokens
    assert {"rg_lru", "log_linear_mamba2"} <= {r.label for r in full}


def test_measured_layer_state_equals_the_derived_accounting():
    for mixer, cls in (("attention", "O(n)"), ("pow2_ce", "O(log n)"), ("gla", "O(1)")):
        cfg = _grid([(16, 8)]).runs([mixer])[0].model_config()
        st = row_layer_state(mixer, cfg, 16)
        assert st.scalars_measured == st.scalars_derived > 0 and st.cache_class == cls
    # attention keeps every past key and value (grows with n); gla's state does not
    sizes = {
        m: [row_layer_state(m, _grid([(n, 8)]).runs([m])[0].model_config(), n).scalars_measured for n in (16, 32)]
        for m in ("attention", "gla")
    }
    assert sizes["attention"][1] > sizes["attention"][0] and sizes["gla"][1] == sizes["gla"][0]


def test_a_tiny_frontier_sweep_gives_its_table_plots_and_findings(tmp_path):
    tiny = replace(
        F.TRAIN,
        steps=4,
        batch_size=4,
        train_examples=16,
        val_examples=8,
        test_examples=8,
        eval_every=2,
        warmup_steps=1,
        min_steps=0,
        patience_steps=0,
    )
    runs = _grid([(16, 8), (32, 8)], train=tiny).runs(["attention", "first_order"])
    outcome = run_sweep(runs, tmp_path, workers=1, progress=False)
    section = frontier_section(tmp_path, CompareCells.build(runs, outcome.results, structure=False))
    table_lines = [
        line
        for line in section.markdown.splitlines()
        if line.startswith("| ") and ("attention" in line or "first_order" in line)
    ]
    assert len(table_lines) == 4  # one per (row, cell)
    assert "acc @2L %" in section.markdown and "acc @4L %" in section.markdown
    assert "key+value in conv window: 1 / 2 hops %" in section.markdown and "100.0 / 100.0" in section.markdown
    assert "acc % by read (share %)" in section.markdown and "natural acc %" in section.markdown
    assert {p.name for p in section.figures} == {
        "frontier_accuracy_vs_state.png",
        "frontier_accuracy_vs_length.png",
        "frontier_extrapolation.png",
    }
    assert all(p.is_file() and p.stat().st_size > 0 for p in section.figures)
    verdicts = {f["claim"]: f["verdict"] for f in section.findings}
    assert any("attention solves MQAR" in c for c in verdicts) and any(c.startswith("calibrated") for c in verdicts)
    # rows not in the sweep are reported as not measured, never as holding
    assert all(v == "not measured" for c, v in verdicts.items() if "pow2" in c or "log-linear" in c)


def _point(label, acc, length=64, width=64, state=10, cls="O(1)", std=0.0, seeds=(), rising=0, guess=0.1):
    p = FrontierPoint(
        label,
        length,
        width,
        acc,
        std,
        max(len(seeds), 1),
        1e-3,
        state=LayerState(state, state, 0, cls),
        guess=guess,
        still_rising=rising,
        acc_by_seed=dict(enumerate(seeds)) if seeds else {0: acc},
        best_val_by_seed=dict(enumerate(seeds)) if seeds else {0: acc},
    )
    return p


def _verdicts(pts):
    return {f["claim"].split(" (")[0]: f for f in frontier_findings(pts)}


def test_frontier_verdicts_follow_the_numbers():
    pts = [
        _point("attention", 0.97),
        _point("attention", 0.92, length=128),
        _point("pow2", 0.6),
        _point("pow2_ce", 0.58),
        _point("sq1", 0.7),
        _point("sq1_ce", 0.5),
        _point("first_order", 0.3),
        _point("gla", 0.55),
    ]
    v = _verdicts(pts)
    assert v["calibrated: attention ≥ 95 % at L=64, d=64"]["verdict"] == "holds"
    assert v["attention solves MQAR at every length at its smallest width"]["verdict"] == "holds"
    assert v["pow2_ce keeps pow2's recall with its smaller cache"]["verdict"] == "holds"
    assert v["sq1_ce keeps sq1's recall with its smaller cache"]["verdict"] == "does not hold"
    assert v["pow2 recalls more than the best O(1)-state row"]["verdict"] == "holds"  # 0.6 > max(0.3, 0.55)
    assert v["sq1 recalls more than the best O(1)-state row"]["verdict"] == "holds"
    pts[-1] = _point("gla", 0.65)
    v = _verdicts(pts)
    assert v["pow2 recalls more than the best O(1)-state row"]["verdict"] == "does not hold"
    assert v["sq1 recalls more than the best O(1)-state row"]["verdict"] == "holds"
    assert v["attention ≥ every pattern recurrence"]["verdict"] == "holds"
    pts[0] = _point("attention", 0.9)
    v = _verdicts(pts)
    assert v["calibrated: attention ≥ 95 % at L=64, d=64"]["verdict"] == "does not hold"


def test_frontier_claims_say_the_spread_the_still_rising_cells_and_untested_rows():
    # every seed of pow2 above every seed of the best O(1) row: beyond the spread
    pts = [
        _point("attention", 0.99),
        _point("pow2", 0.6, std=0.02, seeds=(0.58, 0.6, 0.62)),
        _point("mamba2", 0.4, std=0.1, seeds=(0.3, 0.4, 0.5), rising=2),
    ]
    f = _verdicts(pts)["pow2 recalls more than the best O(1)-state row"]
    assert f["verdict"] == "holds" and f["still_rising"] == ["mamba2"]
    why = " | ".join(f["why"])
    assert "+20.0 points, beyond the seeds' spread" in why and "every seed of the first above every seed" in why
    assert "judged on cells still rising when their budget ended: mamba2" in why
    assert "seeds 58.0, 60.0, 62.0" in f["measured"]
    # rows that never left their guessing level test nothing: "untested", never "holds"
    low = [_point(lab, 0.26, guess=0.25) for lab in ("pow2", "pow2_ce")]
    f = _verdicts(low)["pow2_ce keeps pow2's recall with its smaller cache"]
    assert f["verdict"] == "untested" and "did not learn within it" in " | ".join(f["why"])
    # one side learned: decided, with the other named as never leaving the guessing level
    mixed = [_point("pow2", 0.26, guess=0.25), _point("pow2_ce", 0.5, guess=0.25)]
    f = _verdicts(mixed)["pow2_ce keeps pow2's recall with its smaller cache"]
    assert (
        f["verdict"] == "holds"
        and "pow2: " in " | ".join(f["why"])
        and "never left the guessing level" in " | ".join(f["why"])
    )


def test_column_names_round_trip():
    assert parse_column(frontier_column(128, 64)) == (128, 64)
    assert parse_column("assoc_recall") is None


def test_the_pareto_claim_reads_state_and_the_seeds_spread():
    def pts(ce_acc, ce_std=0.01):
        return [
            _point("attention", 0.97, state=8192, cls="O(n)"),
            _point("gla", 0.5, state=2048, std=0.02),
            _point("pow2_ce", ce_acc, state=768, cls="O(log n)", std=ce_std),
            _point("pow2", 0.4, state=4096, cls="O(n)"),
        ]

    claim = "a pattern row is on the accuracy-vs-state Pareto front"
    on = _verdicts(pts(0.6))[claim]
    assert on["verdict"] == "holds" and "pattern rows on it: pow2_ce" in on["measured"]
    assert [p.label for p in pareto_front(pts(0.6))] == ["pow2_ce", "attention"]  # gla: less, with more state
    assert any("pow2 (4096 scalars" in w and "dominated by gla, pow2_ce" in w for w in on["why"])
    # pow2_ce below gla, which keeps more state: pow2_ce stays on the front (nothing smaller beats it)
    assert _verdicts(pts(0.3))[claim]["verdict"] == "holds"
    small_gla = pts(0.3)
    small_gla[1].state = LayerState(512, 512, 0, "O(1)")  # now gla is smaller and better: pow2_ce is off
    assert _verdicts(small_gla)[claim]["verdict"] == "does not hold"
    small_gla[2].acc_std = 0.2  # ... unless the spread covers the gap
    assert _verdicts(small_gla)[claim]["verdict"] == "holds"
    # without attention and an O(1)-state row beside them the front says nothing about the trade
    alone = [p for p in pts(0.6) if p.label in ("pow2_ce", "pow2")]
    assert _verdicts(alone)[claim]["verdict"] == "not measured"
