"""LM training end to end, in subprocesses as a user runs it: exact resume after SIGKILL,
torchrun (DDP and FSDP) against one process, checkpoint damage refused without losing the last good one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lm_helpers import TINY, lm_env, run_tokenmix, step_losses, tokenmix_cmd, torchrun_tiny_cmd, val_losses
from progress_guard import NoProgress, TreeSampler, Watch, run_guarded

# one trajectory, shared by the resume and the distributed checks
TRAJECTORY = TINY + ["train.max_steps=40", "train.checkpoint_every=10", "train.eval_every=20"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lm_cache")


@pytest.fixture(scope="module")
def reference_run(cache, tmp_path_factory) -> Path:
    """An uninterrupted single-process run."""
    out = tmp_path_factory.mktemp("runs") / "reference"
    proc = run_tokenmix(["train", "lm", "--preset", "tiny", "--out", str(out), "--quiet", "--set", *TRAJECTORY], cache)
    assert proc.returncode == 0, proc.stderr
    return out


def test_resume_after_sigkill_is_bitwise_identical(reference_run, cache, tmp_path):
    out = tmp_path / "killed"
    cmd = tokenmix_cmd("train", "lm", "--preset", "tiny", "--out", str(out), "--quiet", "--set", *TRAJECTORY)
    proc = subprocess.Popen(cmd, env=lm_env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    watch, sampler = Watch(cpu_seconds=600), TreeSampler(proc.pid)  # hung: judged by its CPU, not the clock
    killed_after, polls = None, 0
    while proc.poll() is None:
        polls += 1
        if polls % 100 == 0 and (reason := watch.verdict(*sampler.sample())):
            proc.kill()
            raise NoProgress(reason)
        if metrics.exists():
            steps = [json.loads(l).get("step", 0) for l in metrics.read_text().splitlines() if l.endswith("}")]
            if max(steps, default=0) >= 12:  # past the first checkpoint, well before the end
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                killed_after = max(steps)
                break
        time.sleep(0.002)
    assert killed_after is not None, f"run ended before it could be killed: {proc.returncode} {proc.stderr.read()}"
    assert proc.returncode == -signal.SIGKILL
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert 10 <= latest["step"] <= killed_after < 40

    resumed = run_tokenmix(["train", "lm", "--resume", str(out), "--quiet"], cache)
    assert resumed.returncode == 0, resumed.stderr
    ref, got = step_losses(reference_run), step_losses(out)
    assert sorted(got) == list(range(1, 41))
    assert all(got[s] == ref[s] for s in ref), {s: (got[s], ref[s]) for s in ref if got[s] != ref[s]}
    assert val_losses(out) == val_losses(reference_run)
    # every step after the checkpoint was recomputed by the resumed process, the killed run's extra lines dropped
    assert len((out / "metrics.jsonl").read_text().splitlines()) == len(
        (reference_run / "metrics.jsonl").read_text().splitlines()
    )


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_two_ranks_matches_single_process(reference_run, cache, tmp_path, parallel):
    out = tmp_path / parallel
    cmd = torchrun_tiny_cmd(out, *TRAJECTORY, f"train.parallel={parallel}")
    proc = run_guarded(cmd, env=lm_env(cache), cpu_seconds=900)  # hung: judged by its CPU, not the clock
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref, got = step_losses(reference_run), step_losses(out)
    assert sorted(got) == sorted(ref)
    worst = max(abs(got[s] - ref[s]) for s in ref)
    assert worst <= 1e-5, f"{parallel}: loss trajectories differ by {worst:.2e}"
    vref, vgot = val_losses(reference_run), val_losses(out)
    assert max(abs(vgot[s] - vref[s]) for s in vref) <= 1e-5
    # rank 0 alone wrote the checkpoint; its weights equal the single-process ones
    from safetensors.torch import load_file

    a = load_file(str(reference_run / "checkpoints" / "step_0000040" / "model.safetensors"))
    b = load_file(str(out / "checkpoints" / "step_0000040" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-4


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _tokenmix(args: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in this process (no interpreter start-up): (exit status, stdout, stderr)."""
    from tokenmix.cli.main import main

    capsys.readouterr()
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(result: tuple[int, str, str], *words: str) -> None:
    rc, _, err = result
    assert rc == 2, (rc, err[-2000:])
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]


