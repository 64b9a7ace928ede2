"""Every independent cross-check registered in tokenmix.checks (``tokenmix check`` runs the same
functions): each stays within its tolerance (NaN fails) and compares every mode of its mixer.

References: fla-core 0.6.0's pure-PyTorch naive.py files (loaded by path), torch SDPA, and explicit
formulas (ChaCAL's dense inverse, H-LRU's per-channel loop). Each check states its metric in its label.
"""
from __future__ import annotations

import pytest

from tokenmix.checks import CROSSCHECKS, load_all_crosschecks
from tokenmix.mixers.registry import build_mixer

load_all_crosschecks()
REFERENCES = {
    "attention": ("fla naive_parallel_attn", "torch SDPA"),
    "local_attention": ("fla naive_parallel_attn window_size",),
    "chacal": ("dense-inverse formula",),
    "hlru": ("per-channel loop",),
    "deltanet": ("fla delta_rule_recurrence",),
    "gated_deltanet": ("fla naive_recurrent_gated_delta_rule", "fla naive_chunk_gated_delta_rule"),
    "log_linear": ("fla naive_log_linear_attn", "fla construct_level_mask"),
    "linear_attention": ("fla naive_recurrent_linear_attn", "fla naive_chunk_linear_attn"),
    "retnet": ("fla naive_retention",),
    "gla": ("fla naive_recurrent_gla",),
    "mamba2": ("fla naive_recurrent_simple_gla", "fla naive_chunk_simple_gla"),
    "diag_ssm": ("fla naive_recurrent_gla one head per channel",),
    # the 2025-26 mixers (issue 22)
    "gated_delta_product": ("fla naive_recurrent_gated_delta_product",),
    "kda": ("fla naive_recurrent_kda", "fla naive_chunk_kda"),
    "gdn2": ("fla naive_recurrent_gdn2", "fla naive_chunk_gdn2"),
    "forgetting_attention": ("fla naive_forgetting_attn",),
    "stickbreaking_attention": ("fla naive_stickbreaking_attn",),
    "path_attention": ("fla naive_path_attn",),
    "mesa_net": ("fla naive_mesa_net_exact",),
    "hgrn2": ("fla naive_recurrent_hgrn",),
    "rg_lru": ("plain loop of the Griffin paper's equations",),
    "short_conv": ("explicit loop", "nn.Conv1d(padding=k-1)"),
    "ttt_linear": ("fla chunk_ttt_linear_ref",),
    "log_linear_mamba2": ("fla naive_log_linear_attn",),
    "log_linear_gated_deltanet": ("explicit λ-weighted gated-delta formula", "level scales 1 vs fla"),
}
GLA_FAMILY = {"linear_attention", "retnet", "gla", "mamba2", "diag_ssm"}
FLOAT32_REL_TOL = 1e-5
CASES = [pytest.param(name, label, fn, tol, id=f"{name}: {label}")
         for name in REFERENCES for label, fn, tol in CROSSCHECKS.get(name, [])]


@pytest.mark.parametrize("name", list(REFERENCES))
def test_mixer_is_crosschecked_against_its_references(name):
    labels = [label for label, _, _ in CROSSCHECKS.get(name, [])]
    missing = [ref for ref in REFERENCES[name] if not any(label.startswith(ref) for label in labels)]
    assert not missing, f"{name}: no registered cross-check against {missing} (registered: {labels})"


@pytest.mark.parametrize("name,label,check,tolerance", CASES)
def test_crosscheck_within_tolerance(name, label, check, tolerance):
    errors = check()
    assert errors, f"{name} vs {label}: the check returned no errors"
    too_large = {q: e for q, e in errors.items() if not e <= tolerance}  # NaN counts as too large
    assert not too_large, f"{name} vs {label}: errors above {tolerance:.0e}: {too_large}"
    if "construct_level_mask" in label:  # compares level patterns, not a mixer's modes
        return
    modes = build_mixer(name, 12, n_heads=2).modes
    uncovered = [mode for mode in modes if not any(f"{mode}." in q for q in errors)]
    assert not uncovered, f"{name} vs {label}: modes not compared with the reference: {uncovered}"
    if name in GLA_FAMILY:
        assert tolerance <= FLOAT32_REL_TOL, f"{name} vs {label}: tolerance {tolerance:.0e} is too loose"
        # both op implementations, outputs (and, except for fla's stateless chunk form, final states)
        for impl in ("chunked_gla", "recurrent_gla"):
            assert any(q.startswith(f"op.{impl}") and q.endswith(".output") for q in errors), \
                f"{name} vs {label}: op {impl} not compared with the reference"
        stateful = "naive_chunk_linear_attn" not in label
        if stateful:
            assert any(q.startswith("op.") and q.endswith(".state") for q in errors), \
                f"{name} vs {label}: no op final state compared"
        needed = (".output", ".continued.output", ".state") if stateful else (".output",)
        missing = [mode + what for mode in modes for what in needed if f"{mode}{what}" not in errors]
        assert not missing, f"{name} vs {label}: modes/quantities not compared with the reference: {missing}"
