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

Reading a file a user may have put there goes through the guarded readers here, for the same reason:

    read_json(path, "config file")            # the one JSON reader: one InputError line naming the file
    read_text_file(path, "notes", within=run)  # a regular file inside ``run``, of bounded size

They stat before they open and read regular files only (a FIFO would block the open forever, a
device never end), refuse a file larger than a limit, one that a symbolic link takes outside the
folder ``within`` (a run folder never lends another folder's files), text that is not UTF-8, and
JSON that nests deeper than ``MAX_JSON_DEPTH`` or holds an integer longer than
``MAX_JSON_INT_DIGITS`` digits (which the standard decoder would meet with a RecursionError or a
ValueError). ``check_output_dir`` says whether a folder can be made and written before any work
is done, creating nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from tokenmix.core.errors import InputError, MissingInput


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


# the temporary names atomic_path makes: ".<final name>.<8 random characters>.tmp[<suffix>]"
_TEMPORARY = re.compile(r"\.(?P<final>.+)\.[a-z0-9_]{8}\.tmp(?:\.[A-Za-z0-9]+)?")


def temporary_of(name: str) -> str | None:
    """The final name whose ``atomic_path`` temporary ``name`` is, or None when it is none."""
    m = _TEMPORARY.fullmatch(name)
    return m.group("final") if m else None


def remove_temporaries(folder: str | os.PathLike, final: Callable[[str], bool]) -> list[Path]:
    """Remove the ``atomic_path`` temporaries in ``folder`` (not below it) whose final name ``final``
    accepts; returns them. Only for a caller that knows no writer is running (it holds the folder's
    lock): a temporary of a live writer would vanish under it."""
    removed = []
    for p in sorted(Path(folder).iterdir()):
        name = temporary_of(p.name)
        if name is not None and final(name):
            _remove(p)
            removed.append(p)
    return removed


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
    """Create ``path`` (and parents) and check it is writable (``check_output_dir`` first); one
    ``InputError`` line otherwise.

    Nothing is left behind on failure: directories this call created are removed again.
    """
    path = Path(path)
    check_output_dir(path)
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


# --------------------------------------------------------------------------------------- reading
MAX_JSON_BYTES = 256 * 2**20  # the largest JSON file read (run records are kilobytes, analysis results megabytes)
MAX_JSON_DEPTH = 64  # nesting of arrays and objects (tokenmix writes at most a handful of levels)
MAX_JSON_INT_DIGITS = 1000  # digits of one integer (every integer field is far below; Python's own limit is 4300)
MAX_TEXT_BYTES = 64 * 2**20  # a text file shown or parsed whole (metrics, notes, Markdown)

_FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO (named pipe)", "a folder", ...)."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether ``path``, every symbolic link followed, lies in the folder ``root`` (followed too)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    return True


def check_inside(path: str | os.PathLike, root: str | os.PathLike, what: str) -> None:
    """Refuse (InputError) a path that a symbolic link takes out of the folder ``root``."""
    if not inside(path, root):
        raise InputError(
            f"{what} '{path}' is a symbolic link out of '{root}' (to '{Path(path).resolve()}'); "
            "files of another folder are not read"
        )


def check_regular_file(
    path: str | os.PathLike, what: str, *, within: str | os.PathLike | None = None, max_bytes: int | None = None
) -> os.stat_result:
    """The ``stat`` of ``path`` after refusing (InputError) a path that does not exist (``MissingInput``),
    is no regular file, leaves the folder ``within`` or is larger than ``max_bytes``; opens nothing."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise MissingInput(
                f"{what} '{path}' is a symbolic link to '{os.readlink(path)}', which does not exist"
            ) from None
        raise MissingInput(f"{what} '{path}' does not exist") from None
    except OSError as e:
        raise InputError(f"{what} '{path}' cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} '{path}' is {file_kind(st.st_mode)}, not a regular file")
    if within is not None:
        check_inside(path, within, what)
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(f"{what} '{path}' is {st.st_size:,} bytes, more than the {max_bytes:,} read at most")
    return st


def read_regular_bytes(
    path: str | os.PathLike, what: str, *, max_bytes: int = MAX_TEXT_BYTES, within: str | os.PathLike | None = None
) -> bytes:
    """The content of a regular file (``check_regular_file``); the file opened is checked again
    (``fstat``), so that one swapped for a FIFO between the check and the open is refused too."""
    checked = check_regular_file(path, what, within=within, max_bytes=max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"{what} '{path}' cannot be read: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} '{path}' is {file_kind(st.st_mode)}, not a regular file")
        if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
            raise InputError(f"{what} '{path}' was replaced while it was read; try again")
        os.set_blocking(f.fileno(), True)
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise InputError(f"{what} '{path}' cannot be read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise InputError(f"{what} '{path}' is more than the {max_bytes:,} bytes read at most")
    return data


def read_text_file(
    path: str | os.PathLike,
    what: str,
    *,
    max_bytes: int = MAX_TEXT_BYTES,
    within: str | os.PathLike | None = None,
    errors: str = "strict",
) -> str:
    """A regular file as UTF-8 text (``read_regular_bytes``); ``errors="replace"`` shows bad bytes as U+FFFD."""
    data = read_regular_bytes(path, what, max_bytes=max_bytes, within=within)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise InputError(
            f"{what} '{path}' is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


class _TooManyDigits(ValueError):
    pass


def _json_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_JSON_INT_DIGITS:
        raise _TooManyDigits(len(text))
    return int(text)


def parse_json(text: str, what: str) -> Any:
    """``json.loads`` of ``text`` (named ``what`` in the message), refusing in one InputError line what
    is not JSON, nests deeper than ``MAX_JSON_DEPTH`` or holds an integer of more than
    ``MAX_JSON_INT_DIGITS`` digits."""
    if "[" in text or "{" in text:
        depth = deepest = 0
        for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub("", text)):
            depth += 1 if bracket in "[{" else -1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    raise InputError(f"{what} nests arrays or objects more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text, parse_int=_json_int)
    except _TooManyDigits:
        raise InputError(f"{what} holds an integer of more than {MAX_JSON_INT_DIGITS} digits") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{what} is not valid JSON ({e})") from None
    except (RecursionError, ValueError) as e:  # ValueError: a number Python cannot convert
        why = str(e).splitlines()[0] if str(e) else ""
        raise InputError(f"{what} is not valid JSON ({type(e).__name__}: {why})") from None


def read_json(
    path: str | os.PathLike, what: str, *, max_bytes: int = MAX_JSON_BYTES, within: str | os.PathLike | None = None
) -> Any:
    """The one JSON reader: the document in the regular file ``path``, read as ``read_text_file`` reads
    and parsed as ``parse_json`` parses; anything wrong is one InputError line naming ``what`` and the file."""
    text = read_text_file(path, what, max_bytes=max_bytes, within=within)
    return parse_json(text, f"{what} '{path}'")


# --------------------------------------------------------------------------------------- writing checks
def _probe_writable(folder: Path) -> None:
    """Make and remove an empty folder in ``folder``: the only sure test (root passes ``os.access``
    everywhere, and /proc or a read-only mount still refuse)."""
    os.rmdir(tempfile.mkdtemp(prefix=".tokenmix-probe.", dir=folder))


def check_output_dir(path: str | os.PathLike, what: str = "output directory") -> Path:
    """Refuse (InputError) a folder ``path`` that could not be made or written into, before any work is
    done and without creating anything: a file in the way (of ``path`` or of a folder above it), a
    symbolic link to nothing, a place that takes no new entries (/proc, a read-only mount, no
    permission). Returns ``path``."""
    path = Path(path)
    noun = "folder" if what.endswith("folder") else "directory"  # the caller's word for it
    where = path
    try:
        for p in [path, *path.parents]:
            where = p
            if p.is_symlink() and not p.exists():
                raise InputError(
                    f"cannot write to {what} '{path}': '{p}' is a symbolic link to "
                    f"'{os.readlink(p)}', which does not exist"
                )
            if p.exists():
                if not p.is_dir():
                    raise InputError(f"cannot write to {what} '{path}': '{p}' exists and is not a {noun}")
                _probe_writable(p)
                return path
    except OSError as e:
        shown = "" if where == path else f"nothing can be created in '{where}': "
        raise InputError(f"cannot write to {what} '{path}': {shown}{e.strerror or e}") from None
    return path
