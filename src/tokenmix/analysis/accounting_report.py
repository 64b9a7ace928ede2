"""The accounting's output: one summary row per mixer, the cache and time figures, cost.json and cost.md.

Reads what ``analysis/accounting.py`` returns per mixer; computes nothing new.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from tokenmix.analysis.accounting_derived import SLOPE_TOLERANCE, TRAINING_FLOPS_FACTOR
from tokenmix.analysis.outputs import FIGURE_FORMATS, markdown_table, new_figure, save_figure, write_json


def _slope_cell(value: float | None, judged: bool = True) -> float | str | None:
    """A slope for the table: 2 decimals (the tolerance is 0.15), marked when it is not judged."""
    if value is None:
        return None
    return round(value, 2) if judged else f"{value:.2f} (not judged)"


def accounting_rows(results: Sequence[dict]) -> list[dict]:
    """One summary row per mixer for the flag table: complexity, theory slope, measured slopes, flags.

    ``mixing share`` is the mixing's fraction of the whole time at the shortest and longest timed n;
    ``fit n`` the lengths the slopes are fitted and judged over (from ``ASYMPTOTE_FROM`` on where a
    kernel has an entry; the full-range mixing slope is then shown beside);
    ``mixing slope (user)`` the mixing slope on user CPU time and ``sys share@max n`` the system
    part of the CPU time at the longest n, which tell page-fault costs from the computation's own.
    """
    rows = []
    for r in results:
        s = r["slope"]
        judged = s["judged"]
        times = r["time"]
        share = [t["mixing_share"] for t in times if "mixing_share" in t]
        rows.append(
            {
                "mixer": r["mixer"],
                "time/token": r["time_complexity"],
                "cache": r["cache_complexity"],
                "theory slope": _slope_cell(s.get("theory")),
                "mixing slope": _slope_cell(s.get("measured_mixing"), judged),
                "whole slope": _slope_cell(s["measured"], judged),
                "whole band": f"{s['band'][0]:.2f}–{s['band'][1]:.2f}" if s.get("band") else "—",
                "FLOPs slope": _slope_cell(s["derived"]),
                "mixing share": f"{share[0]:.2f}→{share[-1]:.2f}" if share else "—",
                "mixing slope (user)": _slope_cell(s.get("measured_mixing_user")),  # a diagnostic, never judged
                "sys share@max n": round(times[-1]["sys_share"], 2) if times and "sys_share" in times[-1] else None,
                "fit n": f"{s['n_range'][0]}–{s['n_range'][1]}" if s["n_range"] else "—",
                # the whole timed range, when the judged fit starts later (ASYMPTOTE_FROM)
                "full-range mixing slope": (
                    f"{s['measured_mixing_full']:.2f} over {s['n_range_full'][0]}–"
                    f"{s['n_range_full'][1]} (theory {s['theory_full']:.2f})"
                    if s.get("fit_from") is not None
                    and s.get("measured_mixing_full") is not None
                    and s.get("theory_full") is not None
                    else "same"
                ),
                "cache n": ",".join(str(c["n"]) for c in r["cache"]) or "—",
                "cache match": all(c["match"] for c in r["cache"]) if r["cache"] else None,
                "entries@max n": r["cache"][-1]["measured_positions"] if r["cache"] else None,
                "flags": "; ".join(r["flags"]) or "ok",
            }
        )
    return rows


def plot_accounting(results: Sequence[dict], out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """cache.(png|svg): derived lines vs measured markers; time.(png|svg): measured vs scaled derived FLOPs."""
    files: list[Path] = []
    fig, axes = new_figure(1, 2, size=(5.6, 4.2))
    ax_b, ax_p = axes[0]
    for i, r in enumerate(results):
        if not r["cache"]:
            continue
        color = f"C{i % 10}"
        ns = [c["n"] for c in r["cache"]]
        ax_b.plot(ns, [c["derived_bytes"] for c in r["cache"]], "-", color=color, lw=1, label=r["mixer"])
        ax_b.plot(ns, [c["measured_bytes"] for c in r["cache"]], "o", color=color, ms=4, mfc="none")
        pos = [(n, c["derived_positions"], c["measured_positions"]) for n, c in zip(ns, r["cache"])]
        if any(p[1] > 0 for p in pos):
            ax_p.plot([p[0] for p in pos], [max(p[1], 0.5) for p in pos], "-", color=color, lw=1, label=r["mixer"])
            ax_p.plot([p[0] for p in pos], [max(p[2], 0.5) for p in pos], "o", color=color, ms=4, mfc="none")
    for ax, what in ((ax_b, "decode state bytes per sequence (float32)"), (ax_p, "cached positions (> 0 only)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (decoded tokens)")
        ax.set_title(f"{what}\nline = derived, circle = measured", fontsize=9)
        if ax.has_data():
            ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    files += save_figure(fig, out_dir, "cache", formats)

    timed = [r for r in results if len(r["time"]) >= 2]
    if timed:
        fig, axes = new_figure(1, 2, size=(6.0, 4.6))
        panels = (
            (axes[0][0], "seconds", "derived_training_flops", "measured", "whole mixer", "derived training FLOPs"),
            (
                axes[0][1],
                "mixing_seconds",
                "derived_mixing_flops",
                "measured_mixing",
                "mixing (whole − projections)",
                "derived mixing FLOPs",
            ),
        )
        for ax, key, flops_key, slope_key, what, derived_what in panels:
            for i, r in enumerate(timed):
                pts = [(t["n"], t[key], t[flops_key]) for t in r["time"] if t.get(key, 0) > 0]
                if len(pts) < 2:
                    continue
                color = f"C{i % 10}"
                ns, secs, flops = (np.array([p[k] for p in pts], dtype=float) for k in range(3))
                slope = r["slope"].get(slope_key)
                label = r["mixer"] + (f" ({slope:.2f})" if slope is not None else "")
                ax.plot(ns, secs, "o-", color=color, ms=4, lw=1, label=label)
                if (flops > 0).all():
                    scale = math.exp(float(np.mean(np.log(secs) - np.log(flops))))  # match at the geometric mean
                    ax.plot(ns, flops * scale, "--", color=color, lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("n (sequence length)")
            ax.set_ylabel(f"forward + backward seconds ({timed[0].get('clock', 'cpu')} clock)")
            ax.set_title(f"{what}: measured (solid, slope)\nvs {derived_what}, scaled (dashed)", fontsize=9)
            if ax.has_data():
                ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        files += save_figure(fig, out_dir, "time", formats)
    return files


def write_accounting(results: list[dict], out_dir: Path, settings: dict, figures: list[Path], complete: bool) -> dict:
    """cost.json and cost.md of the mixers accounted so far (``complete``: all of them); returns cost.json's content."""
    rows = accounting_rows(results)
    threads = sorted({r["threads"] for r in results if r["time"]}) or [torch.get_num_threads()]
    clocks = sorted({r["clock"] for r in results if r["time"]}) or ["cpu"]
    loads = [t["load_1min"] for r in results for t in r["time"] if "load_1min" in t]
    out = {
        "kind": "cost",
        "complete": complete,
        "slope_tolerance": SLOPE_TOLERANCE,
        "training_flops_factor": TRAINING_FLOPS_FACTOR,
        "settings": {k: v for k, v in settings.items() if k != "mixer"},
        "threads": threads[0] if len(threads) == 1 else threads,
        "clock": "/".join(clocks),
        "load_1min_range": [min(loads), max(loads)] if loads else None,
        "cpus": os.cpu_count(),
        "memory_kept": sorted({r.get("memory_kept", False) for r in results if r["time"]}),
        "summary": rows,
        "mixers": results,
        "figures": [p.name for p in figures],
    }
    write_json(Path(out_dir) / "cost.json", out)
    md = _cost_markdown(results, rows, threads, clocks, loads, complete)
    tmp = Path(out_dir) / "cost.md.tmp"
    tmp.write_text("\n".join(md))
    tmp.replace(Path(out_dir) / "cost.md")
    return out


