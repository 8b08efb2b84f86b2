"""The architecture, checked on the import graph (built with ``ast``, imports inside
functions included, since a lazy import is still a dependency):

- no import cycle among the modules of tirpat/, accel/ and examples/ (an import under
  ``if TYPE_CHECKING:`` counts too: two modules whose annotations need each other share
  something that belongs in a third);
- no private name (``_x``) of one module imported or used by another;
- dependencies point one way: nothing in tirpat/ reaches accel; accel.hw reaches neither
  accel.compiler nor tirpat.model; tirpat.tir and tirpat.device never reach tirpat.model.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("tirpat", "accel")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict:
    """``{module name: path}`` for every Python file of the packages and examples."""
    found = {}
    for top in (*PACKAGES, "examples"):
        for path in sorted((ROOT / top).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _sources()


def _resolve(module: str, path: pathlib.Path, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _local(name: str) -> str | None:
    """The project module ``name`` is, or is inside (``pkg.mod.attr`` -> ``pkg.mod``), else None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Imports(ast.NodeVisitor):
    """The project modules one module imports, and the private names it takes from them."""

    def __init__(self, module: str, path: pathlib.Path):
        self.module, self.path = module, path
        self.edges: set = set()
        self.private: list = []
        self.aliases: dict = {}  # local name -> project module it stands for

    def _edge(self, name: str | None, line: int) -> str | None:
        target = _local(name) if name else None
        if target is not None and target != self.module:
            self.edges.add((target, line))
        return target

    def visit_Import(self, node):
        for alias in node.names:
            target = self._edge(alias.name, node.lineno)
            if target is not None and alias.asname:
                self.aliases[alias.asname] = alias.name

    def visit_ImportFrom(self, node):
        source = _resolve(self.module, self.path, node.level, node.module)
        for alias in node.names:
            full = f"{source}.{alias.name}" if source else alias.name
            if full in MODULES:  # a submodule: ``from . import pattern as P``
                self._edge(full, node.lineno)
                self.aliases[alias.asname or alias.name] = full
                continue
            target = self._edge(source, node.lineno)
            if target is not None and target != self.module and _private(alias.name):
                self.private.append(f"{self.module}:{node.lineno} imports {alias.name} from {target}")
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.aliases and _private(node.attr):
            owner = self.aliases[node.value.id]
            if owner != self.module:
                self.private.append(f"{self.module}:{node.lineno} uses {owner}.{node.attr}")
        self.generic_visit(node)


def _graph():
    graph, private, lines = {}, [], {}
    for module, path in MODULES.items():
        visitor = _Imports(module, path)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        graph[module] = {target for target, _ in visitor.edges}
        for target, line in visitor.edges:
            lines.setdefault((module, target), line)
        private += visitor.private
    return graph, private, lines


GRAPH, PRIVATE, LINES = _graph()


def _cycles(graph) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _reachable(start: str) -> dict:
    """``{module: the module that imports it}`` for every module ``start`` reaches."""
    seen, todo = {start: None}, [start]
    while todo:
        v = todo.pop()
        for w in GRAPH.get(v, ()):
            if w not in seen:
                seen[w] = v
                todo.append(w)
    return seen


def _path(reached: dict, end: str) -> str:
    chain = [end]
    while reached[chain[-1]] is not None:
        chain.append(reached[chain[-1]])
    steps = list(reversed(chain))
    return " -> ".join(f"{a} (line {LINES[(a, b)]})" for a, b in zip(steps, steps[1:])) + f" -> {end}"


def test_the_graph_sees_the_project():
    assert {"tirpat.tir.pattern", "tirpat.tir.engine", "accel.hw.isa", "accel.compiler.rules"} <= set(MODULES)
    assert "tirpat.tir.engine" in GRAPH["tirpat.tir.pattern"]  # a plain import
    assert "tirpat.tir.module_rule" in GRAPH["tirpat.tir.rewrite"]  # an import inside a function


def test_no_import_cycles():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    assert not PRIVATE, "private names used across modules:\n" + "\n".join(PRIVATE)


@pytest.mark.parametrize("start, forbidden", [
    ("tirpat", ("accel",)),
    ("accel.hw", ("accel.compiler", "tirpat.model")),
    ("tirpat.tir", ("tirpat.model",)),
    ("tirpat.device", ("tirpat.model",)),
])
def test_dependencies_point_one_way(start, forbidden):
    sources = [m for m in MODULES if m == start or m.startswith(start + ".")]
    bad = []
    for source in sources:
        reached = _reachable(source)
        bad += [_path(reached, m) for m in reached if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert not bad, f"{start} must not reach {forbidden}:\n" + "\n".join(sorted(set(bad)))


def test_cycle_and_private_checks_catch_what_they_should():
    """The checks on a made-up graph and source: they can fail."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "d": {"a"}}) == []
    visitor = _Imports("tirpat.tir.rewrite", ROOT / "tirpat/tir/rewrite.py")
    visitor.visit(ast.parse("from .match import _Matcher\nfrom . import pattern as P\nx = P._BINOPS\n"
                            "def f():\n    from .engine import _PLAIN\n"
                            "if TYPE_CHECKING:\n    from .explain import Explanation\n"))
    assert visitor.private == ["tirpat.tir.rewrite:1 imports _Matcher from tirpat.tir.match",
                               "tirpat.tir.rewrite:3 uses tirpat.tir.pattern._BINOPS",
                               "tirpat.tir.rewrite:5 imports _PLAIN from tirpat.tir.engine"]
    assert {target for target, _ in visitor.edges} == {"tirpat.tir.match", "tirpat.tir.pattern", "tirpat.tir.engine",
                                                       "tirpat.tir.explain"}


def test_the_old_cycles_stats_cycle_would_be_caught():
    """The cycle this check was extended for: ``accel.hw.stats`` imported ``Timing`` from
    ``accel.hw.cycles`` under TYPE_CHECKING while cycles imported stats's units."""
    old = {"accel.hw.stats": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from accel.hw.cycles import Timing\n",
           "accel.hw.cycles": "from accel.hw.stats import UNITS, Event\n"}
    graph = dict(GRAPH)
    for module, source in old.items():
        visitor = _Imports(module, MODULES[module])
        visitor.visit(ast.parse(source))
        graph[module] = GRAPH[module] | {target for target, _ in visitor.edges}
    assert ["accel.hw.cycles", "accel.hw.stats"] in _cycles(graph)
