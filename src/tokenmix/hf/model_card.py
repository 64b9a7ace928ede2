"""The model card (``README.md``) of an exported run: what the model is, its layers and their mixers,
the data it was trained on, its measured results, how to load it, and the tokenmix that wrote it.

Everything comes from the run folder (its config, ``summary.json`` when training finished, the
checkpoint) and the mixer registry; nothing is estimated. Hugging Face shows this file as the
model's page.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

from tokenmix.core.files import read_json
from tokenmix.mixers.registry import get_mixer_spec
from tokenmix.runs.lm import LoadedRun


def _summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json (training finished), {} without one."""
    path = run_dir / "summary.json"
    if not (path.exists() or path.is_symlink()):
        return {}
    data = read_json(path, "run summary", within=run_dir)
    return data if isinstance(data, dict) else {}


def tokenmix_version() -> str:
    """The installed tokenmix's version (its package metadata)."""
    try:
        return metadata.version("tokenmix")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "(not installed)"


def model_card(run: LoadedRun, run_dir: Path, parameters: int, lm_eval_tasks: tuple[str, ...]) -> str:
    """The card's Markdown text."""
    version = tokenmix_version()
    cfg, mc = run.config, run.config.model
    summary = _summary(run_dir)
    layers = list(mc.layers)
    rows = []
    for i, name in enumerate(layers):
        spec = get_mixer_spec(name)
        overrides = mc.mixer_overrides.get(name, {})
        ab = spec.ab_form.replace("|", "\\|")  # a Markdown table cell
        rows.append(
            f"| {i} | `{name}` | {spec.family} | {ab}"
            + (f" | {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else " | —")
            + " |"
        )
    results = []
    if summary:
        results.append(
            f"- validation perplexity **{summary.get('val_ppl', float('nan')):.2f}** after "
            f"{summary.get('steps', '?')} steps ({summary.get('val_tokens', '?')} tokens), against "
            f"{summary.get('bigram_ppl', float('nan')):.2f} for a bigram model and "
            f"{summary.get('unigram_ppl', float('nan')):.2f} for a unigram model of the same training split"
        )
        if summary.get("val_bits_per_char"):
            results.append(f"- {summary['val_bits_per_char']:.3f} bits per character on the validation split")
    else:
        results.append(
            "- the run had not finished training when it was exported (no summary.json): see the run's metrics.jsonl"
        )
    data = cfg.data
    lines = [
        "---",
        "library_name: transformers",
        "tags:",
        "- tokenmix",
        *[f"- {name}" for name in dict.fromkeys(layers)],
        "---",
        "",
        f"# tokenmix model: {', '.join(layers)}",
        "",
        f"A causal language model of {parameters:,} parameters built and trained with tokenmix {version}: "
        f"{len(layers)} layers of token mixers (each a pair (A, B): Y = (I − B)⁻¹ A X), width {mc.d_model}, "
        f"{mc.n_heads} heads, {'an MLP after each mixer' if mc.mlp else 'no MLP'}, position code "
        f"`{mc.positions}`, vocabulary {mc.vocab_size} (byte-level BPE).",
        "",
        "| layer | mixer | family | (A, B) | settings |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "## Training data",
        "",
        f"Corpus `{data.corpus}` (prepared by `tokenmix data prepare`: split by document, byte-level BPE), "
        f"sequences of {cfg.train.seq_len} tokens, batches of {cfg.train.batch_size}, at most "
        f"{cfg.train.max_steps} steps, AdamW at a peak learning rate of {cfg.train.lr:g}; checkpoint "
        f"`{run.checkpoint.name}`.",
        "",
        "## Results",
        "",
        *results,
        "",
        "## How to load it",
        "",
        "```python",
        "import tokenmix.hf  # registers model_type 'tokenmix' with transformers' Auto classes",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained('PATH')",
        "tokenizer = AutoTokenizer.from_pretrained('PATH')",
        "ids = tokenizer(['To be, or not'], return_tensors='pt')",
        "print(tokenizer.decode(model.generate(**ids, max_new_tokens=20, do_sample=False)[0]))",
        "```",
        "",
        "Without `import tokenmix.hf` (e.g. from lm-eval), pass `trust_remote_code=True`: the two shim files "
        "in this folder import the installed tokenmix's classes (`pip install tokenmix`); no model code is "
        "copied here. `generate()` carries each mixer's own decode state.",
        "",
    ]
    if lm_eval_tasks:
        lines += [
            "## Evaluating it with lm-eval",
            "",
            f"Local tasks on the run's held-out documents ({', '.join(lm_eval_tasks)}):",
            "",
            "```bash",
            "lm_eval --model hf --model_args pretrained=PATH,trust_remote_code=True "
            f"--include_path PATH/lm_eval_tasks --tasks {','.join(lm_eval_tasks)}",
            "```",
            "",
        ]
    lines += [f"Written by tokenmix {version} (`tokenmix export --run RUN --hf OUT`).", ""]
    return "\n".join(lines)


__all__ = ["model_card"]
