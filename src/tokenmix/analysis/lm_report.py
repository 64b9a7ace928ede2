"""``tokenmix report <LM run dir>``: one page a person reads to learn how a language-model run went.

The generic report (``analysis/report.py``) walks a folder file by file; for a run of ``tokenmix
train lm`` that puts checkpoint hashes, AdamW's param groups and the data position in front of the
numbers that matter. This page instead leads with

  * the result: final validation loss and perplexity next to the bigram and unigram baselines
    scored on the same tokens, and in words whether the model beat the bigram;
  * the curves from metrics.jsonl: train and validation loss (with the baselines as lines), the
    learning rate, and tokens per second;
  * a few short greedy generations of the run's model (prompts taken from its validation split);
  * the settings that shape the run (model, data, schedule),

and keeps the full config, summary.json and the checkpoint metadata (hashes, optimizer state
layout, scheduler, data position) in an appendix (an HTML ``<details id="appendix">`` block, the
Markdown's last section). report.html is self-contained (figures embedded); report.md links the
PNGs in ``figures/`` next to it.
"""

from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path

import numpy as np

from tokenmix.analysis.outputs import markdown_table, new_figure, prepare_out_dir, save_figure
from tokenmix.analysis.report import REPORT_DIR_NAME, check_report_out, figure_html, html_page, html_table
from tokenmix.core.errors import InputError
from tokenmix.core.files import read_json, read_text_file
from tokenmix.data.prepare import PreparedData
from tokenmix.data.tokenizer import separator_id
from tokenmix.generation import SamplingConfig, generate, position_limit
from tokenmix.runs.checkpoint import CheckpointError, newest_valid_checkpoint
from tokenmix.runs.lm import LMRunConfig, bigram_verdict, load_run, read_metrics, read_run_config

GENERATIONS = 3  # greedy continuations shown
PROMPT_TOKENS = 8  # tokens of validation text each one starts from
NEW_TOKENS = 40  # tokens each one adds (fewer when the training context is shorter)
THROUGHPUT_WINDOW = 10  # steps a tokens/s point averages over (one step is too noisy to read)


def is_lm_run(path: Path) -> bool:
    """Whether ``path`` is a folder ``train lm`` wrote: a config.json with metrics or checkpoints
    next to it (a broken config.json, or one that is no regular file, still counts, so that the page
    refuses it in one line)."""
    path, config = Path(path), Path(path) / "config.json"
    return (config.exists() or config.is_symlink()) and (
        (path / "metrics.jsonl").exists() or (path / "checkpoints").is_dir()
    )


# ----------------------------------------------------------------------------------------- figures
def _sessions(steps: list[dict]) -> list[list[dict]]:
    """Step records cut where ``elapsed_s`` starts again (each resumed session restarts its clock)."""
    out: list[list[dict]] = []
    for r in steps:
        if not out or r.get("elapsed_s", 0.0) < out[-1][-1].get("elapsed_s", 0.0) or r["step"] <= out[-1][-1]["step"]:
            out.append([])
        out[-1].append(r)
    return out


def throughput(steps: list[dict]) -> tuple[list[int], list[float]]:
    """(step, tokens/s) averaged over ``THROUGHPUT_WINDOW`` steps, within each session."""
    xs, ys = [], []
    for sess in _sessions([r for r in steps if "tokens" in r and "elapsed_s" in r]):
        for i in range(1, len(sess)):
            a, b = sess[max(0, i - THROUGHPUT_WINDOW)], sess[i]
            dt = b["elapsed_s"] - a["elapsed_s"]
            if dt > 0:
                xs.append(b["step"])
                ys.append((b["tokens"] - a["tokens"]) / dt)
    return xs, ys


