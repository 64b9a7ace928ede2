"""What ``tokenmix bench mixers`` times and counts for the linear-attention family (no timing asserted).

- ``mixing_core`` is the chunked mode's own mixing: its output, through the mixer's skip term and
  output projection, is the mixer's chunked output (so the core timing times the real work);
- the benchmark case reports a core time for the family and none for other mixers;
- projection FLOPs are 3 x 2 x the multiply-adds of the nn.Linear layers.
"""

from __future__ import annotations

import pytest
import torch

from tokenmix.bench.mixers import prepare_mixer_case, projection_flops
from tokenmix.mixers.registry import build_mixer

FAMILY = ["linear_attention", "retnet", "gla", "mamba2", "diag_ssm"]


@pytest.mark.parametrize("name", FAMILY)
def test_mixing_core_is_the_chunked_mixing(name):
    torch.manual_seed(0)
    m = build_mixer(name, 24, n_heads=3, chunk_size=8).double()
    x = torch.randn(2, 21, 24, dtype=torch.float64)
    core, inputs = m.mixing_core(x)
    o, state = core(*inputs)
    skip = m._features(x).skip
    if name == "diag_ssm":
        y = m.out(o + skip[..., 0])
    else:
        y = m.out((o if skip is None else o + skip).flatten(2))
    y_ref, s_ref = m(x, mode="chunked")
    assert torch.allclose(y, y_ref, atol=1e-12, rtol=0)
    assert torch.allclose(state.reshape(s_ref.memory.shape), s_ref.memory, atol=1e-12, rtol=0)
    assert any(z is not None and z.requires_grad for z in inputs)


@pytest.mark.parametrize("name,has_core", [("linear_attention", True), ("diag_ssm", True), ("attention", False)])
def test_case_reports_core_time_for_the_family_only(name, has_core):
    case = {"kind": "mixer", "n": 32, "heads": 2, "head_dim": 8, "batch": 1, "repeats": 1, "mixer": name}
    fn, extra = prepare_mixer_case(case)
    fn()
    assert extra["model_flops"] > 0 and extra["projection_flops"] > 0
    assert ("core_time_s" in extra) == has_core
    if has_core:
        assert extra["core_time_s"] > 0


def test_projection_flops_count_every_linear_layer():
    m = build_mixer("linear_attention", 256, n_heads=4)
    assert projection_flops(m, 10) == 3 * 2 * (256 * 768 + 256 * 256) * 10
