"""Scoring a language model: the count baselines, validation passes, bits per character, and the
evaluation of a finished run (``tokenmix eval``).

    evaluate_windows(model, windows, ...) -> {"loss", "ppl", "tokens", "per_position_loss"}
    bigram_baseline(train_ids, windows, vocab_size) -> {"bigram_ppl", "unigram_ppl", ...}
    evaluate_run(run_dir, split="test", ...) -> the run's latest checkpoint scored on a split or a text

The bigram and unigram baselines are counted on the train split and scored on exactly the targets the
model is scored on; bits per character make runs with different vocabularies compare.
``train.precision`` (``resolve_precision``) is decided here too, since every forward pass, training's
and evaluation's, runs under the autocast it picks.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing
from tokenmix.data.corpora import path_documents
from tokenmix.data.loader import eval_windows
from tokenmix.data.prepare import PreparedData, prepare_data
from tokenmix.data.tokenizer import encode_documents, separator_id
from tokenmix.generation import position_limit
from tokenmix.runs.lm import load_run, read_run_config, resolve_device
from tokenmix.training.distributed import DistContext

# interpolation weights tried for the bigram; the best one on Shakespeare is 100-300 (a grid that stops at
# the edge would leave the baseline weaker than it can be)
BIGRAM_SMOOTHING_GRID = (0.01, 0.1, 1.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0)


# ------------------------------------------------------------------------------------ baselines
def bigram_baseline(train_ids: np.ndarray, windows: list[Tensor], vocab_size: int) -> dict:
    """Count-based bigram and unigram perplexities on exactly the targets the model is scored on.

    P(b | a) = (c(a, b) + lam * P_uni(b)) / (c(a) + lam), with P_uni add-one smoothed and lam the
    value of BIGRAM_SMOOTHING_GRID with the lowest validation loss (so the baseline is tuned on the
    data it is compared on, which only makes it stronger).
    """
    ids = np.asarray(train_ids, dtype=np.int64)
    v = vocab_size
    uni = np.bincount(ids, minlength=v).astype(np.float64) + 1.0
    p_uni = uni / uni.sum()
    pairs, counts = np.unique(ids[:-1] * v + ids[1:], return_counts=True)
    prev_count = np.bincount(ids[:-1], minlength=v).astype(np.float64)
    if windows:
        prev = np.concatenate([w[:-1].numpy() for w in windows])
        nxt = np.concatenate([w[1:].numpy() for w in windows])
    else:
        prev = nxt = np.zeros(0, dtype=np.int64)
    if len(nxt) == 0:
        return {"bigram_ppl": float("nan"), "unigram_ppl": float("nan"), "bigram_smoothing": None, "tokens": 0}
    q = prev * v + nxt
    pos = np.searchsorted(pairs, q).clip(max=len(pairs) - 1)
    c_ab = np.where(pairs[pos] == q, counts[pos], 0).astype(np.float64)
    best = None
    for lam in BIGRAM_SMOOTHING_GRID:
        p = (c_ab + lam * p_uni[nxt]) / (prev_count[prev] + lam)
        nll = float(-np.log(p).mean())
        if best is None or nll < best[1]:
            best = (lam, nll)
    uni_nll = float(-np.log(p_uni[nxt]).mean())
    return {
        "bigram_ppl": math.exp(best[1]),
        "bigram_loss": best[1],
        "bigram_smoothing": best[0],
        "unigram_ppl": math.exp(uni_nll),
        "unigram_loss": uni_nll,
        "tokens": int(len(nxt)),
    }


# ------------------------------------------------------------------------------------ precision
def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether bf16 matmuls run natively (fast) on ``device``, and why.

    On CPU only AMX-BF16 or AVX512-BF16 make bf16 autocast pay off; without them oneDNN emulates
    bf16 and a matmul runs one to two orders of magnitude *slower* than fp32 (the measurements:
    docs/notes/design-measurements.md). The CPU flags decide, not a timing, so every rank and every
    resume reach the same answer.
    """
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "this GPU supports bf16" if ok else "this GPU has no bf16 support"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    found = sorted(flags & {"amx_bf16", "avx512_bf16"})
    if found:
        return True, f"this CPU has {', '.join(found)}"
    return False, "this CPU has no native bf16 matmul (no AMX-BF16 or AVX512-BF16)"


