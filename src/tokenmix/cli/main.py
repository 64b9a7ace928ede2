"""``tokenmix`` command line: parsing only. Each subcommand lives in its own module of this package
with ``register(subparsers)`` (adds its parser and sets ``func``) and does its work by calling the
library.

Errors: bad input raises ``tokenmix.core.errors.InputError`` (or a subclass) somewhere in the
library; it ends here as one line on stderr and exit status 2. A command line argparse cannot parse
(an unknown option, a value that is not a number, a missing required option) is bad input too: one
line ``tokenmix <command>: error: ...`` and exit status 2, no usage block (``--help`` shows it).
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os

# Before anything imports torch: OpenMP threads that spin while waiting for work burn whole cores on a
# shared or loaded machine (docs/notes/design-measurements.md). libgomp reads
# OMP_WAIT_POLICY once, when torch loads it, so it is set here, ahead of the command modules (which
# import torch); a value the user set is kept. tokenmix/__init__.py and tokenmix/cli/__init__.py
# import no torch, so nothing has loaded it yet.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402 -- below the OpenMP setting on purpose
import sys  # noqa: E402

from tokenmix.cli import (
    analysis_cmd,
    bench_cmd,
    compare_cmd,
    demo_cmd,
    design_cmd,
    export_cmd,
    lm_cmd,
    patterns_cmd,
    registry_cmd,
)
from tokenmix.core.errors import InputError

# Subcommand modules, one each: patterns; bench solver|decode|mixers|lm; demo; list / check;
# compare / presets; data prepare / train lm / generate / eval; analyze / report.
COMMAND_MODULES = (
    patterns_cmd,
    bench_cmd,
    demo_cmd,
    registry_cmd,
    compare_cmd,
    lm_cmd,
    analysis_cmd,
    export_cmd,
    design_cmd,
)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``<prog>: error: <message>``, exit status 2), like
    every other bad input; sub-parsers are built from the same class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def one_line(text: str) -> str:
    """``text`` on one line: the lines of a multi-line message joined with '; '."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def command_label(args: argparse.Namespace) -> str:
    """``data prepare``, ``bench solver``, ``analyze matrix``, ``report``: the command as typed."""
    words = [args.command] + [getattr(args, k, None) for k in ("bench", "data_command", "train_command", "analysis")]
    return " ".join(w for w in words if w)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="tokenmix", description="Causal token mixers as (A, B) pairs")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (2 for bad input, also for arguments argparse refuses)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a parse error (one line, status 2) or --help (status 0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"tokenmix {command_label(args)}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tokenmix: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
