"""Corpus -> deterministic document split -> byte-level BPE -> token ids in memory-mapped arrays.

A prepared directory holds:

    tokenizer.json          HF tokenizers byte-level BPE, trained on the train split only
    train.bin val.bin test.bin   token ids (uint16, or uint32 for vocabularies over 65536), each
                            document preceded by the separator token
    meta.json               the preparation key, the documents of each split, token counts

The split is by document: documents are ordered by the SHA-256 of their name (so it does not
depend on file-system order and adding a document moves no other one), then the first ones go to
validation until it holds ``val_fraction`` of the characters, the next ones to test, the rest to
train. Preparation is written to a temporary directory and renamed into place, so an interrupted
run never leaves a half-prepared directory that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmix.core.errors import InputError, MissingInput
from tokenmix.core.files import check_output_dir, read_json
from tokenmix.core.lock import folder_lock
from tokenmix.core.progress import Progress
from tokenmix.data.corpora import CorpusError, Document, corpus_identity, default_cache_dir, load_corpus
from tokenmix.data.tokenizer import check_vocab_size, encode_documents, load_tokenizer, separator_id, train_bpe

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class DataConfig:
    """What to train on. ``corpus``: excerpt | shakespeare | kjv | pydocs | a path (file or folder; text
    files, or JSONL/JSON/Parquet/CSV records whose text is in the column ``text_field``)."""

    corpus: str = "excerpt"
    vocab_size: int = 2048
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    doc_chars: int = 4000  # a single-file corpus is cut at blank lines into documents of about this size
    dir: str = ""  # prepared-data directory; "" = a cache entry keyed by the fields above
    text_field: str = "text"  # the column of record files (JSONL, JSON, Parquet, CSV) that holds the text

    def __post_init__(self) -> None:
        if not self.corpus:
            raise InputError("data.corpus must not be empty")
        for name in ("val_fraction", "test_fraction"):
            v = getattr(self, name)
            if not 0.0 < v < 0.5:
                raise InputError(f"data.{name} must be in (0, 0.5), got {v}")
        if self.doc_chars <= 0:
            raise InputError(f"data.doc_chars must be > 0, got {self.doc_chars}")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise InputError(f"data.text_field must be a non-empty column name, got {self.text_field!r}")
        check_vocab_size(self.vocab_size, "data.vocab_size")

    def key(self) -> dict:
        """Everything the prepared arrays depend on (the text field is part of the corpus identity
        when the corpus has record files)."""
        return {
            "format": FORMAT_VERSION,
            "corpus": corpus_identity(self.corpus, self.text_field),
            "vocab_size": self.vocab_size,
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
            "doc_chars": self.doc_chars,
        }


class PreparedData:
    """Read access to a prepared directory: the tokenizer and one memory-mapped id array per split."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        meta_path = self.dir / "meta.json"
        if not (meta_path.exists() or meta_path.is_symlink()):
            raise MissingInput(
                f"'{self.dir}' is not a prepared data directory (no meta.json); run `tokenmix data prepare` first"
            )
        self.meta = read_json(meta_path, "prepared data description", within=self.dir)
        try:
            if not isinstance(self.meta, dict) or not isinstance(self.meta.get("splits"), dict):
                raise TypeError("not a JSON object with splits")
            self.dtype = np.dtype(self.meta["dtype"])
            self.vocab_size = int(self.meta["vocab_size"])
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"'{meta_path}' is corrupt ({e}); delete the directory and prepare again") from None
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.dir / "tokenizer.json")
        return self._tokenizer

    def split(self, name: str) -> np.ndarray:
        """Token ids of one split, [N] memory-mapped (read only)."""
        if name not in SPLITS:
            raise InputError(f"unknown split '{name}'; splits: {', '.join(SPLITS)}")
        path = self.dir / f"{name}.bin"
        expected = int(self.meta["splits"][name]["tokens"])
        if not path.is_file() or path.stat().st_size != expected * self.dtype.itemsize:
            raise InputError(f"'{path}' is missing or truncated; delete '{self.dir}' and prepare again")
        if expected == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(path, dtype=self.dtype, mode="r")

    def summary(self) -> dict:
        s = {
            name: {k: v for k, v in info.items() if k != "documents"} | {"documents": len(info["documents"])}
            for name, info in self.meta["splits"].items()
        }
        return {
            "dir": str(self.dir),
            "corpus": self.meta["corpus"],
            "vocab_size": self.vocab_size,
            "splits": s,
            "chars_per_token": self.meta.get("chars_per_token"),
        }


def split_documents(docs: list[Document], val_fraction: float, test_fraction: float) -> dict[str, list[Document]]:
    """Deterministic split by document (see the module docstring)."""
    if len(docs) < 3:
        raise CorpusError(f"corpus has {len(docs)} document(s); a train/validation/test split needs at least 3")
    names = [d.name for d in docs]
    if len(set(names)) != len(names):
        raise InputError("document names must be unique")
    order = sorted(docs, key=lambda d: hashlib.sha256(d.name.encode()).hexdigest())
    total = sum(len(d.text) for d in docs)
    out: dict[str, list[Document]] = {s: [] for s in SPLITS}
    budget = {"val": val_fraction * total, "test": test_fraction * total}
    filled = {"val": 0, "test": 0}
    for d in order:
        target = next((s for s in ("val", "test") if filled[s] < budget[s]), "train")
        out[target].append(d)
        if target != "train":
            filled[target] += len(d.text)
    if not out["train"]:
        raise CorpusError("corpus is too small: no document is left for the train split")
    return out


