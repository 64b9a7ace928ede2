"""Data sources beyond text files and the command line's manners on a shared machine:

* record files (JSONL, JSON, Parquet, CSV, folders of them) read offline through HF ``datasets``,
  one document per record, the text from ``--text-field``; the field is part of the cache key;
* ``data prepare`` never runs apt-get unless asked (``--install-missing``); it names the command;
* the CLI sets a passive OpenMP wait policy before torch is loaded, keeping a user's own setting.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from lm_helpers import one_line_error, run_cli, run_tokenmix
from progress_guard import run_guarded
from tokenmix.core.errors import MissingDependency
from tokenmix.data import corpora
from tokenmix.data.corpora import CorpusError, Document, corpus_identity, load_corpus
from tokenmix.data.prepare import DataConfig, prepare_data

pytest.importorskip("datasets")

TEXTS = [f"Record {i}: " + " ".join(f"word{(i * 7 + j) % 23}" for j in range(40)) + "\n" for i in range(30)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(corpora.INSTALL_MISSING_ENV, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:] if args else kwargs}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows_of(texts, start=0):
    return [{"id": start + i, "text": t, "title": f"title {start + i}"} for i, t in enumerate(texts)]


# ---------------------------------------------------------------------------------- record files
def test_jsonl_records_become_documents(tmp_path, no_network):
    rows = rows_of(TEXTS[:3]) + [
        {"id": 3, "text": None, "title": "no text"},
        {"id": 4, "text": "a\r\nb", "title": "crlf"},
    ]
    f = write_jsonl(tmp_path / "data.jsonl", rows)
    docs = load_corpus(str(f))
    assert docs == [
        Document("data.jsonl#000000", TEXTS[0]),
        Document("data.jsonl#000001", TEXTS[1]),
        Document("data.jsonl#000002", TEXTS[2]),
        Document("data.jsonl#000004", "a\nb"),
    ]
    assert [d.text for d in load_corpus(str(f), text_field="title")] == [r["title"] for r in rows]


def test_json_array_file(tmp_path, no_network):
    f = tmp_path / "data.json"
    f.write_text(json.dumps(rows_of(TEXTS[:4])))
    assert [d.text for d in load_corpus(str(f))] == TEXTS[:4]


def test_parquet_records(tmp_path, no_network):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    f = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"body": TEXTS[:5], "n": list(range(5))}), f)
    docs = load_corpus(str(f), text_field="body")
    assert [(d.name, d.text) for d in docs] == [(f"shard.parquet#{i:06d}", t) for i, t in enumerate(TEXTS[:5])]


def test_csv_records(tmp_path, no_network):
    f = tmp_path / "table.csv"
    f.write_text('id,text\n1,"Hello, world\nsecond line"\n2,plain\n3,"say ""hi"""\n')
    assert [d.text for d in load_corpus(str(f))] == ["Hello, world\nsecond line", "plain", 'say "hi"']


def test_folder_of_jsonl_files_with_a_text_file(tmp_path, no_network):
    folder = tmp_path / "corpus"
    write_jsonl(folder / "a.jsonl", rows_of(TEXTS[:2]))
    write_jsonl(folder / "sub" / "b.jsonl", rows_of(TEXTS[2:5], start=2))
    (folder / "notes.txt").write_text("plain text stays one document")
    docs = load_corpus(str(folder))
    assert [(d.name, d.text) for d in docs] == [
        ("a.jsonl#000000", TEXTS[0]),
        ("a.jsonl#000001", TEXTS[1]),
        ("notes.txt", "plain text stays one document"),
        ("sub/b.jsonl#000000", TEXTS[2]),
        ("sub/b.jsonl#000001", TEXTS[3]),
        ("sub/b.jsonl#000002", TEXTS[4]),
    ]


def test_file_names_are_not_glob_patterns(tmp_path, no_network):
    for name, texts in (
        ("c*d.jsonl", TEXTS[:2]),
        ("cXd.jsonl", TEXTS[2:5]),
        ("a[1].jsonl", TEXTS[5:6]),
        ("a1.jsonl", TEXTS[6:8]),
    ):
        write_jsonl(tmp_path / name, rows_of(texts))
    assert [d.text for d in load_corpus(str(tmp_path / "c*d.jsonl"))] == TEXTS[:2]
    assert [d.text for d in load_corpus(str(tmp_path / "a[1].jsonl"))] == TEXTS[5:6]


