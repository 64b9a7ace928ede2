"""tokenmix list [--json | --markdown] / tokenmix check [--mixer NAME ... | --all] [--json] [--quiet]

``list --json`` gives, per mixer, its config fields (type, default under that name, help): what
``model.mixer_overrides.NAME.FIELD=VALUE`` can set. The help is the field's ``metadata["help"]``
where given, else the comment on the field's line in the config dataclass (how the mixer configs
document their fields), so the text is written once, next to the field.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import textwrap
import tokenize

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tokenmix.checks import CROSSCHECKS, ReferenceUnavailable, load_all_crosschecks
from tokenmix.checks.equivalence import mode_errors
from tokenmix.checks.tolerances import GRADIENT_FACTOR, mode_tolerance
from tokenmix.core.errors import InputError
from tokenmix.core.progress import Progress
from tokenmix.mixers.registry import build_mixer, get_mixer_spec, mixer_names


def _line_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line in ``cls``'s own source (continued by comment-only lines
    indented further, as multi-line field comments are written); {} when the source is not at hand."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    field_line: dict[int, tuple[str, int]] = {}  # line -> (field, column) of `name: type ...` in the class body
    current: tuple[str, int] | None = None
    tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    body_col = None
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.INDENT and body_col is None:
            body_col = len(tok.string)
        if (
            tok.type == tokenize.NAME
            and tok.start[1] == body_col
            and i + 1 < len(tokens)
            and tokens[i + 1].string == ":"
            and (i == 0 or tokens[i - 1].type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.COMMENT))
        ):
            field_line[tok.start[0]] = (tok.string, tok.start[1])
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            line = tok.start[0]
            if line in field_line:
                current = field_line[line]
                out[current[0]] = text
            elif current is not None and tok.line.strip().startswith("#") and tok.start[1] > current[1]:
                out[current[0]] += " " + text
            else:
                current = None
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and tok.start[0] not in field_line:
            current = None
    return out


def field_docs(config_cls: type, defaults: dict | None = None) -> list[dict]:
    """Each field of a config dataclass: name, type, default (``defaults`` over the class's own) and help."""
    helps: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):  # a subclass's comment wins over its base's
        if dataclasses.is_dataclass(klass):
            helps.update(_line_comments(klass))
    instance = config_cls(**(defaults or {}))
    out = []
    for f in dataclasses.fields(config_cls):
        value = getattr(instance, f.name)
        out.append(
            {
                "name": f.name,
                "type": f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)),
                "default": list(value) if isinstance(value, tuple) else value,
                "help": f.metadata.get("help") or helps.get(f.name, ""),
            }
        )
    return out


def describe(name: str) -> dict:
    spec = get_mixer_spec(name)
    m = build_mixer(name, 16, n_heads=2)
    return {
        "name": name,
        "family": spec.family,
        "ab_form": spec.ab_form,
        "modes": list(m.modes),
        "time_per_token": m.time_complexity,
        "cache": m.cache_complexity,
        "cache_positions@1024": m.cache_positions(1024),
        "state_scalars@1024(d=16)": m.state_size(1024),
        "config": field_docs(spec.config_cls, spec.defaults),
    }


# our config field -> its name in fla / mamba_ssm (and TTT's reference code) where the name differs
OUTSIDE_NAMES = {
    "n_heads": "fla `num_heads` (mamba: `d_inner / headdim`)",
    "head_dim": "mamba `headdim`",
    "state_dim": "mamba `d_state`, fla `state_size`",
    "d_skip": "mamba `D` (always on there)",
    "window": "fla `window_size`",
    "kernel_size": "mamba `d_conv`, fla `conv_size`",
    "n_h": "fla `num_householder`",
    "base_lr": "TTT `ttt_base_lr`",
}
# the fields every mixer shares (mixers/base.py's MixerConfig, whose docstring says them)
SHARED_HELP = {"n_heads": "H, the number of heads", "head_dim": "K per head; None: d_model // n_heads"}


def _reference(name: str) -> tuple[str, str]:
    """(the first paragraph of the mixer's module docstring, its source path from the repository root)."""
    module = inspect.getmodule(get_mixer_spec(name).cls)
    first = (inspect.getdoc(module) or "").split("\n\n")[0]
    path = "src/" + module.__name__.replace(".", "/") + ".py"
    return " ".join(first.split()), path


def _cell(value) -> str:
    return escape_md(json.dumps(value) if not isinstance(value, str) else value)