def test_damaged_checkpoints_are_refused_with_one_line(reference_run, cache, tmp_path, capsys, monkeypatch):
    """With no valid checkpoint left to fall back to (the earlier one removed), damage is refused.
    (A valid earlier checkpoint is used instead, with a warning: tests/runs/test_durability.py.)"""
    monkeypatch.setenv("TOKENMIX_CACHE", str(cache))
    # truncated weights
    run = _copy_run(reference_run, tmp_path / "truncated")
    shutil.rmtree(run / "checkpoints" / "step_0000030")
    w = run / "checkpoints" / "step_0000040" / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    _one_line_error(_tokenmix(["eval", "--run", str(run)], capsys), "model.safetensors", "checksum")
    # one flipped byte in the optimizer state, then resume
    run = _copy_run(reference_run, tmp_path / "tampered")
    shutil.rmtree(run / "checkpoints" / "step_0000030")
    o = run / "checkpoints" / "step_0000040" / "optimizer.safetensors"
    raw = bytearray(o.read_bytes())
    raw[-5] ^= 0xFF
    o.write_bytes(bytes(raw))
    before = o.read_bytes()
    _one_line_error(_tokenmix(["train", "lm", "--resume", str(run)], capsys), "optimizer.safetensors", "tampered")
    assert o.read_bytes() == before
    # a checkpoint of another model shape (config says d_model=32, the weights are d_model=48)
    other = tmp_path / "other"
    rc, _, err = _tokenmix(
        [
            "train",
            "lm",
            "--preset",
            "tiny",
            "--out",
            str(other),
            "--quiet",
            "--set",
            "train.max_steps=1",
            "train.eval_windows=1",
            "model.d_model=48",
        ],
        capsys,
    )
    assert rc == 0, err
    run = _copy_run(reference_run, tmp_path / "wrong_shape")
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(other / "checkpoints", run / "checkpoints")
    _one_line_error(
        _tokenmix(["generate", "--run", str(run), "--prompt", "ROMEO"], capsys),
        "different model shape",
        "[300, 48]",
        "[300, 32]",
    )
    # a checkpoint whose meta.json was edited by hand
    run = _copy_run(reference_run, tmp_path / "edited_meta")
    shutil.rmtree(run / "checkpoints" / "step_0000030")
    meta = run / "checkpoints" / "step_0000040" / "meta.json"
    meta.write_text(meta.read_text().replace('"step": 40', '"step": 41'))
    _one_line_error(_tokenmix(["eval", "--run", str(run)], capsys), "meta.json", "checksum")


def test_failed_run_keeps_the_last_good_checkpoint(cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(cache))
    out = tmp_path / "diverges"
    # a learning rate this large (with decoupled weight decay) makes the loss non-finite after some checkpoints
    rc, _, err = _tokenmix(
        [
            "train",
            "lm",
            "--preset",
            "tiny",
            "--out",
            str(out),
            "--quiet",
            "--set",
            "train.max_steps=40",
            "train.checkpoint_every=2",
            "train.warmup_steps=0",
            "train.lr=1e4",
            "train.grad_clip=0",
            "train.eval_windows=1",
        ],
        capsys,
    )
    assert rc == 2 and "diverged" in err, err
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    ckpt = out / "checkpoints" / latest["checkpoint"]
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "meta.json",
        "model.safetensors",
        "optimizer.safetensors",
        "rng.safetensors",
    ]
    assert not list((out / "checkpoints").glob(".tmp-*"))
    rc, out_text, err = _tokenmix(["eval", "--run", str(out), "--json", "--max-windows", "1"], capsys)
    assert rc == 0, err
    assert json.loads(out_text)["step"] == latest["step"]
