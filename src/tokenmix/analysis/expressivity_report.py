"""Output of ``tokenmix analyze expressivity``: the table's rows, its figures and expressivity.json / .md."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from tokenmix.analysis.expressivity import CROSSCHECK_LIMIT
from tokenmix.analysis.expressivity_table import expressivity_table
from tokenmix.analysis.outputs import FIGURE_FORMATS, markdown_table, new_figure, save_figure, write_json


def table_rows(records: Sequence[dict]) -> list[dict]:
    return [
        {
            "row": r["row"],
            "mixers": ",".join(r.get("mixers", [])) or "—",
            "n": r["n"],
            "neighbors": r.get("neighbors_per_token"),
            "cache": r.get("cache"),
            "nnz(B)": r.get("nnz_B"),
            "path max": r.get("path_max"),
            "path mean": r.get("path_mean"),
            "congestion (L=" + ("n/2" if r["offset"] == r["n"] // 2 else str(r["offset"])) + ")": r.get("congestion"),
            "lower bound": r.get("congestion_lower"),
            "congestion max L≤n/2": r.get("congestion_worst"),
            "reach/layer": (r.get("reach") or {}).get("per_layer"),
            "paper §4.2–4.3": r.get("paper"),
            "agrees": r.get("agrees"),
            "note": r.get("method") if "skipped" in r.get("method", "") else "",
        }
        for r in records
    ]


def plot_expressivity(records: Sequence[dict], out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    keys = list(dict.fromkeys(r["row"] for r in records))
    fig, axes = new_figure(2, 2, size=(5.0, 3.6))
    panels = [
        ("path_max", "shortest path (max hops)"),
        ("path_mean", "shortest path (mean hops)"),
        ("congestion", "congestion, copy at offset n/2"),
        ("cache", "decode cache (positions)"),
    ]
    for ax, (field_name, title) in zip([a for row in axes for a in row], panels):
        for i, key in enumerate(keys):
            pts = [
                (r["n"], r[field_name])
                for r in records
                if r["row"] == key
                and field_name in r
                and isinstance(r[field_name], (int, float))
                and math.isfinite(r[field_name])
                and r[field_name] > 0
            ]
            if pts:
                ax.plot(*zip(*pts), "o-", ms=3, lw=1, color=f"C{i % 10}", label=key)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_title(title, fontsize=9)
        if ax.has_data():
            ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    files = save_figure(fig, out_dir, "expressivity", formats)

    n_top = max(r["n"] for r in records)
    fig, axes = new_figure(1, 2, size=(5.4, 3.8))
    ax_h, ax_l = axes[0]
    for i, key in enumerate(keys):
        rec = next((r for r in records if r["row"] == key and r["n"] == n_top and "reach" in r), None)
        if rec is None:
            rec = max((r for r in records if r["row"] == key and "reach" in r), key=lambda r: r["n"], default=None)
        if rec is None:
            continue
        hops = rec["reach"]["within_hops"]
        ax_h.plot(
            range(1, len(hops) + 1),
            [max(h, 0.5) for h in hops],
            "o-",
            ms=3,
            lw=1,
            color=f"C{i % 10}",
            label=f"{key} (n={rec['n']})",
        )
        lay = rec["reach"]["through_layers"]
        ax_l.plot(range(1, len(lay) + 1), lay, "o-", ms=3, lw=1, color=f"C{i % 10}", label=f"{key} (n={rec['n']})")
    ax_h.set_yscale("log")
    ax_h.set_xlabel("hops h")
    ax_h.set_title("positions the last output reaches within h hops", fontsize=9)
    ax_l.set_yscale("log")
    ax_l.set_xlabel("stacked layers L")
    ax_l.set_title("positions the last output depends on through L layers", fontsize=9)
    for ax in (ax_h, ax_l):
        if ax.has_data():
            ax.legend(fontsize=6)
    fig.tight_layout()
    return files + save_figure(fig, out_dir, "reach", formats)


def run_expressivity(out_dir: Path, *, formats: Sequence[str] = FIGURE_FORMATS, **kwargs) -> dict:
    """:func:`expressivity_table` + plots; writes expressivity.json / expressivity.md."""
    records = expressivity_table(**kwargs)
    figures = plot_expressivity(records, out_dir, formats)
    rows = table_rows(records)
    out = {
        "kind": "expressivity",
        "settings": {k: v for k, v in kwargs.items() if k != "progress"},
        "records": records,
        "summary": rows,
        "figures": [p.name for p in figures],
    }
    write_json(Path(out_dir) / "expressivity.json", out)
    md = [
        "# Expressivity: shortest information path, congestion, reach (framework §4.2–4.3)",
        "",
        "Pattern rows: translation-invariant patterns by the exact gap decomposition (checked against the "
        f"graph BFS up to n = {CROSSCHECK_LIMIT}); lattice/Fenwick patterns by graph distances. Congestion: "
        "copy at offset L, every flow routed (shared decomposition for translation-invariant patterns, "
        "shortest paths otherwise), with the lower bound ⌈Σ path lengths / (n − 1)⌉.",
        "",
        markdown_table(rows),
    ]
    (Path(out_dir) / "expressivity.md").write_text("\n".join(md))
    return out
