"""Sweeps of synthetic-task runs: every run of a list that has no result yet under the sweep's folder
is trained (``training.synthetic.execute_run``), in this process or in worker processes, with
progress; a killed sweep resumes where it stopped (a run whose ``result.json`` exists is finished).
The folder is locked while a sweep writes it; an interrupt, SIGTERM or a failed run stops the workers
at once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_write_json, atomic_write_text, prepare_output_dir
from tokenmix.core.lock import folder_lock
from tokenmix.core.processes import die_with_parent
from tokenmix.core.progress import Progress
from tokenmix.runs.synthetic import SyntheticRunConfig, load_result, results_to_csv
from tokenmix.training import synthetic


@dataclass
class SweepOutcome:
    """What ``run_sweep`` did: all finished results (in config order) and how many were trained now."""

    results: list[dict[str, Any]]
    trained: int
    skipped: int
    wall_seconds: float


# ------------------------------------------------------------------------------------ worker processes
# A worker trains one run after another for the sweep's process and must never outlive it: killed
# (SIGKILL, SIGTERM) or interrupted, the parent takes its workers with it (core/processes.py; the
# thread that started the workers is run_sweep's caller, which waits in run_sweep until the pool is
# done). Ctrl-C reaches the whole process group: workers ignore it, and the parent stops them.

_PROGRESS_QUEUE: Any = None  # this worker's queue of progress counts (set by _worker_init)


def _worker_init(threads: int | None, progress_queue: Any = None, parent_pid: int | None = None) -> None:
    global _PROGRESS_QUEUE
    if parent_pid is not None:
        die_with_parent(parent_pid)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it terminates its workers
    _PROGRESS_QUEUE = progress_queue
    if threads:
        torch.set_num_threads(threads)


def _execute_in_worker(cfg_dict: dict[str, Any], out: str, threads: int | None, device: str) -> dict[str, Any]:
    return synthetic.execute_run(cfg_dict, out, threads, _PROGRESS_QUEUE, device)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what is queued and end the running workers now (not after their current run)."""
    if hasattr(pool, "terminate_workers"):  # Python 3.14+
        pool.terminate_workers()
        return
    procs = list((getattr(pool, "_processes", None) or {}).values())  # the running workers (3.11-3.13)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.0))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def check_device(device: str) -> None:
    """Raise ``ValueError`` with one line if torch cannot allocate on ``device``."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        raise InputError(f"device '{device}' is not usable: {str(e).splitlines()[0]}") from None


def validate_sweep(configs: Iterable[SyntheticRunConfig]) -> list[SyntheticRunConfig]:
    """Validate every run up front and refuse duplicate runs; returns the list."""
    configs = list(configs)
    if not configs:
        raise InputError("the sweep has no runs")
    seen: dict[str, SyntheticRunConfig] = {}
    for cfg in configs:
        cfg.validate()
        rid = cfg.run_id
        if rid in seen:
            raise InputError(f"the sweep lists run '{rid}' twice")
        seen[rid] = cfg
    return configs


def run_sweep(
    configs: Sequence[SyntheticRunConfig],
    out: str | Path,
    workers: int = 1,
    threads: int | None = None,
    progress: bool = True,
    console: Any = None,
    device: str = "cpu",
) -> SweepOutcome:
    """Run every config not finished yet under ``out``; write per-run and sweep-level files.

    Args:
        configs: the runs (validated here before anything is written).
        out: run directory (created; must be writable).
        workers: parallel worker processes (1 = in this process).
        threads: torch threads per worker (None = leave torch's default).
        progress: show progress (steps of all pending runs): a bar on a terminal, plain lines with an
            ETA on stderr otherwise (``core/progress.py``).
        device: torch device of the training ("cpu", "cuda", "cuda:1", ...); not part of the run id.

    ``out`` is locked while the sweep runs (a second sweep into it is refused, naming this process);
    an interrupt, SIGTERM (from the CLI) or a failed run stops the workers at once.
    """
    configs = validate_sweep(configs)
    check_device(device)
    if workers < 1:
        raise InputError(f"workers must be >= 1, got {workers}")
    out = prepare_output_dir(out)
    with folder_lock(out, "compare"):  # one sweep writes a folder at a time (re-entrant: run_compare holds it)
        return _run_sweep(configs, out, workers, threads, progress, console, device)


def _run_sweep(
    configs: list[SyntheticRunConfig],
    out: Path,
    workers: int,
    threads: int | None,
    progress: bool,
    console: Any,
    device: str,
) -> SweepOutcome:
    (out / "runs").mkdir(exist_ok=True)
    atomic_write_json(out / "sweep.json", [c.to_dict() for c in configs])
    t0 = time.perf_counter()
    done: dict[str, dict[str, Any]] = {}
    pending: list[SyntheticRunConfig] = []
    for cfg in configs:
        res = load_result(out, cfg)
        if res is None:
            pending.append(cfg)
        else:
            done[cfg.run_id] = res
    skipped = len(done)
    # longest step budgets first (stable: runs sharing a task and seed stay together, so the per-process
    # dataset cache keeps hitting): with several workers the short runs then fill the end of the sweep
    # instead of one long run keeping a single core busy after the others have finished
    pending.sort(key=lambda c: -c.train.steps)

    total_steps = sum(c.train.steps for c in pending)
    with Progress(
        "compare", total_steps, "steps", enabled=progress and bool(pending), console=console, check_load=True
    ) as bar:
        finished_now = 0

        def describe() -> str:
            return f"runs {finished_now}/{len(pending)} ({skipped} done before)"

        def finished(res: dict[str, Any]) -> None:
            nonlocal finished_now
            finished_now += 1
            bar.note(describe())
            bar.milestone(
                f"{res['label']} / {res.get('column', res['task'])} seed {res['seed']}: test accuracy "
                f"{100 * res['test_acc']:.1f} % after {res['steps_done']} steps ({res['stop_reason']}"
                + (", still rising" if res.get("still_rising") else "")
                + ")"
            )

        bar.note(describe())
        if workers == 1 or len(pending) <= 1:
            prev_threads = torch.get_num_threads()
            try:
                for cfg in pending:
                    bar.note(f"{describe()} {cfg.task}/{cfg.label}")
                    res = synthetic.execute_run(cfg.to_dict(), str(out), threads, _ProgressSink(bar), device)
                    done[cfg.run_id] = res
                    finished(res)
            finally:
                torch.set_num_threads(prev_threads)
        else:
            ctx = mp.get_context("spawn")
            q = ctx.Queue()  # handed to each worker when it starts (no manager process to outlive us)
            pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(threads, q, os.getpid())
            )
            try:
                futures = {pool.submit(_execute_in_worker, c.to_dict(), str(out), threads, device): c for c in pending}
                remaining = set(futures)
                while remaining:
                    done_now, remaining = wait(remaining, timeout=0.5, return_when=FIRST_COMPLETED)
                    _drain(q, bar)
                    for fut in done_now:
                        res = fut.result()  # re-raises a worker's exception
                        done[res["run_id"]] = res
                        finished(res)
                _drain(q, bar)
            except BaseException:  # interrupted, terminated or a run failed: stop the others now
                _stop_workers(pool)
                raise
            else:
                pool.shutdown(wait=True)
            finally:
                q.close()
                q.cancel_join_thread()

    results = [done[c.run_id] for c in configs]
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "results.csv", results_to_csv(results))
    return SweepOutcome(results, trained=len(pending), skipped=skipped, wall_seconds=time.perf_counter() - t0)


class _ProgressSink:
    """Queue-like sink that advances the progress (in-process runs)."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar

    def put(self, item: tuple[int, bool]) -> None:
        self.bar.advance(*item)


def _drain(q: Any, bar: Progress) -> None:
    while True:
        try:
            k, credited = q.get_nowait()
        except queue_mod.Empty:
            return
        bar.advance(k, credited)
