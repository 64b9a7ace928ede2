"""The package's floors: no import cycle, no import from a lower layer into a higher one, no tokenmix
import hidden inside a function, and no two classes sharing a name (a reader must be able to tell
which class an import brings)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import tokenmix

PACKAGE = Path(tokenmix.__file__).parent
# lower rank = lower floor; a module may import from its own package or a lower rank only
RANK = {
    "core": 0,
    "patterns": 1,
    "tasks": 1,
    "data": 1,
    "ops": 2,
    "mixers": 3,
    "checks": 4,
    "models": 4,
    "generation": 4,
    "runs": 5,
    "training": 6,
    "analysis": 6,
    "bench": 6,
    "hf": 6,
    "study": 7,
    "cli": 8,
    "__main__": 9,
}
# Modules that are slow to import and that only some commands need, imported when those commands run so
# every other command starts without them: the ones loading transformers (the optional ``hf`` extra,
# seconds), and the lm preset registry (every preset and its analysis modules, matplotlib: a third of
# `train lm`'s start-up, which a command refused on its --set never needs). Not a cycle dodge: nothing
# below imports them. Any other import inside a function fails the test.
LOADED_WHEN_USED = {"tokenmix.hf.export", "tokenmix.bench.hf_generate", "tokenmix.study.presets.lm"}
# same floor, but neither may import the other
APART = [{"training", "analysis"}, {"analysis", "bench"}, {"training", "bench"}]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(target: str, known: set[str]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def _imports(name: str, source: str, known: set[str], pkg: str) -> list[tuple[str, ast.stmt]]:
    """(imported tokenmix module, the import statement) for every import in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            if t.startswith("tokenmix"):
                r = _resolve(t, known)
                if r is not None and r != name:
                    found.append((r, node))
    return found


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    # a package's __init__ that imports its own children is its face, not an arrow
    return {
        m: {
            t
            for t, _ in _imports(m, p.read_text(encoding="utf-8"), known, _package_of(m, p))
            if not t.startswith(m + ".")
        }
        for m, p in mods.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, targets in graph.items():
        a = _floor(m)
        if a == "__init__":
            continue
        assert a in RANK, f"{m}: floor '{a}' has no rank; give it one in RANK"
        for t in targets:
            b = _floor(t)
            if a == b:
                continue
            if b == "__init__" or RANK[b] > RANK[a] or (RANK[a] == RANK[b] and {a, b} in APART):
                bad.append(f"{m} -> {t}")
    return bad


def hidden_imports(name: str, source: str, known: set[str], pkg: str) -> list[int]:
    """Lines of tokenmix imports placed inside a function body."""
    found = _imports(name, source, known, pkg)
    optional = {node.lineno for target, node in found if target in LOADED_WHEN_USED}
    arrows = {node.lineno for _, node in found} - optional
    lines = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines += [
                n.lineno for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno in arrows
            ]
    return lines


def test_no_import_cycle():
    assert not cycles(_graph())


def test_imports_only_go_down_the_floors():
    bad = upward_arrows(_graph())
    assert not bad, "\n".join(bad)


def test_no_tokenmix_import_inside_a_function():
    mods = _modules()
    known = set(mods)
    hidden = {
        m: lines
        for m, p in mods.items()
        if (lines := hidden_imports(m, p.read_text(encoding="utf-8"), known, _package_of(m, p)))
    }
    assert not hidden, hidden


def test_no_two_classes_share_a_name():
    where = defaultdict(list)
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(name)
    shared = {k: v for k, v in where.items() if len(v) > 1}
    assert not shared, shared


def test_the_checks_see_planted_violations():
    """A cycle, an upward arrow, a same-floor arrow between floors kept apart, and a hidden import."""
    assert cycles({"tokenmix.a.x": {"tokenmix.b.y"}, "tokenmix.b.y": {"tokenmix.a.x"}, "tokenmix.c": set()}) == [
        ["tokenmix.a.x", "tokenmix.b.y"]
    ]
    assert upward_arrows(
        {
            "tokenmix.core.operator": {"tokenmix.mixers.registry"},
            "tokenmix.analysis.report": {"tokenmix.training.lm"},
            "tokenmix.study.compare": {"tokenmix.training.synthetic"},
        }
    ) == ["tokenmix.core.operator -> tokenmix.mixers.registry", "tokenmix.analysis.report -> tokenmix.training.lm"]
    known = {"tokenmix.core.files", "tokenmix.study.paper"}
    src = "from tokenmix.core.files import atomic_path\n\ndef f():\n    from tokenmix.study.paper import PAPER_ROWS\n"
    assert hidden_imports("tokenmix.core.operator", src, known, "tokenmix.core") == [4]
