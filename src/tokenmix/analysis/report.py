"""``tokenmix report RUN_DIR_OR_PRESET``: one self-contained HTML page (plus Markdown) from the outputs of
``tokenmix compare``, ``tokenmix bench`` and ``tokenmix analyze``.

A run directory is read recursively, one section per folder: Markdown files are rendered, JSON and CSV
files become tables (a JSON file is skipped when a Markdown file of the same name says the same),
PNG figures are embedded (SVG only when no PNG of the same name exists). In the HTML page every image
is a base64 data URI, so the page references nothing outside itself; the Markdown copy references
only the figures copied next to it (``figures/``).

Only the run directory's own files are read: a symbolic link that leads out of it (to a file or a
folder) is listed, never followed, and every file is read as a regular file of bounded size
(``core.files``: a FIFO is never opened, a JSON file goes through the one guarded reader).

A language-model run of ``tokenmix train lm`` gets its own page instead, written for a person
rather than walked file by file: ``analysis/lm_report.py`` (it uses the helpers of this module).

``tokenmix report PRESET`` first runs an analysis preset (``study/presets/analysis.py``) into a fresh
run directory, then reports it (``study/analysis_suite.py``).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Sequence

from markdown_it import MarkdownIt

from tokenmix.analysis.outputs import fmt_value, markdown_table, plural, prepare_out_dir
from tokenmix.core.errors import InputError, MissingInput
from tokenmix.core.files import inside, read_json, read_regular_bytes, read_text_file

MAX_EMBED_BYTES = 8 * 1024 * 1024  # larger files are listed, not embedded
MAX_TABLE_ROWS = 300
MAX_TEXT_CHARS = 20000
MAX_CHILD_DIRS = 20  # a folder with more sub-folders (a sweep's runs) is not expanded
REPORT_DIR_NAME = "report"
# files only tokenmix writes: a folder holding one of them (or a sub-folder that does, two levels
# down at most) is a run directory; anything else is refused before the report is written into it
RUN_MARKERS = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "sweep.json",
    "results.csv",
    "results.json",
    "result.json",
    "matrix.json",
    "cost.json",
    "expressivity.json",
    "norms.json",
)
MARKER_DEPTH = 2
MARKER_SCAN_FOLDERS = 500  # folders looked at for a marker at most (a home folder is not walked)


# ----------------------------------------------------------------------------- reading artifacts
def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


# CommonMark with GitHub's pipe tables; raw HTML in a Markdown file is shown as text, never passed through
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


def markdown_to_html(md: str, heading_offset: int = 2) -> str:
    """Render Markdown with markdown-it-py; headings move down ``heading_offset`` levels so that a
    file's ``#`` sits below the report's own section headings."""
    tokens = _MARKDOWN.parse(md)
    for tok in tokens:
        if tok.type in ("heading_open", "heading_close"):
            tok.tag = f"h{min(6, int(tok.tag[1]) + heading_offset)}"
    return _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {})


def _flat(v) -> bool:
    return not isinstance(v, (dict, list))


def json_tables(data) -> list[tuple[str, list[dict]]]:
    """Tables a JSON document holds: a list of flat records, a dict's lists of flat records, or scalars."""

    def records(v) -> list[dict] | None:
        if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
            return [{k: (x if _flat(x) else json.dumps(x)[:80]) for k, x in r.items()} for r in v]
        return None

    if (rec := records(data)) is not None:
        return [("", rec)]
    tables: list[tuple[str, list[dict]]] = []
    if isinstance(data, dict):
        scalars = {k: v for k, v in data.items() if _flat(v)}
        if scalars:
            tables.append(("", [{"field": k, "value": v} for k, v in scalars.items()]))
        # an analysis file's "summary" is its table; other lists of records follow
        keys = sorted(data, key=lambda k: k != "summary")
        for k in keys:
            if (rec := records(data[k])) is not None:
                tables.append((k, rec))
            elif isinstance(data[k], dict) and data[k] and all(_flat(v) for v in data[k].values()):
                tables.append((k, [{"field": kk, "value": vv} for kk, vv in data[k].items()]))
    return tables


def csv_table(path: Path, within: Path) -> list[dict]:
    text = read_text_file(path, "CSV file", max_bytes=MAX_EMBED_BYTES, within=within)
    return list(csv.DictReader(io.StringIO(text, newline="")))


