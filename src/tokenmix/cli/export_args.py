"""Arguments of ``tokenmix export`` (handler: ``export_cmd.py``). Light: imports no torch (cli/main.py)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write an LM run as a Hugging Face model folder (AutoModelForCausalLM, AutoTokenizer; needs tokenmix[hf])",
    )
    p.add_argument("--run", required=True, help="run folder written by 'tokenmix train lm'")
    p.add_argument("--hf", required=True, metavar="OUT", help="new (or empty) folder to write")
    p.set_defaults(handler="export_cmd:run_export")
