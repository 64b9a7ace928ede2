"""``tokenmix`` command line: parsing only, and fast to start.

The parser is built from light modules, ``<group>_args.py`` (each a ``register(subparsers)`` adding its
parsers), which import no torch, numpy or matplotlib and no registry: ``tokenmix --help`` and every
``tokenmix <command> --help`` answer in a fraction of a second. Each parser names its handler as
``"<module>:<function>"`` of this package (``set_defaults(handler=...)``, mostly ``<group>_cmd.py``);
the handler's module, and with it torch and the library, is imported only once a command is
dispatched. Values argparse would need a registry to check (mixer and preset names, devices) are
checked by the handler (``validate.py``), with the same one line and exit status 2.

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
# OMP_WAIT_POLICY once, when torch loads it, so it is set here, ahead of the handler modules (which
# import torch); a value the user set is kept. tokenmix/__init__.py and this package's parser modules
# import no torch, so nothing has loaded it yet.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402 -- below the OpenMP setting on purpose
import importlib  # noqa: E402
import sys  # noqa: E402
from typing import Callable  # noqa: E402

from tokenmix.cli import (  # noqa: E402
    analysis_args,
    bench_args,
    compare_args,
    demo_args,
    design_args,
    export_args,
    lm_args,
    patterns_args,
    registry_args,
)
from tokenmix.study.durations import stated  # noqa: E402

# Parser modules, one per group: patterns; bench solver|decode|mixers|lm|step|hf; demo; list / check;
# compare / presets; data prepare / train lm / generate / eval; analyze / report; export; design.
COMMAND_MODULES = (
    patterns_args,
    bench_args,
    demo_args,
    registry_args,
    compare_args,
    lm_args,
    analysis_args,
    export_args,
    design_args,
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


# the durations `tokenmix --help` states, from the one table (study/durations.py: light, no torch)
HELP_DURATIONS = (
    ("compare (quick preset)", "compare quick"),
    ("train lm", "train lm"),
    ("check --all", "check all"),
    ("make test", "make test"),
)


def build_parser() -> argparse.ArgumentParser:
    took = ", ".join(f"{label} {stated(key)}" for label, key in HELP_DURATIONS)
    parser = OneLineParser(
        prog="tokenmix",
        description="Causal token mixers as (A, B) pairs",
        epilog=f"On a quiet 2-core machine: {took}; `tokenmix presets` gives each preset's.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return parser


def load_handler(ref: str) -> Callable[[argparse.Namespace], int | None]:
    """The function ``"<module>:<function>"`` of this package names, its module imported now."""
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (2 for bad input, also for arguments argparse refuses)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a parse error (one line, status 2) or --help (status 0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    handler = load_handler(args.handler)
    input_error = importlib.import_module("tokenmix.core.errors").InputError  # loaded with the handler's library
    try:
        return int(handler(args) or 0)
    except input_error as e:
        print(f"tokenmix {command_label(args)}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tokenmix: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
