"""Issue 20, durability and processes (items 15-19) and the bad-input parts of items 7, 10, 11 and 13
that belong to `train lm` / `compare`: compare workers die with their parent, one writer per run
folder, a finished run is left alone on --resume, a corrupt latest checkpoint falls back to the
newest valid one, bare preset names never import files from the current directory, and impossible
train settings are refused in one line before anything is written."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lm_helpers import lm_env, one_line_error, run_cli, tokenmix_cmd
from progress_guard import alive, child_pids, run_guarded, wait_for_exit, wait_until
from tokenmix.cli.main import main
from tokenmix.core.lock import LOCK_NAME, folder_lock

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "--preset",
    "tiny",
    "--no-progress",
    "--quiet",
    "--set",
    "train.threads=1",
    "train.tensorboard=false",
    "train.eval_windows=1",
]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _cache_env(cache, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(cache))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache) -> Path:
    """A finished tiny run: 4 steps, checkpoints at 2 and 4 (in this process)."""
    out = tmp_path_factory.mktemp("runs") / "done"
    os.environ["TOKENMIX_CACHE"] = str(cache)
    try:
        rc = main(
            [
                "train",
                "lm",
                *TINY,
                "train.max_steps=4",
                "train.checkpoint_every=2",
                "train.eval_every=2",
                "--out",
                str(out),
            ]
        )
    finally:
        del os.environ["TOKENMIX_CACHE"]
    assert rc == 0
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 4
    return out


def copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


def metric_steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def set_max_steps(run: Path, steps: int) -> None:
    cfg = json.loads((run / "config.json").read_text())
    cfg["train"]["max_steps"] = steps
    (run / "config.json").write_text(json.dumps(cfg))


# ------------------------------------------------------------------------------ 15: workers and signals
SLOW_PRESET = """
from tokenmix.runs.synthetic import SyntheticRunConfig as RunConfig, SyntheticTrainConfig as TrainConfig

TRAIN = TrainConfig(lr=1e-2, steps=1_000_000, batch_size=4, warmup_steps=1, train_examples=16, val_examples=4,
                    test_examples=8, eval_every=1_000_000, early_stop_acc=2.0)


def slow(extra_mixers=()):
    return [RunConfig(label="pow2", task="copy", task_args=dict(vocab_size=6, seq_len=8, copy_len=3, offset=4),
                      seed=s, train=TRAIN, model=dict(d_model=8, n_heads=2, mlp=False, layers=["pow2"]))
            for s in range(4)]
