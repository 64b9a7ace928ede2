"""Hang detection by the work a process has done, not by the wall clock.

A test that detects a hang used to fail when a command had not answered within N wall-clock seconds;
on a busy machine (load 20 on 2 cores) a healthy command gets a twentieth of a core and misses any
such limit. The verdict here is the command's own progress instead:

- **CPU budget**: it fails when the command (its process and every descendant, all threads) has
  used more than ``cpu_seconds`` of CPU time without answering: a loop or an absurd allocation.
  A starved process uses CPU time at the rate it is given, so load does not change the verdict.
- **Blocked**: it fails when no thread of the command has been runnable (state R) or in disk
  wait (D) and its CPU time has not moved for ``idle_seconds``: a read from a FIFO, a lock never
  released. A healthy command on a loaded machine is runnable, so this does not fire either.
- **Ceiling**: a wall-clock ``ceiling_seconds`` far above any honest run, only as a last resort
  against something neither rule sees (it keeps the suite from running forever). It does not decide
  the verdict under ordinary load, however busy the machine.

``run_guarded`` runs a command in a child process, ``guarded`` watches code in this process (the
in-process CLI cases), ``wait_until`` waits for a condition while a child makes progress.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

CPU_SECONDS = 60.0  # a fresh interpreter importing torch uses ~3 s of CPU; 20x room
IDLE_SECONDS = 30.0  # asleep with no CPU used for this long: blocked, not slow
CEILING_SECONDS = 1800.0  # last resort only (see the module docstring); never reached under load
POLL_SECONDS = 0.2
_BUSY_STATES = {"R", "D"}  # running or runnable; uninterruptible disk wait


class NoProgress(AssertionError):
    """The watched command spent its CPU budget, or sat blocked, without answering."""


@dataclass
class Watch:
    """The verdict from samples of (CPU seconds used so far, any thread runnable)."""

    cpu_seconds: float = CPU_SECONDS
    idle_seconds: float = IDLE_SECONDS
    ceiling_seconds: float = CEILING_SECONDS
    cpu: float = 0.0
    _start: float = field(default_factory=lambda: time.monotonic())
    _last_move: float = field(default_factory=lambda: time.monotonic())

    def verdict(self, cpu: float, busy: bool) -> str | None:
        """None while the command is making progress; else why it is judged hung."""
        now = time.monotonic()
        if cpu > self.cpu or busy:
            self._last_move = now
        self.cpu = max(self.cpu, cpu)
        if self.cpu > self.cpu_seconds:
            return f"used {self.cpu:.1f} s of CPU time (budget {self.cpu_seconds} s) without answering"
        if now - self._last_move > self.idle_seconds:
            return f"blocked: no thread runnable and no CPU used for {self.idle_seconds} s"
        if now - self._start > self.ceiling_seconds:
            return f"still running after the last-resort ceiling of {self.ceiling_seconds} s"
        return None


def _thread_states(pid: int, skip: int | None = None) -> list[str]:
    """The scheduler state letter of each thread of pid (empty when it is gone)."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        if skip is not None and int(tid) == skip:
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                out.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue
    return out


class TreeSampler:
    """CPU seconds used since construction, and runnability, of processes (one pid or several) and
    all their descendants (descendants that ended still count, up to their last sample)."""

    def __init__(self, pids: int | list[int]):
        self.roots: list[psutil.Process] = []
        for pid in [pids] if isinstance(pids, int) else pids:
            with contextlib.suppress(psutil.Error):
                self.roots.append(psutil.Process(pid))
        self.seen: dict[int, float] = {}
        self.base = self._total()[0]

    def _total(self) -> tuple[float, bool]:
        busy = False
        procs = {}
        for root in self.roots:
            with contextlib.suppress(psutil.Error):
                procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        for p in procs.values():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                # a descendant that ended keeps its last sample in `seen` (the parent's children_* times
                # would count it a second time once reaped)
                self.seen[p.pid] = max(self.seen.get(p.pid, 0.0), t.user + t.system)
                busy = busy or bool(_BUSY_STATES.intersection(_thread_states(p.pid)))
        return sum(self.seen.values()), busy

    def sample(self) -> tuple[float, bool]:
        total, busy = self._total()
        return total - self.base, busy


def _kill_tree(proc: subprocess.Popen) -> None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(OSError):
        proc.kill()