def _plots(metrics: list[dict], baselines: dict, fig_dir: Path) -> list[tuple[Path, str]]:
    """loss.png, lr.png, throughput.png (each only when metrics.jsonl has its numbers)."""
    steps = [r for r in metrics if "loss" in r and "step" in r]
    vals = [r for r in metrics if "val_loss" in r]
    out: list[tuple[Path, str]] = []
    if steps or vals:
        fig, ax = new_figure(size=(7.5, 4.2))
        ax = ax[0, 0]
        if steps:
            ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=1, alpha=0.7, label="train loss")
        if vals:
            ax.plot([r["step"] for r in vals], [r["val_loss"] for r in vals], "o-", label="validation loss")
        for key, label, style in (("bigram_loss", "bigram baseline", "--"), ("unigram_loss", "unigram baseline", ":")):
            if isinstance(baselines.get(key), (int, float)) and math.isfinite(baselines[key]):
                ax.axhline(baselines[key], color="gray", ls=style, lw=1, label=f"{label} ({baselines[key]:.3f})")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats per token)")
        ax.set_title("loss")
        ax.legend(fontsize=8)
        fig.tight_layout()
        out.append(
            (
                save_figure(fig, fig_dir, "loss", ("png",))[0],
                "train loss per step, validation loss, and the baselines on the final validation tokens",
            )
        )
    if any("lr" in r for r in steps):
        fig, ax = new_figure(size=(7.5, 3.0))
        ax = ax[0, 0]
        ax.plot([r["step"] for r in steps if "lr" in r], [r["lr"] for r in steps if "lr" in r])
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.set_title("learning rate")
        fig.tight_layout()
        out.append((save_figure(fig, fig_dir, "lr", ("png",))[0], "learning rate per step (warmup, then cosine)"))
    xs, ys = throughput(steps)
    if xs:
        fig, ax = new_figure(size=(7.5, 3.0))
        ax = ax[0, 0]
        ax.plot(xs, ys)
        ax.set_xlabel("step")
        ax.set_ylabel("tokens / s")
        ax.set_ylim(bottom=0)
        ax.set_title("training throughput")
        fig.tight_layout()
        out.append(
            (
                save_figure(fig, fig_dir, "throughput", ("png",))[0],
                f"training tokens per second, averaged over {THROUGHPUT_WINDOW} steps",
            )
        )
    return out


# ------------------------------------------------------------------------------------- generations
def sample_generations(run_dir: Path, cfg: LMRunConfig, n: int = GENERATIONS) -> tuple[list[dict], str]:
    """Greedy continuations of the run's model, from prompts of its validation text (or from the
    document separator when the prepared data is gone); returns them and a line saying how."""
    try:
        run = load_run(run_dir)
    except (InputError, CheckpointError) as e:
        return [], f"no generations: {e}"
    tok = run.tokenizer
    prompts: list[list[int]] = []
    try:
        val = np.asarray(PreparedData(cfg.data.dir).split("val"), dtype=np.int64)
    except (InputError, OSError):
        val = np.zeros(0, dtype=np.int64)
    sep = separator_id(tok)
    if len(val) > PROMPT_TOKENS * n:
        for k in range(n):
            start = (k * len(val)) // n
            ids = [int(t) for t in val[start : start + PROMPT_TOKENS] if t != sep]
            if ids:
                prompts.append(ids)
    how = f"greedy, {PROMPT_TOKENS}-token prompts from the validation split"
    if not prompts:
        prompts, how = [[sep]], "greedy, from the document separator (the prepared data is not at hand)"
    limit = position_limit(run.model)
    context = min(cfg.train.seq_len, limit) if limit is not None else cfg.train.seq_len
    n_new = min(NEW_TOKENS, context - max(len(p) for p in prompts))
    if n_new < 1:
        return [], "no generations: the training context is too short for a prompt"
    outs = generate(run.model, prompts, SamplingConfig(max_new_tokens=n_new, temperature=0.0))
    items = [{"prompt": tok.decode(p), "continuation": tok.decode(o)} for p, o in zip(prompts, outs)]
    return items, f"{how}, {n_new} new tokens each, checkpoint step {run.meta['step']}"


