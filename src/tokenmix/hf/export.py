"""``export_run``: a tokenmix LM run folder -> a Hugging Face model folder, readable offline by
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (after ``import tokenmix.hf``).

The folder holds ``config.json`` (``TokenmixConfig``: the run's whole ``ModelConfig`` and the
special token ids), ``generation_config.json``, ``model.safetensors`` (the weights of the newest
valid checkpoint, as ``load_run`` verifies them, under ``model.net.``; a tied head is stored once)
and the tokenizer as a fast tokenizer (``tokenizer.json`` and ``tokenizer_config.json``): the run's
own byte-level BPE, unchanged, with its one special token, the document separator, as bos, eos and
pad token. Generation therefore stops at a separator (as a document ends in training), and
batches are padded with it on the left (``padding_side = "left"``: the only padding a tokenmix
model takes).

Two more things for tools that never ``import tokenmix.hf`` (``lm_eval``, other people's scripts):
``configuration_tokenmix.py`` / ``modeling_tokenmix.py``, one-line modules that import the classes
from the installed tokenmix, named by ``auto_map`` in config.json, so ``from_pretrained(OUT,
trust_remote_code=True)`` loads it (no code of the model is copied: the installed tokenmix is the
one implementation); ``lm_eval_tasks/``, local lm-eval tasks on the run's held-out split
(``hf/lm_eval.py``); and ``README.md``, the model card (``hf/model_card.py``: the model, its layers
and mixers, training data, results, how to load it, the tokenmix version).

The folder is written whole or not at all (``atomic_path``); an existing file, or a folder that is
not empty, is refused rather than overwritten.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from tokenmix.core.errors import InputError
from tokenmix.core.files import atomic_path, check_output_dir
from tokenmix.data.tokenizer import DOC_SEPARATOR, separator_id
from tokenmix.hf.configuration import TokenmixConfig
from tokenmix.hf.lm_eval import write_lm_eval_tasks
from tokenmix.hf.model_card import model_card
from tokenmix.hf.modeling import TokenmixForCausalLM
from tokenmix.runs.lm import load_run, read_run_config

# auto_map of config.json -> the shim module files written beside it (their whole text)
AUTO_MAP = {
    "AutoConfig": "configuration_tokenmix.TokenmixConfig",
    "AutoModel": "modeling_tokenmix.TokenmixModel",
    "AutoModelForCausalLM": "modeling_tokenmix.TokenmixForCausalLM",
}
SHIMS = {
    "configuration_tokenmix.py": '"""The installed tokenmix\'s config class (``pip install tokenmix``)."""\n'
    "from tokenmix.hf.configuration import TokenmixConfig  # noqa: F401\n",
    "modeling_tokenmix.py": '"""The installed tokenmix\'s model classes (``pip install tokenmix``)."""\n'
    "from tokenmix.hf.modeling import TokenmixForCausalLM, TokenmixModel  # noqa: F401\n",
}


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    checkpoint: Path
    parameters: int
    lm_eval_tasks: tuple[str, ...] = ()


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output that exists as a file, a symbolic link or a folder with something in it, or
    whose parent folder is missing or takes no new entries (``core.files.check_output_dir``)."""
    if out_dir.is_symlink():
        raise InputError(
            f"--hf '{out_dir}' is a symbolic link (to '{os.readlink(out_dir)}'); give a new or empty folder"
        )
    if out_dir.is_file() or (out_dir.exists() and not out_dir.is_dir()):
        raise InputError(f"--hf '{out_dir}' is a file; give a new or empty folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise InputError(f"--hf '{out_dir}' is a folder that is not empty; give a new or empty folder")
    if not (out_dir.parent.exists() or out_dir.parent.is_symlink()):
        raise InputError(f"--hf '{out_dir}': its parent folder '{out_dir.parent}' does not exist")
    check_output_dir(out_dir.parent, "the parent folder of --hf")


def fast_tokenizer(tok, max_length: int | None = None) -> PreTrainedTokenizerFast:
    """The run's ``tokenizers`` BPE as a transformers fast tokenizer, the separator as bos/eos/pad
    (encoding text as tokenmix does: the separator's string in a text stays text);
    ``max_length``: the longest input the model places (learned positions), None when unbounded."""
    separator_id(tok)  # InputError when the run's tokenizer has no separator
    extra = {} if max_length is None else {"model_max_length": max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=DOC_SEPARATOR,
        eos_token=DOC_SEPARATOR,
        pad_token=DOC_SEPARATOR,
        padding_side="left",
        split_special_tokens=True,  # text is text: a literal <|endoftext|> is no separator (data/tokenizer.py)
        **extra,
    )


def export_run(run_dir: str | Path, out_dir: str | Path) -> ExportResult:
    """Write the run at ``run_dir`` as a Hugging Face model folder at ``out_dir`` (module docstring)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    read_run_config(run_dir)  # a missing or malformed run is reported before the output is looked at
    check_out_dir(out_dir)
    run = load_run(run_dir)
    sep = separator_id(run.tokenizer)
    config = TokenmixConfig.from_model_config(run.config.model, bos_token_id=sep, eos_token_id=sep, pad_token_id=sep)
    config.auto_map = dict(AUTO_MAP)
    model = TokenmixForCausalLM(config)
    model.net.load_state_dict(run.model.state_dict(), strict=True)
    model = model.to(next(run.model.parameters()).dtype).eval()
    mc = run.config.model
    tokenizer = fast_tokenizer(run.tokenizer, mc.max_seq_len if mc.positions == "learned" else None)
    if out_dir.is_dir():
        out_dir.rmdir()  # empty (checked): the finished folder takes its place
    with atomic_path(out_dir, folder=True) as tmp, torch.no_grad():
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in SHIMS.items():
            (Path(tmp) / name).write_text(text)
        tasks = write_lm_eval_tasks(run, Path(tmp) / "lm_eval_tasks", out_dir / "lm_eval_tasks")
        parameters = sum(p.numel() for p in model.parameters())
        (Path(tmp) / "README.md").write_text(model_card(run, run_dir, parameters, tuple(tasks)))
    return ExportResult(out_dir, run.checkpoint, parameters, tuple(tasks))
