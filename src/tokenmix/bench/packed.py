"""``tokenmix bench packed``: what document boundaries cost. A batch of rows packed with documents whose
lengths follow a corpus' own distribution, timed three ways, forward + backward of one mixer layer
(its default mode, x [B, T, 256], 4 heads):

  * ``unpacked``: the same [B, T] tokens with no boundaries (the cost of the mixing alone);
  * ``packed``:   the same tokens with the boundaries (``Packing``): no state or attention crosses a
                  document, each document computed as if alone;
  * ``padded``:   the same documents without packing, one per row, right-padded to the longest: the
                  usual way to keep documents apart without boundaries.

``packed_over_unpacked`` is the price of the boundaries (the issue's target: within 1.2x); the
``padded_over_unpacked`` ratio is what padding costs instead (its rows hold
``padded_tokens / tokens`` times the real tokens). The three are timed round-robin in one process,
best of ``repeats`` after a warm-up each, so they see the same machine load.

The documents: the train split of the prepared ``corpus`` (``tokenmix data prepare``; prepared here
when it is not yet), cut at its separator tokens; every row is filled with lengths drawn from them
(seeded), the last document of a row cut at the row's end, as ``train lm --set train.pack=true``
cuts its stream.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np
import torch

from tokenmix.bench.settings import PACKED_MIXERS, PACKED_ROW_LENGTH, PACKED_ROWS
from tokenmix.core.errors import InputError
from tokenmix.core.packing import Packing
from tokenmix.data.prepare import DataConfig, prepare_data
from tokenmix.data.tokenizer import separator_id
from tokenmix.mixers.registry import build_mixer
from tokenmix.runs.clocks import time_repeats

MIXERS, ROWS, ROW_LENGTH = PACKED_MIXERS, PACKED_ROWS, PACKED_ROW_LENGTH  # (settings.py: the CLI's help states them)
WIDTH, HEADS = 256, 4
WAYS = ("unpacked", "packed", "padded")


def document_lengths(ids: np.ndarray, separator: int) -> list[int]:
    """Token lengths of the documents of a prepared stream, each ``[separator, its ids...]`` (the
    separator counted with its document, as a packed row holds it)."""
    at = np.flatnonzero(np.asarray(ids) == separator)
    if at.size == 0:
        raise InputError("the prepared stream holds no document separator: no document lengths to draw from")
    return np.diff(np.append(at, len(ids))).tolist()


def fill_rows(lengths: Sequence[int], rows: int, row_length: int, seed: int = 0) -> list[list[int]]:
    """``rows`` rows of exactly ``row_length`` tokens, each a run of document lengths drawn (with
    replacement, seeded) from ``lengths``; a row's last document is cut at the row's end."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        row, left = [], row_length
        while left > 0:
            n = min(rng.choice(lengths), left)
            row.append(n)
            left -= n
        out.append(row)
    return out


def corpus_lengths(corpus: str) -> list[int]:
    """Document lengths of the prepared train split of ``corpus`` (the default data settings)."""
    data = prepare_data(DataConfig(corpus=corpus), wait=True)
    return document_lengths(data.split("train"), separator_id(data.tokenizer))


def time_packing(name: str, rows: list[list[int]], repeats: int = 3, seed: int = 0) -> dict:
    """Forward + backward seconds of mixer ``name`` on the three batches (module docstring)."""
    torch.manual_seed(seed)
    m = build_mixer(name, WIDTH, n_heads=HEADS)
    b, t = len(rows), sum(rows[0])
    packing = Packing.from_lengths(rows)
    docs = [n for row in rows for n in row]
    x = torch.randn(b, t, WIDTH)
    x_padded = torch.randn(len(docs), max(docs), WIDTH)
    batches = {"unpacked": (x, None), "packed": (x, packing), "padded": (x_padded, None)}

    def call(way: str) -> Callable[[], None]:
        inputs, pack = batches[way]

        def fn() -> None:
            for p in m.parameters():
                p.grad = None
            leaf = inputs.detach().requires_grad_()
            y, _ = m(leaf, packing=pack)
            y.sum().backward()

        return fn

    walls: dict[str, list[float]] = {way: [] for way in WAYS}
    for way in WAYS:
        call(way)()  # warm-up: kernels compile, plans build
    for _ in range(repeats):  # round-robin: the three see the same load
        for way in WAYS:
            walls[way].append(time_repeats(call(way), 1, warmup=0)["wall"][0])
    best = {way: min(walls[way]) for way in WAYS}
    return {
        "mixer": name,
        "mode": m.modes[0],
        "native_packing": m.modes[0] in m.packing_modes,
        "rows": b,
        "row_length": t,
        "documents": len(docs),
        "tokens": b * t,
        "padded_tokens": len(docs) * max(docs),
        **{f"{way}_s": best[way] for way in WAYS},
        "packed_over_unpacked": best["packed"] / best["unpacked"],
        "padded_over_unpacked": best["padded"] / best["unpacked"],
    }


def run(
    mixers: Sequence[str] | None = None,
    corpus: str = "excerpt",
    rows: int = ROWS,
    row_length: int = ROW_LENGTH,
    repeats: int = 3,
    seed: int = 0,
    progress: Callable[[dict], None] | None = None,
    lengths: Sequence[int] | None = None,
) -> dict:
    """The three ways timed for each mixer; ``lengths``: the corpus' document lengths when the caller
    has read them already (``corpus_lengths``; the command reads them before its progress starts)."""
    lengths = corpus_lengths(corpus) if lengths is None else list(lengths)
    layout = fill_rows(lengths, rows, row_length, seed)
    results = []
    for name in mixers or MIXERS:
        results.append(time_packing(name, layout, repeats, seed))
        if progress:
            progress(results[-1])
    return {
        "corpus": corpus,
        "corpus_documents": len(lengths),
        "document_length_median": float(np.median(lengths)),
        "document_length_mean": float(np.mean(lengths)),
        "rows": [list(r) for r in layout],
        "width": WIDTH,
        "heads": HEADS,
        "threads": torch.get_num_threads(),
        "results": results,
        "summary": {
            r["mixer"]: {
                "packed_over_unpacked": round(r["packed_over_unpacked"], 2),
                "padded_over_unpacked": round(r["padded_over_unpacked"], 2),
            }
            for r in results
        },
    }
