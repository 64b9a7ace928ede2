"""The report is one self-contained HTML page plus Markdown that references only what it ships; the
analyze / report commands turn bad input into one line and exit status 2."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from tokenmix.analysis import report as report_mod
from tokenmix.analysis.accounting import run_accounting
from tokenmix.analysis.expressivity_report import run_expressivity
from tokenmix.analysis.matrices import analyze_registered
from tokenmix.analysis.norms import run_norms
from tokenmix.analysis.outputs import PNG_SIGNATURE, new_figure, save_figure
from tokenmix.cli.main import main
from tokenmix.study import analysis_suite
from tokenmix.study.presets import AnalysisPlan, Preset
from tokenmix.study.presets import base as preset_base

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "source", "wbr"}


pytestmark = pytest.mark.usefixtures("one_thread")


class StrictPage(HTMLParser):
    """Checks nesting of non-void elements and collects every URL-bearing attribute."""

    def __init__(self):
        super().__init__()
        self.stack, self.urls, self.imgs, self.errors, self.tags = [], [], 0, [], set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for k, v in attrs:
            if k in ("src", "href", "data", "action", "poster") and v is not None:
                self.urls.append(v)
        if tag == "img":
            self.imgs += 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> (open: {self.stack[-3:]})")
        else:
            self.stack.pop()


def _check_report(html_path, md_path, expected_images):
    page = StrictPage()
    text = html_path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    page.feed(text)
    page.close()
    assert not page.errors and not page.stack, (page.errors, page.stack)
    assert {"html", "head", "body", "table", "img"} <= page.tags
    assert page.imgs == expected_images
    outside = [u for u in page.urls if not (u.startswith("data:") or u.startswith("#"))]
    assert not outside, f"the page references files it does not ship: {outside[:3]}"
    assert not re.search(r"url\((?!data:)", text)  # no stylesheet references either
    md = md_path.read_text(encoding="utf-8")
    refs = re.findall(r"\]\(([^)]+)\)", md)
    assert len(refs) == expected_images
    for ref in refs:
        shipped = md_path.parent / ref
        assert shipped.is_file() and shipped.read_bytes().startswith(PNG_SIGNATURE), ref
    return text, md


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory holding analyze outputs and compare/bench-like files of other shapes."""
    root = tmp_path_factory.mktemp("run")
    analyze_registered("sq1_ce", 12, _sub(root, "matrix-sq1_ce"), d_model=8, n_heads=2, formats=("png", "svg"))
    run_accounting(
        ["first_order"],
        _sub(root, "cost"),
        cache_ns=(4,),
        time_ns=(16, 32),
        d_model=8,
        n_heads=2,
        repeats=1,
        formats=("png",),
    )
    run_expressivity(_sub(root, "expressivity"), formats=("png",), patterns=("pow2",), mixers=(), ns=(16,))
    run_norms(["pow2"], _sub(root, "norms"), n=12, gram_iters=6, d_model=8, formats=("png",))
    bench = _sub(root, "bench")
    (bench / "solver.json").write_text(
        json.dumps(
            {
                "device": "cpu",
                "results": [
                    {"pattern": "pow2", "n": 1024, "seconds": 0.1},
                    {"pattern": "sq1", "n": 1024, "seconds": 0.2},
                ],
            }
        )
    )
    (root / "results.csv").write_text("mixer,task,accuracy\npow2,copy,0.93\nsq1,copy,0.99\n")
    (root / "notes.md").write_text(
        "# Compare\n\nAccuracy **per task** with `quick` preset.\n\n| a | b |\n|---|---|\n| 1 | <x> |\n"
    )
    fig, axes = new_figure()
    axes[0][0].plot([1, 2], [3, 4])
    save_figure(fig, root, "accuracy_vs_cache", ("png",))
    (root / "blob.bin").write_bytes(b"\x00\x01")
    return root


def _sub(root, name):
    p = root / name
    p.mkdir()
    return p


def test_report_is_self_contained(run_dir, tmp_path):
    res = report_mod.build_report(run_dir, tmp_path / "rep")
    # matrices/dependency/decay + cache/time + expressivity/reach + norms + accuracy_vs_cache; SVGs
    # are skipped where a PNG of the same name exists
    text, md = _check_report(res["html"], res["markdown"], expected_images=9)
    assert res["sections"] == 6
    assert "&lt;x&gt;" in text and "<x>" not in text  # file content is escaped
    assert "<strong>per task</strong>" in text and "<code>quick</code>" in text
    assert "solver.json — results" in text and "0.93" in text  # JSON records and CSV rows as tables
    assert "not included: blob.bin" in text
    assert "| pow2 | — | 16 |" in md  # the analysis Markdown tables are carried over