def html_table(rows: Sequence[dict]) -> str:
    if not rows:
        return "<p>(empty)</p>"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    shown = rows[:MAX_TABLE_ROWS]
    body = "".join("<tr>" + "".join(f"<td>{_esc(fmt_value(r.get(c)))}</td>" for c in cols) + "</tr>" for r in shown)
    more = f"<p>({len(rows) - len(shown)} more rows not shown)</p>" if len(rows) > len(shown) else ""
    return (
        "<table><thead><tr>"
        + "".join(f"<th>{_esc(c)}</th>" for c in cols)
        + "</tr></thead><tbody>"
        + body
        + "</tbody></table>"
        + more
    )


_ORDER = {".md": 0, ".json": 1, ".csv": 2, ".txt": 3, ".png": 4, ".svg": 5}


def _leaves(path: Path, root: Path) -> bool:
    """Whether ``path`` is a symbolic link that leads out of the folder ``root`` (never followed)."""
    return path.is_symlink() and not inside(path, root)


def _section_files(folder: Path, root: Path) -> list[Path]:
    """Files of one folder: text first (Markdown, JSON, CSV), then figures, each by name; links out of
    ``root`` and anything but regular files left out."""
    files = [
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".tmp") and not _leaves(p, root)
    ]
    return sorted(files, key=lambda p: (_ORDER.get(p.suffix.lower(), 9), p.name))


def _is_bench_json(path: Path, root: Path) -> bool:
    """A JSON file written by ``tokenmix bench`` (its top-level object names the benchmark); a link
    out of ``root`` is not read (``read_json`` refuses it)."""
    try:
        data = read_json(path, "JSON file", max_bytes=MAX_EMBED_BYTES, within=root)
    except InputError:
        return False
    return isinstance(data, dict) and isinstance(data.get("benchmark"), str)


def _child_dirs(folder: Path) -> list[Path]:
    """Sub-folders of ``folder`` that are real folders: symbolic links are never followed (a link to
    a parent would make the walk endless), hidden folders are skipped."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if not p.name.startswith(".") and not p.is_symlink() and p.is_dir())


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds tokenmix output: one of ``RUN_MARKERS`` or a bench JSON in it or in its
    sub-folders up to ``MARKER_DEPTH`` levels down (symbolic links not followed)."""
    level, seen = [Path(path)], 0
    for depth in range(MARKER_DEPTH + 1):
        nxt: list[Path] = []
        for folder in level:
            seen += 1
            if seen > MARKER_SCAN_FOLDERS:
                return False
            if any((folder / m).is_file() and not _leaves(folder / m, path) for m in RUN_MARKERS):
                return True
            try:
                if any(p.suffix == ".json" and _is_bench_json(p, path) for p in folder.iterdir() if p.is_file()):
                    return True
            except OSError:
                continue
            if depth < MARKER_DEPTH:
                nxt += _child_dirs(folder)
        level = nxt
    return False


def check_report_out(out_dir: str | Path, run_dir: str | Path) -> None:
    """Refuse (InputError) an ``--out`` that would write into another run, before anything is written:
    a symbolic link (where it leads is not the report's to decide: another run, say), or a folder in
    or inside a folder holding tokenmix output (one of ``RUN_MARKERS``) other than ``run_dir``."""
    out = Path(out_dir)
    if out.is_symlink():
        raise InputError(
            f"--out '{out}' is a symbolic link (to '{os.readlink(out)}'); give a folder of its own, "
            "so that the report cannot write into another run"
        )
    own = Path(run_dir).resolve()
    target = out.resolve()
    for folder in [target, *target.parents]:
        if folder == own:
            return  # inside the reported run (its report/ folder, say)
        if any((folder / m).is_file() for m in RUN_MARKERS):
            where = "is" if folder == target else "is inside"
            raise InputError(
                f"--out '{out}' {where} the run folder '{folder}', another run than '{run_dir}'; give a folder "
                "of its own (or no --out: the report goes into the run's report/ folder)"
            )


def check_run_dir(run_dir: Path, hint: str = "") -> None:
    """Refuse (InputError) a path that is not a run directory, before anything is written; ``hint``
    ends the message (e.g. the presets the caller also takes)."""
    if not run_dir.exists():
        raise MissingInput(f"run directory '{run_dir}' does not exist")
    if not run_dir.is_dir():
        raise MissingInput(f"'{run_dir}' is not a run directory (it is a file, not a folder)")
    if not is_run_dir(run_dir):
        raise InputError(
            f"'{run_dir}' is not a tokenmix run directory: none of {', '.join(RUN_MARKERS[:6])}, ... "
            f"(files tokenmix writes) is in it or in its sub-folders {MARKER_DEPTH} levels down{hint}"
        )