# ------------------------------------------------------------------------------------------- page
def _result_rows(summary: dict, final_base: dict, vals: list[dict]) -> tuple[list[dict], str]:
    """The result table (model, bigram, unigram) and the sentence that reads it."""
    if summary:
        loss, ppl = summary.get("val_loss"), summary.get("val_ppl")
        note = f"final validation pass over {summary.get('val_tokens', 0):,} tokens at step {summary.get('steps')}"
        bpc, bigram_bpc = summary.get("val_bits_per_char"), summary.get("bigram_bits_per_char")
    elif vals:
        loss, ppl = vals[-1]["val_loss"], vals[-1].get("val_ppl")
        note = f"the run has not finished: its last validation pass, step {vals[-1]['step']}"
        bpc = bigram_bpc = None
    else:
        return [], "no validation pass yet"
    bigram_ppl = summary.get("bigram_ppl", final_base.get("bigram_ppl"))
    unigram_ppl = summary.get("unigram_ppl", final_base.get("unigram_ppl"))
    rows = [
        {"": "this model", "loss": loss, "perplexity": ppl, "bits/char": bpc},
        {
            "": "bigram (counted on train)",
            "loss": final_base.get("bigram_loss"),
            "perplexity": bigram_ppl,
            "bits/char": bigram_bpc,
        },
        {
            "": "unigram (counted on train)",
            "loss": final_base.get("unigram_loss"),
            "perplexity": unigram_ppl,
            "bits/char": None,
        },
    ]
    verdict = bigram_verdict(ppl if ppl is not None else math.nan, bigram_ppl if bigram_ppl is not None else math.nan)
    return rows, f"Validation: {verdict}; {note}."


def _settings(cfg: LMRunConfig, summary: dict, steps_done: int | None) -> list[dict]:
    m, d, t = cfg.model, cfg.data, cfg.train
    return [
        {"setting": "layers", "value": ",".join(m.layers)},
        {"setting": "width / heads", "value": f"d_model {m.d_model}, {m.n_heads} heads, mlp {m.mlp}"},
        {
            "setting": "positions",
            "value": m.positions + (f" (max_seq_len {m.max_seq_len})" if m.positions == "learned" else ""),
        },
        {"setting": "parameters", "value": f"{summary['num_params']:,}" if "num_params" in summary else None},
        {"setting": "data", "value": f"{d.corpus}, {m.vocab_size}-token BPE"},
        {
            "setting": "steps",
            "value": f"{steps_done if steps_done is not None else '?'} of {t.max_steps}, "
            f"{t.batch_size} x {t.seq_len} tokens each",
        },
        {
            "setting": "schedule",
            "value": f"lr {t.lr:g}, {t.warmup_steps} warmup steps, cosine to {t.min_lr_ratio:g} x lr",
        },
        {
            "setting": "regularisation",
            "value": f"weight decay {t.weight_decay:g}, grad clip {t.grad_clip:g}, dropout {m.dropout:g}",
        },
        {"setting": "precision / seed", "value": f"{t.precision}, seed {t.seed}"},
    ]


def _appendix(run_dir: Path, cfg: LMRunConfig, summary: dict) -> list[tuple[str, str]]:
    """(title, JSON text) of what a reader rarely needs: the full config, summary.json, latest.json
    and the newest valid checkpoint's metadata (file hashes, optimizer param groups, scheduler,
    data position)."""
    parts = [("config.json (the resolved configuration)", cfg.to_json())]
    if summary:
        parts.append(("summary.json", json.dumps(summary, indent=1)))
    ckpt_root = run_dir / "checkpoints"
    latest = ckpt_root / "latest.json"
    if latest.exists() or latest.is_symlink():
        try:
            text = read_text_file(latest, "checkpoint record", max_bytes=1 << 16, within=run_dir, errors="replace")
        except InputError as e:
            text = str(e)
        parts.append(("checkpoints/latest.json", text))
    try:
        ckpt, meta, _ = newest_valid_checkpoint(ckpt_root)
    except CheckpointError as e:
        parts.append(("checkpoints", str(e)))
    else:
        if ckpt is not None:
            meta = {k: v for k, v in meta.items() if k != "config"}  # the config is shown above
            parts.append(
                (
                    f"checkpoints/{ckpt.name}/meta.json (hashes, optimizer, scheduler, data position)",
                    json.dumps(meta, indent=1),
                )
            )
    return parts


