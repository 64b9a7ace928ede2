"""Dimension letters used in every docstring of tokenmix.

    B  batch                      T  time (sequence length)
    H  heads                      K  key / state-row dimension
    V  value dimension            N  SSM state dimension
    C  chunk length               G  state channels summed by a readout (see MixOperator)
    P  number of cached (prefix) positions
    D  model width (d_model)

One layout everywhere for activations: [B, T, H, .]. Mixing matrices are [B, H, T, T].
Positions are 0-indexed in code; the paper's formulas are 1-indexed (i = t + 1) and are
converted in exactly one place each (patterns/).
"""