def collect_sections(run_dir: Path, exclude: Path | None = None) -> tuple[list[tuple[Path, list[Path]]], list[str]]:
    """(folder, its files) for run_dir and its sub-folders with files, and notes on what was left out.

    Skipped: ``exclude`` (the report being written), earlier reports (folders holding report.html),
    hidden folders, symbolic links to folders (never followed: a link to a parent would loop) and to
    files outside ``run_dir`` (a run folder never lends another folder's files), and the children of
    a folder with more than ``MAX_CHILD_DIRS`` sub-folders (one folder per run of a
    sweep: their results are in the sweep's own summary files).
    """
    sections, notes = [], []
    queue = [run_dir]
    while queue:
        folder = queue.pop(0)
        if exclude is not None and folder.resolve() == exclude:
            continue
        if folder != run_dir and (folder / "report.html").is_file():
            notes.append(f"{folder.relative_to(run_dir)}/ (an earlier report)")
            continue
        files = _section_files(folder, run_dir)
        if files:
            sections.append((folder, files))
        links = sorted(
            p
            for p in folder.iterdir()
            if p.is_symlink() and not p.name.startswith(".") and (not p.is_file() or _leaves(p, run_dir))
        )
        if links:
            notes.append(f"{', '.join(str(p.relative_to(run_dir)) for p in links)} (symbolic links, not followed)")
        children = _child_dirs(folder)
        if len(children) > MAX_CHILD_DIRS:
            notes.append(f"{len(children)} sub-folders of {folder.relative_to(run_dir)}/ (one per run; not expanded)")
        else:
            queue[:0] = children  # depth first, in name order
    return sections, notes


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
color:#222;line-height:1.45;padding:0 1em}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f1f1f1}tr:nth-child(even) td{background:#fafafa}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.8em}
code{background:#f1f1f1;padding:0 .2em}.muted{color:#777;font-size:.85em}
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}
"""


def image_uri(path: Path, data: bytes | None = None) -> str:
    """A figure (``data``: its bytes, else read from ``path``) as a base64 data URI, so the HTML page
    references nothing outside itself."""
    mime = "image/png" if path.suffix.lower() == ".png" else "image/svg+xml"
    data = data if data is not None else read_regular_bytes(path, "figure", max_bytes=MAX_EMBED_BYTES)
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def figure_html(path: Path, caption: str, data: bytes | None = None) -> str:
    return (
        f'<figure><img src="{image_uri(path, data)}" alt="{_esc(path.name)}">'
        f"<figcaption>{_esc(caption)}</figcaption></figure>"
    )


def html_page(title: str, body: str) -> str:
    """The one HTML page frame of reports: title, the report CSS, ``body``."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _section(
    k: int, folder: Path, files: list[Path], run_dir: Path, fig_dir: Path, n_figures: int
) -> tuple[str, list[str], list[str], int]:
    """Section k of the report, one folder of the run: (its table-of-contents entry, its HTML parts, its
    Markdown lines, the figures shipped so far, counting this section's)."""
    rel = folder.relative_to(run_dir)
    name = str(rel) if str(rel) != "." else run_dir.resolve().name
    anchor = f"s{k}"
    h = [f'<h2 id="{anchor}">{_esc(name)}</h2>']
    m = [f"## {name}", ""]
    md_stems = {p.stem for p in files if p.suffix.lower() == ".md"}
    png_stems = {p.stem for p in files if p.suffix.lower() == ".png"}
    skipped: list[str] = []
    for p in files:
        suffix = p.suffix.lower()
        size = p.stat().st_size
        if size > MAX_EMBED_BYTES:
            skipped.append(f"{p.name} ({size} bytes, too large)")
            continue
        if suffix in (".md", ".txt", ".png", ".svg"):
            try:  # a regular file of the run folder, read once (it may have changed since the listing)
                raw = read_regular_bytes(p, "file", max_bytes=MAX_EMBED_BYTES, within=run_dir)
            except InputError:
                skipped.append(f"{p.name} (unreadable)")
                continue
            text = raw.decode("utf-8", errors="replace")
        if suffix == ".md":
            h.append(markdown_to_html(text))
            m += [re.sub(r"^(#{1,4}) ", r"#\1# ", ln) if ln.startswith("#") else ln for ln in text.splitlines()]
            m.append("")
        elif suffix == ".json" and p.stem not in md_stems:
            try:
                data = read_json(p, "JSON file", max_bytes=MAX_EMBED_BYTES, within=run_dir)
            except InputError:
                skipped.append(f"{p.name} (not valid JSON)")
                continue
            tables = json_tables(data)
            if not tables:
                text = json.dumps(data, indent=1)[:MAX_TEXT_CHARS]
                h.append(f"<h3>{_esc(p.name)}</h3><pre>{_esc(text)}</pre>")
                m += [f"### {p.name}", "", "```", text, "```", ""]
            for tname, rows in tables:
                label = p.name + (f" — {tname}" if tname else "")
                h.append(f"<h3>{_esc(label)}</h3>" + html_table(rows))
                m += [f"### {label}", "", markdown_table(rows[:MAX_TABLE_ROWS]), ""]
        elif suffix == ".csv":
            try:
                rows = csv_table(p, within=run_dir)
            except (csv.Error, InputError):
                skipped.append(f"{p.name} (not valid CSV)")
                continue
            h.append(f"<h3>{_esc(p.name)}</h3>" + html_table(rows))
            m += [f"### {p.name}", "", markdown_table(rows[:MAX_TABLE_ROWS]), ""]
        elif suffix in (".png", ".svg") and not (suffix == ".svg" and p.stem in png_stems):
            h.append(figure_html(p, p.name, raw))
            n_figures += 1
            prefix = "" if str(rel) == "." else re.sub(r"[^A-Za-z0-9_.-]", "_", str(rel)) + "-"
            shipped = fig_dir / f"{n_figures:03d}-{prefix}{p.name}"
            shipped.write_bytes(raw)
            m += [f"![{p.name}](figures/{shipped.name})", ""]
        elif suffix == ".txt":
            text = text[:MAX_TEXT_CHARS]
            h.append(f"<h3>{_esc(p.name)}</h3><pre>{_esc(text)}</pre>")
            m += [f"### {p.name}", "", "```", text, "```", ""]
        elif not (suffix == ".svg" or (suffix == ".json" and p.stem in md_stems)):
            skipped.append(p.name)
    if skipped:
        h.append(f'<p class="muted">not included: {_esc(", ".join(skipped))}</p>')
        m += [f"_not included: {', '.join(skipped)}_", ""]
    return f'<li><a href="#{anchor}">{_esc(name)}</a></li>', h, m, n_figures


