"""The command line starts fast: the parser tree is built from light modules, and a command's handler
(with torch and the library) is imported only when the command runs (cli/main.py)."""

from __future__ import annotations

import argparse
import json
import sys

from progress_guard import run_guarded
from tokenmix.cli.main import build_parser, load_handler

# every command's --help in one process, then the heavy modules that got loaded
WALK_HELP = """
import argparse, io, json, sys
from contextlib import redirect_stdout
from tokenmix.cli.main import build_parser, main

def commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from commands(sub, (*prefix, name))

seen = []
for argv in [[]] + [list(c) for c in commands(build_parser())]:
    with redirect_stdout(io.StringIO()) as out:
        code = main([*argv, "--help"])
    assert code == 0 and "usage: tokenmix" in out.getvalue(), (argv, code)
    seen.append(argv)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy", "matplotlib", "transformers", "rich")
               or m.startswith(("tokenmix.mixers", "tokenmix.study.presets")))
print(json.dumps({"helped": len(seen), "heavy": heavy}))
"""


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, parser) of every command that runs (one without sub-commands)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*prefix, name))


def test_help_of_every_command_loads_neither_torch_nor_a_registry():
    out = run_guarded([sys.executable, "-c", WALK_HELP], cpu_seconds=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["helped"] >= 20  # tokenmix --help, the groups and every command
    assert result["heavy"] == [], result["heavy"][:20]


def test_every_command_names_a_handler_that_exists():
    leaves = list(_leaves(build_parser()))
    assert len(leaves) >= 20
    for words, parser in leaves:
        ref = parser.get_default("handler")
        assert isinstance(ref, str) and ":" in ref, words
        assert callable(load_handler(ref)), (words, ref)


def test_tokenmix_help_answers_within_a_generous_budget():
    """The CPU time of a fresh ``tokenmix --help`` process (its own work, whatever the load): ~0.1 s on a
    quiet 2-core machine, ~2 s when every command's module (torch, the mixers, matplotlib) was imported
    first; 1.5 s still shows a return of the heavy imports."""
    best = float("inf")
    for _ in range(2):
        out = run_guarded([sys.executable, "-m", "tokenmix", "--help"])
        best = min(best, out.cpu_seconds)
        assert out.returncode == 0 and "usage: tokenmix" in out.stdout
    assert best < 1.5, f"tokenmix --help used {best:.2f} s of CPU time"


def test_import_tokenmix_installs_no_import_hook():
    """``import tokenmix`` adds nothing to ``sys.meta_path`` and loads no third-party module: the
    Hugging Face registration is ``import tokenmix.hf``, explicit (tokenmix/__init__.py)."""
    code = (
        "import json, sys\n"
        "before, mods = list(sys.meta_path), set(sys.modules)\n"
        "import tokenmix\n"
        "new = sorted(m for m in set(sys.modules) - mods if m.split('.')[0] not in sys.stdlib_module_names)\n"
        "print(json.dumps({'hooks': len(sys.meta_path) - len(before), 'new': new}))\n"
    )
    out = run_guarded([sys.executable, "-c", code], cpu_seconds=30)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"hooks": 0, "new": ["tokenmix"]}, result
