"""``tokenmix`` command line: parsing only. Each subcommand lives in its own module of this package
with ``register(subparsers)`` (adds its parser and sets ``func``) and does its work by calling the
library. Bad input ends as one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, one line each (tokenmix.cli.<module>).
COMMAND_MODULES = [
    "patterns_cmd",   # tokenmix patterns
    "bench_cmd",      # tokenmix bench solver|decode|mixers|lm
    "demo_cmd",       # tokenmix demo
    "registry_cmd",   # tokenmix list / tokenmix check
    "compare_cmd",    # tokenmix compare
    "lm_cmd",         # tokenmix data prepare / train lm / generate / eval
    "analysis_cmd",   # tokenmix analyze / report
]


class UsageError(Exception):
    """Raised by subcommands for bad input; printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmix", description="Causal token mixers as (A, B) pairs")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod_name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"tokenmix.cli.{mod_name}")
        except ModuleNotFoundError as e:
            if e.name == f"tokenmix.cli.{mod_name}":
                continue  # command not built yet in this checkout
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, TypeError, FileNotFoundError, PermissionError, NotADirectoryError,
            IsADirectoryError, UnicodeDecodeError) as e:
        print(f"tokenmix {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tokenmix: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