def escape_md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def mixers_markdown(rows: list[dict]) -> str:
    """docs/mixers.md: per mixer its reference, (A, B) form, modes, cost, cache and parameters with
    defaults and their fla / mamba names (``tokenmix list --markdown``; tests/cli/test_mixers_doc.py
    fails when the checked-in page is not current)."""
    out = [
        "# Mixers",
        "",
        "Generated by `tokenmix list --markdown > docs/mixers.md` from the registry; do not edit by hand",
        "(tests/cli/test_mixers_doc.py fails when this page is not current). Set a parameter with",
        "`--set model.mixer_overrides.NAME.FIELD=VALUE`; every mixer takes `d_model` from the model. Cost is",
        "time per token; the cache is what decoding keeps (positions and state scalars at n = 1024, d = 16).",
        "",
        "| mixer | family | time / token | cache | modes |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| [{r['name']}](#{r['name']}) | {r['family']} | {r['time_per_token']} | {r['cache']} "
        f"| {', '.join(r['modes'])} |"
        for r in rows
    ]
    for r in rows:
        reference, path = _reference(r["name"])
        out += [
            "",
            f"## {r['name']}",
            "",
            f"{escape_md(reference)} ([{path.rsplit('/', 1)[-1]}](../{path}))",
            "",
            f"- (A, B): {escape_md(r['ab_form'])}",
            f"- modes: {', '.join(f'`{m}`' for m in r['modes'])} (the first is the default)",
            f"- cost: {r['time_per_token']} time per token; cache {r['cache']}: "
            f"{r['cache_positions@1024']} positions, {r['state_scalars@1024(d=16)']:,} state scalars at n = 1024",
            "",
            "| parameter | type | default | fla / mamba name | meaning |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| `{f['name']}` | {escape_md(f['type'])} | {_cell(f['default'])} | {OUTSIDE_NAMES.get(f['name'], '')} "
            f"| {escape_md(f['help'] or SHARED_HELP.get(f['name'], ''))} |"
            for f in r["config"]
        ]
    return "\n".join(out) + "\n"


def run_list(args) -> int:
    rows = [describe(n) for n in mixer_names()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if args.markdown:
        print(mixers_markdown(rows), end="")
        return 0
    table = Table(title="registered mixers")
    for col in ("name", "family", "modes", "time/token", "cache", "(A, B) form"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["name"], r["family"], ",".join(r["modes"]), r["time_per_token"], r["cache"], escape(r["ab_form"])
        )
    Console(width=200).print(table)
    return 0


def check_mixer(name: str) -> dict:
    """One mixer's mode errors and cross-checks with their tolerances, and whether all pass ("ok")."""
    tol = mode_tolerance(get_mixer_spec(name).cls)
    errs = mode_errors(name)
    entry = {
        "modes": {
            k: {"max_abs": v, "tolerance": tol * (GRADIENT_FACTOR if k.endswith("grad") else 1)}
            for k, v in errs.items()
        }
    }
    for check in CROSSCHECKS.get(name, []):
        try:
            res = check.fn()
            entry.setdefault("crosschecks", {})[check.label] = {"errors": res, "tolerance": check.tolerance}
        except ReferenceUnavailable as e:
            entry.setdefault("crosschecks", {})[check.label] = {"error": str(e)}
        except Exception as e:  # a broken check fails that check, not the whole report
            entry.setdefault("crosschecks", {})[check.label] = {"error": f"{type(e).__name__}: {e}"}
    entry["ok"] = all(v["max_abs"] <= v["tolerance"] for v in entry["modes"].values()) and all(
        "error" not in c and all(e <= c["tolerance"] for e in c["errors"].values())
        for c in entry.get("crosschecks", {}).values()
    )
    return entry


def run_check(args) -> int:
    if args.all == bool(args.mixer):
        raise InputError("give either --mixer NAME ... or --all")
    names = mixer_names() if args.all else args.mixer
    for n in names:
        get_mixer_spec(n)  # unknown names fail before any work, listing the known ones
    load_all_crosschecks()
    report = {}
    # progress on stderr (a line per mixer in a log, the bar on a terminal): stdout keeps the table / JSON
    enabled = not args.quiet
    with Progress("check", len(names), unit="mixers", enabled=enabled, check_load=enabled) as bar:
        for name in names:
            bar.note(name)  # on a terminal, the mixer being checked
            report[name] = check_mixer(name)
            bar.note("")  # in a log, the line below names it
            bar.advance(1, event=f"{name} {'ok' if report[name]['ok'] else 'FAILED'}")
    failed = [name for name, entry in report.items() if not entry["ok"]]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        table = Table(
            title="tokenmix check: float64 max abs error of every mode vs the fast mode; "
            "independent cross-checks: worst error (metric in each label) / tolerance"
        )
        for col in ("mixer", "output", "state", "grad", "continuation", "cross-checks", "ok"):
            table.add_column(col)
        for name, e in report.items():
            worst = {
                q: max([v["max_abs"] for k, v in e["modes"].items() if k.endswith(q)] + [0.0])
                for q in ("output", "state", "grad")
            }
            xc = (
                "\n".join(
                    (f"{lab}: {max(c['errors'].values(), default=0.0):.1e} / {c['tolerance']:.0e}")
                    if "errors" in c
                    else f"{lab}: {c['error']}"
                    for lab, c in e.get("crosschecks", {}).items()
                )
                or "-"
            )
            table.add_row(
                name,
                f"{worst['output']:.1e}",
                f"{worst['state']:.1e}",
                f"{worst['grad']:.1e}",
                f"{e['modes']['continuation.output']['max_abs']:.1e}",
                escape(xc),
                "yes" if e["ok"] else "[red]NO[/]",
            )
        Console(width=160).print(table)
    if failed:
        print(f"check failed for: {', '.join(failed)}")
        return 1
    return 0
