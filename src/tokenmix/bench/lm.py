"""``tokenmix bench lm``: LM training and decode throughput per mixer at equal parameter count.

For each mixer, a model of ``--layers`` layers of that mixer alone is sized (by d_model) to the
same non-embedding parameter count as every other; attention is the baseline. At each context T:

    train   tokens/s of forward + backward + AdamW steps on batches of max(1, batch_tokens // T)
            sequences of length T (after one untimed warm-up step; the median of the timed steps)
    decode  prefill T - n tokens in the default mode, then time n single-token ``model.step``
            calls one by one (batch 1, inference mode; the median token): the per-token cost at the end of the
            context, where attention reads T cached keys per layer and a bounded-cache mixer reads
            only what its pattern/state holds

Output is JSON (stdout, and ``--out FILE``), with ratios against attention and the issue's targets:
at T = 4096 a pattern mixer should train at >= 3x attention's tokens/s and decode >= 5x faster per token;
at T = 512 it should be within 1.5x of attention. Timings are wall clock on whatever machine runs
it: on a shared machine repeat runs vary, so read the ratios, measured in one process back to back.
Each timing is also taken in process CPU time (``*_cpu`` ratios), which a busy machine disturbs less
than wall clock (with ``--threads 1`` it is the work done; with more threads it includes spin-waits);
medians of individually timed steps keep one preempted step from moving a number, and the mixers take
turns (training step by step, decode in blocks of ``--decode-block`` tokens, the first mixer rotating), so a
burst of load
from other processes falls on all of them alike instead of on whichever mixer was running.
``--device cuda``: the models and batches on the GPU, each step timed by CUDA events with the stream
synchronised around it (``bench/device.py``; the untimed warm-up step and the prefill come first).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from tokenmix.bench.device import timed_call
from tokenmix.bench.settings import DEFAULT_MIXERS, LMBenchConfig
from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_write_text
from tokenmix.core.seeds import check_seed
from tokenmix.mixers.registry import mixer_names
from tokenmix.models import MixerModel, ModelConfig

TRAIN_TARGET_AT_LONG = 3.0  # train tokens/s vs attention at the long context (the project's target)
DECODE_TARGET_AT_LONG = 5.0  # decode speed-up per token vs attention at the long context
WITHIN_AT_SHORT = 1.5  # at the short context: within this factor of attention
MAX_D_MODEL = 4096  # size_model searches widths up to this
# memory of a timed training step per token (upper estimate): the logits and their gradient
# (vocabulary wide, float32, a few copies) and every layer's activations (a few dozen d_model-wide
# float32 tensors kept for backward); weights + gradients + AdamW moments: 16 bytes a parameter
LOGIT_BYTES_PER_TOKEN_AND_VOCAB = 16
ACTIVATION_BYTES_PER_TOKEN_AND_WIDTH = 4 * 48
TRAIN_BYTES_PER_PARAM = 16


def _layers_config(mixer: str, d_model: int, args: LMBenchConfig) -> ModelConfig:
    return ModelConfig(vocab_size=args.vocab_size, d_model=d_model, layers=(mixer,) * args.layers, n_heads=args.n_heads)


def size_model(mixer: str, args: LMBenchConfig) -> tuple[ModelConfig, int]:
    """The d_model (a multiple of 2 * n_heads) whose non-embedding parameter count is closest to the target."""
    step = 2 * args.n_heads
    best = None
    with torch.device("meta"):  # sizes only: no memory, no init cost
        for d in range(step, MAX_D_MODEL + step, step):
            n = MixerModel(_layers_config(mixer, d, args)).num_params(exclude_embedding=True)
            gap = abs(n - args.target_params)
            if best is None or gap < best[2]:
                best = (d, n, gap)
            if n > args.target_params:
                break
    return _layers_config(mixer, best[0], args), best[1]


def _train_stepper(model: MixerModel, t: int, args: LMBenchConfig) -> tuple[int, Callable[[], None]]:
    """(batch size, one forward + backward + AdamW step on a fresh random batch [b, t + 1])."""
    b = max(1, args.batch_tokens // t)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(args.seed)

    def one_step() -> None:
        model.train()
        x = torch.randint(0, args.vocab_size, (b, t + 1), generator=g).to(args.device)
        logits, _ = model(x[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return b, one_step


def _decode_stepper(
    model: MixerModel, t: int, args: LMBenchConfig
) -> tuple[int, float, Callable[[int], None], list[list]]:
    """Prefill t - n tokens (batch 1), then a function decoding token i (t - n <= i < t) on the cache.

    Returns (prefill length, prefill seconds, step function, [the layers' current states]).
    """
    n = min(args.decode_tokens, t - 1)
    model.eval()
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab_size, (1, t), generator=g).to(args.device)
    holder = []
    # inference mode, not just no_grad: no version counters or autograd bookkeeping on any tensor,
    # the same saving for every mixer (the states never meet autograd here)
    with torch.inference_mode():
        prefill_s = timed_call(lambda: holder.append(model(ids[:, : t - n])[1]), args.device)[0]
        model.step(ids[:, t - n], holder[0])  # warm-up; a state may be updated in place, so prefill again
        _, holder[0] = model(ids[:, : t - n])

    @torch.inference_mode()
    def step(i: int) -> None:
        _, holder[0] = model.step(ids[:, i], holder[0])

    return t - n, prefill_s, step, holder


def _backends(states) -> str | None:
    """The backends the structured layers' last calls ran on (ops/pattern/backend.py), or None."""
    names = sorted({s.backend for s in states if getattr(s, "backend", None)})
    return ",".join(names) or None


def _round_robin(
    calls: dict[str, Callable[[int], None]], indices: range, block: int = 1, device: str = "cpu"
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call of each function, the functions taking turns every
    ``block`` consecutive indices (the first one rotating), so every mixer is timed under the same
    moment-to-moment load. Each call is timed on its own.

    Decode takes turns in blocks: a decoder streams its model's weights and cache every token, and
    one that runs right after another model's tokens finds them evicted from the CPU caches (a cost
    the same for every mixer, which pulls the ratios towards 1). Real
    generation decodes one model's tokens back to back: within a block only the first token is
    cold, and the median ignores it."""
    names = list(calls)
    walls: dict[str, list[float]] = {m: [] for m in names}
    cpus: dict[str, list[float]] = {m: [] for m in names}
    for k, s in enumerate(range(indices.start, indices.stop, block)):
        for m in names[k % len(names) :] + names[: k % len(names)]:
            for i in range(s, min(s + block, indices.stop)):
                w, c, _, _ = timed_call(lambda: calls[m](i), device)
                walls[m].append(w)
                cpus[m].append(c)
    return {m: (statistics.median(walls[m]), statistics.median(cpus[m])) for m in names}


def _time_context(models: dict[str, MixerModel], t: int, args: LMBenchConfig) -> dict[str, dict]:
    """Training and decode timings of every model at context t, each step of one mixer next to the others'."""
    out: dict[str, dict] = {m: {} for m in models}
    trainers = {}
    for m, model in models.items():
        b, one_step = _train_stepper(model, t, args)
        one_step()  # warm-up: allocator, pattern tables, lazy inits
        trainers[m] = lambda _i, f=one_step: f()
        out[m]["train_batch"] = b
    for m, (dt, dc) in _round_robin(trainers, range(args.train_steps), device=args.device).items():
        b = out[m]["train_batch"]
        out[m].update({"train_step_s": dt, "train_tokens_per_s": b * t / dt, "train_tokens_per_cpu_s": b * t / dc})
    decoders, held = {}, {}
    for m, model in models.items():
        prefill, prefill_s, step, held[m] = _decode_stepper(model, t, args)
        decoders[m] = step
        out[m].update({"prefill_tokens": prefill, "prefill_s": prefill_s})
    prefill = next(iter(out.values()))["prefill_tokens"]
    for m, (dt, dc) in _round_robin(decoders, range(prefill, t), args.decode_block, args.device).items():
        out[m].update(
            {"decode_ms_per_token": 1000 * dt, "decode_tokens_per_s": 1 / dt, "decode_cpu_ms_per_token": 1000 * dc}
        )
        if backend := _backends(held[m][0]):  # the structured mixers' decode steps
            out[m]["backend"] = backend
    return out


def check_settings(args: LMBenchConfig) -> None:
    """Refuse settings that cannot run (InputError naming the flag) before any model is built."""
    for flag, v, lo in (
        ("--layers", args.layers, 1),
        ("--n-heads", args.n_heads, 1),
        ("--target-params", args.target_params, 1),
        ("--vocab-size", args.vocab_size, 2),
        ("--batch-tokens", args.batch_tokens, 1),
        ("--train-steps", args.train_steps, 1),
        ("--decode-tokens", args.decode_tokens, 1),
        ("--decode-block", args.decode_block, 1),
        ("--threads", args.threads, 0),
    ):
        if v < lo:
            raise InputError(f"{flag} must be >= {lo}, got {v}")
    if 2 * args.n_heads > MAX_D_MODEL:
        raise InputError(
            f"--n-heads {args.n_heads} leaves no width: models are sized up to d_model {MAX_D_MODEL} "
            f"in steps of 2 x n_heads"
        )
    if not args.contexts:
        raise InputError("--contexts needs at least one context length")
    for t in args.contexts:
        if t < 2:
            raise InputError(f"--contexts must be >= 2, got {t}")
    check_seed(args.seed)
    if args.out is not None:  # checked now, not after minutes of timing
        out = Path(args.out)
        if out.is_dir():
            raise InputError(f"--out '{out}' is a folder; give the path of the JSON file to write")
        if not out.parent.is_dir():
            raise InputError(f"--out '{out}': folder '{out.parent}' does not exist")


def check_memory(
    mixers: list[str], sized: dict[str, tuple[ModelConfig, int]], args: LMBenchConfig, available: int
) -> None:
    """Refuse a run whose models and largest training batch do not fit in ``available`` bytes."""
    params = sum(TRAIN_BYTES_PER_PARAM * (n + cfg.vocab_size * cfg.d_model) for cfg, n in sized.values())
    widest = max(cfg.d_model * len(cfg.layers) for cfg, _ in sized.values())
    per_token = LOGIT_BYTES_PER_TOKEN_AND_VOCAB * args.vocab_size + ACTIVATION_BYTES_PER_TOKEN_AND_WIDTH * widest
    for t in sorted(args.contexts, reverse=True):
        tokens = max(1, args.batch_tokens // t) * t
        need = params + tokens * per_token
        if need > available:
            raise InputError(
                f"bench lm at context {t:,} ({tokens:,} tokens a step, vocabulary {args.vocab_size:,}, "
                f"{len(mixers)} models) would need about {need / 2**30:,.1f} GiB, more than the "
                f"{available / 2**30:,.1f} GiB of memory available; lower --contexts, --batch-tokens, "
                "--vocab-size or --layers"
            )


def _layer_budget(args: LMBenchConfig, available: int) -> None:
    """--layers against memory before sizing builds (meta) models of that many layers: even at the
    narrowest width every layer holds parameters and module objects."""
    cfg = _layers_config(DEFAULT_MIXERS[0], 2 * args.n_heads, dataclasses.replace(args, layers=1))
    with torch.device("meta"):
        one = MixerModel(cfg).num_params(exclude_embedding=True)
    per_layer = TRAIN_BYTES_PER_PARAM * one + 64 * 2**10  # + Python objects of a block
    if args.layers * per_layer > available:
        raise InputError(
            f"--layers {args.layers:,} would need about {args.layers * per_layer / 2**30:,.1f} GiB even at "
            f"the narrowest width, more than the {available / 2**30:,.1f} GiB of memory available; "
            f"the largest --layers that fits is {available // per_layer:,}"
        )


def run(args: LMBenchConfig, available_memory: int | None = None) -> dict:
    """The benchmark (see the module docstring). ``available_memory`` (bytes) bounds what the models and
    batches may take; None = no check."""
    check_settings(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    known = mixer_names()
    if args.mixers == "all":
        mixers = known
    else:
        requested = [m.strip() for m in args.mixers.split(",") if m.strip()]
        explicit = args.mixers != ",".join(DEFAULT_MIXERS)
        unknown = [m for m in requested if m not in known]
        if unknown and explicit:
            raise InputError(f"unknown mixer(s) {unknown}; known mixers: {', '.join(known)}")
        mixers = [m for m in requested if m in known]
    if "attention" not in mixers and "attention" in known:
        mixers = ["attention"] + mixers
    if available_memory is not None:
        _layer_budget(args, available_memory)
    sized = {m: size_model(m, args) for m in mixers}
    if available_memory is not None:
        check_memory(mixers, sized, args, available_memory)
    torch.manual_seed(args.seed)
    models = {m: MixerModel(cfg).to(args.device) for m, (cfg, _) in sized.items()}
    results = []
    for t in args.contexts:
        timings = _time_context(models, t, args)
        for m in mixers:
            cfg, n_params = sized[m]
            results.append(
                {
                    "mixer": m,
                    "context": t,
                    "d_model": cfg.d_model,
                    "layers": args.layers,
                    "params_non_embedding": n_params,
                    **timings[m],
                }
            )
    results.sort(key=lambda r: (mixers.index(r["mixer"]), r["context"]))
    report = {
        "benchmark": "lm",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": args.device,
        "machine": platform.processor() or platform.machine(),
        "config": dataclasses.asdict(args),
        "results": results,
        "ratios": _ratios(results, args.contexts),
    }
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
    return report


def _ratios(results: list[dict], contexts: list[int]) -> dict:
    """Per context and mixer: train tokens/s and decode speed relative to attention, with the targets."""
    out: dict = {}
    long_t, short_t = max(contexts), min(contexts)
    for t in contexts:
        base = next((r for r in results if r["mixer"] == "attention" and r["context"] == t), None)
        if base is None:
            continue
        per = {}
        for r in results:
            if r["context"] != t or r["mixer"] == "attention":
                continue
            train = r["train_tokens_per_s"] / base["train_tokens_per_s"]
            decode = base["decode_ms_per_token"] / r["decode_ms_per_token"]
            entry = {
                "train_vs_attention": round(train, 3),
                "decode_speedup_vs_attention": round(decode, 3),
                # the same ratios in process CPU time: steadier than wall clock on a shared machine
                "train_vs_attention_cpu": round(r["train_tokens_per_cpu_s"] / base["train_tokens_per_cpu_s"], 3),
                "decode_speedup_vs_attention_cpu": round(
                    base["decode_cpu_ms_per_token"] / r["decode_cpu_ms_per_token"], 3
                ),
            }
            train_cpu, decode_cpu = entry["train_vs_attention_cpu"], entry["decode_speedup_vs_attention_cpu"]
            if t == long_t and long_t != short_t:
                entry["meets_long_context_targets"] = train >= TRAIN_TARGET_AT_LONG and decode >= DECODE_TARGET_AT_LONG
                entry["meets_long_context_targets_cpu"] = (
                    train_cpu >= TRAIN_TARGET_AT_LONG and decode_cpu >= DECODE_TARGET_AT_LONG
                )
            if t == short_t:
                entry["within_1.5x_of_attention"] = 1 / WITHIN_AT_SHORT <= train and 1 / WITHIN_AT_SHORT <= decode
                entry["within_1.5x_of_attention_cpu"] = (
                    1 / WITHIN_AT_SHORT <= train_cpu and 1 / WITHIN_AT_SHORT <= decode_cpu
                )
            per[r["mixer"]] = entry
        out[str(t)] = per
    return out
