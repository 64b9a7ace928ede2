"""What reports and progress lines write and print: ``report <preset> --out X`` writes nothing
outside X; counts read as English ("1 section"); one seed shows no "± 0.0"; a stopped job prints no
``-- done`` line."""

from __future__ import annotations

from fractions import Fraction

import pytest

from lm_helpers import run_cli
from tokenmix.analysis.design import DesignRequest, explore, table_rows
from tokenmix.analysis.design_space import DesignSpace
from tokenmix.analysis.outputs import plural
from tokenmix.core.errors import InputError
from tokenmix.study import analysis_suite

pytestmark = pytest.mark.usefixtures("one_thread")


def test_report_of_a_preset_with_out_writes_only_there(tmp_path, monkeypatch, capsys):
    def tiny_plan(plan, run_dir, progress=None):  # the preset's analyses, shrunk to one file
        (run_dir / "notes.md").write_text("# one analysis\n")
        (run_dir / "results.json").write_text("{}")

    monkeypatch.setattr(analysis_suite, "run_analysis_plan", tiny_plan)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    rc, out, err = run_cli(["report", "quick", "--out", str(tmp_path / "X")], capsys)
    assert rc == 0, err
    assert list(cwd.iterdir()) == []  # no runs/report-quick-<time> beside the user
    runs = [p for p in (tmp_path / "X").iterdir() if p.name.startswith("report-quick-")]
    assert len(runs) == 1 and (runs[0] / "notes.md").is_file()
    assert (tmp_path / "X" / "report.html").is_file()
    assert "(1 section, 0 figures)" in out


def test_plural():
    assert [plural(n, "section") for n in (0, 1, 2)] == ["0 sections", "1 section", "2 sections"]


@pytest.mark.parametrize("seeds, spread", [((0,), False), ((0, 1), True)])
def test_one_seed_shows_no_spread(seeds, spread):
    space = DesignSpace(bases=(Fraction(2),), powers=(2,), mix_windows=(), mix_bases=(), windows=(4,))
    res = explore(DesignRequest(n=32, space=space, route_front=False))
    res.rows[0].accuracy, res.rows[0].accuracy_std = 0.5, 0.0
    res.training = {"task": "copy", "seeds": list(seeds)}
    cells = [row["copy acc %"] for row in table_rows(res, [res.rows[0]])]
    assert cells == ["50.0 ± 0.0"] if spread else cells == ["50.0"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, InputError], ids=["ctrl-c", "bad input"])
def test_a_job_stopped_midway_prints_no_done_line(stop):
    """``compare`` stopped by Ctrl-C, ``bench packed`` or ``data prepare`` stopped by bad input: the log
    says nothing more (the CLI's one line follows), never ``-- done``; a finished job still says done."""
    import io

    from tokenmix.core.progress import Progress

    log = io.StringIO()
    with pytest.raises(stop):
        with Progress("compare", 3, unit="runs", stream=log) as bar:
            bar.advance(1)
            raise stop("stopped")
    assert "done" not in log.getvalue() and "started" in log.getvalue()
    log = io.StringIO()
    with Progress("compare", 1, unit="runs", stream=log) as bar:
        bar.advance(1)
    assert log.getvalue().rstrip().endswith("-- done")