"""


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A suite started in the background (nohup,
    `&` in a script) ignores SIGINT and its children inherit that, so Ctrl-C could not reach them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["KILL", "TERM", "INT"])
def test_compare_workers_die_with_their_parent(tmp_path, sig):
    """Item 15: the sweep's worker processes never outlive `tokenmix compare`, and SIGTERM / SIGINT
    stop it at once (the queued runs are not trained first); the folder's lock goes with it."""
    (tmp_path / "slow.py").write_text(SLOW_PRESET)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        tokenmix_cmd(
            "compare",
            "--preset",
            str(tmp_path / "slow.py"),
            "--out",
            str(out),
            "--workers",
            "2",
            "--no-plots",
            "--no-progress",
        ),
        env=lm_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    try:
        wait_until(lambda: len(list(out.glob("runs/*/config.json"))) >= 2, proc, cpu_seconds=120)
        assert len(list(out.glob("runs/*/config.json"))) == 2, "the two workers did not start"
        kids = child_pids(proc.pid)
        assert len(kids) >= 2
        proc.send_signal(sig)
        # "at once": each process exits before using 10 s of CPU (training the queued runs would)
        left = wait_for_exit([proc.pid, *kids], cpu_seconds=10)
        assert proc.pid not in left, "tokenmix compare did not stop"
        _, err = proc.communicate()
        assert not [k for k in kids if alive(k)], "worker processes outlived tokenmix compare"
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig, (proc.returncode, err)
            assert len(err.strip().splitlines()) == 1, err
            assert not (out / LOCK_NAME).exists()
        assert not (out / "results.json").exists()  # nothing finished, nothing claimed to
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ------------------------------------------------------------------------------ 16: one writer per folder
@contextlib.contextmanager
def lock_held_elsewhere(lock_path: Path, what: str = "train lm"):
    """Another process holding ``lock_path`` the way tokenmix does (flock, its pid and command inside)."""
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(lock_path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        f"os.write(fd, f'{{os.getpid()}} {what}'.encode())\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_second_writer_of_a_folder_is_refused_naming_the_holder(tmp_path, finished_run, capsys):
    """Item 16: `train lm`, `compare` and `data prepare` into a folder another process is writing are
    refused in one line naming its pid, writing nothing; a lock left by a killed holder is no obstacle."""
    run = tmp_path / "run"
    run.mkdir()
    with lock_held_elsewhere(run / LOCK_NAME, "compare") as holder:
        one_line_error(
            run_cli(["train", "lm", *TINY, "train.max_steps=2", "--out", str(run)], capsys),
            "cannot train lm",
            f"in use by process {holder.pid} (`tokenmix compare`)",
        )
        resumed = copy_run(finished_run, tmp_path / "resumed")
        with lock_held_elsewhere(resumed / LOCK_NAME) as other:
            before = snapshot(resumed)
            one_line_error(run_cli(["train", "lm", "--resume", str(resumed)], capsys), f"process {other.pid}")
            assert snapshot(resumed) == before
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # only the (dead) holder's file

    (tmp_path / "tiny.py").write_text(SLOW_PRESET.replace("def slow", "def tiny"))
    out = tmp_path / "compare"
    out.mkdir()
    with lock_held_elsewhere(out / LOCK_NAME) as holder:
        one_line_error(
            run_cli(
                [
                    "compare",
                    "--preset",
                    str(tmp_path / "tiny.py"),
                    "--out",
                    str(out),
                    "--workers",
                    "1",
                    "--no-progress",
                    "--no-plots",
                ],
                capsys,
            ),
            f"process {holder.pid}",
        )
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]

    prep = tmp_path / "prep"
    with lock_held_elsewhere(tmp_path / f".{prep.name}.lock") as holder:
        one_line_error(
            run_cli(["data", "prepare", "--vocab-size", "280", "--out", str(prep)], capsys), f"process {holder.pid}"
        )
    assert not prep.exists()

    # the holder was killed: its lock file is left, but the lock died with it
    with folder_lock(run, "train lm") as path:
        assert path.read_text() == f"{os.getpid()} train lm"
    assert not (run / LOCK_NAME).exists()  # released and removed on exit


# ------------------------------------------------------------------------------ 17: a finished run
def test_resume_of_a_finished_run_says_so_and_touches_nothing(tmp_path, finished_run, capsys):
    """Item 17: --resume on a finished run exits 0 saying it is finished, and writes nothing (no second
    final evaluation record); with the schedule extended in its config it trains the extra steps."""
    run = copy_run(finished_run, tmp_path / "run")
    before = snapshot(run)
    rc, out, err = run_cli(["train", "lm", "--resume", str(run), "--no-progress"], capsys)
    assert rc == 0, err
    assert "finished" in out and "step 4" in out
    assert snapshot(run) == before
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in finished_run.iterdir())

    set_max_steps(run, 6)
    rc, out, err = run_cli(["train", "lm", "--resume", str(run), "--quiet"], capsys)
    assert rc == 0, err
    assert metric_steps(run) == [1, 2, 3, 4, 5, 6]
    finals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r.get("event") == "final"]
    assert [r["step"] for r in finals] == [4, 6]


