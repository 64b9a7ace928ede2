"""One writer per folder: an exclusive lock that dies with the process holding it.

    with folder_lock(run_dir, "train lm"):     # a second process gets FolderLocked (exit 2)
        ...                                     # write into run_dir

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a lock file (by default ``FOLDER/.tokenmix.lock``); the
kernel drops it when the holding process ends, however it ends (exit, exception, SIGKILL), so a
lock can never go stale: a lock file left behind by a killed process is simply taken again. The
holder writes its pid and command into the file, and the refusal names them. The file is removed on release; a
process that opened it before the removal notices (the path no longer names the file it locked)
and tries again, so removing it never lets two holders in.

Within one process the lock is re-entrant (``tokenmix compare`` holds its folder while the sweep
inside takes it again). Where ``fcntl`` is missing (Windows) the lock file is created with
``O_EXCL`` and a lock whose recorded pid no longer runs is taken over.

``wait=True`` blocks until the holder is done instead of refusing (a second preparation of the same
data waits for the first and then reuses what it wrote).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

from tokenmix.core.errors import InputError
from tokenmix.core.files import read_text_file

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_NAME = ".tokenmix.lock"

# re-entrancy: lock file path -> (fd, depth) held by this process
_HELD: dict[str, tuple[int, int]] = {}


class FolderLocked(InputError):
    """Another process holds the folder's lock (it is writing there now)."""


def _holder(path: Path) -> str:
    """Who holds the lock, from what it wrote into the file: "process PID (`tokenmix COMMAND`)"."""
    try:  # a regular file only: whatever else sits at the lock's path is never waited on
        pid, _, what = read_text_file(path, "lock file", max_bytes=4096, errors="replace").strip().partition(" ")
    except InputError:
        return "another process"
    if not pid.isdigit():
        return "another process"
    return f"process {pid}" + (f" (`tokenmix {what}`)" if what else "")


def _refusal(folder: Path, path: Path, what: str) -> FolderLocked:
    return FolderLocked(
        f"cannot {what} into '{folder}': it is in use by {_holder(path)}, which is writing there; "
        "wait for it to finish or use another folder"
    )


def _acquire_flock(path: Path, folder: Path, what: str, wait: bool) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if wait:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise _refusal(folder, path, what) from None
            try:  # still the file at the path? (the previous holder may have removed it meanwhile)
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _acquire_exclusive_file(path: Path, folder: Path, what: str, wait: bool) -> int:  # pragma: no cover
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            text = path.read_text().strip().partition(" ")[0] if path.is_file() else ""
            if text.isdigit() and not _pid_alive(int(text)):
                path.unlink(missing_ok=True)  # its holder is gone: a stale lock
                continue
            if not wait:
                raise _refusal(folder, path, what) from None
            time.sleep(0.2)


def holds_lock(folder: str | os.PathLike, lock_file: str | os.PathLike | None = None) -> bool:
    """Whether this process holds the lock of ``folder`` (``folder_lock``, same ``lock_file``) now:
    what a caller checks before it removes what a killed writer left there."""
    path = Path(lock_file) if lock_file is not None else Path(folder) / LOCK_NAME
    return os.path.abspath(path) in _HELD


@contextlib.contextmanager
def folder_lock(
    folder: str | os.PathLike, what: str, *, lock_file: str | os.PathLike | None = None, wait: bool = False
) -> Iterator[Path]:
    """Hold the exclusive lock of ``folder`` for the ``with`` block.

    Args:
        folder: the folder written under the lock; it must exist unless ``lock_file`` is given.
        what: the command holding it, for the refusal (``train lm``, ``compare``, ``data prepare``).
        lock_file: where the lock lives (default ``folder/.tokenmix.lock``); a folder that must stay
            empty until it is complete (a data directory renamed into place) keeps it beside itself.
        wait: block until the holder is done instead of raising ``FolderLocked``.
    """
    folder = Path(folder)
    path = Path(lock_file) if lock_file is not None else folder / LOCK_NAME
    key = os.path.abspath(path)
    if key in _HELD:  # this process holds it already
        fd, depth = _HELD[key]
        _HELD[key] = (fd, depth + 1)
        try:
            yield path
        finally:
            fd, depth = _HELD[key]
            _HELD[key] = (fd, depth - 1)
        return
    try:
        fd = (_acquire_flock if fcntl is not None else _acquire_exclusive_file)(path, folder, what, wait)
    except FolderLocked:
        raise
    except OSError as e:
        raise InputError(f"cannot lock '{folder}': {e.strerror or e}") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {what}".encode())
        _HELD[key] = (fd, 1)
        yield path
    finally:
        _HELD.pop(key, None)
        try:
            path.unlink(missing_ok=True)  # while still holding it: nobody can have it now
        except OSError:
            pass
        os.close(fd)  # releases the flock


__all__ = ["FolderLocked", "LOCK_NAME", "folder_lock", "holds_lock"]