def test_wrong_field_is_one_line_listing_the_columns(tmp_path, cache, capsys):
    f = write_jsonl(tmp_path / "data.jsonl", rows_of(TEXTS[:5]))
    line = one_line_error(
        run_cli(["data", "prepare", "--corpus", str(f), "--text-field", "body"], capsys),
        "data prepare",
        "no column 'body'",
        "id, text, title",
        "--text-field",
    )
    assert str(f) in line
    assert not (cache / "prepared").exists() or not any((cache / "prepared").iterdir())


def test_non_text_column_and_malformed_file_are_bad_input(tmp_path, capsys, cache):
    f = write_jsonl(tmp_path / "data.jsonl", rows_of(TEXTS[:5]))
    with pytest.raises(CorpusError, match=r"column 'id' of .* holds int values, not text"):
        load_corpus(str(f), text_field="id")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "unterminated\n')
    # in a fresh process: nothing of `datasets` (its own log lines) may come with the one-line error
    proc = run_tokenmix(["data", "prepare", "--corpus", str(bad)], cache)
    one_line_error((proc.returncode, proc.stdout, proc.stderr), "cannot read", "bad.jsonl", "JSON")


def test_token_streams_equal_the_same_texts_from_a_text_folder(tmp_path, cache, no_network):
    """Records named like the files of a text folder, holding the same texts, prepare to the same arrays."""
    rows = rows_of(TEXTS)
    rows[7]["text"] = None  # skipped, like a file that is not there
    records = write_jsonl(tmp_path / "data.jsonl", rows)
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, r in enumerate(rows):
        if r["text"] is not None:
            (folder / f"data.jsonl#{i:06d}").write_text(r["text"])
    assert load_corpus(str(records)) == load_corpus(str(folder))
    a = prepare_data(DataConfig(corpus=str(records), vocab_size=300, dir=str(tmp_path / "a")))
    b = prepare_data(DataConfig(corpus=str(folder), vocab_size=300, dir=str(tmp_path / "b")))
    for split in ("train", "val", "test"):
        assert a.meta["splits"][split]["documents"] == b.meta["splits"][split]["documents"]
        assert len(a.split(split)) > 0
        np.testing.assert_array_equal(np.asarray(a.split(split)), np.asarray(b.split(split)))
    assert a.tokenizer.get_vocab() == b.tokenizer.get_vocab()


def test_cache_key_includes_the_text_field(tmp_path, cache, no_network):
    rows = [{"text": t, "other": t.upper()} for t in TEXTS]
    f = write_jsonl(tmp_path / "data.jsonl", rows)
    assert DataConfig(corpus=str(f)).key() != DataConfig(corpus=str(f), text_field="other").key()
    assert corpus_identity(str(f), "text") != corpus_identity(str(f), "other")
    lower = prepare_data(DataConfig(corpus=str(f), vocab_size=300))
    upper = prepare_data(DataConfig(corpus=str(f), vocab_size=300, text_field="other"))
    assert lower.dir != upper.dir
    assert "word" in lower.tokenizer.decode(list(lower.split("train")[1:40]))
    assert "WORD" in upper.tokenizer.decode(list(upper.split("train")[1:40]))
    # a corpus of text files only has no field: its identity (and prepared cache) does not change
    t = tmp_path / "plain.txt"
    t.write_text("some text\n")
    assert corpus_identity(str(t), "text") == corpus_identity(str(t), "other")
    assert ":field=" not in corpus_identity(str(t))


