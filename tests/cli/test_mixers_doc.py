"""docs/mixers.md is generated from the registry (``tokenmix list --markdown``) and must be current;
the op level (``tokenmix.ops``) exports the user-facing kernels with their shapes documented."""

from __future__ import annotations

import inspect
from pathlib import Path

import tokenmix.ops
from lm_helpers import run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "mixers.md"


def test_docs_mixers_md_is_current(capsys):
    rc, out, err = run_cli(["list", "--markdown"], capsys)
    assert rc == 0, err
    assert DOC.read_text() == out, "docs/mixers.md is stale: run `tokenmix list --markdown > docs/mixers.md`"


def test_the_page_names_every_mixer_with_its_outside_parameter_names():
    text = DOC.read_text()
    for name in ("mamba2", "gla", "gated_deltanet", "attention", "pow2_ce"):
        assert f"\n## {name}\n" in text
    mamba2 = text.split("\n## mamba2\n")[1].split("\n## ")[0]
    assert "| `state_dim` | int | 64 | mamba `d_state`" in mamba2 and "Dao & Gu 2024" in mamba2


def test_ops_exports_the_user_facing_kernels_with_shape_docs():
    assert {"chunked_gla", "recurrent_gla", "chunked_delta_rule", "recurrent_delta_rule"} <= set(tokenmix.ops.__all__)
    for name in tokenmix.ops.__all__:
        fn = getattr(tokenmix.ops, name)
        assert callable(fn) and fn.__module__.startswith("tokenmix.ops."), name
        doc = inspect.getdoc(fn) or ""
        assert "[B, T" in doc or "signature of" in doc or "Same arguments" in doc, f"{name}: no shapes in its docstring"
