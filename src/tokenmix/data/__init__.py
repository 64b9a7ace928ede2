"""Text data for language modelling: corpora, document split, byte-level BPE, memory-mapped token ids.

load_corpus(name)        -> list[Document]   (corpora.py)
prepare_data(DataConfig) -> PreparedData     (prepare.py: split, tokenizer.json, *.bin)
TokenBatches / eval_windows                  (loader.py: deterministic, resumable, rank-sharded batches)
"""

from __future__ import annotations

from tokenmix.data.corpora import BUILTIN_CORPORA, CorpusError, Document, load_corpus
from tokenmix.data.prepare import DataConfig, PreparedData, prepare_data, split_documents

__all__ = [
    "BUILTIN_CORPORA",
    "CorpusError",
    "DataConfig",
    "Document",
    "PreparedData",
    "load_corpus",
    "prepare_data",
    "split_documents",
]
