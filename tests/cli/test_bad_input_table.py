"""Bad input, command by command: every case must exit with status 2, print exactly one line on
stderr, write nothing (the working directory, the data cache and the fixture runs are unchanged) and
finish within seconds.

The classes of bad input per command: unknown names, values that are not numbers, zero / negative /
absurd sizes, missing / empty / binary / special files, and contradictory options. Most cases run in
this process through ``tokenmix.cli.main.main`` under a progress guard (a hang fails the case instead
of the suite); ``SUBPROCESS_CASES`` run as real processes under the same guard, for the hangs that only
a real process shows (a FIFO, a symlink loop, an absurd size). A hang is judged by the command's own
CPU time or by its sitting blocked, never by the wall clock (progress_guard.py): a busy machine
slows a case down but cannot fail it.

``CASES_TRIED`` is the number of cases (in-process + subprocess), for the record.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from lm_helpers import train_tiny_run
from progress_guard import guarded, run_guarded
from tokenmix.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

CASE_CPU_SECONDS = 10.0  # in-process: CPU time per case (most use well under 1 s)
SUBPROCESS_CPU_SECONDS = 60.0  # a fresh interpreter imports torch first (~3 s of CPU)
HUGE = "1000000000000"  # 10^12
NAN = "nan"

# (command words, argv after them). Placeholders: {run} a trained tiny LM run, {tmp} a scratch folder
# outside the working directory, {file} a regular text file, {empty} an empty file, {binary} a file
# that is not UTF-8, {fifo} a named pipe, {notrun} a folder of unrelated files, {emptydir} an empty
# folder, {cfg_*} copies of {run} with one wrong value in config.json, {nockpt} a run without checkpoints.
# Broken JSON and run files: {deep} a JSON file nested 100000 levels, {bigint} a config whose integer has
# 5000 digits, {cfg_deep} a run whose config.json is {deep}, {latest_deep} / {latest_list} runs whose
# latest.json is {deep} / [1, 2] (and no step_* checkpoint that verifies), {fifo_cfg} / {fifo_metrics} runs
# whose config.json / metrics.jsonl is a FIFO, {escape} / {escape_link} runs whose latest.json / step_*
# folder leads to {run}'s checkpoint. Paths: {dangling} a symbolic link to nothing, {runlink} one to
# another run. {raising} /
# {raising_build}: preset files whose code raises while loading / in their function.
CASES: list[tuple[str, list[str]]] = [
    # ---- parsing: unknown commands and options, non-numbers, missing required arguments
    ("parse", []),
    ("parse", ["nosuch"]),
    ("parse", ["patterns", "--pattern", "pow2", "--bogus"]),
    ("parse", ["patterns"]),
    ("parse", ["patterns", "--pattern", "pow2", "--n", "abc"]),
    ("parse", ["patterns", "--pattern", "pow2", "--n", "1e20"]),
    ("parse", ["bench", "nosuch"]),
    ("parse", ["bench", "solver", "--n", "x"]),
    ("parse", ["bench", "lm", "--contexts", "1.5"]),
    ("parse", ["generate", "--prompt", "hi"]),
    ("parse", ["generate", "--run", "{run}", "--temperature", "warm"]),
    ("parse", ["generate", "--run", "{run}", "--seed", "1e20"]),
    ("parse", ["eval", "--run", "{run}", "--split", "dev"]),
    ("parse", ["presets", "--kind", "nope"]),
    ("parse", ["analyze", "nosuch"]),
    ("parse", ["analyze", "matrix", "--n", "sixty"]),
    ("parse", ["data", "prepare", "--vocab-size", "big"]),
    ("parse", ["train", "nosuch"]),
    ("parse", ["compare", "--workers", "two"]),
    ("parse", ["demo", "--n", "-"]),
    # ---- patterns
    ("patterns", ["--pattern", "nope"]),
    ("patterns", ["--pattern", "pow2", "--n", "0"]),
    ("patterns", ["--pattern", "pow2", "--n", "-5"]),
    ("patterns", ["--pattern", "dense", "--n", HUGE]),
    ("patterns", ["--pattern", "pow2_ce", "--n", HUGE]),
    ("patterns", ["--pattern", "fenwick", "--n", HUGE]),
    ("patterns", ["--pattern", "sq1", "--n", "1000000", "--path-limit", "0"]),
    ("patterns", ["--pattern", "pow2", "--n", "100000", "--path-limit", "100000"]),
    ("patterns", ["--pattern", "pow2", "--n", "100", "--path-limit", "-1"]),
    ("patterns", ["--pattern", "dense", "--cache-efficient"]),
    ("patterns", ["--pattern", "window:0"]),
    ("patterns", ["--pattern", "window:x"]),
    ("patterns", ["--pattern", "f:2-k"]),
    ("patterns", ["--pattern", "f:k+"]),
    ("patterns", ["--pattern", "f:__import__('os')"]),
    # engineer A's items (f:EXPR explosions, window:1e12, ZeroDivision, recursion)
    ("patterns", ["--pattern", f"window:{HUGE}", "--n", "100"]),
    ("patterns", ["--pattern", "f:9**9**9"]),
    ("patterns", ["--pattern", "f:2**2**k"]),
    ("patterns", ["--pattern", "f:k**k**k+1"]),
    ("patterns", ["--pattern", "f:10**(10**k)"]),
    ("patterns", ["--pattern", "f:k//0"]),
    ("patterns", ["--pattern", "f:k%0+1"]),
    ("patterns", ["--pattern", "f:k**-1"]),
    ("patterns", ["--pattern", "f:" + "(" * 400 + "k+1" + ")" * 400]),
    ("patterns", ["--pattern", "f:" + "+".join(["k"] * 20000)]),
    # ---- bench
    ("bench", ["solver", "--n", "-3"]),
    ("bench", ["solver", "--n", HUGE]),
    ("bench", ["solver", "--patterns", "nosuch", "--n", "64"]),
    ("bench", ["solver", "--patterns", "attention", "--n", "64"]),
    ("bench", ["decode", "--n", "0"]),
    ("bench", ["decode", "--n", HUGE]),
    ("bench", ["decode", "--mixers", "nosuch", "--n", "64"]),
    ("bench", ["mixers", "--n", HUGE]),
    ("bench", ["mixers", "--mixers", "nosuch", "--n", "64"]),
    ("bench", ["mixers", "--busy", "-1"]),
    ("bench", ["mixers", "--busy", "1000"]),
    ("bench", ["lm", "--contexts", HUGE, "--mixers", "pow2"]),
    ("bench", ["lm", "--contexts", "1"]),
    ("bench", ["lm", "--mixers", "nosuch"]),
    ("bench", ["lm", "--layers", "0"]),
    ("bench", ["lm", "--layers", "100000000"]),
    ("bench", ["lm", "--n-heads", "0"]),
    ("bench", ["lm", "--n-heads", HUGE]),
    ("bench", ["lm", "--vocab-size", HUGE]),
    ("bench", ["lm", "--batch-tokens", "0"]),
    ("bench", ["lm", "--train-steps", "0"]),
    ("bench", ["lm", "--threads", "-1"]),
    ("bench", ["lm", "--seed", "100000000000000000000"]),
    ("bench", ["lm", "--out", "{tmp}"]),
    ("bench", ["lm", "--out", "{tmp}/no/such/dir/out.json"]),
    ("bench", ["packed", "--seed", "100000000000000000000"]),
    ("bench", ["packed", "--seed", "-1"]),
    ("bench", ["packed", "--repeats", HUGE]),
    ("bench", ["packed", "--rows", "1000000000"]),
    ("bench", ["packed", "--corpus", "{tmp}/missing.txt"]),
    # ---- demo, list, check, presets
    ("demo", ["--n", "1"]),
    ("demo", ["--n", HUGE]),
    ("check", []),
    ("check", ["--mixer", "nosuch"]),
    ("check", ["--mixer", "pow2", "--all"]),
    # ---- compare (engineer B's items among them)
    ("compare", ["--preset", "nosuch", "--out", "{tmp}/cmp1"]),
    ("compare", ["--preset", "{tmp}/missing.py", "--out", "{tmp}/cmp2"]),
    ("compare", ["--preset", "{binary}", "--out", "{tmp}/cmp3"]),
    ("compare", ["--mixers", "nosuch", "--out", "{tmp}/cmp4"]),
    ("compare", ["--workers", "0", "--out", "{tmp}/cmp5"]),
    ("compare", ["--workers", "-2", "--out", "{tmp}/cmp6"]),
    ("compare", ["--threads", "0", "--out", "{tmp}/cmp7"]),
    ("compare", ["--out", "{file}"]),
    ("compare", ["--preset", "{raising}", "--out", "{tmp}/cmp8"]),
    ("compare", ["--preset", "{raising_build}", "--out", "{tmp}/cmp9"]),
    # ---- data prepare
    ("data", ["prepare", "--corpus", "{tmp}/missing.txt", "--out", "{tmp}/prep1"]),
    ("data", ["prepare", "--corpus", "{empty}", "--out", "{tmp}/prep2"]),
    ("data", ["prepare", "--corpus", "{binary}", "--out", "{tmp}/prep3"]),
    ("data", ["prepare", "--corpus", "{emptydir}", "--out", "{tmp}/prep4"]),
    ("data", ["prepare", "--corpus", "/dev/zero", "--out", "{tmp}/prep5"]),
    ("data", ["prepare", "--corpus", "{fifo}", "--out", "{tmp}/prep6"]),
    ("data", ["prepare", "--vocab-size", HUGE, "--out", "{tmp}/prep7"]),
    ("data", ["prepare", "--vocab-size", "10", "--out", "{tmp}/prep8"]),
    ("data", ["prepare", "--vocab-size", "-1", "--out", "{tmp}/prep9"]),
    ("data", ["prepare", "--set", "data.vocab_size=" + HUGE, "--out", "{tmp}/prep10"]),
    ("data", ["prepare", "--set", "train.lr=1", "--out", "{tmp}/prep11"]),
    ("data", ["prepare", "--set", "data.nosuch=1", "--out", "{tmp}/prep12"]),
    ("data", ["prepare", "--set", "data.val_fraction=x", "--out", "{tmp}/prep13"]),
    ("data", ["prepare", "--set", "data.val_fraction=nan", "--out", "{tmp}/prep14"]),
    ("data", ["prepare", "--out", "{file}"]),
    ("data", ["prepare", "--out", "{notrun}"]),
    ("data", ["prepare", "--out", "{file}/x"]),
    ("data", ["prepare", "--out", "/proc/tokenmix-x"]),
    ("data", ["prepare", "--out", "{dangling}"]),
    # ---- train lm (engineer B's items among them)
    ("train", ["lm", "--preset", "nosuch", "--out", "{tmp}/tr1"]),
    ("train", ["lm", "--layers", "pow2,mamba9", "--out", "{tmp}/tr2"]),
    ("train", ["lm", "--layers", "", "--out", "{tmp}/tr3"]),
    ("train", ["lm", "--layers", "pow2*100000000", "--out", "{tmp}/tr4"]),
    ("train", ["lm", "--set", "train.lrate=1", "--out", "{tmp}/tr5"]),
    ("train", ["lm", "--set", "train.lr=nan", "--out", "{tmp}/tr6"]),
    ("train", ["lm", "--set", "train.lr=-1", "--out", "{tmp}/tr7"]),
    ("train", ["lm", "--set", "train.seq_len=0", "--out", "{tmp}/tr8"]),
    ("train", ["lm", "--set", "train.max_steps=x", "--out", "{tmp}/tr9"]),
    ("train", ["lm", "--set", "model.d_model=1000000000", "--out", "{tmp}/tr10"]),
    ("train", ["lm", "--set", "model.mixer_overrides.nosuch.x=1", "--out", "{tmp}/tr11"]),
    ("train", ["lm", "--set", "noequals", "--out", "{tmp}/tr12"]),
    ("train", ["lm", "--corpus", "{empty}", "--preset", "tiny", "--out", "{tmp}/tr13"]),
    ("train", ["lm", "--corpus", "{tmp}/missing.txt", "--out", "{tmp}/tr14"]),
    ("train", ["lm", "--out", "{file}"]),
    ("train", ["lm", "--preset", "tiny", "--out", "{run}"]),
    ("train", ["lm", "--resume", "{run}", "--set", "train.lr=1"]),
    ("train", ["lm", "--resume", "{tmp}/no_run"]),
    ("train", ["lm", "--resume", "{file}"]),
    ("train", ["lm", "--resume", "{notrun}"]),
    ("train", ["lm", "--resume", "{cfg_d_model}"]),
    ("train", ["lm", "--resume", "{cfg_json}"]),
    ("train", ["lm", "--config", "{deep}", "--out", "{tmp}/tr15"]),
    ("train", ["lm", "--config", "{bigint}", "--out", "{tmp}/tr16"]),
    ("train", ["lm", "--resume", "{cfg_deep}"]),
    ("train", ["lm", "--resume", "{latest_deep}"]),
    ("train", ["lm", "--resume", "{latest_list}"]),
    ("train", ["lm", "--set", "model.mixer_overrides.pow2.chunk_size=" + "[" * 100000, "--out", "{tmp}/tr17"]),
    ("train", ["lm", "--preset", "tiny", "--set", "model.max_seq_len=-1", "model.positions=learned", "--print-config"]),
    (
        "train",
        ["lm", "--preset", "tiny", "--set", "model.max_seq_len=-1", "model.positions=learned", "--out", "{tmp}/tr18"],
    ),
    (
        "train",
        [
            "lm",
            "--preset",
            "tiny",
            "--set",
            "model.max_seq_len=16",
            "model.positions=learned",
            "train.seq_len=64",
            "--out",
            "{tmp}/tr19",
        ],
    ),
    ("train", ["lm", "--preset", "tiny", "--set", "train.seq_len=100000000", "--out", "{tmp}/tr20"]),
    ("train", ["lm", "--preset", "tiny", "--set", "train.threads=100000000000", "--out", "{tmp}/tr21"]),
    ("train", ["lm", "--preset", "tiny", "--set", "train.batch_size=" + HUGE, "--out", "{tmp}/tr22"]),
    ("train", ["lm", "--preset", "tiny", "--out", "{file}/x", "--print-config"]),
    ("train", ["lm", "--preset", "tiny", "--out", "{dangling}", "--print-config"]),
    ("train", ["lm", "--preset", "tiny", "--init-from", "{tmp}/no_run", "--print-config"]),
    ("train", ["lm", "--set", "train.steps=50", "--set", "train.max_steps=5", "--out", "{tmp}/tr23"]),
    ("train", ["lm", "--set", "train.max_steps=5", "--set", "train.lr=inf", "--out", "{tmp}/tr24"]),
    # ---- generate
    ("generate", ["--run", "{run}", "--prompt", "hi", "--temperature", NAN]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--temperature", "inf"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--temperature", "-1"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--top-p", NAN]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--top-p", "0"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--top-p", "1.5"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--top-k", "-1"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--max-new-tokens", "-1"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--seed", "100000000000000000000"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--seed", "-1"]),
    ("generate", ["--run", "{run}", "--prompt", "hi", "--max-context", "1"]),
    ("generate", ["--run", "{run}", "--prompt", "to be or not to be " * 40]),
    ("generate", ["--run", "{run}", "--prompt", "\udcff\udcfe"]),
    ("generate", ["--run", "{tmp}/no_run", "--prompt", "hi"]),
    ("generate", ["--run", "{file}", "--prompt", "hi"]),
    ("generate", ["--run", "{notrun}", "--prompt", "hi"]),
    ("generate", ["--run", "{nockpt}", "--prompt", "hi"]),
    ("generate", ["--run", "{cfg_json}", "--prompt", "hi"]),
    ("generate", ["--run", "{cfg_d_model}", "--prompt", "hi"]),
    ("generate", ["--run", "{cfg_layers}", "--prompt", "hi"]),
    ("generate", ["--run", "{cfg_seq_len}", "--prompt", "hi"]),
    ("generate", ["--run", "{cfg_overrides}", "--prompt", "hi"]),
    ("generate", ["--run", "{cfg_deep}", "--prompt", "hi"]),
    ("generate", ["--run", "{latest_deep}", "--prompt", "hi"]),
    ("generate", ["--run", "{latest_list}", "--prompt", "hi"]),
    ("generate", ["--run", "{escape}", "--prompt", "hi"]),
    # ---- eval
    ("eval", ["--run", "{tmp}/no_run"]),
    ("eval", ["--run", "{file}"]),
    ("eval", ["--run", "{emptydir}"]),
    ("eval", ["--run", "{nockpt}"]),
    ("eval", ["--run", "{run}", "--max-windows", "-1"]),
    ("eval", ["--run", "{cfg_json}"]),
    ("eval", ["--run", "{cfg_d_model}"]),
    ("eval", ["--run", "{cfg_vocab}"]),
    ("eval", ["--run", "{cfg_seq_len}"]),
    ("eval", ["--run", "{cfg_deep}"]),
    ("eval", ["--run", "{latest_deep}"]),
    ("eval", ["--run", "{latest_list}"]),
    ("eval", ["--run", "{escape}"]),
    ("eval", ["--run", "{escape_link}"]),
    # ---- analyze
    ("analyze", ["matrix"]),
    ("analyze", ["matrix", "--mixer", "nope"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--n", "0"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--n", HUGE]),
    ("analyze", ["matrix", "--mixer", "pow2", "--d-model", "0"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--d-model", HUGE]),
    ("analyze", ["matrix", "--mixer", "pow2", "--heads", "0"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--show-heads", "a,b"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--n", "8", "--d-model", "8", "--show-heads", "7"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--n", "8", "--d-model", "8", "--position", "99"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--n", "8", "--d-model", "8", "--channel", "-1"]),
    ("analyze", ["matrix", "--mixer", "mamba2", "--n", "8", "--d-model", "8", "--channel", "999"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--formats", "gif"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--out", "{file}"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--run", "{run}", "--text", "hi"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--text", "hi"]),
    ("analyze", ["matrix", "--run", "{run}"]),
    ("analyze", ["matrix", "--run", "{run}", "--text", "hi", "--layer", "9"]),
    ("analyze", ["matrix", "--run", "{run}", "--text", "\udcff"]),
    ("analyze", ["matrix", "--run", "{tmp}/no_run", "--text", "hi"]),
    ("analyze", ["matrix", "--run", "{notrun}", "--text", "hi"]),
    ("analyze", ["matrix", "--run", "{cfg_d_model}", "--text", "hi"]),
    ("analyze", ["matrix", "--run", "{cfg_deep}", "--text", "hi"]),
    ("analyze", ["matrix", "--run", "{escape}", "--text", "hi"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--out", "{file}/x"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--out", "/proc/tokenmix-x"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--out", "{dangling}"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--seed", str(2**63), "--out", "{tmp}/an5"]),
    ("analyze", ["matrix", "--mixer", "pow2", "--seed", "-1", "--out", "{tmp}/an6"]),
    ("analyze", ["cost", "--mixers", "pow2", "--seed", str(2**63), "--out", "{tmp}/an3"]),
    ("analyze", ["cost", "--mixers", "pow2", "--seed", "-1", "--out", "{tmp}/an7"]),
    ("analyze", ["norms", "--mixers", "pow2", "--seed", "100000000000000000000", "--out", "{tmp}/an4"]),
    ("analyze", ["norms", "--mixers", "pow2", "--seed", "-1", "--out", "{tmp}/an8"]),
    ("analyze", ["cost", "--mixers", "pow2", "--out", "{file}/x"]),
    ("analyze", ["cost", "--mixers", "pow2", "--out", "/proc/tokenmix-x"]),
    ("analyze", ["cost", "--mixers", "pow2", "--out", "{dangling}"]),
    ("analyze", ["cost", "--mixers", "pow2", "--heads", "5", "--out", "{tmp}/an1"]),
    ("analyze", ["cost", "--mixers", "pow2,nope"]),
    ("analyze", ["cost", "--mixers", ""]),
    ("analyze", ["cost", "--clock", "gpu"]),
    ("analyze", ["cost", "--threads", "0"]),
    ("analyze", ["cost", "--cache-n", "0"]),
    ("analyze", ["cost", "--cache-n", HUGE, "--time-n"]),
    ("analyze", ["cost", "--time-n", HUGE]),
    ("analyze", ["cost", "--time-n", "1"]),
    ("analyze", ["cost", "--d-model", HUGE]),
    ("analyze", ["cost", "--batch", HUGE]),
    ("analyze", ["cost", "--min-time", NAN]),
    ("analyze", ["cost", "--time-budget", NAN]),
    ("analyze", ["expressivity", "--n", HUGE]),
    ("analyze", ["expressivity", "--n", "1"]),
    ("analyze", ["expressivity", "--patterns", "nope"]),
    ("analyze", ["expressivity", "--mixers", "nope"]),
    ("analyze", ["expressivity", "--patterns", "none", "--mixers", "none"]),
    ("analyze", ["expressivity", "--n", "64", "--offset", "64"]),
    ("analyze", ["expressivity", "--layers", "0"]),
    ("analyze", ["expressivity", "--layers", HUGE]),
    ("analyze", ["expressivity", "--path-limit", "-1"]),
    ("analyze", ["expressivity", "--operator-limit", "-1"]),
    ("analyze", ["norms", "--n", HUGE]),
    ("analyze", ["norms", "--mixers", "nope"]),
    ("analyze", ["norms", "--gram-iters", "-1"]),
    ("analyze", ["norms", "--gram-iters", HUGE]),
    ("analyze", ["norms", "--d-model", HUGE]),
    ("analyze", ["norms", "--mixers", "pow2", "--heads", "5", "--out", "{tmp}/an2"]),
    # ---- design: a folder only once the front is derived and the training checked
    ("design", ["--n", "64", "--out", "{file}/x"]),
    ("design", ["--n", "64", "--out", "/proc/tokenmix-x"]),
    ("design", ["--n", "64", "--out", "{dangling}"]),
    ("design", ["--n", "64", "--pattern", "nosuch", "--out", "{tmp}/ds1"]),
    ("design", ["--n", "64", "--max-cache", "0", "--out", "{tmp}/ds2"]),
    ("design", ["--n", "64", "--train", "copy", "--lr", NAN, "--out", "{tmp}/ds3"]),
    ("design", ["--n", "64", "--train", "copy", "--device", "tpu", "--out", "{tmp}/ds4"]),
    # ---- report
    ("report", ["{tmp}/nothing"]),
    ("report", ["nosuch_preset"]),
    ("report", ["{file}"]),
    ("report", ["{notrun}"]),
    ("report", ["{emptydir}"]),
    ("report", ["{run}", "--out", "{file}"]),
    ("report", ["{run}", "--out", "{file}/x"]),
    ("report", ["{run}", "--out", "/proc/tokenmix-x"]),
    ("report", ["{run}", "--out", "{dangling}"]),
    ("report", ["{cfg_deep}"]),
    ("report", ["{run}", "--out", "{runlink}"]),
    ("report", ["{run}", "--out", "{nockpt}"]),
    ("report", ["{run}", "--out", "{nockpt}/report"]),
]

# real processes, for hangs an in-process alarm might not interrupt (blocking opens, long C loops)
SUBPROCESS_CASES: list[list[str]] = [
    ["data", "prepare", "--corpus", "{fifo}", "--out", "{tmp}/sp1"],
    ["report", "{loop}", "--quiet"],
    ["patterns", "--pattern", "dense", "--n", HUGE],
    ["analyze", "expressivity", "--n", HUGE, "--out", "{tmp}/sp2"],
    # run files that are FIFOs: refused, never opened (an open would wait for a writer forever)
    ["eval", "--run", "{fifo_cfg}"],
    ["generate", "--run", "{fifo_cfg}", "--prompt", "hi"],
    ["analyze", "matrix", "--run", "{fifo_cfg}", "--text", "hi", "--out", "{tmp}/sp3"],
    ["train", "lm", "--resume", "{fifo_cfg}"],
    ["train", "lm", "--resume", "{fifo_metrics}", "--set", "train.max_steps=3"],
    # export imports transformers (seconds): a real process with its longer limit
    ["export", "--run", "{run}", "--hf", "/proc/tokenmix-x"],
    ["export", "--run", "{run}", "--hf", "{dangling}"],
]

CASES_TRIED = len(CASES) + len(SUBPROCESS_CASES)

BAD_CONFIGS = {
    "cfg_d_model": ("model", "d_model", "32"),
    "cfg_layers": ("model", "layers", 5),
    "cfg_seq_len": ("train", "seq_len", "abc"),
    "cfg_vocab": ("data", "vocab_size", None),
    "cfg_overrides": ("model", "mixer_overrides", [1]),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Placeholders -> paths: a trained tiny run, files and folders of every bad kind."""
    root = tmp_path_factory.mktemp("bad_input")
    cache, tmp = root / "cache", root / "scratch"
    tmp.mkdir()
    run = train_tiny_run(root, main)
    paths = {
        "run": run,
        "tmp": tmp,
        "file": root / "plain.txt",
        "empty": root / "empty.txt",
        "binary": root / "binary.txt",
        "fifo": root / "fifo",
        "notrun": root / "notrun",
        "emptydir": root / "emptydir",
        "nockpt": root / "nockpt",
        "loop": root / "loop",
    }
    paths["file"].write_text("just a text file\n")
    paths["empty"].write_text("")
    paths["binary"].write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    os.mkfifo(paths["fifo"])
    (paths["notrun"] / "sub").mkdir(parents=True)
    (paths["notrun"] / "sub" / "notes.txt").write_text("holiday photos\n")
    paths["emptydir"].mkdir()
    shutil.copytree(run, paths["nockpt"], ignore=shutil.ignore_patterns("checkpoints"))
    (paths["loop"] / "a").mkdir(parents=True)  # symbolic-link loops and no tokenmix output: not a run
    os.symlink("..", paths["loop"] / "a" / "up")
    os.symlink(paths["loop"], paths["loop"] / "a" / "again")
    for name, (section, key, value) in BAD_CONFIGS.items():
        shutil.copytree(run, root / name)
        cfg = json.loads((root / name / "config.json").read_text())
        cfg[section][key] = value
        (root / name / "config.json").write_text(json.dumps(cfg))
        paths[name] = root / name
    shutil.copytree(run, root / "cfg_json")
    (root / "cfg_json" / "config.json").write_text("{not json")
    paths["cfg_json"] = root / "cfg_json"
    _broken_run_files(root, run, paths)
    return root, cache, paths