def build_lm_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict:
    """Write report.html (self-contained) and report.md (+ figures/) for an LM run; returns the paths."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)  # a broken config or metrics file is refused before anything is written
    metrics = read_metrics(run_dir)
    try:
        summary = read_json(run_dir / "summary.json", "run summary", within=run_dir)
    except InputError:
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    out = Path(out_dir) if out_dir is not None else run_dir / REPORT_DIR_NAME
    check_report_out(out, run_dir)
    out = prepare_out_dir(out, "report")
    fig_dir = out / "figures"
    fig_dir.mkdir(exist_ok=True)
    bases = {r.get("event"): r for r in metrics if r.get("event") in ("baseline", "final_baseline")}
    final_base = bases.get("final_baseline") or bases.get("baseline") or {}
    steps = [r for r in metrics if "loss" in r]
    vals = [r for r in metrics if "val_loss" in r]
    init = next((r for r in metrics if r.get("event") == "init_from"), None)
    steps_done = summary.get("steps", steps[-1]["step"] if steps else None)

    figures = _plots(metrics, final_base, fig_dir)
    gens, gen_note = sample_generations(run_dir, cfg)
    rows, verdict = _result_rows(summary, final_base, vals)
    settings = _settings(cfg, summary, steps_done)
    appendix = _appendix(run_dir, cfg, summary)
    title = f"tokenmix LM run: {run_dir.resolve().name}"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    origin = f"Initial weights from {init['run']} ({init['checkpoint']}, step {init['source_step']})." if init else ""
    esc = html.escape

    h = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="muted">Run folder <code>{esc(str(run_dir))}</code> — generated {esc(stamp)}. {esc(origin)}</p>',
        '<h2 id="result">Result</h2>',
        f"<p><strong>{esc(verdict)}</strong></p>",
        html_table(rows) if rows else "",
        '<h2 id="curves">Training curves</h2>',
        *(figure_html(p, cap) for p, cap in figures),
        '<h2 id="generations">Generations</h2>',
        f'<p class="muted">{esc(gen_note)}</p>',
        *(f"<pre><strong>{esc(g['prompt'])}</strong>{esc(g['continuation'])}</pre>" for g in gens),
        '<h2 id="settings">Settings</h2>',
        html_table(settings),
        '<details id="appendix"><summary>Appendix: full configuration, summary and checkpoint metadata '
        "(hashes, optimizer internals)</summary>",
        *(f"<h3>{esc(name)}</h3><pre>{esc(text)}</pre>" for name, text in appendix),
        "</details>",
    ]
    m = [
        f"# {title}",
        "",
        f"Run folder `{run_dir}` — generated {stamp}. {origin}".rstrip(),
        "",
        "## Result",
        "",
        f"**{verdict}**",
        "",
        markdown_table(rows) if rows else "",
        "## Training curves",
        "",
    ]
    m += [f"![{cap}](figures/{p.name})\n" for p, cap in figures]
    m += ["## Generations", "", f"_{gen_note}_", ""]
    m += [f"```\n[{g['prompt']}]{g['continuation']}\n```\n" for g in gens]
    m += [
        "## Settings",
        "",
        markdown_table(settings),
        "## Appendix",
        "",
        "Full configuration, summary and checkpoint metadata (hashes, optimizer internals).",
        "",
    ]
    m += [f"### {name}\n\n```json\n{text}\n```\n" for name, text in appendix]
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(html_page(title, "\n".join(h)), encoding="utf-8")
    md_path.write_text("\n".join(m) + "\n", encoding="utf-8")
    return {
        "run_dir": run_dir,
        "html": html_path,
        "markdown": md_path,
        "figures": len(figures),
        "sections": 4,
        "generations": len(gens),
        "verdict": verdict,
    }


__all__ = ["build_lm_report", "is_lm_run", "sample_generations", "throughput"]
