"""tokenmix export --run DIR --hf OUT -- a trained LM run as a Hugging Face model folder (hf/export.py)."""

from __future__ import annotations

from tokenmix.core.errors import MissingDependency


def run_export(args) -> int:
    # transformers is an optional dependency (the ``hf`` extra) and takes seconds to import, so it is
    # imported here, when the command runs -- not on every tokenmix command, and not to dodge a cycle.
    try:
        from tokenmix.hf.export import export_run
    except ImportError as e:
        if getattr(e, "name", None) and e.name.split(".")[0] in ("transformers", "tokenizers"):
            raise MissingDependency(e.name.split(".")[0], "tokenmix export", "hf") from None
        raise
    result = export_run(args.run, args.hf)
    print(f"exported {args.run} ({result.checkpoint.name}, {result.parameters:,} parameters) to {result.out_dir}")
    return 0
