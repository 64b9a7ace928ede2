"""The paper's qualitative claims, checked on a compare run's cells: each verdict (holds, does not
hold, untested) comes with the measured numbers and the structural facts that explain it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.study.cells import CompareCells, column_baselines
from tokenmix.study.paper import DIAGONAL_SSM, PAPER_TASKS
from tokenmix.study.theory import CopyRoutes, RecallReads, doubling_layers

WIDE_MARGIN = 0.20  # "by a wide margin"
CLOSE_MARGIN = 0.05  # "close to", "keeps"
GUESS_SLACK = 0.03  # a cell within this of a guessing baseline is "at guessing level"
CEILING = 0.99


def cell_diagnostics(
    key: tuple[str, str], cell: dict[str, Any], baselines: dict[str, dict[str, float]], lrs: Sequence[float]
) -> list[str]:
    """Facts about one measured cell that bear on why a comparison came out as it did, each computed
    from the runs: accuracy per answer group (which kinds of question it answers), at a guessing
    level, stopped by the step budget while still improving, best learning rate at the edge of the grid."""
    label, task = key
    out = []
    by_group = cell.get("acc_by_group") or {}
    if len(by_group) > 1:
        out.append(
            f"{label} on {task} by answer group (test, every question of the group, scored or only "
            f"trained on): " + ", ".join(f"{g} {100 * a:.1f} %" for g, a in by_group.items())
        )
    acc = cell["acc_mean"]
    guess = baselines.get(task, {})
    if guess:
        name, level = max(guess.items(), key=lambda kv: kv[1])
        if acc <= level + GUESS_SLACK:
            out.append(
                f"{label} on {task} is at a guessing level ({100 * acc:.1f} % vs '{name}' "
                f"{100 * level:.1f} %): it learned what an answer looks like, not how to find it"
            )
    rising = cell.get("still_rising", 0)
    if rising:
        out.append(
            f"{label} on {task} was still improving when its {cell.get('max_steps', '?')}-step budget "
            f"ended ({rising} of {cell.get('n_seeds', '?')} seeds): more steps may change it"
        )
    grid = sorted(set(lrs))
    # with two learning rates both are edges: the note says something only for a longer grid
    if len(grid) > 2 and acc < CEILING and cell.get("best_lr") in (grid[0], grid[-1]):
        out.append(
            f"{label} on {task}: its best learning rate {cell['best_lr']:g} is at the edge of the grid "
            f"{[f'{lr:g}' for lr in grid]}"
        )
    return out


def _spread_note(a: tuple[str, str], b: tuple[str, str], cells: dict) -> str | None:
    ca, cb = cells[a], cells[b]
    diff = ca["acc_mean"] - cb["acc_mean"]
    spread = ca.get("acc_std", 0.0) + cb.get("acc_std", 0.0)
    if abs(diff) <= spread:
        return (
            f"{a[0]} − {b[0]} on {a[1]} is {100 * diff:+.1f} points, within the seeds' spread "
            f"(± {100 * ca.get('acc_std', 0.0):.1f}, ± {100 * cb.get('acc_std', 0.0):.1f})"
        )
    return None


def _route_pair_note(a: CopyRoutes, b: CopyRoutes) -> str:
    """What the two rows' copy routes predict about their order."""
    if a.routed == b.routed == 0:
        return (
            f"neither {a.label} nor {b.label} routes any answer through free positions alone at this size: "
            "what they copy goes through relays that also carry their own symbol"
        )
    if a.hop_counts() == b.hop_counts():
        return (
            f"the structure does not separate {a.label} and {b.label} on copy at this size: both route "
            f"{a.routed} of {a.copy_len} answers through free positions with the same hop counts, so their "
            "difference was learned (optimisation, gates), not imposed by the pattern"
        )
    better = a if (a.routed, [-h for h in a.hop_counts()]) > (b.routed, [-h for h in b.hop_counts()]) else b

    def hops(r: CopyRoutes) -> str:
        return ", ".join(f"{c} in {h} hop(s)" for h, c in r.hop_counts().items()) or "none"

    return (
        f"the structure favours {better.label} on copy at this size: {a.label} routes {a.routed} ({hops(a)}), "
        f"{b.label} {b.routed} ({hops(b)}) of {a.copy_len} answers through free positions"
    )


