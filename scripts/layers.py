"""Import circles and imports that run up the layers, among the modules of ninelives.

Reads the sources (nothing is imported): every ``import`` and ``from ... import``
at module level or inside a function counts, those under ``if TYPE_CHECKING:``
do not (they never run). Prints the circles (strongly connected groups of
modules, with one cycle through each), the imports that run from a lower layer
up to a higher one, the modules over the line limit, and exits 1 if any circle
or upward import is found::

    python scripts/layers.py            # the report
    python scripts/layers.py --json     # the same as one JSON object

The layers, lowest first, are :data:`LAYERS`; a module imports only from its
own layer or lower ones. ``tests/unit/test_layers.py`` holds the restructured
packages to that.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1] / "src" / "ninelives"
#: Modules over this many lines are listed.
MAX_LINES = 600

#: The layers, lowest first: (name, module prefixes). A module belongs to the
#: layer of its longest matching prefix (``ninelives.store.sqlite`` is "store").
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "leaves",
        ("ninelives.errors", "ninelives.humanize", "ninelives.crashpoints", "ninelives.version"),
    ),
    (
        "records",
        ("ninelives.models", "ninelives.files", "ninelives.settings", "ninelives.locking"),
    ),
    (
        "rules",
        (
            "ninelives.journal",
            "ninelives.plan",
            "ninelives.policy",
            "ninelives.diskio",
            "ninelives.blobs",
            "ninelives.lineage",
            "ninelives.traces",
            "ninelives.exchange",
            "ninelives.names",
            "ninelives.agentplan",
        ),
    ),
    ("storage", ("ninelives.store",)),
    (
        "tools",
        (
            "ninelives.tools",
            "ninelives.llm",
            "ninelives.chat",
            "ninelives.agent",
            "ninelives.durable",
        ),
    ),
    (
        "engine",
        (
            "ninelives.runtime",
            "ninelives.parking",
            "ninelives.replay",
            "ninelives.replay_async",
            "ninelives.replay_chat",
            "ninelives.replay_checks",
            "ninelives.worker",
            "ninelives.housekeeping",
            "ninelives.verify",
            "ninelives.report",
            "ninelives.torture",
            "ninelives.integrations",
        ),
    ),
    ("front", ("ninelives.cli", "ninelives.testing", "ninelives.__main__")),
    ("package", ("ninelives",)),
]


def module_name(path: Path, root: Path) -> str:
    parts = ["ninelives", *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, depth: int) -> Iterator[tuple[ast.AST, int]]:
    """Every node under ``node`` with how many functions enclose it, skipping
    ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other, depth
                yield from _walk(other, depth)
            continue
        inner = depth + isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield child, depth
        yield from _walk(child, inner)


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool, int]]:
    """``(target, at_module_level, line)`` for each import of a ninelives module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node, depth in _walk(tree, 0):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                sub = f"{stem}.{alias.name}"
                targets.append(sub if sub in known else stem)
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("ninelives"):
                found.append((target, depth == 0, getattr(node, "lineno", 0)))
    return found


def graph(root: Path = ROOT) -> dict[str, list[tuple[str, bool, int]]]:
    """Each module's imports of other ninelives modules."""
    found = modules(root)
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def circles(edges: dict[str, list[tuple[str, bool, int]]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _, _ in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(groups)


def cycle_in(group: list[str], edges: dict[str, list[tuple[str, bool, int]]]) -> list[str]:
    """One cycle through the group's first module (a breadth-first search back to it)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w, _, _ in edges[v]:
            if w == start:
                return [*paths[v], start]
            if w in members and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return group


def layer_of(name: str) -> int:
    best, rank = -1, len(LAYERS)
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def upward(edges: dict[str, list[tuple[str, bool, int]]]) -> list[tuple[str, str, int]]:
    """``(importer, imported, line)`` for each import of a higher layer."""
    return sorted(
        {
            (name, target, line)
            for name, found in edges.items()
            for target, _, line in found
            if layer_of(target) > layer_of(name)
        }
    )


def pairs(edges: dict[str, list[tuple[str, bool, int]]]) -> list[tuple[str, str]]:
    """The modules that import each other directly (the shortest circles)."""
    linked = {(a, b) for a, found in edges.items() for b, _, _ in found}
    return sorted((a, b) for a, b in linked if a < b and (b, a) in linked)


def long_modules(root: Path = ROOT) -> list[tuple[str, int]]:
    """The modules over :data:`MAX_LINES` lines, longest first."""
    found = modules(root).items()
    sizes = [(n, len(p.read_text(encoding="utf-8").splitlines())) for n, p in found]
    return sorted(((n, s) for n, s in sizes if s > MAX_LINES), key=lambda x: -x[1])


def report(root: Path = ROOT) -> dict[str, Any]:
    """Circles, mutual imports, upward imports and long modules, as JSON values."""
    edges = graph(root)
    groups = circles(edges)
    return {
        "layers": [name for name, _ in LAYERS],
        "circles": [{"modules": g, "cycle": cycle_in(g, edges)} for g in groups],
        "mutual": [list(p) for p in pairs(edges)],
        "upward": [{"from": a, "to": b, "line": n} for a, b, n in upward(edges)],
        "unplaced": sorted(n for n in edges if layer_of(n) == len(LAYERS)),
        "over_600_lines": [{"module": n, "lines": s} for n, s in long_modules(root)],
    }


def text(found: dict[str, Any]) -> list[str]:
    """The report as lines for a person."""
    lines = ["layers, lowest first: " + " < ".join(found["layers"])]
    lines.append(f"\n{len(found['circles'])} import circle(s):")
    for c in found["circles"]:
        lines.append(f"  {' -> '.join(c['cycle'])}")
        lines.append(f"    ({len(c['modules'])} modules: {', '.join(c['modules'])})")
    lines.append(f"\n{len(found['mutual'])} pair(s) of modules importing each other:")
    lines += [f"  {a} <-> {b}" for a, b in found["mutual"]]
    lines.append(f"\n{len(found['upward'])} import(s) up the layers:")
    lines += [f"  {u['from']}:{u['line']} imports {u['to']}" for u in found["upward"]]
    lines += [f"  (not in any layer: {name})" for name in found["unplaced"]]
    lines.append(f"\n{len(found['over_600_lines'])} module(s) over {MAX_LINES} lines:")
    lines += [f"  {m['module']}: {m['lines']}" for m in found["over_600_lines"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--root", type=Path, help="the package folder (default: this checkout's)")
    args = parser.parse_args(argv)
    found = report(ROOT if args.root is None else args.root.resolve())
    print(json.dumps(found, indent=2) if args.json else "\n".join(text(found)))
    return 1 if found["circles"] or found["upward"] else 0


if __name__ == "__main__":
    sys.exit(main())
