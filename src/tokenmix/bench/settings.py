"""Settings of the benchmarks that the command line's help states, as plain constants and config
dataclasses: this module imports no torch, so the parser can read it on every call (``tokenmix
--help`` included) while the benchmarks themselves load only when one runs."""

from __future__ import annotations

from dataclasses import dataclass

# bench lm
DEFAULT_MIXERS = ("attention", "pow2", "mamba2")

# bench mixers / solver: defaults that answer in about a minute on 2 cores; --full is the whole sweep
QUICK_MIXERS = ("attention", "mamba2", "gla", "gated_deltanet", "pow2", "pow2_ce", "sq1_ce")
QUICK_MIXER_SIZES = (2048,)
FULL_MIXER_SIZES = (512, 2048, 8192)  # with every registered mixer
QUICK_SOLVER_SIZES = (4096,)
QUICK_SOLVER_PATTERNS = ("pow2", "pow2_ce", "sq1", "sq1_ce")  # --full: bench/solver.py's PATTERNS
FULL_SOLVER_SIZES = (1024, 4096, 16384)

# bench solver|decode|mixers|lm --device (bench/device.py checks it)
DEVICES = ("cpu", "cuda")

# bench packed
PACKED_MIXERS = ("pow2", "pow2_ce", "sq1_ce", "mamba2", "gla", "gated_deltanet", "attention")
PACKED_ROWS, PACKED_ROW_LENGTH = 4, 2048


@dataclass(frozen=True)
class LMBenchConfig:
    """Settings of ``tokenmix bench lm`` (the CLI's flags, one field each)."""

    mixers: str = ",".join(DEFAULT_MIXERS)  # comma list; unregistered defaults are skipped; 'all' = every mixer
    contexts: tuple[int, ...] = (512, 4096)
    layers: int = 2  # layers of the one mixer per model
    n_heads: int = 4
    target_params: int = 1_000_000  # non-embedding parameters every model is sized to
    vocab_size: int = 512  # small: embedding and head cost the same for every mixer and would dilute
    batch_tokens: int = 8192  # tokens per training step
    train_steps: int = 5  # timed training steps (the median is reported)
    decode_tokens: int = 32  # timed decode steps at the end of the context (the median is reported)
    decode_block: int = 8  # decode tokens a mixer runs back to back before the next mixer's turn
    threads: int = 0  # torch threads (0 = default)
    seed: int = 0
    out: str | None = None  # also write the JSON here
    device: str = "cpu"  # cpu | cuda (bench/device.py)
