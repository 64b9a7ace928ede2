"""``tokenmix bench hf``: decode time per token through transformers' ``generate()`` vs tokenmix's own
loop (``generation.generate_batch``), on the same model object.

For each mixer, one ``TokenmixForCausalLM`` (``layers`` layers of that mixer, d_model 256 by
default); tokenmix's loop runs its ``.net``, so both paths use the same weights and the same
``MixerModel`` forward: what differs is the loop around it (transformers' logits processors,
stopping criteria, input and mask bookkeeping, ``TokenmixCache``; ``no_grad``) against tokenmix's
(``inference_mode``, a prefill and ``model.step``). Batch 1, a random prompt, greedy.

Timing: the clock is read as each token is handed out (a streamer's ``put`` for transformers,
``on_token`` for tokenmix), so an interval is one decode step with its sampling and bookkeeping.
The prefill's interval and the first ``warmup`` steps are not timed; ``ms/token`` is the median of
the remaining intervals, over ``repeats`` runs that alternate between the two loops (so a burst of
load from other processes falls on both alike). Both loops must produce the same tokens
(``same tokens``), else the comparison would not be of the same work.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
from transformers.generation.streamers import BaseStreamer

from tokenmix.core.errors import InputError
from tokenmix.generation import SamplingConfig, generate_batch
from tokenmix.hf import TokenmixConfig, TokenmixForCausalLM
from tokenmix.mixers.registry import get_mixer_spec
from tokenmix.models import ModelConfig


@dataclass(frozen=True)
class HFBenchConfig:
    mixers: tuple[str, ...] = ("attention", "pow2_ce", "mamba2")
    layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    vocab_size: int = 256
    prompt: int = 64
    new_tokens: int = 128
    warmup: int = 8  # decode steps not timed after the prefill
    repeats: int = 3  # runs of each loop, alternating
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.mixers:
            get_mixer_spec(name)  # InputError naming the known mixers
        for name in ("layers", "d_model", "n_heads", "vocab_size", "prompt", "repeats"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.threads < 0:
            raise InputError("--warmup and --threads must be >= 0")
        if self.new_tokens < self.warmup + 2:
            raise InputError(
                f"--new-tokens must be >= warmup + 2 = {self.warmup + 2} (at least one timed step), "
                f"got {self.new_tokens}"
            )


class _Clock(BaseStreamer):
    """A streamer that only reads the clock at each ``put`` (the prompt, then each new token)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _decode_ms(times: list[float], warmup: int) -> float:
    """Median interval between tokens, in ms, after the first ``warmup`` decode steps."""
    steps = [b - a for a, b in zip(times, times[1:])]
    return 1e3 * statistics.median(steps[warmup:])


def weight_bytes(cfg: HFBenchConfig, d_model: int | None = None) -> float:
    """Upper estimate of the fp32 weights and their decode copies (``Linear``'s kept transposes):
    about 16 d^2 weights a layer (projections and a 4x MLP) plus the embedding, twice."""
    d = cfg.d_model if d_model is None else d_model
    return 2 * 4 * (16.0 * d * d * cfg.layers + float(cfg.vocab_size) * d)


def bench_mixer(name: str, cfg: HFBenchConfig) -> dict:
    torch.manual_seed(cfg.seed)
    model_cfg = ModelConfig(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, layers=(name,) * cfg.layers, n_heads=cfg.n_heads
    )
    model = TokenmixForCausalLM(TokenmixConfig.from_model_config(model_cfg)).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, cfg.prompt), generator=torch.Generator().manual_seed(cfg.seed))
    greedy = SamplingConfig(max_new_tokens=cfg.new_tokens, temperature=0.0)
    hf_ms, tm_ms, same = [], [], True
    for _ in range(cfg.repeats):
        clock = _Clock()
        hf_out = model.generate(
            prompt, max_new_tokens=cfg.new_tokens, min_new_tokens=cfg.new_tokens, do_sample=False, streamer=clock
        )
        # the streamer's first put is the prompt, its second the token the prefill chose
        hf_ms.append(_decode_ms(clock.times[1:], cfg.warmup))
        times: list[float] = []
        tm_out = generate_batch(
            model.net, prompt, greedy, on_token=lambda _row, _tok: times.append(time.perf_counter())
        )
        tm_ms.append(_decode_ms(times, cfg.warmup))
        same &= hf_out[0, cfg.prompt :].tolist() == tm_out[0].tolist()
    hf, tm = statistics.median(hf_ms), statistics.median(tm_ms)
    return {
        "mixer": name,
        "hf_ms_per_token": hf,
        "tokenmix_ms_per_token": tm,
        "ratio_hf_over_tokenmix": hf / tm,
        "same_tokens": same,
        "timed_steps": cfg.new_tokens - 1 - cfg.warmup,
        "repeats": cfg.repeats,
    }


def run(cfg: HFBenchConfig, progress=None) -> dict:
    before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        rows = []
        for name in cfg.mixers:
            rows.append(bench_mixer(name, cfg))
            if progress is not None:
                progress(rows[-1])
    finally:
        torch.set_num_threads(before)
    return {"config": {**asdict(cfg), "mixers": list(cfg.mixers)}, "threads": cfg.threads or before, "results": rows}


def table(result: dict) -> str:
    """The results as a fixed-width text table, with the setting in its title line."""
    c = result["config"]
    lines = [
        f"decode ms/token, batch 1, {c['layers']} layers d_model {c['d_model']}, prompt {c['prompt']}, "
        f"{c['new_tokens']} new tokens greedy (first {c['warmup']} steps untimed, median of "
        f"{c['repeats']} runs), {result['threads']} thread(s)",
        f"{'mixer':<12} {'HF generate':>12} {'tokenmix':>10} {'HF/tokenmix':>12} {'same tokens':>12}",
    ]
    for r in result["results"]:
        lines.append(
            f"{r['mixer']:<12} {r['hf_ms_per_token']:>12.3f} {r['tokenmix_ms_per_token']:>10.3f} "
            f"{r['ratio_hf_over_tokenmix']:>12.2f} {str(r['same_tokens']).lower():>12}"
        )
    return "\n".join(lines)
