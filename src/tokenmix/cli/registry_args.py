"""Arguments of ``tokenmix list`` and ``tokenmix check`` (handlers: ``registry_cmd.py``). Light: imports no
torch and no registry (cli/main.py)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "list",
        help="every registered mixer: family, modes, per-token time and cache "
        "(--json: also its config fields, defaults and help)",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument(
        "--json", action="store_true", help="print JSON, with each mixer's config fields (name, type, default, help)"
    )
    fmt.add_argument(
        "--markdown", action="store_true", help="print the per-mixer reference page (docs/mixers.md) as Markdown"
    )
    p.set_defaults(handler="registry_cmd:run_list")
    c = sub.add_parser("check", help="mode equivalence and independent cross-checks, with max errors")
    c.add_argument("--mixer", nargs="+", default=None, help="mixer name(s)")
    c.add_argument("--all", action="store_true", help="check every registered mixer")
    c.add_argument("--json", action="store_true")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c.set_defaults(handler="registry_cmd:run_check")
