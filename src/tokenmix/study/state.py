"""State tracking's published claims, checked on a ``state`` sweep (``study/presets/state.py``):
negative eigenvalues let the delta rule track parity (Grazzi et al. 2025), and DeltaProduct with
n_h >= 2 Householder steps per token and PaTH's data-dependent Householder transforms track the
non-solvable group A5 (Siems et al. 2025; Yang et al. 2025).

Each claim gets "holds" or "does not hold", with every seed's accuracy and the seeds' spread, read
at the training length (the columns' cells, learning rate chosen by validation) and, where the
claim is about tracking rather than fitting, at the longer test length too. "untested" is kept for
a claim whose rows all stayed at their guessing level for their whole budget (every seed's best
validation accuracy within ``GUESS_SLACK`` of it): the runs then show that the budget was too short
for those rows to learn the group, and the finding says so. A cell whose runs were still rising
when their budget ended is named in the claim's facts (``still_rising``).

The rows are the preset's labels, stated here once (the preset builds its rows from them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.cells import CompareCells, best_cells, column_baselines
from tokenmix.study.claims import GUESS_SLACK
from tokenmix.study.report import ReportSection, finding_lines
from tokenmix.training.synthetic import summarize

PARITY, A5 = "parity", "A5"  # the preset's columns
DELTA, DELTA_NEG = "gated_deltanet", "gated_deltanet (neg. eig.)"
POSITIVE_ROWS = ("mamba2", "gla", "rg_lru", "deltanet", DELTA)  # transitions with positive eigenvalues
PRODUCT = "gated_delta_product n_h={}"  # with negative eigenvalues, n_h Householder steps per token
PATH = "path_attention"
TRACKS = 0.90  # "tracks the group": at least this at the training length


def _learned(label: str, column: str, results: Sequence[dict[str, Any]], cell: dict[str, Any], guess: float) -> bool:
    vals = [
        r["best_val_acc"]
        for r in results
        if r["label"] == label and r.get("column", r["task"]) == column and r["lr"] == cell["best_lr"]
    ]
    return max(vals, default=cell["acc_mean"]) > guess + GUESS_SLACK


def state_findings(configs: Sequence[SyntheticRunConfig], results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The claims of the module docstring on a finished state sweep (see there for the verdicts)."""
    cells = best_cells(summarize(results))
    baselines = column_baselines(configs)
    for cell in cells.values():  # each seed's test accuracy at the cell's learning rate
        cell["by_seed"] = sorted(
            (r["seed"], r["test_acc"])
            for r in results
            if r["label"] == cell["label"]
            and r.get("column", r["task"]) == cell["column"]
            and r["lr"] == cell["best_lr"]
        )
    out: list[dict[str, Any]] = []

    def text(label: str, column: str) -> str:
        c = cells[(label, column)]
        seeds = ", ".join(f"{100 * a:.1f}" for _, a in c["by_seed"])
        at = "".join(f"; @{n}: {100 * v:.1f}" for n, v in c.get("acc_at", {}).items())
        return f"{label} {100 * c['acc_mean']:.1f} ± {100 * c['acc_std']:.1f} (seeds {seeds}{at})"

    def claim(statement: str, column: str, labels: Sequence[str], test) -> None:
        missing = [lab for lab in labels if (lab, column) not in cells]
        if missing:
            out.append(
                {
                    "claim": statement,
                    "verdict": "not measured",
                    "measured": f"no runs for {', '.join(missing)}",
                    "why": [],
                    "still_rising": [],
                }
            )
            return
        guess = max(baselines[column].values())
        acc = {lab: cells[(lab, column)]["acc_mean"] for lab in labels}
        why = [f"{column}: guessing level {100 * guess:.1f} % (the first position copied, uniform elsewhere)"]
        learned = {lab: _learned(lab, column, results, cells[(lab, column)], guess) for lab in labels}
        for lab in labels:
            c = cells[(lab, column)]
            facts = f"{c['steps_mean']:.0f} steps on average (budget {c['max_steps']})"
            if not learned[lab]:
                facts += "; never left the guessing level"
            why.append(f"{lab}: {facts}")
        rising = [lab for lab in labels if cells[(lab, column)].get("still_rising")]
        if rising:
            why.append(f"judged on cells still rising when their budget ended: {', '.join(rising)}")
        verdict = "holds" if test(acc) else "does not hold"
        if not any(learned.values()):
            verdict = "untested"
            why.append(
                f"no row here left the guessing level within its budget: the budget is too short for them to "
                f"learn {column}, so the claim is neither confirmed nor refuted"
            )
        out.append(
            {
                "claim": statement,
                "verdict": verdict,
                "measured": ", ".join(text(lab, column) for lab in labels),
                "why": why,
                "still_rising": rising,
            }
        )

    positive = [lab for lab in POSITIVE_ROWS if (lab, PARITY) in cells]
    claim(
        f"negative eigenvalues let Gated DeltaNet track parity (Grazzi et al. 2025; ≥ {100 * TRACKS:.0f} % and "
        "above every row with positive transitions)",
        PARITY,
        [DELTA_NEG, *positive],
        lambda a: a[DELTA_NEG] >= TRACKS and all(a[DELTA_NEG] > a[lab] for lab in positive),
    )
    products = [PRODUCT.format(n) for n in (1, 2, 3) if (PRODUCT.format(n), A5) in cells]
    for n in (2, 3):
        lab = PRODUCT.format(n)
        if lab in products:
            one = PRODUCT.format(1)
            rows = [lab] + ([one] if one in products else [])
            claim(
                f"DeltaProduct with n_h = {n} tracks A5 (Siems et al. 2025; ≥ {100 * TRACKS:.0f} %"
                + (", above n_h = 1)" if one in rows else ")"),
                A5,
                rows,
                lambda a, lab=lab, one=one: a[lab] >= TRACKS and (one not in a or a[lab] > a[one]),
            )
    claim(f"PaTH tracks A5 (Yang et al. 2025; ≥ {100 * TRACKS:.0f} %)", A5, [PATH], lambda a: a[PATH] >= TRACKS)
    return out


def state_section(out: Path, cc: CompareCells, plots: bool = True) -> ReportSection:
    """The state preset's report part: its claims (figures: the generic learning curves)."""
    findings = state_findings(cc.configs, cc.results)
    md = [
        "## State tracking: the published claims",
        "",
        "Each claim read at the training length (test accuracy, learning rate chosen by validation); every "
        "seed's accuracy and the longer test length in brackets.",
        "",
    ]
    md += finding_lines(findings)
    return ReportSection("\n".join(md), [], findings)


__all__ = [
    "A5",
    "DELTA",
    "DELTA_NEG",
    "PARITY",
    "PATH",
    "POSITIVE_ROWS",
    "PRODUCT",
    "TRACKS",
    "state_findings",
    "state_section",
]