RAISING_PRESET = '''"""A preset file whose code fails."""
settings = {"lr": 1e-3}
raise RuntimeError("this preset is broken")
'''
RAISING_BUILD_PRESET = '''"""A preset file whose function fails."""


def raising_build(extra_mixers=()):
    return [1 / 0]
'''


def _broken_run_files(root: Path, run: Path, paths: dict) -> None:
    """The placeholders of broken JSON, FIFOs, links out of a run, and failing preset files."""
    deep = "[" * 100000 + "]" * 100000
    paths["deep"], paths["bigint"] = root / "deep.json", root / "bigint.json"
    paths["deep"].write_text(deep)
    paths["bigint"].write_text('{"train": {"seed": 1' + "0" * 5000 + "}}")
    os.symlink(root / "nowhere", root / "dangling")
    paths["dangling"] = root / "dangling"
    os.symlink(paths["nockpt"], root / "runlink")  # a link to another run
    paths["runlink"] = root / "runlink"
    paths["raising"], paths["raising_build"] = root / "raising.py", root / "raising_build.py"
    paths["raising"].write_text(RAISING_PRESET)
    paths["raising_build"].write_text(RAISING_BUILD_PRESET)

    def copy(name: str) -> Path:
        paths[name] = shutil.copytree(run, root / name)
        return paths[name]

    (copy("cfg_deep") / "config.json").write_text(deep)
    (copy("latest_deep") / "checkpoints" / "latest.json").write_text(deep)
    for ckpt in (root / "latest_deep" / "checkpoints").glob("step_*"):
        shutil.rmtree(ckpt)
    (copy("latest_list") / "checkpoints" / "latest.json").write_text("[1, 2]")
    for ckpt in (root / "latest_list" / "checkpoints").glob("step_*"):
        (ckpt / "model.safetensors").unlink()
    fifo_cfg = copy("fifo_cfg")
    (fifo_cfg / "config.json").unlink()
    os.mkfifo(fifo_cfg / ".pipe")
    os.symlink(".pipe", fifo_cfg / "config.json")
    fifo_metrics = copy("fifo_metrics")
    (fifo_metrics / "metrics.jsonl").unlink()
    os.mkfifo(fifo_metrics / "metrics.jsonl")
    # another run's checkpoint, with the checksum latest.json records: never read by this run
    escape = root / "escape"
    (escape / "checkpoints").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(run / name, escape / name)
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())
    (escape / "checkpoints" / "latest.json").write_text(
        json.dumps({**latest, "checkpoint": f"../../{run.name}/checkpoints/{latest['checkpoint']}"})
    )
    paths["escape"] = escape
    link = copy("escape_link") / "checkpoints" / latest["checkpoint"]
    shutil.rmtree(link)
    os.symlink(run / "checkpoints" / latest["checkpoint"], link)


