"""Arguments of ``tokenmix demo`` (handler: ``demo_cmd.py``). Light: imports no torch (cli/main.py)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="short built-in demo of the core engine (patterns, modes, decode)")
    p.add_argument("--n", type=int, default=512, help="sequence length of the demo")
    p.set_defaults(handler="demo_cmd:run")
