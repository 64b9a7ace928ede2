"""``bench ... --device``: the device check and the clock it selects (bench/device.py), on the CPU.

The CUDA clock itself (events around a synchronised call) runs only where a GPU is
(scripts/gpu_check.sh); here: which clock a device gets, the one-line refusals, and that the host
clock times the work (not the clock that is not there).
"""

from __future__ import annotations

import time

import pytest
import torch

from lm_helpers import run_cli
from tokenmix.bench import device as bench_device
from tokenmix.core.errors import InputError


def test_each_device_gets_its_clock():
    assert bench_device.clock("cpu") == "host"
    assert bench_device.clock("cuda") == "cuda_events"
    with pytest.raises(InputError, match=r"^--device must be one of cpu, cuda, got 'tpu'$"):
        bench_device.clock("tpu")


def test_cuda_is_refused_in_one_line_where_there_is_none():
    with pytest.raises(InputError, match=r"^--device cuda: no CUDA device is available here"):
        bench_device.check_device("cuda", cuda_available=False)
    assert bench_device.check_device("cuda", cuda_available=True) == "cuda"
    assert bench_device.check_device("cpu", cuda_available=False) == "cpu"


def test_the_host_clock_times_the_call_after_its_warm_up(monkeypatch):
    calls = []

    def work():
        calls.append(time.perf_counter())
        time.sleep(0.02 if len(calls) == 1 else 0.001)  # the warm-up is the slow one

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: pytest.fail("the CPU clock synchronised CUDA"))
    times = bench_device.time_on(work, repeats=3, device="cpu", warmup=1)
    assert len(calls) == 4 and len(times["wall"]) == 3
    assert max(times["wall"]) < 0.015  # the warm-up call is not among the timed ones
    assert bench_device.peak_device_mb("cpu") == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
@pytest.mark.parametrize("bench", ["mixers", "decode", "solver", "lm"])
def test_bench_refuses_cuda_without_a_device(bench, capsys):
    rc, out, err = run_cli(["bench", bench, "--device", "cuda"], capsys)
    assert rc == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert last.endswith("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False)")
