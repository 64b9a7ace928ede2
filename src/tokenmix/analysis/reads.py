"""Where a trained synthetic run's layers read, query by query: ``tokenmix analyze reads RUN``.

For the run's test queries (MQAR: query q asks for the value at v = p + 1, p the key's place), each
mixer layer's operator is materialised on the layer's own input, M = (I − B)⁻¹ A ([B, H, T, T], the
sum over state channels where there are several), and the weight |M[q, j]| / Σ_j |M[q, j]| of each
query row is split into

    value    j = v, the value's position
    key      j = p, the key's position
    window   the other positions behind which a short convolution holds key and value (v + 1 ..
             p + w − 1, w its taps)
    query    j = q, the query's own position
    rest     every other position

averaged over the queries, per head: over every answered query, and over those whose value position
the layer reads in one hop (where a learned read can put weight on it) -- there also for the one-hop
row |A + B| itself, the coefficient a hop puts on the value's output before the solve spreads it over
the paths behind that output (the verdict reads this one). Three regimes tell apart at a glance
(docs/results.md, "What the read diagnostic sees"): a layer that has learned the read puts most of a
head's hop on the value (0.9 after the one-hop curriculum); a relay plateau puts about 0 on the query
itself and spreads its hop over the other neighbours (each query answers "some value of the
context"); a layer that answers by other paths keeps a large share on the query's own input and little
on the value (the pattern rows trained on past the curriculum). Beside it, the test accuracy split by how the layer
reads (``tasks.READ_CLASSES``) with each class's share. Writes ``reads.json`` and ``reads.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenmix.analysis.outputs import new_figure, save_figure, write_json
from tokenmix.core.errors import InputError
from tokenmix.core.files import read_json
from tokenmix.models import MixerModel
from tokenmix.models.reads import BINDING_LAYERS, binding_window, layer_hops, row_layer
from tokenmix.runs.synthetic import SyntheticRunConfig, load_run_weights
from tokenmix.tasks import IGNORE_INDEX, READ_CLASSES, TaskConfig, TaskData

PARTS = ("value", "key", "window", "query", "rest")
LEARNED_READ = 0.5  # a head putting at least this share on the value reads it ...
PARTIAL_READ = 0.2  # ... at least this, in part; below, it relays (a plateau puts about 0.06 there) ...
RELAY_SELF = 0.1  # ... when it also keeps less than this on the query itself (a plateau: about 0.01)


@dataclass
class LayerReads:
    """Mean share of each query row's |M| weight per part (``PARTS``), per head, of one layer: over
    every answered query (``by_head``) and over those whose value position the layer reads in one hop
    (``readable``: where a learned read can put its weight; empty when there is none); and, for those
    queries, the share of the one-hop row |A + B| (``direct``: the coefficient the hop itself puts on
    the value's output, before the solve spreads it over the paths behind that output)."""

    layer: int
    mixer: str
    by_head: list[dict[str, float]]
    readable: list[dict[str, float]]
    readable_queries: int
    # the same queries' one-hop rows (A + B, before the solve): the weight a hop puts on each part
    direct: list[dict[str, float]]

    @property
    def best_head(self) -> int:
        heads = self.direct or self.by_head
        return max(range(len(heads)), key=lambda h: heads[h]["value"])

    def verdict(self) -> str:
        if not self.direct:
            return f"layer {self.layer} ({self.mixer}): reads no query's value position in one hop"
        share = self.direct[self.best_head]["value"]
        own = self.direct[self.best_head]["query"]
        if share >= LEARNED_READ:
            kind = "reads the value"
        elif share >= PARTIAL_READ:
            kind = "reads the value in part"
        elif own < RELAY_SELF:
            kind = "relays (no head reads the value; this one keeps about 0 on the query itself)"
        else:
            kind = f"holds the query's own input ({100 * own:.0f} % on it) and answers, if at all, by other paths"
        head = f"layer {self.layer} ({self.mixer}), head {self.best_head}"
        solved = self.readable[self.best_head]["value"]
        return (
            f"{head}: its hop puts {100 * share:.0f} % of |A + B| on the value's position for the "
            f"{self.readable_queries} queries it reads in one hop ({100 * solved:.0f} % of |M| after the solve): {kind}"
        )


def _query_parts(inputs: list[int], labels: list[int], window: int) -> list[tuple[int, int, int, range]]:
    """(q, key p, value v, the rest of the window before q) for every answered position of one example."""
    out = []
    for q, label in enumerate(labels):
        if label == IGNORE_INDEX:
            continue
        p = inputs.index(inputs[q])
        out.append((q, p, p + 1, range(p + 2, min(p + window, q))))
    return out


def _row_shares(w: torch.Tensor) -> torch.Tensor:
    """|w| [N, H, (G,) T, T] -> rows normalised to sum 1 [N, H, T, T] (summed over state channels)."""
    w = w.abs()
    if w.dim() == 5:
        w = w.sum(2)
    return w / w.sum(-1, keepdim=True).clamp_min(1e-30)


@torch.no_grad()
def layer_reads(model: MixerModel, data: TaskData, window: int, layers: list[int]) -> list[LayerReads]:
    """:class:`LayerReads` of ``layers`` of ``model`` over the answered positions of ``data``."""
    model.eval()
    x = model.embed(data.inputs)
    inputs_of: dict[int, torch.Tensor] = {}
    for i, block in enumerate(model.blocks):
        inputs_of[i] = block.norm1(x)
        x, _ = block(x, None, None)
    out = []
    for i in layers:
        mixer = model.blocks[i].mixer
        hops = layer_hops(mixer, data.inputs.shape[1])
        op = mixer.materialize(inputs_of[i])
        # [all queries by M | readable queries by M | readable queries by the one-hop row A + B]
        rows = (_row_shares(op.mixing_matrix()), _row_shares(op.A.abs() + op.B.abs()))
        sums = torch.zeros(3, rows[0].shape[1], len(PARTS), dtype=torch.float64)
        counts = [0, 0, 0]
        for n, (inputs, labels) in enumerate(zip(data.inputs.tolist(), data.labels.tolist())):
            for q, p, v, rest_window in _query_parts(inputs, labels, window):
                for k, which in ((0, 0), (1, 0), (2, 1)) if hops[q, v] <= 1 else ((0, 0),):
                    row = rows[which][n, :, q].double()  # [H, T]
                    parts = [row[:, v], row[:, p], row[:, list(rest_window)].sum(-1), row[:, q]]
                    parts.append(1 - sum(parts))
                    sums[k] += torch.stack(parts, -1)
                    counts[k] += 1
        if counts[0] == 0:
            raise InputError("the data has no answered query to read")
        mean = [
            [dict(zip(PARTS, h)) for h in (sums[k] / max(counts[k], 1)).tolist()] if counts[k] else [] for k in range(3)
        ]
        out.append(LayerReads(i, model.cfg.layers[i], mean[0], mean[1], counts[1], mean[2]))
    return out


def load_run(run_dir: Path) -> tuple[SyntheticRunConfig, MixerModel]:
    """A finished synthetic run's config and model with its scored checkpoint (float64, eval)."""
    cfg = SyntheticRunConfig.from_dict(read_json(run_dir / "config.json", "run config", within=run_dir))
    model = MixerModel(cfg.model_config())
    try:
        model.load_state_dict(load_run_weights(run_dir))
    except RuntimeError as e:
        raise InputError(f"{run_dir}: the checkpoint does not fit the run's model ({str(e).splitlines()[0]})") from None
    return cfg, model.double().eval()


def read_split(model: MixerModel, task: TaskConfig, data: TaskData, label: str) -> dict[str, Any]:
    """Accuracy and share of the scored queries per ``READ_CLASSES`` (the harness's split, recomputed)."""
    i = row_layer(model.cfg, label)
    classes = task.answer_reads(data, layer_hops(model.blocks[i].mixer, data.inputs.shape[1]), _window(model, i))
    with torch.no_grad():
        h, _ = model.features(data.inputs)
    hit = model.head(h).argmax(-1) == data.labels
    out = {}
    for k, name in enumerate(READ_CLASSES):
        sel = (classes == k) & data.scored
        total = int(sel.sum())
        out[name] = {
            "share": total / max(int(data.scored.sum()), 1),
            "acc": float(hit[sel].float().mean()) if total else None,
        }
    return out


def _window(model: MixerModel, i: int) -> int:
    return binding_window(model.cfg, model.cfg.layers[i])


def analyze_reads(run_dir: Path, out_dir: Path, examples: int = 200, formats=("png",)) -> dict[str, Any]:
    """The read diagnostic of a finished run (module docstring): the JSON payload, also written to
    ``out_dir/reads.json``, and the figure."""
    cfg, model = load_run(run_dir)
    task = cfg.task_config()
    if not task.has_answer_sources:
        raise InputError(f"task '{cfg.task}' has no single source per answer: no reads to diagnose")
    data = task.build(examples, cfg.train.test_seed)  # the first test examples of the run
    row = row_layer(model.cfg, cfg.label)
    window = _window(model, row)
    layers = [i for i, name in enumerate(model.cfg.layers) if name not in BINDING_LAYERS] or [row]
    reads = layer_reads(model, data, window, layers)
    payload = {
        "run": str(run_dir),
        "label": cfg.label,
        "examples": examples,
        "window": window,
        "layers": [
            {
                "layer": r.layer,
                "mixer": r.mixer,
                "by_head": r.by_head,
                "readable": r.readable,
                "readable_queries": r.readable_queries,
                "direct": r.direct,
                "verdict": r.verdict(),
            }
            for r in reads
        ],
        "read_split": read_split(model, task, data, cfg.label),
    }
    write_json(out_dir / "reads.json", payload)
    _plot(out_dir, reads, cfg.label, formats)
    return payload


def _plot(out_dir: Path, reads: list[LayerReads], label: str, formats) -> list[Path]:
    fig, axes = new_figure(1, len(reads), (3.2 * len(reads) + 1, 3.4))
    axes = list(axes.flat) if hasattr(axes, "flat") else [axes]
    colours = ("tab:green", "tab:blue", "tab:olive", "tab:orange", "lightgrey")
    for ax, r in zip(axes, reads):
        bottom = [0.0] * len(r.by_head)
        for part, colour in zip(PARTS, colours):
            vals = [h[part] for h in r.by_head]
            ax.bar(range(len(vals)), vals, bottom=bottom, color=colour, label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(r.by_head)), [f"head {h}" for h in range(len(r.by_head))])
        ax.set_ylim(0, 1)
        ax.set_title(f"layer {r.layer} ({r.mixer})", fontsize=9)
        ax.set_ylabel("share of |M[q, :]| (mean over queries)")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(f"{label}: where each query's operator row reads", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, "reads", formats)


def summary_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (layer, head) for the command's table."""
    rows = []
    for layer in payload["layers"]:
        for h, parts in enumerate(layer["by_head"]):
            rows.append(
                {
                    "layer": layer["layer"],
                    "mixer": layer["mixer"],
                    "head": h,
                    **{k: round(100 * parts[k], 1) for k in PARTS},
                }
            )
    return rows