def _cost_markdown(
    results: list[dict], rows: list[dict], threads: list, clocks: list[str], loads: list[float], complete: bool
) -> list[str]:
    """The lines of cost.md: how it was measured and judged, the flag table, the later fit starts."""
    load = f"1-min load {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} CPUs" if loads else "no timing"
    kept = {r.get("memory_kept", False) for r in results if r["time"]}
    memory = (
        "freed memory kept in the process (no page faults of buffers mapped afresh per call)"
        if kept == {True}
        else "freed memory returned to the OS (page faults of fresh buffers included)"
        if kept == {False}
        else "freed memory kept for some mixers only"
    )
    md = [
        "# Cost and cache accounting: derived vs measured",
        "",
        "Cache: decode n tokens with `step`, compare the measured `peak_positions` / `peak_numel` with the "
        "derived `cache_positions(n)` / `state_size(n)` (bytes at float32). Time: forward + backward of "
        "the training mode, and a replay of the same projection calls alone; the fastest of the repeats "
        f"on the {'/'.join(clocks)} clock ('cpu' = process CPU time, which time-slicing by other "
        "processes does not inflate); the lengths are timed in turns, so each sees the same load. *Mixing* = "
        "whole minus projections. The theory slope is that of n x the stated per-token complexity over "
        "the fitted n (`fit n`); the mixing slope must be within "
        f"±{SLOPE_TOLERANCE} of it, the whole slope within the projection-aware band (between the "
        f"projections' 1 and the derived mixing slope, ±{SLOPE_TOLERANCE}). The FLOPs slope is the "
        "derived prediction of the whole slope (projections and mixing weighted by multiply-adds, not "
        "by how fast each runs). A slope marked 'not judged' comes from short lengths where fixed "
        f"per-call overheads dominate. {'/'.join(map(str, threads))} torch thread(s), {load}, {memory}.",
        "",
        markdown_table(rows),
    ]
    starts = [
        f"- **{r['mixer']}** judged over n >= {r['slope']['fit_from']}: {r['slope']['fit_why']}."
        for r in results
        if r["slope"].get("fit_from") is not None
    ]
    if starts:
        md += [
            "",
            "Slopes judged from a later length on (the kernel reaches its asymptote there; the "
            "full-range mixing slope is in the table):",
        ]
        for line in starts:  # one paragraph each (the report's Markdown subset has no lists)
            md += ["", line]
    if not complete:
        md.insert(2, "_Partial: the run is still going or was interrupted._\n")
    return md
