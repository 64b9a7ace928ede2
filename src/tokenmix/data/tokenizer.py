"""Byte-level BPE with HF ``tokenizers``, saved as tokenizer.json.

Byte-level means every string round-trips: the 256 byte symbols are in the initial alphabet, so
no text is ever unknown. One special token separates documents in the packed id stream.

Text never becomes that token: every tokenizer made or loaded here encodes its input as plain text
(``encode_special_tokens``), so a literal ``<|endoftext|>`` in a corpus, an ``eval --text`` file or a
prompt is byte-level BPE like any other string, and the separator id enters a stream only where the
code that joins documents puts it (``separator_id``). Without this, text could cut a document in two
under ``train.pack=true``, ``eval --per-document`` and ``data prepare``. The setting is not saved in
tokenizer.json: an exported Hugging Face tokenizer keeps the library's usual behaviour.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokenmix.core.errors import InputError
from tokenmix.core.files import read_text_file

DOC_SEPARATOR = "<|endoftext|>"
MIN_VOCAB = 257  # 256 byte symbols + the separator
# The tokenizers trainer reserves its tables for the whole requested vocabulary up front (about 72
# bytes an entry, measured: 10^9 entries ask for 71 GB and abort the process), so the size is
# bounded before it is called: 2^24 entries reserve about 1.2 GB, and are 16x the largest
# vocabularies in use.
MAX_VOCAB = 2**24
MAX_TOKENIZER_BYTES = 4 * 2**30  # a saved tokenizer of MAX_VOCAB entries (vocabulary and merges) stays below


def check_vocab_size(vocab_size: int, name: str = "vocab_size") -> None:
    """Refuse (InputError) a vocabulary size the BPE trainer cannot be asked for."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise InputError(f"{name} must be an integer, got {vocab_size!r}")
    if vocab_size < MIN_VOCAB:
        raise InputError(f"{name} must be >= {MIN_VOCAB} (256 bytes + separator), got {vocab_size}")
    if vocab_size > MAX_VOCAB:
        raise InputError(
            f"{name} must be <= {MAX_VOCAB:,} (2^24; the BPE trainer reserves about 72 bytes an entry "
            f"up front), got {vocab_size:,}"
        )


def train_bpe(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2, show_progress: bool | None = None
) -> Tokenizer:
    """Train a byte-level BPE tokenizer of ``vocab_size`` entries (including the separator).

    ``show_progress``: the trainer's own progress bars on stderr (a large corpus takes minutes
    here, silent otherwise); None shows them when stderr is a terminal, where they cannot garble
    a log or a JSON answer on stdout."""
    check_vocab_size(vocab_size)
    if show_progress is None:
        show_progress = sys.stderr.isatty()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[DOC_SEPARATOR],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _text_only(tok)


def _text_only(tok: Tokenizer) -> Tokenizer:
    """``tok``, set to encode any input as text: special tokens' strings are split like other text."""
    tok.encode_special_tokens = True
    return tok


def load_tokenizer(path: str | Path, within: str | Path | None = None) -> Tokenizer:
    """The tokenizer saved at ``path``: a regular UTF-8 file (inside the folder ``within``, when given)
    of at most ``MAX_TOKENIZER_BYTES`` that the tokenizers library reads; otherwise one InputError line."""
    path = Path(path)
    text = read_text_file(path, "tokenizer file", max_bytes=MAX_TOKENIZER_BYTES, within=within)
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # the tokenizers library raises a bare Exception on malformed JSON
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"tokenizer file '{path}' is unreadable: {why}") from None
    return _text_only(tok)


def separator_id(tok: Tokenizer) -> int:
    sid = tok.token_to_id(DOC_SEPARATOR)
    if sid is None:
        raise InputError(f"tokenizer has no document separator token {DOC_SEPARATOR!r}")
    return sid


def encode_documents(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Ids of each document. All paragraphs go through one parallel ``encode_batch`` (a long string
    encoded whole runs on one thread); byte-level decoding of the concatenation gives the text back."""
    pieces: list[str] = []
    owner: list[int] = []
    for i, text in enumerate(texts):
        parts = text.split("\n\n")
        for j, p in enumerate(parts):
            p = p + "\n\n" if j < len(parts) - 1 else p
            if p:
                pieces.append(p)
                owner.append(i)
    out: list[list[int]] = [[] for _ in texts]
    for i, enc in zip(owner, tok.encode_batch(pieces, add_special_tokens=False)):
        out[i].extend(enc.ids)
    return out