def qualitative_findings(
    cells: dict[tuple[str, str], dict[str, Any]],
    baselines: dict[str, dict[str, float]] | None = None,
    lrs: Sequence[float] = (),
    routes: dict[str, CopyRoutes] | None = None,
    reads: dict[str, RecallReads] | None = None,
) -> list[dict[str, Any]]:
    """The paper's qualitative claims (framework §5.1), each checked on the measured table.

    A claim is "holds", "does not hold" or "not measured" (a row or column is missing). Margins:
    "wide" = at least 20 points, "close" / "keeps" = within 5 points. ``why`` lists facts computed
    from the runs behind the claim's cells (guessing level, still improving at the end of the
    budget, learning rate at the grid edge, difference within the seeds' spread) that bear on a
    verdict; ``baselines`` (per column, ``TaskConfig.baselines()``) and ``lrs`` (the grid) enable
    the first and third. ``routes`` (:func:`copy_routes_for_rows`) adds, to claims on the copy column,
    what each pattern row's structure allows there (and whether it separates a compared pair);
    ``reads`` (:func:`recall_reads_for_rows`) does the same for the recall column.

    A claim whose cells are all at a guessing level is "untested": it compares guesses, and a
    "holds" there would report a finding that nothing measured.

    "Diagonal SSM lowest" is checked against every recurrence and attention, not local attention:
    in the paper's own table local attention (23.75 copy, 26.20 recall) is below the diagonal SSM
    (42.98, 32.53), so the paper's ladder is a claim about the recurrences.
    """
    baselines = baselines or {}
    routes = routes or {}
    reads = reads or {}

    def get(label, task):
        c = cells.get((label, task))
        return None if c is None else c["acc_mean"]

    out = []

    def claim(
        text: str,
        needed: list[tuple[str, str]],
        test,
        pairs: Sequence[tuple[tuple[str, str], tuple[str, str]]] = (),
        explain: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        vals = {k: get(*k) for k in needed}
        why: list[str] = []
        if any(v is None for v in vals.values()):
            verdict, detail = "not measured", ", ".join(f"{a}/{t}" for (a, t), v in vals.items() if v is None)
        else:
            verdict = "holds" if test(vals) else "does not hold"
            detail = ", ".join(
                f"{a} {t} {100 * v:.1f} ± {100 * cells[(a, t)].get('acc_std', 0.0):.1f}" for (a, t), v in vals.items()
            )
            verdict = _why_of_claim(vals, needed, pairs, explain, verdict, why, cells, baselines, lrs, routes, reads)
        out.append({"claim": text, "verdict": verdict, "measured": detail, "why": why})

    dense, att = ("dense_recurrence", "multi_hop"), ("attention", "multi_hop")
    claim(
        "dense recurrence ≥ attention on multi-hop by a wide margin (≥ 20 points)",
        [dense, att],
        lambda v: v[dense] - v[att] >= WIDE_MARGIN,
        [(dense, att)],
    )
    others = ["attention", "kth_order", "dense_recurrence", "pow2", "pow2_ce", "sq1", "sq1_ce"]
    for task in ("copy", "assoc_recall"):
        present = [o for o in others if get(o, task) is not None]
        diag = (DIAGONAL_SSM, task)
        nearest = min(present, key=lambda o: get(o, task)) if present and get(*diag) is not None else None
        claim(
            f"diagonal SSM ({DIAGONAL_SSM}) lowest on {task} (among attention and the recurrences)",
            [diag] + [(o, task) for o in present],
            lambda v, task=task, present=present: all(v[(DIAGONAL_SSM, task)] <= v[(o, task)] for o in present),
            [(diag, (nearest, task))] if nearest else [],
            explain=[diag, (nearest, task)] if nearest else [diag],
        )
    sq1, pow2, attc = ("sq1", "copy"), ("pow2", "copy"), ("attention", "copy")
    claim("sq1 ≥ pow2 on copy", [sq1, pow2], lambda v: v[sq1] >= v[pow2], [(sq1, pow2)])
    claim(
        "sq1 close to attention on copy (within 5 points)",
        [sq1, attc],
        lambda v: v[sq1] >= v[attc] - CLOSE_MARGIN,
        [(sq1, attc)],
    )
    for base in ("pow2", "sq1"):
        ce, b = (f"{base}_ce", "copy"), (base, "copy")
        claim(
            f"{base}_ce costs copy accuracy ({base}_ce < {base})",
            [ce, b],
            lambda v, ce=ce, b=b: v[ce] < v[b],
            [(ce, b)],
        )
        ce, b = (f"{base}_ce", "assoc_recall"), (base, "assoc_recall")
        claim(
            f"{base}_ce keeps recall ({base}_ce ≥ {base} − 5 points)",
            [ce, b],
            lambda v, ce=ce, b=b: v[ce] >= v[b] - CLOSE_MARGIN,
            [(ce, b)],
        )
    return out


def _why_of_claim(
    vals: dict[tuple[str, str], float],
    needed: Sequence[tuple[str, str]],
    pairs: Sequence[tuple[tuple[str, str], tuple[str, str]]],
    explain: Sequence[tuple[str, str]] | None,
    verdict: str,
    why: list[str],
    cells: dict[tuple[str, str], dict[str, Any]],
    baselines: dict[str, dict[str, float]],
    lrs: Sequence[float],
    routes: dict[str, CopyRoutes],
    reads: dict[str, RecallReads],
) -> str:
    """Append to ``why`` the facts behind a measured claim (spreads, routes, ceilings, guessing levels,
    each cell's diagnostics and structure) and return its verdict ("untested" when every cell is at a
    guessing level, else ``verdict``)."""
    for a, b in pairs:
        note = _spread_note(a, b, cells)
        if note:
            why.append(note)
        if a[1] == b[1] == "copy" and a[0] in routes and b[0] in routes:
            why.append(_route_pair_note(routes[a[0]], routes[b[0]]))
    if all(v >= CEILING for v in vals.values()):
        why.append(
            f"every cell is at the ceiling (≥ {100 * CEILING:.0f} %): this task does not separate "
            "these rows at this size"
        )
    levels = {t: max(baselines[t].values()) for (_, t) in vals if baselines.get(t)}
    if len(vals) > 1 and all(t in levels and v <= levels[t] + GUESS_SLACK for (_, t), v in vals.items()):
        verdict = "untested"
        why.append(
            "every cell is at a guessing level: none of these rows learned the task within its budget, "
            "so there is nothing to compare (untested, not holds)"
        )
    for k in needed if explain is None else explain:
        why += cell_diagnostics(k, cells[k], baselines, lrs)
        if k[1] == "copy" and k[0] in routes:
            guess = max(baselines.get("copy", {}).values(), default=None)
            why.append(routes[k[0]].describe(cells[k], guess))
        if k[1] == "assoc_recall" and k[0] in reads:
            why.append(reads[k[0]].describe(cells[k]))
    return verdict


SOLVED = 0.90  # "solves" in the depth claim


def depth_rows(configs: Sequence[SyntheticRunConfig]) -> tuple[list[str], dict[int, str], dict[str, int]]:
    """The rows the depth claim reads, recognised from their models: labels of the one-layer
    ``dense_recurrence`` / ``chacal`` rows, attention-only rows by layer count, and the number of
    state changes n of every entity-tracking column."""
    one_layer: list[str] = []
    attention: dict[int, str] = {}
    columns: dict[str, int] = {}
    for c in configs:
        if c.task != "entity_tracking":
            continue
        columns.setdefault(c.column_name, c.task_config().num_changes)
        layers = c.model_config().layers
        if len(layers) == 1 and layers[0] in ("dense_recurrence", "chacal") and c.label not in one_layer:
            one_layer.append(c.label)
        elif set(layers) == {"attention"}:
            attention.setdefault(len(layers), c.label)
    return one_layer, attention, columns


def depth_findings(
    cells: dict[tuple[str, str], dict[str, Any]],
    configs: Sequence[SyntheticRunConfig],
    lrs: Sequence[float] = (),
    baselines: dict[str, dict[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """ChaCAL's depth claim (framework §6.2, references §3) on an entity-tracking table.

    Per column with n state changes, bound b = ceil(log2(n + 1)): (1) a one-layer dense recurrence
    or ChaCAL solves it (≥ 90 %); (2) attention with fewer than b layers does not (each at least 20
    points below the better one-layer recurrence); and, as a measured fact rather than a claim (b is
    a lower bound), the fewest attention layers that reach 90 %. Rows are recognised from their
    models: one layer of ``dense_recurrence`` or ``chacal``, or only ``attention`` layers.
    """
    one_layer, attention, columns = depth_rows(configs)
    baselines = column_baselines(configs) if baselines is None else baselines
    out = []
    for col, n in columns.items():
        bound = math.ceil(math.log2(n + 1))
        rec = {lab: cells[(lab, col)] for lab in one_layer if (lab, col) in cells}
        att = {L: cells[(lab, col)] for L, lab in sorted(attention.items()) if (lab, col) in cells}
        if not rec or not att:
            out.append({"claim": f"{col}: depth effect", "verdict": "not measured", "measured": "", "why": []})
            continue
        best_rec = max(rec, key=lambda lab: rec[lab]["acc_mean"])
        # every one-layer row's facts, not only the best one's: a second row that fails needs its reason
        why = [w for lab, c in rec.items() for w in cell_diagnostics((lab, col), c, baselines, lrs)]
        detail = ", ".join(f"{lab} {100 * c['acc_mean']:.1f} ± {100 * c['acc_std']:.1f}" for lab, c in rec.items())
        out.append(
            {
                "claim": f"{col}: a one-layer dense recurrence / ChaCAL solves {n} state changes (≥ 90 %)",
                "verdict": "holds" if rec[best_rec]["acc_mean"] >= SOLVED else "does not hold",
                "measured": detail,
                "why": why,
            }
        )
        shallow = {L: c for L, c in att.items() if L < bound}
        if shallow:
            ok = all(c["acc_mean"] <= rec[best_rec]["acc_mean"] - WIDE_MARGIN for c in shallow.values())
            why = [w for L, c in shallow.items() for w in cell_diagnostics((attention[L], col), c, baselines, lrs)]
            out.append(
                {
                    "claim": f"{col}: attention with fewer than ceil(log2({n} + 1)) = {bound} layers fails "
                    f"(≥ 20 points below {best_rec})",
                    "verdict": "holds" if ok else "does not hold",
                    "measured": ", ".join(
                        f"{L} layer(s) {100 * c['acc_mean']:.1f} ± {100 * c['acc_std']:.1f}" for L, c in shallow.items()
                    ),
                    "why": why,
                }
            )
        reach = [L for L, c in att.items() if c["acc_mean"] >= SOLVED]
        deep = {L: c for L, c in att.items() if L >= bound}
        why = []
        if not reach and deep:
            # the bound says what depth permits, not what training finds: say which it was here
            steps = max(c.get("max_steps", 0) for c in deep.values())
            budget = f" within {steps} steps" if steps else ""
            why.append(
                f"attention with {', '.join(map(str, deep))} layer(s) (at or above the bound) did not solve it "
                f"either{budget}: the bound permits a solution these runs did not find"
            )
            why.append(
                f"a known solution needs {doubling_layers(n)} layers: pointer doubling with one-hot attention "
                f"(L layers follow 2^L - 1 links; the ASK is {n + 1} links from the PUT)"
            )
            why += [w for L, c in deep.items() for w in cell_diagnostics((attention[L], col), c, baselines, lrs)]
        out.append(
            {
                "claim": f"{col}: fewest attention layers reaching 90 % (lower bound {bound})",
                "verdict": f"{reach[0]} layers" if reach else f"none of 1..{max(att)}",
                "measured": ", ".join(f"{L}: {100 * c['acc_mean']:.1f}" for L, c in att.items()),
                "why": why,
            }
        )
    return out


def paper_findings(cc: CompareCells) -> list[dict[str, Any]]:
    """The paper's qualitative claims on the sweep's cells (none when it has no paper column)."""
    if not any(c in PAPER_TASKS for c in cc.columns):
        return []
    return qualitative_findings(cc.cells, cc.baselines, cc.lrs, cc.routes, cc.reads)


def entity_depth_findings(cc: CompareCells) -> list[dict[str, Any]]:
    """The depth claims on the sweep's cells (none when it has no entity-tracking column)."""
    if not any(c.task == "entity_tracking" for c in cc.configs):
        return []
    return depth_findings(cc.cells, cc.configs, cc.lrs, cc.baselines)
