"""``tokenmix bench step``: CPU and wall milliseconds of one training step of a compare preset's run
(its model, task and batch), each case in a fresh process. Here, not in ``bench/``, because it times
``training.synthetic``'s own step on a preset's configs (benchmarks stay apart from training).

Two environments per run config, timed in alternation:
    cli      what ``tokenmix compare`` gives a worker: OMP_WAIT_POLICY=PASSIVE set before torch
             loads, one torch thread;
    python   a library user's plain ``python`` process calling ``train_one``: torch imported
             first, no OpenMP setting, the threads ``train_one`` takes by default (the defect
             behind it: compiled kernels whose idle worker threads spun made such a step cost
             ~10x the CLI's CPU on a loaded machine).
``busy`` single-threaded matmul loops run beside the whole benchmark (the contention of a shared
machine, as in ``bench mixers --busy``). The step is ``training.synthetic.train_step``, the one
``train_one`` runs: answer positions' logits, cross-entropy, backward, clipping, the optimiser;
``steps`` of them are timed after ``warmup``, best of ``repeats`` blocks, per step.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

import torch

from tokenmix.bench.mixers import start_busy
from tokenmix.bench.worker import case_main, run_in_subprocess
from tokenmix.models import MixerModel
from tokenmix.runs.clocks import time_repeats
from tokenmix.runs.synthetic import SyntheticRunConfig
from tokenmix.training.optim import build_optimizer
from tokenmix.training.synthetic import RUN_THREADS, dataset, train_step

CASE_MODULE = "tokenmix.study.step_bench"
ENVIRONMENTS = ("cli", "python")


def prepare_step_case(case: dict) -> tuple[Any, dict]:
    """(fn, extra): fn runs ``case["steps"]`` training steps of the run config ``case["config"]``."""
    cfg = SyntheticRunConfig.from_dict(case["config"])
    tc = cfg.train
    data = dataset(cfg.task_config(), tc.batch_size * 8, cfg.seed)
    torch.manual_seed(cfg.seed)
    model = MixerModel(cfg.model_config())
    opt = build_optimizer(model, tc.lr, tc.weight_decay)
    batches = [
        (
            data.inputs[i * tc.batch_size : (i + 1) * tc.batch_size],
            data.labels[i * tc.batch_size : (i + 1) * tc.batch_size],
        )
        for i in range(8)
    ]
    state = {"i": 0}

    def step() -> None:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        train_step(model, opt, x, y, tc).item()

    def block() -> None:
        for _ in range(case["steps"]):
            step()

    for _ in range(case["warmup"]):
        step()
    times = time_repeats(block, case["repeats"], warmup=0)
    return (lambda: None), {
        "cpu_ms_per_step": 1000 * min(times["cpu"]) / case["steps"],
        "wall_ms_per_step": 1000 * min(times["wall"]) / case["steps"],
        "threads_used": torch.get_num_threads(),
    }


def environment(kind: str) -> dict[str, str]:
    """The process environment of a case (module docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER")}
    if kind == "cli":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def run(
    configs: Sequence[SyntheticRunConfig],
    steps: int = 20,
    warmup: int = 5,
    repeats: int = 3,
    environments: Sequence[str] = ENVIRONMENTS,
    busy: int = 0,
    progress=None,
) -> dict:
    """Time a step of each run config in each environment (alternating, one process per case)."""
    busy_procs = start_busy(busy)
    results = []
    try:
        for cfg in configs:
            for kind in environments:
                case = {
                    "kind": "synthetic_step",
                    "label": cfg.label,
                    "column": cfg.column_name,
                    "environment": kind,
                    "config": cfg.to_dict(),
                    "steps": steps,
                    "warmup": warmup,
                    "repeats": repeats,
                }
                case["threads"] = RUN_THREADS  # compare's workers, and train_one's default
                r = run_in_subprocess(case, CASE_MODULE, env=environment(kind))
                r.pop("config", None)
                results.append(r)
                if progress:
                    progress(r)
    finally:
        for proc in busy_procs:
            proc.kill()
            proc.wait()
    summary: dict[str, dict[str, float]] = {}
    for r in results:
        if "cpu_ms_per_step" in r:
            row = summary.setdefault(r["label"], {})
            row[f"{r['environment']}_cpu_ms"] = round(r["cpu_ms_per_step"], 2)
            row[f"{r['environment']}_wall_ms"] = round(r["wall_ms_per_step"], 2)
    for row in summary.values():
        if "cli_cpu_ms" in row and "python_cpu_ms" in row:
            row["python_over_cli_cpu"] = round(row["python_cpu_ms"] / row["cli_cpu_ms"], 2)
    return {
        "benchmark": "synthetic_step",
        "busy_processes": busy,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "results": results,
        "summary": summary,
    }


if __name__ == "__main__":
    case_main(prepare_step_case)
