"""Progress of a long job, on a terminal and in a log.

On a terminal: rich's live bar. Anywhere else (``make compare > log``, CI, a pipe): plain lines on
stderr, one when the job starts, then at most one every ``every`` seconds and one at each milestone
(a finished run, say), each ``label: done/total unit (percent), m:ss elapsed, ETA in m:ss`` (the ETA
is the time left, never a clock time); stdout stays free for a command's results (JSON, tables).

Work that may end early (a run stopped by its learning budget before its maximum steps) is
*credited*: ``advance(k, credited=True)`` moves the count without counting as work done, so the
ETA is the work left at the rate of real work, scaled by the share of the budget that finished
work actually used (``used / (used + credited)``): the runs ahead are expected to stop as early.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

LOG_EVERY_SECONDS = 30.0
BUSY_LOAD = 0.5  # 1-min load average (other work, before a job starts) that makes its stated duration optimistic


def busy_cores(sample_seconds: float = 0.3) -> float | None:
    """Cores other work keeps busy now: the non-idle share of all cores over a short sample of
    /proc/stat (this process sleeps through it), times the core count; the 1-min load average where
    /proc/stat is missing. (The load average alone lags: a job that just ended still counts.)"""

    def ticks() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)  # total, idle + iowait

    try:
        total0, idle0 = ticks()
        time.sleep(sample_seconds)
        total1, idle1 = ticks()
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except OSError:  # pragma: no cover - platforms without a load average
            return None
    cores = os.cpu_count() or 1
    return cores * (1 - (idle1 - idle0) / max(total1 - total0, 1))


def load_warning(load: float | None = None, cores: int | None = None) -> str | None:
    """A line saying that other work holds the machine (``busy_cores`` >= ``BUSY_LOAD`` before the
    job starts), so durations stated for a quiet machine will be exceeded; None when it is quiet."""
    if load is None:
        load = busy_cores()
        if load is None:
            return None
    cores = cores or os.cpu_count() or 1
    if load < BUSY_LOAD:
        return None
    return (
        f"the machine is busy before this job starts ({load:.1f} of {cores} cores taken by other work): it will "
        f"take longer than durations stated for a quiet machine (about {min(load, cores) / cores:.0%} of the "
        "cores are taken)"
    )


def format_seconds(seconds: float) -> str:
    """h:mm:ss or m:ss."""
    seconds = max(int(round(seconds)), 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_eta(seconds: float) -> str:
    """The time left, worded so it cannot be read as a clock time: 'ETA in 12:34', 'ETA in 1:02:05'."""
    return f"ETA in {format_seconds(seconds)}"


class Progress:
    """One job's progress: ``advance`` as work is done, ``note`` what it is doing, ``milestone``
    to log an event now; use as a context manager (or call ``close``).

    Args:
        label: the job, e.g. "compare frontier".
        total: units of work (0: unknown, then no percentage and no ETA).
        unit: what a unit is ("steps", "runs", "mixers").
        enabled: False shows nothing at all.
        stream: where plain lines go (default stderr); a terminal stream gets the live bar.
        every: seconds between plain lines.
        console: a rich Console for the live bar (default: one on ``stream``).
        check_load: warn once, at the start, when other work already loads the machine (``load_warning``).
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "steps",
        enabled: bool = True,
        stream: TextIO | None = None,
        every: float = LOG_EVERY_SECONDS,
        console: Any = None,
        check_load: bool = False,
    ) -> None:
        self.label, self.total, self.unit, self.enabled = label, max(int(total), 0), unit, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.done = 0  # units counted (work done + credited)
        self.used = 0  # units of real work
        self.credited = 0  # units credited without work (early stops)
        self.text = ""
        self.start = time.monotonic()
        self._last_line = self.start
        self._bar = self._task = None
        if not enabled:
            return
        if console is not None or getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            console = console if console is not None else Console(file=self.stream)
            if console.is_terminal:
                self._bar = RichProgress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn(unit),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=console,
                    transient=False,
                )
                self._bar.start()
                self._task = self._bar.add_task(label, total=self.total or None)
                self._warn_load(check_load)
                return
        self._line("started")
        self._warn_load(check_load)

    def _warn_load(self, check: bool) -> None:
        note = load_warning() if check else None
        if note:
            self.warn(note)

    # ------------------------------------------------------------------------------------------
    def eta_seconds(self) -> float | None:
        """Seconds left at the rate of real work so far (None before any work, or without a total)."""
        elapsed = time.monotonic() - self.start
        if not self.total or self.used <= 0 or elapsed <= 0:
            return None
        share = self.used / max(self.used + self.credited, 1)  # of a budget that work actually used
        return (self.total - self.done) * share / (self.used / elapsed)

    def describe(self) -> str:
        elapsed = time.monotonic() - self.start
        parts = [f"{self.done:,}/{self.total:,} {self.unit}" if self.total else f"{self.done:,} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.done / self.total:.0f}%)"
        parts.append(f"{format_seconds(elapsed)} elapsed")
        eta = self.eta_seconds()
        if eta is not None and self.done < self.total:
            parts.append(format_eta(eta))
        return ", ".join(parts)

    def _line(self, event: str = "") -> None:
        self._last_line = time.monotonic()
        text = f" {self.text}" if self.text else ""
        print(
            f"{self.label}:{text} {self.describe()}" + (f" -- {event}" if event else ""), file=self.stream, flush=True
        )

    # ------------------------------------------------------------------------------------------
    def advance(self, k: int, credited: bool = False, event: str | None = None) -> None:
        """``k`` more units done (``credited``: done before, e.g. a resumed run's). ``event``: in a
        log, a line now carrying it (``milestone``), instead of the periodic line."""
        self.done += k
        if credited:
            self.credited += k
        else:
            self.used += k
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
        elif event is not None or time.monotonic() - self._last_line >= self.every:
            self._line(event or "")

    def note(self, text: str) -> None:
        """What the job is doing now (shown in the bar, and in the next plain line)."""
        self.text = text
        if self.enabled and self._bar is not None:
            self._bar.update(self._task, description=f"{self.label} {text}")

    def milestone(self, event: str) -> None:
        """An event worth a line in a log now (a run finished); the bar just moves on."""
        if self.enabled and self._bar is None:
            self._line(event)

    def warn(self, message: str) -> None:
        """One line of warning, on the terminal above the bar or in the log."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(f"[yellow]{message}[/yellow]")
        else:
            print(f"{self.label}: {message}", file=self.stream, flush=True)

    def close(self, finished: bool = True) -> None:
        """Stop the bar; in a log, a last ``-- done`` line, only when the job ``finished`` (a job
        stopped by an error or Ctrl-C is not done, and its one error line stays the only one)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif finished:
            self._line("done")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(finished=exc_type is None)


__all__ = ["BUSY_LOAD", "LOG_EVERY_SECONDS", "Progress", "format_eta", "format_seconds", "load_warning"]
