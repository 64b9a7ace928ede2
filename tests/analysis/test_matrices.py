"""Mixing-matrix viewer: figures render, the dependency graph and decay profile are the operator's own,
long inputs are refused, and trained-run inputs are the layers' real inputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from tokenmix.analysis.matrices import (
    analyze_matrix,
    analyze_registered,
    decay_profile,
    dependency_levels,
    head_matrices,
    plot_operator_heatmaps,
)
from tokenmix.analysis.outputs import PNG_SIGNATURE
from tokenmix.analysis.run_inputs import layer_inputs, text_layer_input
from tokenmix.core.operator import MAX_DENSE_T, MixOperator
from tokenmix.models.model import MixerModel, ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _check_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), f"{path.name} is not a PNG"
    assert len(data) > 1000


def _check_svg(path):
    root = ET.fromstring(path.read_text())
    assert root.tag.endswith("svg")
    assert len(list(root.iter())) > 20, f"{path.name} has almost no drawing elements"


def test_registered_mixer_figures_and_json(tmp_path):
    res = analyze_registered("pow2", 16, tmp_path, d_model=8, n_heads=2)
    for stem in ("matrices", "dependency", "decay"):
        _check_png(tmp_path / f"{stem}.png")
        _check_svg(tmp_path / f"{stem}.svg")
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert data["summary"]["T"] == 16 and data["summary"]["heads"] == 2
    assert data["summary"]["nnz_A_per_head"] == 16  # A is the diagonal of the structured mixer
    # pow2: the last position reaches every earlier one, within popcount(15) = 4 hops
    assert data["dependency"]["reached"] == 15 and data["dependency"]["max_hops"] == 4
    assert res["figures"] == data["figures"]


def test_dependency_levels_are_popcounts_for_pow2():
    from tokenmix.analysis.matrices import build_analysis_mixer, materialize_mixer, random_input

    mixer = build_analysis_mixer("pow2", d_model=8, n_heads=2)
    op = materialize_mixer(mixer, random_input(mixer, 40))
    for p in (39, 22):
        levels = dependency_levels(op, p, head=1)
        assert levels == {j: bin(p - j).count("1") for j in range(p + 1)}


def test_decay_profile_reads_the_diagonals():
    gamma = 0.5
    t = 10
    b = torch.diag_embed(torch.full((1, 1, t - 1), gamma, dtype=torch.float64), offset=-1)
    op = MixOperator(torch.eye(t, dtype=torch.float64).expand(1, 1, t, t).clone(), b)
    prof = decay_profile(op)
    expected = torch.tensor([gamma**d for d in range(t)], dtype=torch.float64).numpy()
    assert abs(prof["mean"][0] - expected).max() < 1e-12
    assert abs(prof["max"][0] - expected).max() < 1e-12


def test_state_axis_and_readout_are_drawn(tmp_path):
    g, t = 3, 8
    torch.manual_seed(0)
    a = torch.tril(torch.randn(1, 2, g, t, t, dtype=torch.float64))
    b = torch.tril(torch.randn(1, 2, g, t, t, dtype=torch.float64), -1) * 0.3
    r = torch.tril(torch.randn(1, 2, g, t, t, dtype=torch.float64))
    op = MixOperator(a, b, r)
    mats = head_matrices(op, channel=2)
    assert set(mats) == {"A", "B", "R", "M"}
    assert torch.equal(mats["A"], a[0, :, 2])
    assert torch.allclose(mats["M"], op.mixing_matrix()[0])
    files = plot_operator_heatmaps(op, tmp_path, "g", formats=("png",), channel=2)
    _check_png(files[0])
    with pytest.raises(ValueError, match="state channel"):
        head_matrices(op, channel=3)
    with pytest.raises(ValueError, match="head index"):
        plot_operator_heatmaps(op, tmp_path, "bad", heads=[5], formats=("png",))


def test_too_long_to_materialise_is_refused(tmp_path):
    with pytest.raises(ValueError, match=rf"limit {MAX_DENSE_T}.*expressivity"):
        analyze_registered("pow2", MAX_DENSE_T + 1, tmp_path)


def test_trained_run_layer_inputs(tmp_path):
    from safetensors.torch import save_file

    cfg = ModelConfig(vocab_size=256, d_model=8, layers=("pow2", "first_order"), n_heads=2, mlp=False)
    torch.manual_seed(0)
    model = MixerModel(cfg)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model": {"vocab_size": 256, "d_model": 8, "n_heads": 2, "layers": ["pow2", "first_order"], "mlp": False}}
        )
    )
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"},
        str(tmp_path / "model.safetensors"),
    )
    mixer, x, name = text_layer_input(tmp_path, "hello", layer=1)
    assert name == "first_order" and x.shape == (1, 5, 8)
    idx = torch.tensor([list(b"hello")])
    expected = layer_inputs(model.eval(), idx)[1]
    assert torch.allclose(x, expected)
    out = tmp_path / "viewer"
    out.mkdir()
    res = analyze_matrix(mixer.double(), x.double(), out, name=name, formats=("png",))
    assert res["summary"]["T"] == 5
    _check_png(out / "matrices.png")
    with pytest.raises(ValueError, match="layer 2 out of range"):
        text_layer_input(tmp_path, "hi", layer=2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        text_layer_input(tmp_path / "missing", "hi", layer=0)


def test_operators_too_large_for_memory_are_refused(tmp_path, monkeypatch):
    from tokenmix.analysis import matrices
    from tokenmix.analysis.matrices import build_analysis_mixer, operator_bytes

    mixer = build_analysis_mixer("pow2", d_model=8, n_heads=2)
    assert operator_bytes(mixer, 10) == 2 * 2 * 10 * 10 * 8  # A and B, two heads, float64
    monkeypatch.setattr(matrices, "MAX_OPERATOR_BYTES", operator_bytes(mixer, 10))
    analyze_registered("pow2", 10, tmp_path, d_model=8, n_heads=2, formats=("png",))
    with pytest.raises(ValueError, match="GiB.*smaller --n"):
        analyze_registered("pow2", 11, tmp_path, d_model=8, n_heads=2, formats=("png",))