def _fill(argv: list[str], paths: dict) -> list[str]:
    out = []
    for a in argv:
        for key, p in paths.items():
            a = a.replace("{" + key + "}", str(p))
        out.append(a)
    return out


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root (links not followed) -> (size, mtime_ns): what "nothing written" compares."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (st.st_size if not os.path.isdir(p) else 0, st.st_mtime_ns if not os.path.isdir(p) else 0)
    return out


def _case_id(case) -> str:
    words, argv = case
    text = " ".join([words] + argv)
    return text if len(text) <= 70 else text[:67] + "..."


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(case, world, tmp_path, monkeypatch, capsys):
    words, argv = case
    root, cache, paths = world
    argv = _fill(argv if words == "parse" else [words] + argv, paths)
    monkeypatch.setenv("TOKENMIX_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    before, cwd_before = _tree(root), _tree(tmp_path)
    capsys.readouterr()
    with guarded(cpu_seconds=CASE_CPU_SECONDS) as used:
        rc = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err[-2000:])
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith("tokenmix") and ": error: " in lines[0], lines[0]
    assert used.cpu < CASE_CPU_SECONDS
    assert _tree(tmp_path) == cwd_before, "wrote into the working directory"
    assert _tree(root) == before, "wrote into the fixtures or the data cache"


@pytest.mark.parametrize("argv", SUBPROCESS_CASES, ids=[" ".join(a)[:70] for a in SUBPROCESS_CASES])
def test_bad_input_in_a_real_process(argv, world, tmp_path):
    root, cache, paths = world
    before = _tree(root)
    env = {**os.environ, "TOKENMIX_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    proc = run_guarded(
        [sys.executable, "-m", "tokenmix", *_fill(argv, paths)],
        env=env,
        cwd=tmp_path,
        cpu_seconds=SUBPROCESS_CPU_SECONDS,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert not any(tmp_path.iterdir()) and _tree(root) == before