def test_text_field_flag_reaches_the_prepared_data(tmp_path, cache, capsys):
    f = write_jsonl(tmp_path / "data.jsonl", [{"body": t} for t in TEXTS])
    rc, out, err = run_cli(
        [
            "data",
            "prepare",
            "--corpus",
            str(f),
            "--text-field",
            "body",
            "--vocab-size",
            "300",
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
        capsys,
    )
    assert rc == 0, err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["key"]["corpus"].endswith(":field=body")
    assert sum(len(meta["splits"][s]["documents"]) for s in meta["splits"]) == len(TEXTS)


def test_missing_datasets_names_the_extra(tmp_path, cache, capsys, monkeypatch):
    f = write_jsonl(tmp_path / "data.jsonl", rows_of(TEXTS[:5]))
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(MissingDependency):
        load_corpus(str(f))
    one_line_error(run_cli(["data", "prepare", "--corpus", str(f)], capsys), "datasets", "pip install 'tokenmix[hf]'")


def test_text_files_do_not_import_datasets(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("\n\n".join(f"paragraph {i}" for i in range(50)))
    code = (
        "import sys; from tokenmix.data.corpora import load_corpus; "
        f"load_corpus({str(f)!r}); print('datasets' in sys.modules)"
    )
    out = run_guarded([sys.executable, "-c", code], cpu_seconds=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------- apt-get only when asked
@pytest.fixture
def no_bible(monkeypatch, tmp_path):
    """The `bible` command and the python3-doc sources are missing; apt-get exists; running it is recorded."""
    calls = []
    real_which, real_run = corpora.shutil.which, corpora.subprocess.run
    installed = {}

    def which(name, *a, **k):
        if name == "bible":
            return installed.get("bible")
        if name == "apt-get":
            return "/usr/bin/apt-get"
        return real_which(name, *a, **k)

    def run(cmd, *a, **k):
        if cmd and str(cmd[0]).endswith("apt-get"):
            calls.append(list(cmd))
            return subprocess.CompletedProcess(cmd, 1, "", "E: apt-get is faked in the tests")
        return real_run(cmd, *a, **k)

    monkeypatch.setattr(corpora.shutil, "which", which)
    monkeypatch.setattr(corpora.subprocess, "run", run)
    monkeypatch.setattr(corpora, "DOC_ROOT", tmp_path / "no-docs")
    monkeypatch.delenv(corpora.INSTALL_MISSING_ENV, raising=False)
    return calls


def test_missing_package_is_refused_naming_the_command(no_bible, cache, capsys, monkeypatch):
    monkeypatch.setattr(corpora, "_is_root", lambda: False)
    line = one_line_error(
        run_cli(["data", "prepare", "--corpus", "kjv"], capsys), "`sudo apt-get install bible-kjv`", "--install-missing"
    )
    assert "installing" not in line
    monkeypatch.setattr(corpora, "_is_root", lambda: True)
    one_line_error(run_cli(["data", "prepare", "--corpus", "pydocs"], capsys), "`apt-get install python3-doc`")
    with pytest.raises(CorpusError, match="`apt-get install bible-kjv`"):
        load_corpus("kjv")
    assert no_bible == []  # apt-get never ran


def test_install_missing_runs_apt_get_saying_so_first(no_bible, cache, capsys, monkeypatch):
    monkeypatch.setattr(corpora, "_is_root", lambda: True)
    rc, out, err = run_cli(["data", "prepare", "--corpus", "kjv", "--install-missing"], capsys)
    assert no_bible[0] == ["/usr/bin/apt-get", "install", "-y", "-q", "bible-kjv"]
    assert "installing Debian package bible-kjv" in err and "apt-get install -y -q bible-kjv" in err
    assert rc == 2 and "apt-get install bible-kjv" in err.strip().splitlines()[-1]  # the fake install failed
    no_bible.clear()
    monkeypatch.setenv(corpora.INSTALL_MISSING_ENV, "1")  # the same, asked through the environment
    with pytest.raises(CorpusError):
        load_corpus("pydocs")
    assert no_bible and no_bible[0][-1] == "python3-doc"


def test_install_missing_without_root_does_not_run_apt_get(no_bible, cache, capsys, monkeypatch):
    monkeypatch.setattr(corpora, "_is_root", lambda: False)
    rc, out, err = run_cli(["data", "prepare", "--corpus", "kjv", "--install-missing"], capsys)
    assert rc == 2 and no_bible == []
    assert "not running as root" in err and "sudo apt-get install bible-kjv" in err


# ---------------------------------------------------------------------------------- OpenMP wait policy
PROBE = """
import os, sys
seen = {}
class Probe:  # records OMP_WAIT_POLICY at the moment torch is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "torch" not in seen:
            seen["torch"] = os.environ.get("OMP_WAIT_POLICY")
        return None
sys.meta_path.insert(0, Probe())
import tokenmix.cli.main
import torch
print(seen.get("torch"), os.environ.get("OMP_WAIT_POLICY"))
"""


def _probe(policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = run_guarded([sys.executable, "-c", PROBE], env=env, cpu_seconds=180)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_cli_sets_a_passive_openmp_wait_policy_before_torch_loads():
    assert _probe(None) == "PASSIVE PASSIVE"


def test_cli_keeps_the_users_openmp_wait_policy():
    assert _probe("ACTIVE") == "ACTIVE ACTIVE"


def test_package_and_cli_package_do_not_import_torch():
    code = "import sys, tokenmix, tokenmix.cli; print('torch' in sys.modules)"
    out = run_guarded([sys.executable, "-c", code], cpu_seconds=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
