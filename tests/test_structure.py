"""The code's structure: no import cycles between the project's modules (imports inside
functions included: a cycle hidden in a function is still a cycle), the worker below
the manager, and one list of index kinds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("panjoin", "spark_conn", "workers", "opencl")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            if "proto" in rel.parts:  # generated
                continue
            name = ".".join(rel.parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in its file."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(filter(None, (resolve(a.name) for a in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    out.add(full if full in mods else resolve(base))
        out.discard(None)
        out.discard(mod)
        graph[mod] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions():
    g = import_graph()
    assert "panjoin.manager.engine" in g["panjoin.cli.replay"]  # imported in run()
    assert len(g) > 80


def test_no_import_cycles():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("low", ["workers.server", "panjoin.codec", "panjoin.backend",
                                 "panjoin.subwindow.store"])
def test_the_worker_side_imports_nothing_of_the_manager(low):
    g = import_graph()
    seen, todo = set(), [low]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(g[m])
    assert not [m for m in seen if m.startswith("panjoin.manager")]


def test_one_list_of_index_kinds():
    from panjoin import config, subwindow

    assert subwindow.INDEX_KINDS == config.INDEX_KINDS
    for kind in config.INDEX_KINDS:
        if kind != "bisort-opencl":  # needs pyopencl: tests/test_opencl_bisort.py
            assert issubclass(subwindow.index_class(kind), subwindow.SubwindowIndex)