STAGES = ("training the tokenizer", "encoding and writing")  # progress lines


def prepare_data(
    cfg: DataConfig, verbose: bool = False, wait: bool = False, install_missing: bool | None = None
) -> PreparedData:
    """Prepare (or reuse) the data of ``cfg``; returns the prepared directory.

    ``install_missing``: may a missing Debian package of a built-in corpus be installed with apt-get
    (see ``load_corpus``; None = as the environment variable TOKENMIX_INSTALL_MISSING says).

    One process prepares a directory at a time: it holds ``.<name>.lock`` beside it (the directory
    itself only appears, renamed into place, when complete). Another process preparing the same
    directory meanwhile is refused naming the holder (``FolderLocked``), or with ``wait`` waits for
    it and reuses what it wrote.
    """
    key = cfg.key()
    if cfg.dir:
        target = Path(cfg.dir).expanduser()
    else:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(cfg.corpus).name or cfg.corpus)[:40]
        target = default_cache_dir() / "prepared" / f"{slug}-v{cfg.vocab_size}-{digest}"
    prepared = _reuse(target, key)
    if prepared is not None:
        return prepared
    check_output_dir(target, "data folder")  # before the corpus is read and the tokenizer trained
    docs = load_corpus(
        cfg.corpus, cfg.doc_chars, text_field=cfg.text_field, install_missing=install_missing
    )  # bad input is refused before anything is written (or printed)
    splits = split_documents(docs, cfg.val_fraction, cfg.test_fraction)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the data folder '{target.parent}': {e.strerror or e}") from None
    with folder_lock(target, "data prepare", lock_file=target.parent / f".{target.name}.lock", wait=wait):
        prepared = _reuse(target, key)  # prepared by the process this one waited for
        if prepared is not None:
            return prepared
        # a line on stderr as each stage starts: BPE training takes minutes on a big corpus
        with Progress("data prepare", len(STAGES), unit="stages", enabled=verbose) as bar:
            return _prepare_locked(cfg, key, target, docs, splits, verbose, bar)


def _reuse(target: Path, key: dict) -> PreparedData | None:
    """The prepared data at ``target`` if it was prepared with ``key``; None if there is none yet."""
    if (target / "meta.json").exists() or (target / "meta.json").is_symlink():
        data = PreparedData(target)
        if data.meta.get("key") != key:
            raise InputError(
                f"'{target}' holds data prepared with different settings ({_describe(data.meta.get('key'))}); "
                f"requested {_describe(key)}: use another directory"
            )
        return data
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InputError(f"'{target}' exists and is not a prepared data directory; choose an empty or new directory")
    return None


def _prepare_locked(
    cfg: DataConfig,
    key: dict,
    target: Path,
    docs: list[Document],
    splits: dict[str, list[Document]],
    verbose: bool,
    bar: Progress,
) -> PreparedData:
    chars = sum(len(d.text) for d in docs)
    bar.milestone(
        f"{cfg.corpus}: {len(docs)} documents, {chars:,} characters; {STAGES[0]} ({cfg.vocab_size}-token BPE)"
    )
    # progress bars when someone reads (verbose) and stderr is a terminal; never for --json or a log
    tok = train_bpe((d.text for d in splits["train"]), cfg.vocab_size, show_progress=None if verbose else False)
    bar.advance(1, event=STAGES[1])
    sep = separator_id(tok)
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.uint32

    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tok.save(str(tmp / "tokenizer.json"))
        meta_splits = {}
        n_chars = n_tokens = 0
        for name in SPLITS:
            ids_per_doc = encode_documents(tok, [d.text for d in splits[name]])
            stream = np.concatenate([np.asarray([sep, *ids], dtype=dtype) for ids in ids_per_doc])
            stream.tofile(tmp / f"{name}.bin")
            chars = sum(len(d.text) for d in splits[name])
            n_chars, n_tokens = n_chars + chars, n_tokens + len(stream) - len(ids_per_doc)
            meta_splits[name] = {
                "tokens": int(len(stream)),
                "chars": chars,
                "documents": [d.name for d in splits[name]],
            }
        meta = {
            "key": key,
            "corpus": cfg.corpus,
            "vocab_size": tok.get_vocab_size(),
            "dtype": np.dtype(dtype).name,
            "separator_id": sep,
            "chars_per_token": round(n_chars / max(n_tokens, 1), 3),
            "splits": meta_splits,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        bar.advance(1)
        if target.exists():
            target.rmdir()  # empty (checked above)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "meta.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same preparation first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PreparedData(target)


def _describe(key: dict | None) -> str:
    if not key:
        return "unknown settings"
    return ", ".join(f"{k}={v}" for k, v in key.items() if k != "format")
