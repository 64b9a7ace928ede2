"""Mode equivalence of a registered mixer, measured (used by ``tokenmix check``)."""

from __future__ import annotations

import dataclasses

import torch

from tokenmix.mixers.registry import build_mixer, get_mixer_spec


def small_overrides(name: str, **extra) -> dict:
    """Config overrides of a registered mixer at test size: its ``test_overrides``, chunk size 4 (so
    chunks do not divide the test lengths), then ``extra``; only fields its config has."""
    spec = get_mixer_spec(name)
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    overrides = dict(getattr(spec.cls, "test_overrides", {}))
    if "chunk_size" in fields:
        overrides.setdefault("chunk_size", 4)
    overrides.update(extra)
    return {k: v for k, v in overrides.items() if k in fields}


def small_mixer(name: str, d_model: int = 12, n_heads: int = 2, dtype=torch.float64, **extra):
    """A registered mixer at test size (``small_overrides``)."""
    overrides = small_overrides(name, n_heads=n_heads, **extra)
    torch.manual_seed(0)
    return build_mixer(name, d_model, **overrides).to(dtype)


def mode_errors(name: str, t: int = 13, seed: int = 0) -> dict[str, float]:
    """Max abs differences (float64) of every mode against the fast one: outputs, final state,
    x- and parameter-gradients, and an uneven multi-token continuation."""
    m = small_mixer(name)
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(2, t, m.d_model, dtype=torch.float64, generator=g)
    w = torch.randn(2, t, m.d_model, dtype=torch.float64, generator=g)
    runs = {}
    for mode in m.modes:
        m.zero_grad()
        x = x0.clone().requires_grad_()
        y, state = m(x, mode=mode)
        (y * w).sum().backward()
        grads = [x.grad] + [p.grad if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
        runs[mode] = (y.detach(), {k: v.detach() for k, v in state.tensors().items()}, grads)
    ref = m.modes[0]
    out: dict[str, float] = {}
    y_ref, s_ref, g_ref = runs[ref]
    for mode in m.modes[1:]:
        y, s, gr = runs[mode]
        out[f"{mode}.output"] = (y - y_ref).abs().max().item()
        out[f"{mode}.state"] = max([(s[k] - s_ref[k]).abs().max().item() if s[k].numel() else 0.0 for k in s] + [0.0])
        out[f"{mode}.grad"] = max((a - b).abs().max().item() for a, b in zip(gr, g_ref))
    with torch.no_grad():
        pieces, state, t0 = [], None, 0
        for i, size in enumerate([3, 1, t - 6, 2]):
            y, state = m(x0[:, t0 : t0 + size], state, mode=m.modes[i % len(m.modes)])
            pieces.append(y)
            t0 += size
        out["continuation.output"] = (torch.cat(pieces, 1) - y_ref).abs().max().item()
    return out
