"""The model-call mechanism sits below what uses it: ``ninelives.chat`` imports
none of the plan agent, the tools or the workflow runtime, and the plan agent
does not import the tools (whose ``agent`` tool imports it), so there is one
mechanism and no import circle among them. Imports inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

import ninelives

PACKAGE = Path(ninelives.__file__).resolve().parent


def imported(module: str) -> set[str]:
    """The ninelives modules ``module`` (dotted, under the package) imports anywhere."""
    path = PACKAGE.joinpath(*module.split(".")).with_suffix(".py")
    package = module.rpartition(".")[0].split(".") if "." in module else []
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            names = [node.module] if node.module else [a.name for a in node.names]
            found.update(".".join([*base, name]) for name in names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ninelives."):
            found.add(str(node.module).removeprefix("ninelives."))
    return found


def test_chat_imports_nothing_that_uses_it() -> None:
    users = {"agent", "replay", "replay_chat", "replay_async", "durable", "runtime", "plan"}
    found = imported("chat")
    assert not found & users
    assert not {m for m in found if m == "tools" or m.startswith("tools.")}
    assert found >= {"errors", "models"}  # the walk sees its imports at all


def test_the_plan_agent_and_the_model_tools_form_no_circle() -> None:
    assert "chat" in imported("agent")
    assert not {m for m in imported("agent") if m == "tools" or m.startswith("tools.")}
    assert {"agent", "chat"} <= imported("tools.model")