def test_report_cli_and_default_location(run_dir, capsys):
    assert main(["report", str(run_dir), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "report.html" in out
    _check_report(run_dir / "report" / "report.html", run_dir / "report" / "report.md", expected_images=9)
    # reporting again does not report the report
    assert main(["report", str(run_dir), "--quiet"]) == 0
    assert "report" not in {p.name for p in (run_dir / "report").iterdir() if p.is_dir()}


def test_report_preset_runs_the_analyses(monkeypatch, tmp_path):
    tiny = {
        "matrix": {"mixers": ("pow2", "not_registered"), "n": 10, "d_model": 8, "n_heads": 2},
        "cost": {
            "mixers": ("first_order",),
            "cache_ns": (3,),
            "time_ns": (),
            "d_model": 8,
            "n_heads": 2,
            "repeats": 1,
            "time_budget_s": 5.0,
            "decode_budget_s": 5.0,
        },
        "expressivity": {"ns": (16,)},
        "norms": {"mixers": ("pow2",), "n": 10, "gram_iters": 4, "d_model": 8, "n_heads": 2},
    }
    monkeypatch.setitem(
        preset_base._PRESETS,
        ("analysis", "quick"),
        Preset(name="quick", kind="analysis", summary="tiny", build=lambda: AnalysisPlan(**tiny)),
    )
    res = analysis_suite.report("quick", runs_root=tmp_path)
    assert res["run_dir"].parent == tmp_path and res["run_dir"].name.startswith("report-quick-")
    assert {p.name for p in res["run_dir"].iterdir()} >= {"matrix-pow2", "cost", "expressivity", "norms", "report"}
    _check_report(res["html"], res["markdown"], expected_images=3 + 1 + 2 + 1)


def _fails(argv, capsys, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_bad_input_exits_2(capsys, tmp_path):
    _fails(["report", str(tmp_path / "nothing")], capsys, "no run directory or preset", "quick")
    _fails(["analyze", "matrix", "--mixer", "nope"], capsys, "unknown mixer 'nope'")
    _fails(
        ["analyze", "matrix", "--mixer", "pow2", "--n", "5000"],
        capsys,
        "limit 4096",
        "tokenmix analyze expressivity --n 5000",
    )
    _fails(["analyze", "norms", "--mixers", "pow2", "--n", "5000"], capsys, "limit 4096")
    _fails(["analyze", "cost", "--mixers", "pow2,nope"], capsys, "unknown mixer 'nope'")
    _fails(["analyze", "cost", "--mixers", "pow2", "--clock", "gpu"], capsys, "--clock must be one of cpu, user, wall")
    _fails(["analyze", "cost", "--threads", "0"], capsys, "--threads values must be >= 1")
    _fails(["analyze", "matrix", "--run", str(tmp_path / "gone"), "--text", "hi"], capsys, "does not exist")
    _fails(["analyze", "matrix"], capsys, "--mixer")
    _fails(["analyze", "expressivity", "--patterns", "nope"], capsys, "unknown pattern")
    _fails(["analyze", "expressivity", "--n", "64", "--offset", "64"], capsys, "--offset")
    _fails(["analyze", "matrix", "--mixer", "pow2", "--formats", "gif"], capsys, "gif")
    (tmp_path / "file").write_text("x")
    _fails(["analyze", "matrix", "--mixer", "pow2", "--out", str(tmp_path / "file")], capsys, "not a directory")


def test_analyze_commands_write_outputs(capsys, tmp_path):
    out = tmp_path / "ex"
    assert (
        main(
            [
                "analyze",
                "expressivity",
                "--patterns",
                "pow2,sq1",
                "--mixers",
                "none",
                "--n",
                "64",
                "--json",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert {r["row"] for r in data["summary"]} == {"pow2", "sq1"}
    assert all(r["agrees"] for r in data["summary"])
    assert (out / "expressivity.json").is_file()
    out = tmp_path / "mx"
    assert (
        main(
            [
                "analyze",
                "matrix",
                "--mixer",
                "first_order",
                "--n",
                "12",
                "--d-model",
                "8",
                "--formats",
                "png",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert (out / "matrices.png").read_bytes().startswith(PNG_SIGNATURE) and not (out / "matrices.svg").exists()


def test_sweep_run_folders_and_earlier_reports_are_not_expanded(tmp_path):
    root = tmp_path / "sweep"
    for k in range(report_mod.MAX_CHILD_DIRS + 1):
        run = root / "runs" / f"run{k:02d}"
        run.mkdir(parents=True)
        (run / "result.json").write_text(json.dumps({"accuracy": k / 100}))
    (root / "results.csv").write_text("run,accuracy\nrun00,0.0\n")
    first = report_mod.build_report(root, root / "report")
    second = report_mod.build_report(root, tmp_path / "elsewhere")
    for res in (first, second):
        text = res["html"].read_text()
        assert res["sections"] == 1 and "21 sub-folders of runs/ (one per run; not expanded)" in text
    assert "report/ (an earlier report)" in second["html"].read_text()
