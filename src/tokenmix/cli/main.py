"""``tokenmix`` command line: parsing only. Each subcommand lives in its own module of this package
with ``register(subparsers)`` (adds its parser and sets ``func``) and does its work by calling the
library.

Errors: bad input raises ``tokenmix.core.errors.InputError`` (or a subclass) somewhere in the
library; it ends here as one line on stderr and exit status 2. Any other exception is a bug and
keeps its traceback.
"""
from __future__ import annotations

import argparse
import sys

from tokenmix.cli import (analysis_cmd, bench_cmd, compare_cmd, demo_cmd, lm_cmd, patterns_cmd,
                          registry_cmd)
from tokenmix.core.errors import InputError

# Subcommand modules, one each: patterns; bench solver|decode|mixers|lm; demo; list / check;
# compare / presets; data prepare / train lm / generate / eval; analyze / report.
COMMAND_MODULES = (patterns_cmd, bench_cmd, demo_cmd, registry_cmd, compare_cmd, lm_cmd, analysis_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmix", description="Causal token mixers as (A, B) pairs")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"tokenmix {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tokenmix: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
