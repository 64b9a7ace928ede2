"""The one atomic write: every file or folder tokenmix leaves on disk appears whole or not at all.

    with atomic_path(final) as tmp:   # write a file, or fill a folder, at tmp
        ...
    # now final is tmp's content; on an exception tmp is removed and final is untouched

The content goes to a temporary name in the same folder (so the rename never crosses a file
system), is flushed to disk (``fsync`` of the file or of every file in the folder), and then
``os.replace`` puts it at the final name, which is atomic on POSIX; the parent folder is synced
last so that the rename itself survives a crash. A reader (a resumed sweep, ``tokenmix report``,
a second process preparing the same data) therefore sees the old content or the new, never half.

It sits in ``core`` because every layer writes files: the data preparation (``data``), run records
and checkpoints (``runs``), figures and reports (``analysis``, ``study``).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from tokenmix.core.errors import InputError


def fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries and every file below it, to disk."""
    path = Path(path)
    if path.is_dir():
        for child in path.rglob("*"):
            if child.is_file():
                fsync_path(child)
        fsync_entries(path)
    else:
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def fsync_entries(folder: Path) -> None:
    """Flush a folder's own entries (names), not the files below it: what makes a rename durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, *, folder: bool = False, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on a clean exit it replaces ``final`` atomically.

    Args:
        final: the path the content ends up at; its parent folder must exist.
        folder: yield an empty folder to fill (a prepared data set, a checkpoint) instead of a file
            name. ``os.replace`` of a folder needs ``final`` absent or an empty folder.
        suffix: ending of the temporary name (e.g. ``.png``, so that writers that pick a format by
            the file's ending still see it).
    """
    final = Path(final)
    if folder:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f".tmp{suffix}", dir=final.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_entries(final.parent)  # the rename; the parent's other files are not ours to flush
    except BaseException:
        _remove(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy the file ``src`` to ``dst`` so that ``dst`` is the old content or the whole copy."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
    return Path(dst)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def prepare_output_dir(path: str | Path) -> Path:
    """Create ``path`` (and parents) and check it is writable; one clear ``ValueError`` otherwise.

    Nothing is left behind on failure: directories this call created are removed again.
    """
    path = Path(path)
    created: list[Path] = []
    try:
        missing = [p for p in [path, *path.parents] if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            created.append(p)
        if not path.is_dir():
            raise NotADirectoryError("exists and is not a directory")
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        for p in reversed(created):
            try:
                p.rmdir()
            except OSError:
                pass
        reason = e.strerror or str(e)
        raise InputError(f"cannot write to output directory '{path}': {reason}") from None
    return path
