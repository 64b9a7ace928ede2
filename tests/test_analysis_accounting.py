"""Cost and cache accounting: the measured decode cache equals the derivation for every registered mixer,
derived slopes are the stated complexities, and the flag table flags exactly the departures."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import ALL_MIXERS, small_mixer
from tokenmix.analysis import accounting
from tokenmix.analysis.accounting import (account_mixer, derived_costs, fit_loglog_slope, per_token_growth,
                                          run_accounting, stated_slope)
from tokenmix.analysis.outputs import PNG_SIGNATURE
from tokenmix.core.registry import build_mixer


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one thread is faster, and far faster on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", ALL_MIXERS)
def test_measured_cache_equals_derived(name):
    mixer = small_mixer(name)
    res = account_mixer(name, cache_ns=(1, 6, 19), mixer=mixer)
    assert [r["n"] for r in res["cache"]] == [1, 6, 19]
    for r in res["cache"]:
        assert r["measured_positions"] == r["derived_positions"], f"{name} n={r['n']}"
        assert r["measured_numel"] == r["derived_numel"], f"{name} n={r['n']}"
        assert r["match"]
    assert not [f for f in res["flags"] if f.startswith("cache")]


def test_derived_training_flops_sum_per_token_flops():
    m = build_mixer("pow2", 16, n_heads=2)
    rows = derived_costs(m, [1, 7, 50])
    for r in rows:  # exact below EXACT_SUM_POSITIONS
        mixing = 3 * sum(m.flops_per_token(t) for t in range(1, r["n"] + 1))
        proj = sum(p.numel() for p in m.parameters() if p.dim() >= 2)  # qkv and output projections
        assert proj == 16 * 3 * 16 + 16 * 16
        assert r["training_mixing_flops"] == mixing
        assert r["training_flops"] == mixing + 3 * r["n"] * proj
        assert r["cache_bytes"] == 4 * r["cache_numel"] == 4 * m.state_size(r["n"])
        assert r["cache_positions"] == m.cache_positions(r["n"])
    # beyond, a trapezoid sum over sampled positions: close to the exact sum
    n = 3 * accounting.EXACT_SUM_POSITIONS + 5
    approx = derived_costs(m, [n])[0]["training_mixing_flops"]
    exact = 3 * sum(m.flops_per_token(t) for t in range(1, n + 1))
    assert abs(approx - exact) / exact < 1e-3


@pytest.mark.parametrize("name,lo,hi", [("first_order", 0.99, 1.01), ("pow2", 1.05, 1.2), ("sq1", 1.4, 1.55),
                                        ("dense_recurrence", 1.95, 2.05)])
def test_derived_slopes_match_stated_complexity(name, lo, hi):
    m = build_mixer(name, 16, n_heads=2)
    # dense patterns cost O(t) per flops_per_token call; their slope is 2 at any length
    ns = [256, 512, 1024, 2048] if name == "dense_recurrence" else [1024, 2048, 4096, 8192, 16384]
    derived = fit_loglog_slope(ns, [r["training_mixing_flops"] for r in derived_costs(m, ns)])
    stated = stated_slope(m.time_complexity, ns)
    assert lo <= derived <= hi, f"{name}: derived slope {derived}"
    assert abs(derived - stated) <= accounting.SLOPE_TOLERANCE


def test_complexity_strings():
    ns = [1024, 16384]
    assert stated_slope("O(1)", ns) == pytest.approx(1.0)
    assert stated_slope("O(n)", ns) == pytest.approx(2.0)
    assert stated_slope("O(sqrt n)", ns) == pytest.approx(1.5)
    assert stated_slope("O(√n)", ns) == pytest.approx(1.5)
    assert 1.1 < stated_slope("O(log n)", ns) < 1.13
    assert stated_slope("O(m)", ns) == pytest.approx(1.0)
    assert stated_slope("O(d N)", ns) == pytest.approx(1.0)
    assert per_token_growth("O(f^-1(n))") is None
    assert per_token_growth("fast") is None
    assert fit_loglog_slope([2, 4, 8], [3 * 2**1.5, 3 * 4**1.5, 3 * 8**1.5]) == pytest.approx(1.5)
    assert fit_loglog_slope([2], [1.0]) is None


@pytest.mark.parametrize("name,exponent,flagged", [("first_order", 1.0, False), ("first_order", 1.2, True),
                                                   ("dense_recurrence", 1.5, False), ("dense_recurrence", 2.0, False),
                                                   ("dense_recurrence", 0.8, True), ("dense_recurrence", 2.2, True)])
def test_time_flag_follows_the_fitted_slope(monkeypatch, name, exponent, flagged):
    """A measured slope must lie between the projections' 1 and the mixing's derived slope (± 0.15)."""
    def fake_timing(mixer, n, **kwargs):
        t = 1e-6 * n**exponent
        return {"n": n, "seconds": t, "median_seconds": t, "all_seconds": [t], "mode": "chunked"}

    monkeypatch.setattr(accounting, "time_forward_backward", fake_timing)
    res = account_mixer(name, cache_ns=(), time_ns=(256, 512, 1024), d_model=8, n_heads=2, threads=1)
    assert res["slope"]["measured"] == pytest.approx(exponent)
    assert abs(res["slope"]["derived_mixing"] - (1.0 if name == "first_order" else 2.0)) < 0.02
    assert any(f.startswith("time") for f in res["flags"]) == flagged
    unjudged = account_mixer(name, cache_ns=(), time_ns=(256, 512, 1024), d_model=8, n_heads=2,
                             judge_time=False)
    assert unjudged["slope"]["measured"] == pytest.approx(exponent) and not unjudged["flags"]


def test_cache_mismatch_is_flagged(monkeypatch):
    m = build_mixer("pow2_ce", 8, n_heads=2)
    monkeypatch.setattr(m, "cache_positions", lambda n: 0)
    res = account_mixer("pow2_ce", cache_ns=(9,), mixer=m)
    assert res["cache"][0]["match"] is False
    assert res["flags"] and res["flags"][0].startswith("cache")


def test_budget_skips_longer_runs(monkeypatch):
    def slow_timing(mixer, n, **kwargs):
        return {"n": n, "seconds": 10.0, "median_seconds": 10.0, "all_seconds": [10.0], "mode": "chunked"}

    monkeypatch.setattr(accounting, "time_forward_backward", slow_timing)
    res = account_mixer("first_order", cache_ns=(), time_ns=(64, 128), d_model=8, n_heads=2, time_budget_s=15)
    assert [r["n"] for r in res["time"]] == [64]
    assert res["skipped"] == [{"what": "time", "n": 128, "why": "predicted > 15 s budget"}]


def test_run_accounting_writes_table_and_plots(tmp_path):
    out = run_accounting(["first_order", "pow2_ce"], tmp_path, cache_ns=(3, 9), time_ns=(32, 64), d_model=8,
                         n_heads=2, repeats=1, formats=("png",))
    data = json.loads((tmp_path / "cost.json").read_text())
    assert [r["mixer"] for r in data["summary"]] == ["first_order", "pow2_ce"]
    assert all(r["cache match"] for r in data["summary"])
    assert all(t["seconds"] > 0 and math.isfinite(t["seconds"]) for m in data["mixers"] for t in m["time"])
    md = (tmp_path / "cost.md").read_text()
    assert "| first_order |" in md and "| pow2_ce |" in md
    for name in ("cache.png", "time.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_SIGNATURE)
    assert out["figures"] == ["cache.png", "time.png"]
    with pytest.raises(ValueError, match="unknown mixer 'nope'"):
        run_accounting(["nope"], tmp_path)
