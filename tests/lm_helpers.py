"""Shared helpers of the language-modelling tests: tiny runs in subprocesses, metrics reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from progress_guard import guarded, run_guarded
from tokenmix.cli.main import main

# every test run: the tiny preset, one thread (deterministic and fast on a shared machine)
TINY = ["train.threads=1", "train.log_every=100", "train.eval_windows=2"]


def lm_env(cache: Path) -> dict:
    env = dict(os.environ)
    env.update({"TOKENMIX_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return env


def tokenmix_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmix", *args]


def run_tokenmix(args: list[str], cache: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command in a fresh process; ``timeout`` is a budget of the command's own CPU seconds."""
    return run_guarded(tokenmix_cmd(*args), env=lm_env(cache), cpu_seconds=timeout)


def step_losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def val_losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return {r["step"]: r["val_loss"] for r in recs if "val_loss" in r}


def within(seconds: float):
    """Fail (instead of hanging the suite) when the block uses more than ``seconds`` of CPU time or sits
    blocked; not a wall-clock limit, so a busy machine does not fail it (progress_guard.py)."""
    return guarded(cpu_seconds=seconds)


# a two-step run that evaluates once: what a test of a run's files needs, fast
SHORT_RUN = (
    "train.max_steps=2",
    "train.eval_every=2",
    "train.eval_windows=1",
    "train.final_eval_windows=1",
    "train.tensorboard=false",
    "train.threads=1",
)


def tiny_lm_argv(
    out: Path, *settings: str, corpus: Path | None = None, log: bool = False, options: tuple[str, ...] = ()
) -> list[str]:
    """The ``train lm --preset tiny`` command line of a run at ``out``: on ``corpus`` (None: the preset's
    data), with its log (``log``; never the progress bar) or ``--quiet``, further ``options`` (such as
    ``--layers``), then ``--set`` ``settings`` (a later setting of a key wins)."""
    corpus_args = ["--corpus", str(corpus)] if corpus is not None else []
    output = ["--no-progress"] if log else ["--quiet", "--no-progress"]
    return ["train", "lm", *corpus_args, "--preset", "tiny", *options, "--out", str(out), *output, "--set", *settings]


def torchrun_tiny_cmd(out: Path, *settings: str) -> list[str]:
    """``tiny_lm_argv`` (``--quiet``) launched by torchrun as two local ranks (gloo on the CPU)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "tokenmix"]
    return [*launcher, *tiny_lm_argv(out, *settings)]


def train_tiny_run(root: Path, main, *overrides: str, name: str = "run") -> Path:
    """A two-step ``tiny`` LM run at root/<name> (its data cache at root/cache), through the CLI's
    ``main`` in this process, with further ``--set`` overrides; returns the run folder."""
    old = os.environ.get("TOKENMIX_CACHE")
    os.environ["TOKENMIX_CACHE"] = str(root / "cache")
    try:
        rc = main(tiny_lm_argv(root / name, *SHORT_RUN, *overrides))
    finally:
        if old is None:
            del os.environ["TOKENMIX_CACHE"]
        else:
            os.environ["TOKENMIX_CACHE"] = old
    assert rc == 0
    return root / name


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """The CLI's ``main`` in this process (no interpreter start-up): (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(result: tuple[int, str, str], *words: str) -> str:
    """Assert a ``run_cli`` result is bad input: exit 2, one stderr line holding every word; the line."""
    rc, _, err = result
    assert rc == 2, (rc, err)
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
