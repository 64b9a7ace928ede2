"""Hostile input and faults: files that are not what they claim, runs that meet other runs, and
processes that die; the bad-input table (tests/cli/test_bad_input_table.py) holds the one-line refusals.

Untrusted files: the one guarded JSON reader (size, regular files, depth, big integers) and the report
reading such JSON; FIFOs and devices never opened (a tokenizer.json that is a device too); the report
never follows a link out of the run folder; unreadable safetensors with matching checksums; an empty
JSONL corpus; a failing preset file. Run folders: latest.json of another shape; an output location
checked before the work; a hand-edited config.json's ranges; a run reads only its own checkpoints;
stale checkpoint temporaries cleaned at the next start, under the run lock. Processes: DDP ranks die
with their launcher. Smaller inputs: an empty ``eval --text``, ``bench hf`` with a huge prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from lm_helpers import TINY, lm_env, one_line_error, run_cli, torchrun_tiny_cmd, train_tiny_run, within
from progress_guard import alive, child_pids, wait_for_exit, wait_until
from tokenmix.cli.main import main
from tokenmix.core.errors import InputError, MissingInput

pytestmark = pytest.mark.usefixtures("one_thread")

DEEP = "[" * 100000 + "]" * 100000


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("first_hour")


@pytest.fixture(autouse=True)
def _cache_env(root, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(root / "cache"))


@pytest.fixture(scope="module")
def run(root) -> Path:
    """A finished two-step tiny run with a checkpoint after each step (step_0000001, step_0000002)."""
    return train_tiny_run(root, main, "train.checkpoint_every=1", "train.keep_checkpoints=3")


def copy_run(run: Path, dest: Path) -> Path:
    return Path(shutil.copytree(run, dest))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------ 10, 14: the guarded reader
def test_the_json_reader_refuses_in_one_line_what_json_loads_cannot_take(tmp_path):
    from tokenmix.core.files import MAX_JSON_DEPTH, parse_json, read_json

    cases = {
        "deep.json": (DEEP, "levels deep"),
        "bigint.json": ('{"a": -' + "9" * 5000 + "}", "digits"),
        "latin1.json": (b'{"a": "caf\xe9"}', "not UTF-8"),
        "broken.json": ("{not json", "not valid JSON"),
    }
    for name, (content, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(InputError, match=words) as info:
            read_json(path, "some file")
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "big.json").write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(InputError, match="read at most"):
        read_json(tmp_path / "big.json", "some file", max_bytes=100)
    with pytest.raises(MissingInput, match="does not exist"):
        read_json(tmp_path / "none.json", "some file")
    with pytest.raises(InputError, match="is a folder"):
        read_json(tmp_path, "some file")
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(nested, "text") is not None and parse_json('{"a": "[[[[\\"]]"}', "text") == {"a": '[[[["]]'}


def test_fifos_and_devices_are_refused_without_being_opened(tmp_path):
    from tokenmix.core.files import read_json, read_text_file

    os.mkfifo(tmp_path / "pipe")
    os.symlink("pipe", tmp_path / "config.json")
    with within(10):
        for path in (tmp_path / "pipe", tmp_path / "config.json"):
            with pytest.raises(InputError, match="FIFO"):
                read_json(path, "run config")
        with pytest.raises(InputError, match="character device"):
            read_text_file("/dev/zero", "text")


def test_the_report_skips_json_nested_too_deep_or_with_huge_integers(tmp_path, capsys):
    """Item 10: the generic report met such files with a RecursionError or ValueError traceback."""
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "cost.json").write_text(DEEP)
    (folder / "results.json").write_text('{"n": 1' + "0" * 5000 + "}")
    (folder / "bench.json").write_text('{"benchmark": "x", "deep": ' + DEEP + "}")
    (folder / "matrix.json").write_text(json.dumps({"summary": [{"mixer": "pow2", "cache": 11}]}))
    rc, out, err = run_cli(["report", str(folder), "--out", str(tmp_path / "page"), "--quiet"], capsys)
    assert rc == 0, err
    page = (tmp_path / "page" / "report.html").read_text()
    assert "cost.json (not valid JSON)" in page and "results.json (not valid JSON)" in page and "pow2" in page


# ------------------------------------------------------------------------------ 11: latest.json's shape
@pytest.mark.parametrize(
    "record",
    [
        "[1, 2]",
        '"step_0000002"',
        '{"checkpoint": 5}',
        '{"checkpoint": "step_0000002", "step": "2", "meta_sha256": "00"}',
        '{"checkpoint": "step_0000002", "step": true, "meta_sha256": "00"}',
    ],
    ids=["list", "string", "number", "step-text", "step-bool"],
)
def test_latest_json_of_another_shape_is_a_corrupt_record(run, tmp_path, capsys, record):
    """generate, eval and --resume said AttributeError: 'list' object has no attribute 'get'; a
    record of the wrong shape is corrupt, and the newest checkpoint that verifies is used."""
    r = copy_run(run, tmp_path / "run")
    (r / "checkpoints" / "latest.json").write_text(record)
    rc, out, err = run_cli(["eval", "--run", str(r), "--json", "--max-windows", "1"], capsys)
    assert rc == 0, err
    assert json.loads(out)["step"] == 2 and "latest.json is corrupt" in err
    rc, out, err = run_cli(["generate", "--run", str(r), "--prompt", "KING", "--max-new-tokens", "2"], capsys)
    assert rc == 0 and "latest.json is corrupt" in err, err
    rc, out, err = run_cli(["train", "lm", "--resume", str(r), "--quiet", "--set", "train.max_steps=3"], capsys)
    assert rc == 0, err
    assert json.loads((r / "checkpoints" / "latest.json").read_text())["step"] == 3


# ------------------------------------------------------------------------------ 12: output locations
def test_check_output_dir_creates_nothing_and_names_what_is_in_the_way(tmp_path):
    from tokenmix.core.files import check_output_dir

    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    before = sorted(p.name for p in tmp_path.iterdir())
    for path, words in (
        (tmp_path / "file" / "out", "is not a directory"),
        (tmp_path / "file", "is not a directory"),
        (tmp_path / "dangling", "does not exist"),
        (tmp_path / "dangling" / "out", "does not exist"),
        (Path("/proc/tokenmix-out/x"), "/proc"),
    ):
        with pytest.raises(InputError, match=words):
            check_output_dir(path)
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_data_prepare_checks_its_folder_before_reading_the_corpus(tmp_path, capsys, monkeypatch):
    import tokenmix.data.prepare as prepare

    def never(*args, **kwargs):
        raise AssertionError("the corpus was read before the output folder was checked")

    monkeypatch.setattr(prepare, "load_corpus", never)
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for out in (tmp_path / "file" / "data", tmp_path / "dangling", Path("/proc/tokenmix-data")):
        one_line_error(run_cli(["data", "prepare", "--out", str(out)], capsys), "cannot write to data folder")


# ------------------------------------------------------------------------------ 13: config ranges
def test_a_hand_edited_config_json_is_refused_on_its_ranges(run, tmp_path, capsys):
    r = copy_run(run, tmp_path / "run")
    cfg = json.loads((r / "config.json").read_text())
    cfg["model"].update(positions="learned", max_seq_len=8)  # below train.seq_len
    (r / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli(["eval", "--run", str(r)], capsys), "train.seq_len", "model.max_seq_len=8")
    cfg["model"]["max_seq_len"] = 0
    (r / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli(["generate", "--run", str(r), "--prompt", "a"], capsys), "model.max_seq_len must be >= 1")


# ------------------------------------------------------------------------------ 16: other runs' checkpoints
def test_a_run_never_evaluates_another_runs_checkpoint(run, root, tmp_path, capsys):
    """latest.json naming ../../<other run>/checkpoints/... with the matching checksum, or a step_*
    folder linked to another run's, is refused; the run's own newest valid checkpoint is used."""
    other = train_tiny_run(root, main, "train.seed=7", name="other")
    r = copy_run(run, tmp_path / "run")
    meta = other / "checkpoints" / "step_0000002" / "meta.json"
    (r / "checkpoints" / "latest.json").write_text(
        json.dumps(
            {
                "checkpoint": f"../{os.path.relpath(other, r)}/checkpoints/step_0000002",
                "step": 2,
                "meta_sha256": sha256(meta),
            }
        )
    )
    rc, out, err = run_cli(["eval", "--run", str(r), "--json", "--max-windows", "1"], capsys)
    assert rc == 0, err
    used = Path(json.loads(out)["checkpoint"]).resolve()
    assert used.is_relative_to(r.resolve()) and "latest.json is corrupt" in err

    r = copy_run(run, tmp_path / "linked")
    shutil.rmtree(r / "checkpoints" / "step_0000002")
    os.symlink(other / "checkpoints" / "step_0000002", r / "checkpoints" / "step_0000002")
    (r / "checkpoints" / "latest.json").write_text(
        json.dumps({"checkpoint": "step_0000002", "step": 2, "meta_sha256": sha256(meta)})
    )
    rc, out, err = run_cli(["eval", "--run", str(r), "--json", "--max-windows", "1"], capsys)
    assert rc == 0, err
    assert json.loads(out)["step"] == 1 and "symbolic link out of the run folder" in err


# ------------------------------------------------------------------------------ 17: report and links
def test_the_report_never_follows_a_file_link_out_of_the_run_folder(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("THE-SECRET-CONTENT\n")
    folder = tmp_path / "results"
    (folder / "sub").mkdir(parents=True)
    (folder / "matrix.json").write_text(json.dumps({"summary": [{"mixer": "pow2"}]}))
    (folder / "own.txt").write_text("my own notes\n")
    os.symlink(secret, folder / "notes.txt")
    os.symlink(secret, folder / "sub" / "more.md")
    os.symlink(secret, folder / "sub" / "table.csv")
    os.symlink("own.txt", folder / "alias.txt")  # a link inside the folder is the folder's own file
    rc, out, err = run_cli(["report", str(folder), "--out", str(tmp_path / "page"), "--quiet"], capsys)
    assert rc == 0, err
    for name in ("report.html", "report.md"):
        text = (tmp_path / "page" / name).read_text()
        assert "THE-SECRET-CONTENT" not in text and "my own notes" in text
    assert "notes.txt" in (tmp_path / "page" / "report.html").read_text()  # listed as not followed


# ------------------------------------------------------------------------------ 18: stale temporaries
def test_stale_checkpoint_temporaries_are_removed_at_the_next_start(run, tmp_path, capsys):
    r = copy_run(run, tmp_path / "run")
    ckpts = r / "checkpoints"
    (ckpts / ".step_0000003.k2j4h5g6.tmp").mkdir()
    (ckpts / ".step_0000003.k2j4h5g6.tmp" / "model.safetensors").write_bytes(b"half")
    (ckpts / ".latest.json.a1b2c3d4.tmp").write_text("{")
    (r / ".metrics.jsonl.zz00yy11.tmp").write_text("{")
    (ckpts / "notes.tmp").write_text("not a temporary of tokenmix")
    rc, out, err = run_cli(["train", "lm", "--resume", str(r), "--quiet", "--set", "train.max_steps=3"], capsys)
    assert rc == 0, err
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "latest.json",
        "notes.tmp",
        "step_0000001",
        "step_0000002",
        "step_0000003",
    ]
    assert not list(r.glob(".*.tmp"))


def test_temporaries_are_only_removed_under_the_run_lock(run, tmp_path):
    from tokenmix.core.lock import folder_lock
    from tokenmix.runs.checkpoint import remove_stale_temporaries

    r = copy_run(run, tmp_path / "run")
    (r / "checkpoints" / ".step_0000009.abcdefgh.tmp").mkdir()
    with pytest.raises(RuntimeError, match="needs the lock"):
        remove_stale_temporaries(r / "checkpoints")
    assert (r / "checkpoints" / ".step_0000009.abcdefgh.tmp").is_dir()
    with folder_lock(r, "test"):
        assert len(remove_stale_temporaries(r / "checkpoints")) == 1
    assert not (r / "checkpoints" / ".step_0000009.abcdefgh.tmp").exists()


# ------------------------------------------------------------------------------ 19: ranks and launcher
def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_ddp_ranks_stop_when_their_torchrun_launcher_is_killed(root, tmp_path):
    """torchrun starts each rank in its own session: SIGKILL to the launcher reached no rank, and the
    two gloo ranks trained on. Each rank now ends with its launcher."""
    out = tmp_path / "ddp"
    cmd = torchrun_tiny_cmd(
        out,
        *TINY,
        "train.max_steps=1000000",
        "train.checkpoint_every=0",
        "train.eval_every=1000000",
        "train.tensorboard=false",
        "train.parallel=ddp",
        "train.device=cpu",
    )
    log = open(tmp_path / "torchrun.log", "w")
    launcher = subprocess.Popen(
        cmd, env=lm_env(root / "cache"), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    ranks: list[int] = []
    try:
        metrics = out / "metrics.jsonl"
        wait_until(  # both ranks in the training loop
            lambda: metrics.exists() and any('"loss"' in line for line in metrics.read_text().splitlines()),
            launcher,
            cpu_seconds=480,
        )
        ranks = [p for p in child_pids(launcher.pid) if alive(p) and b"tokenmix" in _cmdline(p)]
        assert launcher.poll() is None and len(ranks) == 2, (tmp_path / "torchrun.log").read_text()[-3000:]
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        wait_for_exit(ranks)  # a rank still training uses CPU and is judged not exiting
        assert not [p for p in ranks if alive(p)], "ranks outlived their killed launcher"
    finally:
        for pid in [launcher.pid, *ranks]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()
        log.close()


# ------------------------------------------------------------------------------ 20: the smaller ones
def test_eval_with_an_empty_text_does_not_read_the_working_directory(run, tmp_path, capsys, monkeypatch):
    (tmp_path / "private.txt").write_text("a private letter in the working directory\n" * 200)
    monkeypatch.chdir(tmp_path)
    one_line_error(run_cli(["eval", "--run", str(run), "--text", ""], capsys), "--text is empty")
    one_line_error(run_cli(["eval", "--run", str(run), "--text", "  "], capsys), "--text is empty")


def test_bench_hf_names_a_huge_prompt(capsys):
    pytest.importorskip("transformers")
    line = one_line_error(run_cli(["bench", "hf", "--prompt", "1000000000000"], capsys), "--prompt")
    assert "--new-tokens" not in line


def test_a_tokenizer_that_is_a_device_is_called_so(run, tmp_path, capsys):
    r = copy_run(run, tmp_path / "run")
    (r / "tokenizer.json").unlink()
    os.symlink("/dev/zero", r / "tokenizer.json")
    line = one_line_error(
        run_cli(["generate", "--run", str(r), "--prompt", "a"], capsys), "tokenizer.json", "character device"
    )
    assert "does not exist" not in line


def test_an_empty_record_file_is_an_empty_corpus(tmp_path, capsys):
    for name in ("empty.jsonl", "blank.jsonl", "empty.csv"):
        (tmp_path / name).write_text("" if name.startswith("empty") else "\n \n")
        line = one_line_error(
            run_cli(
                ["data", "prepare", "--corpus", str(tmp_path / name), "--out", str(tmp_path / f"prep-{name}")], capsys
            ),
            "empty",
        )
        assert "StopIteration" not in line and not (tmp_path / f"prep-{name}").exists()


def test_unreadable_safetensors_with_matching_checksums_fall_back(run, tmp_path, capsys):
    """The newest checkpoint verifies by its checksums but its weights do not read: the previous
    checkpoint is used (with a warning), as for any other damage."""
    r = copy_run(run, tmp_path / "run")
    ckpt = r / "checkpoints" / "step_0000002"
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"]["model.safetensors"] = sha256(ckpt / "model.safetensors")
    (ckpt / "meta.json").write_text(json.dumps(meta))
    latest = json.loads((r / "checkpoints" / "latest.json").read_text())
    (r / "checkpoints" / "latest.json").write_text(json.dumps({**latest, "meta_sha256": sha256(ckpt / "meta.json")}))
    rc, out, err = run_cli(["eval", "--run", str(r), "--json", "--max-windows", "1"], capsys)
    assert rc == 0, err
    assert json.loads(out)["step"] == 1 and "model.safetensors is unreadable" in err and "step_0000001" in err


def test_a_failing_preset_file_is_one_line_with_its_file_and_line(tmp_path, capsys):
    loading = tmp_path / "loading.py"
    loading.write_text('"""Fails while loading."""\nx = 1\nraise ValueError("no such setting: depth")\n')
    building = tmp_path / "building.py"
    building.write_text('"""Fails in its function."""\n\n\ndef building(extra_mixers=()):\n    return [None][3]\n')
    syntax = tmp_path / "syntax.py"
    syntax.write_text('"""Not Python."""\ndef syntax(:\n')
    for path, words in (
        (loading, ("line 3", "ValueError: no such setting: depth")),
        (building, ("line 5", "building()", "IndexError")),
        (syntax, ("line 2", "SyntaxError")),
    ):
        one_line_error(
            run_cli(["compare", "--preset", str(path), "--out", str(tmp_path / "o")], capsys), str(path), *words
        )
    assert not (tmp_path / "o").exists()