def build_report(run_dir: str | Path, out_dir: str | Path | None = None, title: str | None = None) -> dict:
    """Write report.html (self-contained) and report.md (+ figures/) for ``run_dir``; returns the paths."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / REPORT_DIR_NAME
    check_report_out(out, run_dir)
    out = prepare_out_dir(out, "report")
    fig_dir = out / "figures"
    if fig_dir.exists():
        shutil.rmtree(fig_dir)
    fig_dir.mkdir()
    sections, left_out = collect_sections(run_dir, exclude=out.resolve())
    title = title or f"tokenmix report: {run_dir.resolve().name}"
    html_parts: list[str] = []
    md_parts: list[str] = [
        f"# {title}",
        "",
        f"Source: `{run_dir}` — generated {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
    ]
    toc: list[str] = []
    n_figures = 0
    for k, (folder, files) in enumerate(sections):
        toc_entry, h, m, n_figures = _section(k, folder, files, run_dir, fig_dir, n_figures)
        toc.append(toc_entry)
        html_parts.append("\n".join(h))
        md_parts += m
    if not sections:
        html_parts.append("<p>The run directory holds no files to report.</p>")
        md_parts.append("The run directory holds no files to report.")
    if left_out:
        html_parts.append(f'<p class="muted">Folders not included: {_esc("; ".join(left_out))}</p>')
        md_parts += ["", f"_Folders not included: {'; '.join(left_out)}_"]
    page = html_page(
        title,
        f'<h1>{_esc(title)}</h1><p class="muted">Source: <code>{_esc(run_dir)}</code> — generated '
        f"{_esc(time.strftime('%Y-%m-%d %H:%M:%S'))}; {plural(len(sections), 'section')}, "
        f"{plural(n_figures, 'figure')} "
        "(embedded).</p>\n<nav><ul>" + "".join(toc) + "</ul></nav>\n" + "\n".join(html_parts),
    )
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(page, encoding="utf-8")
    md_path.write_text("\n".join(md_parts) + "\n", encoding="utf-8")
    return {"html": html_path, "markdown": md_path, "figures": n_figures, "sections": len(sections)}
