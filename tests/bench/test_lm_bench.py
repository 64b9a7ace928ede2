"""`tokenmix bench lm` at toy size: models sized to equal parameter counts, JSON with ratios to attention."""

from __future__ import annotations

import json

import pytest

from tokenmix.bench import lm as bench_lm
from tokenmix.cli.bench_cmd import lm_bench_config
from tokenmix.cli.main import build_parser, main
from tokenmix.models import MixerModel

pytestmark = pytest.mark.usefixtures("one_thread")


ARGV = [
    "bench",
    "lm",
    "--contexts",
    "16",
    "48",
    "--target-params",
    "6000",
    "--vocab-size",
    "64",
    "--batch-tokens",
    "96",
    "--train-steps",
    "1",
    "--decode-tokens",
    "3",
]


def _args(*extra: str) -> bench_lm.LMBenchConfig:
    """The benchmark's config as the CLI builds it from these flags."""
    return lm_bench_config(build_parser().parse_args([*ARGV, *extra]))


def test_models_are_sized_to_the_same_parameter_count():
    args = _args()
    for mixer in ("attention", "pow2", "hlru"):
        cfg, n = bench_lm.size_model(mixer, args)
        assert MixerModel(cfg).num_params(exclude_embedding=True) == n
        assert abs(n - 6000) / 6000 < 0.35, (mixer, cfg.d_model, n)


def test_bench_lm_reports_json_with_ratios(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main([*ARGV, "--mixers", "pow2", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == report
    rows = {(r["mixer"], r["context"]): r for r in report["results"]}
    assert set(rows) == {
        ("attention", 16),
        ("attention", 48),
        ("pow2", 16),
        ("pow2", 48),
    }  # attention added as baseline
    for r in rows.values():
        assert r["train_tokens_per_s"] > 0 and r["decode_ms_per_token"] > 0
        assert r["train_batch"] == 96 // r["context"]
    ratio = report["ratios"]["48"]["pow2"]
    expected = rows[("pow2", 48)]["train_tokens_per_s"] / rows[("attention", 48)]["train_tokens_per_s"]
    assert ratio["train_vs_attention"] == pytest.approx(expected, abs=1e-3)
    assert "meets_long_context_targets" in ratio and "within_1.5x_of_attention" in report["ratios"]["16"]["pow2"]


def test_unknown_mixer_is_refused():
    with pytest.raises(ValueError, match="unknown mixer"):
        bench_lm.run(_args("--mixers", "attention,nope"))


def test_mixers_take_turns_with_the_first_rotating():
    calls: list[tuple[str, int]] = []
    fns = {m: (lambda i, m=m: calls.append((m, i))) for m in ("attention", "pow2", "mamba2")}
    timings = bench_lm._round_robin(fns, range(10, 13))
    assert calls == [
        ("attention", 10),
        ("pow2", 10),
        ("mamba2", 10),
        ("pow2", 11),
        ("mamba2", 11),
        ("attention", 11),
        ("mamba2", 12),
        ("attention", 12),
        ("pow2", 12),
    ]
    assert set(timings) == set(fns) and all(w >= 0 and c >= 0 for w, c in timings.values())


def test_decode_takes_turns_in_blocks_of_consecutive_tokens():
    calls: list[tuple[str, int]] = []
    fns = {m: (lambda i, m=m: calls.append((m, i))) for m in ("attention", "pow2")}
    bench_lm._round_robin(fns, range(0, 5), block=2)
    assert calls == [
        ("attention", 0),
        ("attention", 1),
        ("pow2", 0),
        ("pow2", 1),
        ("pow2", 2),
        ("pow2", 3),
        ("attention", 2),
        ("attention", 3),
        ("attention", 4),
        ("pow2", 4),
    ]
