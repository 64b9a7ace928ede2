"""The run folder of a language-model run, as training writes it: what may be left half-written, how
it is claimed, and what a resumed run reads back from it.

    open_run_folder(run_dir, resume, created, lock)   # checked, made, locked, stale temporaries removed
    check_run_tokenizer(run_dir, data, vocab_size)    # on resume: the run's tokenizer is its data's
    truncate_metrics(path, last_step, keep_final)     # on resume: records past the checkpoint dropped
    finishedread_summary(run_dir, cfg, meta)              # summary.json of a run already finished

The folder's files are listed in ``runs/lm.py``'s docstring; reading them (config, metrics, weights) is
``runs/lm.py``'s too. One writer per folder: the lock (core/lock.py) is held for the whole run.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from tokenmix.core.errors import InputError
from tokenmix.core.files import (
    MAX_JSON_BYTES,
    atomic_copy,
    atomic_write_text,
    check_output_dir,
    parse_json,
    read_json,
    read_text_file,
    remove_temporaries,
)
from tokenmix.core.lock import folder_lock
from tokenmix.data.prepare import PreparedData
from tokenmix.data.tokenizer import load_tokenizer
from tokenmix.runs.checkpoint import remove_stale_temporaries
from tokenmix.runs.lm import LMRunConfig

# the files of a run folder train_lm writes atomically (core/files.py): their temporaries, left by a
# killed run, are removed when the run starts again
RUN_FILES = ("config.json", "tokenizer.json", "metrics.jsonl", "summary.json")


def open_run_folder(run_dir: Path, resume: bool, created: list[Path], lock: contextlib.ExitStack) -> None:
    """Check ``run_dir`` can hold this run, make it (each folder made is appended to ``created``), take its
    lock into ``lock`` and remove what a killed run left half-written."""
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"'{run_dir}' exists and is not a folder; --out must name a new or existing run folder")
    if resume and not run_dir.is_dir():
        raise InputError(f"cannot resume: run directory '{run_dir}' does not exist")
    check_output_dir(run_dir, "run folder")
    try:
        for p in reversed([run_dir, *run_dir.parents]):
            if not p.exists():
                p.mkdir()
                created.append(p)
    except OSError as e:
        raise InputError(f"cannot create run folder '{run_dir}': {e.strerror or e}") from None
    lock.enter_context(folder_lock(run_dir, "train lm"))
    # the lock is held: nobody else writes here, so what a killed run left half-written is stale
    remove_stale_temporaries(run_dir / "checkpoints")
    remove_temporaries(run_dir, lambda name: name in RUN_FILES)


def truncate_metrics(path: Path, last_step: int, keep_final: bool) -> None:
    """Drop records of steps after the checkpoint a run resumes from (the killed run wrote them), and,
    unless ``keep_final`` (the run had finished there: a schedule extended since), a final record at
    its step (a run killed between that record and summary.json)."""
    if not path.is_file():
        return
    keep = []
    for line in read_text_file(
        path, "metrics file", max_bytes=MAX_JSON_BYTES, within=path.parent, errors="replace"
    ).splitlines():
        try:
            rec = parse_json(line, "a metrics record")
        except InputError:
            continue  # a line cut by the kill
        if not isinstance(rec, dict):
            continue
        step = rec.get("step", 0)
        if step < last_step or (step == last_step and (keep_final or rec.get("event") != "final")):
            keep.append(line)  # a final record at the checkpoint's step: the resumed run writes its own
    atomic_write_text(path, "".join(l + "\n" for l in keep))


def tokens_differ(path: Path, data: PreparedData) -> bool:
    """Whether the tokenizer at ``path`` has other tokens than the prepared data's (unreadable: differs)."""
    try:
        return load_tokenizer(path, within=path.parent).get_vocab() != data.tokenizer.get_vocab()
    except InputError:
        return True


def check_run_tokenizer(run_dir: Path, data: PreparedData, vocab_size: int) -> str | None:
    """On resume: the run's tokenizer.json must be the tokenizer of its data. A missing or unreadable
    one is restored from the prepared data (when that has the vocabulary the model was trained with);
    returns a line saying so. A readable one with other tokens is refused."""
    path = run_dir / "tokenizer.json"
    source = data.tokenizer
    try:
        tok = load_tokenizer(path, within=run_dir)
    except InputError as e:
        if source.get_vocab_size() != vocab_size:
            raise InputError(
                f"cannot resume: {e}, and the prepared data in {data.dir} has a {source.get_vocab_size()}"
                f"-token tokenizer where the model has {vocab_size}"
            ) from None
        atomic_copy(data.dir / "tokenizer.json", path)
        return f"{e}; restored it from the prepared data in {data.dir}"
    if tok.get_vocab() != source.get_vocab():
        raise InputError(
            f"cannot resume: {path} is not the tokenizer of the run's prepared data {data.dir} "
            "(different tokens); restore the run's own tokenizer.json"
        )
    return None


def read_summary(run_dir: Path) -> dict | None:
    """The run's summary.json, or None when it is missing or unreadable."""
    try:
        summary = read_json(run_dir / "summary.json", "run summary", within=run_dir)
    except InputError:
        return None
    return summary if isinstance(summary, dict) else None


def summary_step(run_dir: Path) -> int | None:
    """The step summary.json was written at (the end of a finished session), if any."""
    return (read_summary(run_dir) or {}).get("steps")


def finished_summary(run_dir: Path, cfg: LMRunConfig, meta: dict) -> dict | None:
    """summary.json of a run whose checkpoint ``meta`` is its final one, already evaluated; else None."""
    if int(meta["step"]) < cfg.train.max_steps:
        return None
    summary = read_summary(run_dir)
    return summary if summary is not None and summary.get("steps") == int(meta["step"]) else None
