"""The frontier presets and their report part: the sweep's shape, measured state = derived state per
point, the table / plots / findings from a tiny real sweep, and the verdict logic."""
from __future__ import annotations

from dataclasses import replace

import pytest

from lm_helpers import one_thread

from tokenmix.study.frontier import (FrontierPoint, LayerState, frontier_column, frontier_findings,
                                     frontier_section, parse_column, row_layer_state)
from tokenmix.study.presets import frontier as F
from tokenmix.study.presets import get_preset
from tokenmix.training.synthetic import run_sweep, validate_sweep


_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)


def _grid(cells, train=F.TRAIN, step_tokens=16 * 4) -> F.FrontierGrid:
    return F.FrontierGrid(256, F.MODEL, tuple(cells), 4, (1e-2,), (0,), step_tokens, train)


def test_frontier_preset_follows_its_protocol():
    runs = validate_sweep(get_preset("compare", "frontier").build())
    assert {r.label for r in runs} == set(F.DEFAULT_MIXERS)
    assert len(runs) == len(F.DEFAULT_MIXERS) * len(F.CELLS) * len(F.LRS) * len(F.SEEDS)
    for r in runs:
        n, d = parse_column(r.column_name)
        task = r.task_config()
        assert (task.seq_len, task.vocab_size, task.num_kv_pairs) == (n, F.VOCAB, n // F.PAIRS_PER_LENGTH)
        model = r.model_config()
        assert model.d_model == d and model.positions == "none"
        assert model.layers == (F.CONV, r.label, F.CONV, r.label)
        assert r.train.test_lengths == tuple(k * n for k in (2, 4) if k * n < F.VOCAB)
        assert r.train.steps * n == F.STEP_TOKENS  # the same tokens, and answers, in every cell
    assert {r.train.test_lengths for r in runs if r.task_config().seq_len == 64} == {(128, 256)}
    full = validate_sweep(get_preset("compare", "frontier_full").build(["rg_lru"]))
    assert {parse_column(r.column_name)[0] for r in full} == {64, 128, 256, 512}
    assert {r.task_config().vocab_size for r in full} == {8192}
    assert {"rg_lru", "log_linear_mamba2"} <= {r.label for r in full}


def test_measured_layer_state_equals_the_derived_accounting():
    for mixer, cls in (("attention", "O(n)"), ("pow2_ce", "O(log n)"), ("gla", "O(1)")):
        cfg = _grid([(16, 8)]).runs([mixer])[0].model_config()
        st = row_layer_state(mixer, cfg, 16)
        assert st.scalars_measured == st.scalars_derived > 0 and st.cache_class == cls
    # attention keeps every past key and value (grows with n); gla's state does not
    sizes = {m: [row_layer_state(m, _grid([(n, 8)]).runs([m])[0].model_config(), n)
                 .scalars_measured for n in (16, 32)] for m in ("attention", "gla")}
    assert sizes["attention"][1] > sizes["attention"][0] and sizes["gla"][1] == sizes["gla"][0]


def test_a_tiny_frontier_sweep_gives_its_table_plots_and_findings(tmp_path):
    tiny = replace(F.TRAIN, steps=4, batch_size=4, train_examples=16, val_examples=8, test_examples=8, eval_every=2,
                   warmup_steps=1)
    runs = _grid([(16, 8), (32, 8)], train=tiny, step_tokens=4 * 16).runs(["attention", "first_order"])
    outcome = run_sweep(runs, tmp_path, workers=1, progress=False)
    section = frontier_section(tmp_path, runs, outcome.results)
    table_lines = [line for line in section.markdown.splitlines() if line.startswith("| ")
                   and ("attention" in line or "first_order" in line)]
    assert len(table_lines) == 4  # one per (row, cell)
    assert "acc @2L %" in section.markdown and "acc @4L %" in section.markdown
    assert {p.name for p in section.figures} == {"frontier_accuracy_vs_state.png", "frontier_accuracy_vs_length.png",
                                                 "frontier_extrapolation.png"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in section.figures)
    verdicts = {f["claim"]: f["verdict"] for f in section.findings}
    assert any("attention solves MQAR" in c for c in verdicts)
    # rows not in the sweep are reported as not measured, never as holding
    assert all(v == "not measured" for c, v in verdicts.items() if "pow2" in c or "log-linear" in c)


def _point(label, acc, length=256, width=64, state=10, cls="O(1)"):
    return FrontierPoint(label, length, width, acc, 0.0, 1, 1e-3, state=LayerState(state, state, 0, cls))


def test_frontier_verdicts_follow_the_numbers():
    pts = [_point("attention", 0.95), _point("attention", 0.92, width=32), _point("pow2", 0.6), _point("pow2_ce", 0.58),
           _point("sq1", 0.7), _point("sq1_ce", 0.5), _point("first_order", 0.3), _point("gla", 0.55)]
    v = {f["claim"].split(" (")[0]: f["verdict"] for f in frontier_findings(pts)}
    assert v["attention solves MQAR at every length at its smallest width"] == "holds"
    assert v["pow2_ce keeps pow2's recall with its smaller cache"] == "holds"
    assert v["sq1_ce keeps sq1's recall with its smaller cache"] == "does not hold"
    assert v["the structured patterns"] == "holds"  # min(0.6, 0.7) > max(0.3, 0.55)
    pts[-1] = _point("gla", 0.65)
    v = {f["claim"].split(" (")[0]: f["verdict"] for f in frontier_findings(pts)}
    assert v["the structured patterns"] == "does not hold"
    # rows at their guessing level test nothing: "untested", never "holds"
    low = [_point(lab, 0.26, state=10) for lab in ("pow2", "pow2_ce")]
    for p in low:
        p.guess = 0.25
    v = {f["claim"].split(" (")[0]: f["verdict"] for f in frontier_findings(low)}
    assert v["pow2_ce keeps pow2's recall with its smaller cache"] == "untested"


def test_column_names_round_trip():
    assert parse_column(frontier_column(128, 64)) == (128, 64)
    assert parse_column("assoc_recall") is None