def run_guarded(
    cmd: list[str],
    *,
    cpu_seconds: float = CPU_SECONDS,
    idle_seconds: float = IDLE_SECONDS,
    ceiling_seconds: float = CEILING_SECONDS,
    **popen_kwargs,
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)`` judged by progress, not time.

    Raises NoProgress (and kills the command's process tree) when the command is judged hung. The
    result carries ``cpu_seconds``: the CPU time the command and its descendants used."""
    popen_kwargs.setdefault("text", True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen_kwargs)
    sampler, watch = TreeSampler(proc.pid), Watch(cpu_seconds, idle_seconds, ceiling_seconds)
    while True:
        try:
            out, err = proc.communicate(timeout=POLL_SECONDS)  # a poll interval, not a verdict
            break
        except subprocess.TimeoutExpired:
            reason = watch.verdict(*sampler.sample())
            if reason:
                _kill_tree(proc)
                out, err = proc.communicate()
                raise NoProgress(f"{' '.join(map(str, cmd))[:200]}: {reason}\n{(err or '')[-2000:]}") from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    done.cpu_seconds = watch.cpu  # type: ignore[attr-defined]
    return done


def wait_until(
    condition: Callable[[], bool],
    proc: subprocess.Popen,
    *,
    cpu_seconds: float = CPU_SECONDS,
    idle_seconds: float = IDLE_SECONDS,
    ceiling_seconds: float = CEILING_SECONDS,
) -> None:
    """Return once condition() holds; raise NoProgress when proc (a running child) is judged hung first,
    or AssertionError when it exits first."""
    sampler, watch = TreeSampler(proc.pid), Watch(cpu_seconds, idle_seconds, ceiling_seconds)
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the process exited with status {proc.returncode} before the condition held")
        reason = watch.verdict(*sampler.sample())
        if reason:
            raise NoProgress(reason)
        time.sleep(POLL_SECONDS)


def wait_for_exit(pids: list[int], *, cpu_seconds: float = 30.0, idle_seconds: float = IDLE_SECONDS) -> list[int]:
    """Wait until every pid has exited, or they are judged not to be exiting: together (with their
    descendants) they used cpu_seconds of CPU (still working), or none of them was runnable for
    idle_seconds (all blocked; one blocked alone, e.g. a helper waiting for its parent, is not judged).
    Returns the pids still alive. Processes on their way out are runnable, however busy the machine."""
    sampler, watch = TreeSampler(pids), Watch(cpu_seconds, idle_seconds)
    while True:
        running = [pid for pid in pids if alive(pid)]
        if not running or watch.verdict(*sampler.sample()):
            return running
        time.sleep(POLL_SECONDS)


def child_pids(pid: int) -> list[int]:
    """The pids whose parent is ``pid``, read from /proc (live children, zombies included)."""
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d.name))
    return kids


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (exists, and is neither a zombie nor dead)."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    return False


@contextlib.contextmanager
def guarded(
    cpu_seconds: float = 10.0, *, idle_seconds: float = IDLE_SECONDS, ceiling_seconds: float = CEILING_SECONDS
) -> Iterator[Watch]:
    """Run the block in this (main) thread; raise NoProgress inside it when it is judged hung.

    A watchdog thread samples this process's CPU time (less its own) and its other threads' states,
    and interrupts the main thread with SIGALRM when the verdict is reached; the handler raises. The
    yielded Watch's ``cpu`` is the CPU time the block used."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("guarded() interrupts the main thread; call it there")
    watch = Watch(cpu_seconds, idle_seconds, ceiling_seconds)
    stop, reason = threading.Event(), []
    main_ident, pid = threading.main_thread().ident, os.getpid()

    def watchdog() -> None:
        me = threading.get_native_id()
        own0, cpu0 = time.thread_time(), time.process_time()
        while not stop.wait(POLL_SECONDS):
            cpu = (time.process_time() - cpu0) - (time.thread_time() - own0)
            why = watch.verdict(cpu, bool(_BUSY_STATES.intersection(_thread_states(pid, skip=me))))
            if why:
                reason.append(why)
                signal.pthread_kill(main_ident, signal.SIGALRM)
                return
        watch.cpu = max(watch.cpu, (time.process_time() - cpu0) - (time.thread_time() - own0))

    def _raise(signum, frame):
        raise NoProgress(reason[0] if reason else "interrupted")

    old = signal.signal(signal.SIGALRM, _raise)
    thread = threading.Thread(target=watchdog, name="progress-guard", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGALRM, old)