# ------------------------------------------------------------------------------ 18: corrupt checkpoints
def test_a_corrupt_latest_checkpoint_falls_back_to_the_newest_valid_one(tmp_path, finished_run, capsys):
    """Item 18: eval, generate and resume use the newest checkpoint that verifies and say so; the
    resumed run sets the corrupt one aside and trains from the valid one to the end again."""
    run = copy_run(finished_run, tmp_path / "run")
    (run / "checkpoints" / "step_0000004" / "model.safetensors").write_bytes(b"\0" * 100)
    rc, out, err = run_cli(["eval", "--run", str(run), "--json", "--max-windows", "2"], capsys)
    assert rc == 0, err
    assert json.loads(out)["step"] == 2
    assert "step_0000004" in err and "step_0000002" in err and "newest valid" in err
    rc, out, err = run_cli(["generate", "--run", str(run), "--prompt", "KING.", "--max-new-tokens", "3"], capsys)
    assert rc == 0 and out.startswith("KING.") and "step_0000002" in err

    rc, out, err = run_cli(["train", "lm", "--resume", str(run), "--quiet"], capsys)
    assert rc == 0, err
    assert "step_0000004" in err and "newest valid" in err
    assert metric_steps(run) == [1, 2, 3, 4]  # the steps after 2 were dropped and trained again, once each
    finals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r.get("event") == "final"]
    assert len(finals) == 1 and json.loads((run / "summary.json").read_text())["steps"] == 4
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 4
    assert (run / "checkpoints" / "corrupt-step_0000004").is_dir()
    rc, out, err = run_cli(["eval", "--run", str(run), "--json", "--max-windows", "2"], capsys)
    assert rc == 0 and json.loads(out)["step"] == 4 and "newest valid" not in err

    # no valid checkpoint at all: refused in one line
    for ckpt in (run / "checkpoints").glob("step_*"):
        (ckpt / "meta.json").write_text("{")
    one_line_error(run_cli(["eval", "--run", str(run)], capsys), "no valid checkpoint")


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_resume_restores_a_missing_or_corrupt_tokenizer(tmp_path, finished_run, capsys, damage):
    """Item 18: resume with tokenizer.json missing or unreadable restores it from the run's prepared
    data (and says so); one that belongs to other data is refused."""
    run = copy_run(finished_run, tmp_path / "run")
    original = (run / "tokenizer.json").read_bytes()
    set_max_steps(run, 5)
    if damage == "missing":
        (run / "tokenizer.json").unlink()
    else:
        (run / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    rc, out, err = run_cli(["train", "lm", "--resume", str(run), "--quiet"], capsys)
    assert rc == 0, err
    assert "restored" in err and "tokenizer.json" in err
    assert (run / "tokenizer.json").read_bytes() == original
    assert metric_steps(run) == [1, 2, 3, 4, 5]

    other = json.loads(original)
    other["model"]["vocab"] = {f"x{k}": v for k, v in other["model"]["vocab"].items()}
    other["model"]["merges"] = []
    (run / "tokenizer.json").write_text(json.dumps(other))
    set_max_steps(run, 6)
    before = snapshot(run)
    one_line_error(run_cli(["train", "lm", "--resume", str(run), "--quiet"], capsys), "tokenizer")
    assert snapshot(run) == before


# ------------------------------------------------------------------------------ 19: preset names
def test_a_bare_preset_name_never_imports_a_file_from_the_current_directory(tmp_path):
    """Item 19: `compare --preset foo` with ./experiments/foo.py (or ./foo.py) present is an unknown
    preset; the file is not run. Only a path runs a user's preset file."""
    marker = tmp_path / "ran"
    evil = f"open({str(marker)!r}, 'w').write('imported')\n"
    (tmp_path / "experiments").mkdir()
    for path in (tmp_path / "experiments" / "foo.py", tmp_path / "experiments" / "__init__.py", tmp_path / "foo.py"):
        path.write_text(evil)
    res = run_guarded(
        tokenmix_cmd("compare", "--preset", "foo", "--out", str(tmp_path / "o")),
        cwd=tmp_path,
        env=lm_env(tmp_path / "cache"),
        cpu_seconds=60,
    )
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "unknown preset 'foo'" in res.stderr
    assert not marker.exists() and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------ 11, 13: bad train settings
@pytest.mark.parametrize(
    "setting, words",
    [
        ("train.lr=nan", ["train.lr", "finite"]),
        ("train.lr=inf", ["train.lr", "finite"]),
        ("train.weight_decay=nan", ["train.weight_decay", "finite"]),
        ("train.grad_clip=-inf", ["train.grad_clip", "finite"]),
        ("train.min_lr_ratio=nan", ["train.min_lr_ratio", "finite"]),
        ("train.beta1=nan", ["train.beta1", "finite"]),
        ("train.beta2=1.5", ["train.beta2", "[0, 1)"]),
        ("train.eps=0", ["train.eps", "> 0"]),
        ("train.seed=-1", ["train.seed"]),
        ("model.mixer_overrides.nosuch.x=1", ["unknown mixer 'nosuch'"]),
        ("model.mixer_overrides.attention.chunk_size=4", ["attention", "not in model.layers"]),
        ("model.mixer_overrides.pow2.nosuch=1", ["mixer 'pow2'", "nosuch"]),
    ],
)
def test_impossible_train_settings_are_refused_before_anything_is_written(tmp_path, capsys, setting, words):
    """Items 11 and 13: non-finite, negative or out-of-range numbers and overrides nothing would read
    are one line, exit 2, and no run folder."""
    out = tmp_path / "run"
    one_line_error(run_cli(["train", "lm", *TINY, "train.max_steps=2", setting, "--out", str(out)], capsys), *words)
    assert not out.exists()


def test_empty_layers_and_a_file_as_out_are_refused(tmp_path, capsys):
    """Item 13: --layers "" is an error, not the preset's layers; item 11: --out naming a file."""
    out = tmp_path / "run"
    one_line_error(
        run_cli(["train", "lm", *TINY, "train.max_steps=2", "--layers", "", "--out", str(out)], capsys), "--layers"
    )
    one_line_error(
        run_cli(["train", "lm", *TINY, "train.max_steps=2", "--layers", " , ", "--out", str(out)], capsys), "layer"
    )
    assert not out.exists()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    one_line_error(
        run_cli(["train", "lm", *TINY, "train.max_steps=2", "--out", str(a_file)], capsys), "notes.txt", "not a folder"
    )
    one_line_error(
        run_cli(["train", "lm", *TINY, "train.max_steps=2", "--out", str(a_file / "run")], capsys), "notes.txt"
    )
    assert a_file.read_text() == "mine"


# ------------------------------------------------------------------------------ 7, 10: absurd sizes
SIZES_SCRIPT = """
import contextlib, io, json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a bug that allocates fails, not the machine
from tokenmix.cli.main import main
res = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    t = time.process_time()  # CPU time, which a busy machine does not stretch
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    res.append({"rc": rc, "err": err.getvalue(), "cpu_seconds": time.process_time() - t})
print(json.dumps(res))
"""


def test_absurd_model_sizes_are_refused_up_front_naming_the_memory(tmp_path):
    """Items 7 and 10: a layer count or width that cannot fit in memory is refused at once, in one
    line that gives the size and the memory available, without trying to allocate it."""
    base = ["train", "lm", "--preset", "tiny", "--out", str(tmp_path / "run")]
    cases = [
        base + ["--layers", "pow2*100000000"],
        base + ["--set", "model.d_model=1000000000"],
        base + ["--layers", "pow2*1000000000000000"],
    ]
    res = run_guarded(
        [sys.executable, "-c", SIZES_SCRIPT, json.dumps(cases)],
        env=lm_env(tmp_path / "cache"),
        cpu_seconds=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for case, r in zip(cases, json.loads(res.stdout)):
        lines = r["err"].strip().splitlines()
        assert r["rc"] == 2 and len(lines) == 1, (case, r)
        assert "too large for this machine" in lines[0] and "GiB of memory is available" in lines[0], lines[0]
        assert r["cpu_seconds"] < 5, (case, r)
    assert not (tmp_path / "run").exists()


def test_the_size_limit_is_decided_by_the_memory_available(monkeypatch):
    """Items 7 and 10: the same model is accepted or refused by the memory there is."""
    from tokenmix.core.errors import InputError
    from tokenmix.runs import lm as runs_lm

    overrides = ["model.d_model=4096", "model.layers=pow2*8", "model.n_heads=4"]  # ~1.7e9 parameters
    monkeypatch.setattr(runs_lm, "available_memory", lambda: 1 << 40)
    cfg = runs_lm.apply_overrides(runs_lm.LMRunConfig(), overrides)
    assert len(cfg.model.layers) == 8
    monkeypatch.setattr(runs_lm, "available_memory", lambda: 2 << 30)
    with pytest.raises(InputError, match=r"2\.0 GiB of memory is available"):
        runs_lm.apply_overrides(runs_lm.LMRunConfig(), overrides)
    estimate = runs_lm.estimate_parameters(
        {"d_model": 64, "layers": ("pow2*3", "attention"), "n_heads": 4, "vocab_size": 300}
    )
    from tokenmix.models import MixerModel, ModelConfig

    real = MixerModel(ModelConfig(vocab_size=300, d_model=64, layers=("pow2",) * 3 + ("attention",), n_heads=4))
    assert estimate == real.num_params()