def resolve_precision(requested: str, device: torch.device) -> tuple[str, str]:
    """``train.precision`` as it will run (``auto`` -> bf16 or fp32) and a line saying why."""
    ok, why = native_bf16(device)
    if requested == "auto":
        return ("bf16", f"precision bf16 autocast ({why})") if ok else ("fp32", f"precision fp32 ({why})")
    if requested == "bf16" and not ok:
        return "bf16", f"precision bf16 as requested, but {why}: expect it to be much slower than fp32"
    return requested, f"precision {requested}"


# ------------------------------------------------------------------------------------ evaluation
def precision_autocast(device: torch.device, precision: str):
    """The autocast a forward pass runs under at ``precision`` (``train.precision`` resolved)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def document_packing(inputs: Tensor, separator: int | None) -> Packing | None:
    """The documents of a batch of token windows [B, T]: each begins at a separator (the stream is
    ``[sep, doc..., sep, doc...]``, data/prepare.py), the part before a row's first separator
    continues a document begun before the window. None without a separator (unpacked).

    What the loss then sees: the separator is predicted from the document it ends (the model learns
    where a document stops, which generation relies on), and each document's first token is
    predicted from the separator alone, never from the previous document's text."""
    return None if separator is None else Packing.from_resets(inputs == separator)


@torch.no_grad()
def evaluate_windows(
    model: nn.Module,
    windows: list[Tensor],
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    ctx: DistContext | None = None,
    separator: int | None = None,
) -> dict:
    """Mean next-token loss over ``windows`` (each [L + 1]), and the mean loss at each position.

    With ``separator`` (the document separator's id) every window runs packed (``document_packing``):
    each token is scored on its own document's context alone, as a model trained with
    ``train.pack`` was trained.

    Under torchrun the windows are dealt round-robin to ranks; every rank runs the same number of
    forward passes (a rank without a window of its own repeats one with weight 0), which FSDP needs
    because each forward is a collective there.
    """
    ctx = ctx or DistContext()
    was_training = model.training
    model.eval()
    by_len: dict[int, list[Tensor]] = {}
    for w in windows:
        by_len.setdefault(len(w), []).append(w)
    max_len = max((len(w) for w in windows), default=1) - 1
    pos_sum = torch.zeros(max(max_len, 1), dtype=torch.float64)
    pos_cnt = torch.zeros(max(max_len, 1), dtype=torch.float64)
    for length in sorted(by_len):
        group = by_len[length]
        mine = group[ctx.rank :: ctx.world_size]
        n_batches = math.ceil(math.ceil(len(group) / ctx.world_size) / batch_size)
        for bi in range(n_batches):
            rows = mine[bi * batch_size : (bi + 1) * batch_size]
            weight = 1.0
            if not rows:  # keep the collective count equal on every rank
                rows, weight = group[:1], 0.0
            x = torch.stack(rows).to(device)
            with precision_autocast(device, precision):
                logits, _ = model(x[:, :-1], packing=document_packing(x[:, :-1], separator))
            nll = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="none")
            nll = nll.view(x.shape[0], -1).double().cpu()
            pos_sum[: length - 1] += weight * nll.sum(0)
            pos_cnt[: length - 1] += weight * nll.shape[0]
    if ctx.distributed:
        sums = ctx.all_reduce_sum(pos_sum.tolist() + pos_cnt.tolist())
        pos_sum = torch.tensor(sums[: len(pos_sum)], dtype=torch.float64)
        pos_cnt = torch.tensor(sums[len(pos_cnt) :], dtype=torch.float64)
    model.train(was_training)
    tokens = float(pos_cnt.sum())
    loss = float(pos_sum.sum() / tokens) if tokens else float("nan")
    per_pos = (pos_sum / pos_cnt.clamp(min=1)).tolist()
    return {
        "loss": loss,
        "ppl": math.exp(loss) if tokens else float("nan"),
        "tokens": int(tokens),
        "per_position_loss": per_pos,
    }


def bits_per_char(res: dict, data: PreparedData) -> float | None:
    """Total validation loss over the split's characters, in bits (comparable across vocabularies);
    None unless ``res`` scored every token of the split (all but the first)."""
    chars = data.meta.get("splits", {}).get("val", {}).get("chars")
    if not chars or not res["tokens"] or res["tokens"] != len(data.split("val")) - 1:
        return None
    return res["loss"] * res["tokens"] / (chars * math.log(2))


