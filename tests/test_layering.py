"""The layering rules of the packages, checked on the import graph of the source (every import:
module-level, function-local and under TYPE_CHECKING, since a local import hides a cycle
rather than removing it).

- no import cycles in ``tuner``, ``search_spaces`` and ``cost_models``;
- ``tuner.db`` imports nothing of the graph and measurement stages but their result types
  (workload keys, the layout vocabulary, measurement results);
- ``search_spaces`` never imports ``tuner.measure`` or ``tuner.device``;
- nothing in ``tuner/`` outside ``tuner/cli`` and nothing in ``benchmarks/`` imports ``tuner.cli``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "search_spaces", "cost_models")
#: What ``tuner.db`` may import from the stages above it: their result types and vocabulary.
DB_MAY_IMPORT = {
    "tuner", "tuner.errors", "tuner.device", "tuner.host", "tuner.trace_json", "tuner.graph.keys",
    "tuner.graph.layout.plan", "tuner.measure.results",
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(f): f for p in PACKAGES for f in (ROOT / p).rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules ``path`` imports (each resolved to the longest known module)."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            subs = [f"{base}.{a.name}" for a in node.names]
            # `from pkg import submodule` imports the submodule; `from pkg import name`, pkg.
            targets = subs + ([base] if any(s not in known for s in subs) else [])
        for t in targets:
            if t.split(".")[0] in (*PACKAGES, "benchmarks"):
                r = resolve(t)
                if r is not None and r != name:
                    found.add(r)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(f, m, set(mods)) for m, f in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_database_imports_only_result_types_of_the_stages_above():
    wrong = defaultdict(set)
    for mod, deps in _graph().items():
        if mod == "tuner.db" or mod.startswith("tuner.db."):
            for d in deps:
                if d.startswith("tuner") and not d.startswith("tuner.db") and d not in DB_MAY_IMPORT:
                    wrong[mod].add(d)
    assert dict(wrong) == {}


def test_search_spaces_never_import_measurement_or_devices():
    wrong = {m: sorted(d for d in deps if d.startswith(("tuner.measure", "tuner.device")))
             for m, deps in _graph().items() if m.startswith("search_spaces")}  # fmt: skip
    assert {m: d for m, d in wrong.items() if d} == {}


def test_nothing_below_the_command_line_imports_it():
    graph = _graph()
    wrong = sorted(m for m, deps in graph.items()
                   if not m.startswith("tuner.cli") and any(d.startswith("tuner.cli") for d in deps))  # fmt: skip
    assert wrong == []
    known = set(graph)
    scripts = [f for f in (ROOT / "benchmarks").glob("*.py")]
    assert scripts, "no maintained benchmark scripts found"
    users = sorted(f.name for f in scripts if any(d.startswith("tuner.cli") for d in _imports(f, f.stem, known)))
    assert users == []


def test_the_checker_sees_a_cycle_and_a_hidden_import(tmp_path):
    """The rules above are only as good as the graph: a cycle through a function-local import is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from tuner.cli import main\n")
    assert _imports(f, "m", {"tuner", "tuner.cli"}) == {"tuner.cli"}
