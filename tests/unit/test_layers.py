"""No import circle and no import up the layers; modules and functions kept short.

``scripts/layers.py`` reads the sources (module- and function-level imports;
``if TYPE_CHECKING:`` excluded). The whole package is held to it here: a new
circle, a pair of modules importing each other, an import up the layers, a
module over 600 lines, a ``from x import _private`` or a function over 60
lines fails these tests.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]

#: The modules this rule covers (prefixes: ``ninelives.cli`` covers ``ninelives.cli.ops``).
GUARDED = (
    "ninelives.cli",
    "ninelives.humanize",
    "ninelives.diskio",
    "ninelives.files",
    "ninelives.blobs",
    "ninelives.errors",
    "ninelives.version",
    "ninelives.tools.effects",
)


def layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layers", ROOT / "scripts" / "layers.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["layers"] = module
    spec.loader.exec_module(module)
    return module


def guarded(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in GUARDED)


def test_the_restructured_modules_are_in_no_circle_and_import_nothing_above_them() -> None:
    lay = layers()
    edges = lay.graph()
    assert "ninelives.cli.output" in edges  # the control: the package was read
    in_circles = [m for group in lay.circles(edges) for m in group if guarded(m)]
    assert in_circles == []
    up = [(a, b, n) for a, b, n in lay.upward(edges) if guarded(a) or guarded(b)]
    assert up == []
    assert [m for m in edges if guarded(m) and lay.layer_of(m) == len(lay.LAYERS)] == []


def test_the_cli_modules_import_no_private_name_of_a_sibling() -> None:
    import ast

    for path in sorted((ROOT / "src" / "ninelives" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert private in ([], ["__version__"]), (path.name, private)


def test_no_module_is_in_a_circle_or_imports_a_layer_above_it() -> None:
    """Over the whole package, not only the restructured parts."""
    lay = layers()
    edges = lay.graph()
    assert "ninelives.runtime.core" in edges  # the control: the package was read
    assert lay.circles(edges) == []
    assert lay.pairs(edges) == []
    assert lay.upward(edges) == []
    assert [m for m in edges if lay.layer_of(m) == len(lay.LAYERS)] == []


def test_no_module_is_over_the_line_limit() -> None:
    lay = layers()
    assert lay.long_modules() == []


def private_imports(root: Path) -> list[tuple[str, int, list[str]]]:
    """``(file, line, names)`` for each ``from x import _name`` (dunders aside)."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                names = [a.name for a in node.names if a.name.startswith("_")]
                names = [n for n in names if not n.startswith("__")]
                if names:
                    found.append((str(path.relative_to(root)), node.lineno, names))
    return found


def long_functions(root: Path, limit: int = 60) -> list[tuple[str, str, int]]:
    """``(file, function, lines)`` for each function longer than ``limit`` lines."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append((str(path.relative_to(root)), node.name, lines))
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports(ROOT / "src" / "ninelives") == []


def test_no_function_is_over_60_lines() -> None:
    assert long_functions(ROOT / "src" / "ninelives") == []


def test_negative_control_a_private_import_and_a_long_function_are_found(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "a.py").write_text(f"from .b import _hidden, __version__\ndef f():\n{body}")
    assert private_imports(tmp_path) == [("a.py", 1, ["_hidden"])]
    assert long_functions(tmp_path) == [("a.py", "f", 61)]


def test_negative_control_a_planted_circle_and_upward_import_are_found(tmp_path: Path) -> None:
    lay = layers()
    package = tmp_path / "ninelives"
    (package / "cli").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("def f():\n    from .cli import output\n")
    (package / "cli" / "__init__.py").write_text("")
    (package / "cli" / "output.py").write_text("from ..errors import f\n")
    (package / "humanize.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .cli import output\n"
    )
    edges = lay.graph(package)
    assert lay.circles(edges) == [["ninelives.cli.output", "ninelives.errors"]]
    assert lay.upward(edges) == [("ninelives.errors", "ninelives.cli.output", 2)]
    assert edges["ninelives.humanize"] == []  # TYPE_CHECKING imports never run
