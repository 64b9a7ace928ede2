"""The decode-tuned ``Linear`` every mixer and the model build their linear layers from, and
``kept_derived``, the cache of a tensor derived from a parameter that it (and decode steps) use."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def kept_derived(module: nn.Module, name: str, source: Tensor, make) -> Tensor:
    """``make(source)``, kept on ``module`` (under ``name``, not a parameter or buffer) and remade only
    when ``source`` changes: another tensor, dtype or device, or an in-place update (its version).

    For decode steps, which would otherwise recompute the same tensor from a parameter on every
    token. The caller keeps autograd and inference tensors (whose in-place updates cannot be seen)
    out of it.
    """
    key = (source.data_ptr(), source.dtype, source.device, source._version)
    kept = module.__dict__.get(name)
    if kept is None or kept[0] != key:
        kept = module.__dict__[name] = (key, make(source))
    return kept[1]


class Linear(nn.Linear):
    """``nn.Linear`` that multiplies a few rows without autograd by a kept transposed copy of its weight.

    At batch 1 a decode step's linear layers are matrix-vector products that stream their whole
    weight, and MKL streams the weight for x Wᵀ with W in nn.Linear's [out, in] layout at about
    half the rate it streams Wᵀ stored [in, out] for x (Wᵀ) (measured: docs/notes/model.md). The
    copy is made on first use and again whenever the weight changes (another tensor or an in-place
    update), costs one more weight's memory per layer once decoding starts, and is no parameter
    (state dicts are unchanged). Same numbers up to rounding (another summation order). Every
    linear layer of the mixers and of the model is one of these, built so.
    """

    rows_transposed = 8  # up to this many rows (B * T) take the transposed weight

    def forward(self, x: Tensor) -> Tensor:
        # the parameters from their dict: ``self.weight`` goes through Module.__getattr__ (~0.6 us,
        # twice per layer and decoded token); a parametrized weight is not in it
        params = self._parameters
        w, bias = (params["weight"], params["bias"]) if "weight" in params else (self.weight, self.bias)
        if (
            torch.is_grad_enabled() or x.numel() > self.rows_transposed * self.in_features or w.is_inference()
        ):  # (an inference tensor's in-place updates cannot be seen)
            return F.linear(x, w, bias)
        wt = kept_derived(self, "_kept_transpose", w, lambda w: w.detach().t().contiguous())  # [in, out]
        if bias is None:
            return x @ wt  # [..., out]: one call, the row folding inside matmul
        return torch.addmm(bias, x.reshape(-1, self.in_features), wt).view(*x.shape[:-1], self.out_features)