# ------------------------------------------------------------------------------------ evaluating runs
def text_token_stream(path: str | Path, tok, doc_chars: int) -> np.ndarray:
    """The token stream of a user's text file (or folder, or record file) packed as the prepared
    splits are: documents cut as ``data prepare`` cuts them, each after a separator token, so that a
    model meets the text as it met its training data."""
    docs = path_documents(Path(path), doc_chars)
    sep = separator_id(tok)
    ids = [tid for doc in encode_documents(tok, [d.text for d in docs]) for tid in (sep, *doc)]
    return np.asarray(ids, dtype=np.int64)


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    max_windows: int = 0,
    batch_size: int = 8,
    text: str | Path | None = None,
    context: int | None = None,
    device: str = "cpu",
    per_document: bool = False,
) -> dict:
    """Perplexity and per-position loss of a run's latest checkpoint on a split of its data, or on
    a text file (``text``, tokenized with the run's tokenizer), in windows of ``context`` tokens
    (default train.seq_len), with the bigram and unigram baselines (counted on the train split) on
    the same tokens. A run trained with ``train.pack`` is scored packed, as it was trained
    (``document_packing``: no token reads another document).

    ``per_document``: also every document alone (``document_scores``): its perplexity from its own
    separator on, in windows of ``context`` tokens, and the perplexity over all of them.

    A context longer than training measures length extrapolation: position-free mixers and
    sinusoidal codes run at any length, learned positions stop at model.max_seq_len (refused).
    """
    if text is not None and not str(text).strip():
        raise InputError("--text is empty; give a text file or a folder of text files")
    cfg = read_run_config(run_dir)
    seq = cfg.train.seq_len if context is None else context
    if seq < 1:
        raise InputError(f"--context must be >= 1, got {seq}")
    dev = resolve_device(device)
    run = load_run(run_dir, dev)
    limit = position_limit(run.model)
    if limit is not None and seq > limit:
        raise InputError(
            f"--context {seq} exceeds this model's learned positions (model.max_seq_len={limit}); "
            "a model with learned positions cannot score tokens past them"
        )
    data = prepare_data(run.config.data, wait=True)  # reuses the run's prepared directory (re-made if it was deleted)
    ids = data.split(split) if text is None else text_token_stream(text, run.tokenizer, run.config.data.doc_chars)
    windows = eval_windows(ids, seq, max_windows)
    if not windows or len(ids) < 2:
        raise InputError(
            f"'{text}' has fewer than 2 tokens" if text is not None else f"the {split} split of {data.dir} is empty"
        )
    separator = separator_id(run.tokenizer)
    res = evaluate_windows(run.model, windows, batch_size, dev, "fp32", separator=separator if cfg.train.pack else None)
    base = bigram_baseline(data.split("train"), windows, data.vocab_size)
    if per_document:
        names = data.meta["splits"][split]["documents"] if text is None else None
        res |= document_scores(run.model, ids, separator, seq, batch_size, dev, names)
    return {
        "split": split if text is None else None,
        "text": None if text is None else str(text),
        "context": seq,
        "train_seq_len": run.config.train.seq_len,
        "packed": cfg.train.pack,
        "device": str(dev),
        "step": run.meta["step"],
        "checkpoint": str(run.checkpoint),
        **res,
        "bigram_ppl": base["bigram_ppl"],
        "unigram_ppl": base["unigram_ppl"],
    }


def document_scores(
    model: nn.Module,
    ids: np.ndarray,
    separator: int,
    context: int,
    batch_size: int,
    device: torch.device,
    names: list[str] | None = None,
) -> dict:
    """Every document of a token stream ``[sep, doc..., sep, doc...]`` scored alone: its tokens from
    its separator on, in consecutive windows of ``context`` (each window from a fresh state), the
    separator that ends it included as its last target.

    Returns {"documents": [{"name", "tokens", "loss", "ppl"}], "document_ppl": the perplexity over
    all documents' tokens, "document_ppl_median": the median of the documents' perplexities}.
    """
    starts = np.flatnonzero(np.asarray(ids) == separator).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = [*starts[1:], len(ids) - 1]
    docs, total_nll, total_tokens = [], 0.0, 0
    for i, (s, e) in enumerate(zip(starts, ends)):
        if e <= s:
            continue
        res = evaluate_windows(model, eval_windows(ids[s : e + 1], context), batch_size, device)
        total_nll, total_tokens = total_nll + res["loss"] * res["tokens"], total_tokens + res["tokens"]
        name = names[i] if names is not None and len(names) == len(starts) else f"document {i}"
        docs.append({"name": name, "tokens": res["tokens"], "loss": res["loss"], "ppl": res["ppl"]})
    if not docs:
        raise InputError("no document to score: the stream holds fewer than 2 tokens")
    return {
        "documents": docs,
        "document_ppl": math.exp(total_nll / total_tokens),
        "document_ppl_median": float(np.median([d["ppl"] for d in docs])),
    }
