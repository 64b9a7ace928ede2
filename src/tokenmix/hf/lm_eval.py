"""Local lm-eval-harness tasks for an exported run: nothing downloads, the data is the run's own
held-out split.

``write_lm_eval_tasks(run, folder)`` writes, next to their data (JSONL, absolute paths in the YAML,
since lm-eval resolves data files from the working directory):

    tokenmix_heldout       rolling log-likelihood over the held-out (test) documents of the run's
                           corpus, as lm-eval's wikitext task scores text: word and byte perplexity
                           and bits per byte (``loglikelihood_rolling``).
    tokenmix_continuation  multiple choice built from the same documents: a passage's first
                           ``CONTEXT_CHARS`` characters, then its true next ``CHOICE_CHARS`` characters
                           among ``N_CHOICES - 1`` same-length pieces cut from other documents
                           (``acc`` and ``acc_norm``; chance = 1 / N_CHOICES). Which piece is true is
                           drawn with a fixed seed.

Run them (the export also writes ``trust_remote_code`` shims, so plain ``lm_eval`` loads the model)::

    lm_eval --model hf --model_args pretrained=OUT,trust_remote_code=True \\
        --include_path OUT/lm_eval_tasks --tasks tokenmix_heldout,tokenmix_continuation
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenmix.data.prepare import prepare_data
from tokenmix.data.tokenizer import separator_id

TASKS = ("tokenmix_heldout", "tokenmix_continuation")
CONTEXT_CHARS = 400
CHOICE_CHARS = 80
N_CHOICES = 4
MAX_DOCUMENTS = 200  # documents of each task (the held-out split may be longer)
SEED = 0

HELDOUT_YAML = """\
task: tokenmix_heldout
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
should_decontaminate: false
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
  - metric: byte_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
metadata:
  version: 1.0
"""

CONTINUATION_YAML = """\
task: tokenmix_continuation
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def heldout_documents(run) -> list[str]:
    """The run's test split as text, one string per document (split at the separator token)."""
    data = prepare_data(run.config.data, wait=True)  # the run's prepared directory (re-made if deleted)
    ids = data.split("test").tolist()
    sep = separator_id(run.tokenizer)
    docs, cur = [], []
    for tid in ids + [sep]:
        if tid == sep:
            if cur:
                docs.append(run.tokenizer.decode(cur))
            cur = []
        else:
            cur.append(tid)
    return [d for d in docs if d.strip()][:MAX_DOCUMENTS]


def continuation_items(docs: list[str], seed: int = SEED) -> list[dict]:
    """Multiple-choice items (module docstring) from documents long enough to cut one from."""
    rng = random.Random(seed)
    need = CONTEXT_CHARS + CHOICE_CHARS
    long = [d for d in docs if len(d) >= need]
    items = []
    for i, doc in enumerate(long):
        others = [d for j, d in enumerate(long) if j != i]
        if len(others) < N_CHOICES - 1:
            break
        true = doc[CONTEXT_CHARS:need]
        wrong = []
        for other in rng.sample(others, N_CHOICES - 1):
            start = rng.randrange(0, len(other) - CHOICE_CHARS + 1)
            wrong.append(other[start : start + CHOICE_CHARS])
        label = rng.randrange(N_CHOICES)
        choices = wrong[:label] + [true] + wrong[label:]
        items.append({"context": doc[:CONTEXT_CHARS], "choices": choices, "label": label})
    return items


def write_lm_eval_tasks(run, folder: str | Path, final: str | Path | None = None) -> list[str]:
    """Write both tasks (YAML + JSONL) into ``folder``, their YAML naming the data at ``final`` (the
    folder's path once in place, when it is written under a temporary name; default ``folder``).
    Returns the task names written. The continuation task needs ``N_CHOICES`` held-out documents of
    ``CONTEXT_CHARS + CHOICE_CHARS`` characters and is left out (the held-out one kept) when fewer."""
    folder = Path(folder)
    where = Path(final if final is not None else folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    docs = heldout_documents(run)
    written = []
    if docs:
        _write_jsonl(folder / "heldout.jsonl", [{"text": d} for d in docs])
        (folder / "tokenmix_heldout.yaml").write_text(
            HELDOUT_YAML.format(data=json.dumps(str(where / "heldout.jsonl")))
        )
        written.append("tokenmix_heldout")
    items = continuation_items(docs)
    if items:
        _write_jsonl(folder / "continuation.jsonl", items)
        (folder / "tokenmix_continuation.yaml").write_text(
            CONTINUATION_YAML.format(data=json.dumps(str(where / "continuation.jsonl")))
        )
        written.append("tokenmix_continuation")
    return written


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
