"""The agent section of a plan, as plan checking needs it (pure rules).

A plan's ``agent`` section (:class:`AgentSpec`), the input of its first model
turn and the step policies of turns and calls, and the check that every tool an
agent may call declares a JSON Schema. The turns themselves run in
:mod:`ninelives.agent`; these rules live below it so that :mod:`ninelives.plan`
checks a plan without importing the machinery that runs one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import PlanError
from .models import AGENT_TOOL

DEFAULT_MAX_TURNS = 8
DEFAULT_MAX_CALLS = 32
LIMIT_TURNS = 1000
_SPEC_KEYS = frozenset({"tools", "max_turns", "max_calls", "system", "model", "engine"})


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """A plan's ``agent`` section."""

    tools: tuple[str, ...]
    max_turns: int = DEFAULT_MAX_TURNS
    max_calls: int = DEFAULT_MAX_CALLS
    system: str = ""
    model: str = ""
    engine: str = ""


def parse_spec(raw: Any) -> AgentSpec:
    """The ``agent`` section of a plan, shape-checked; :class:`PlanError` if wrong."""
    if not isinstance(raw, dict):
        raise PlanError("plan 'agent' must be an object")
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise PlanError(f"plan 'agent' has unknown keys {unknown} (known: {sorted(_SPEC_KEYS)})")
    tools = raw.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
        raise PlanError("plan 'agent.tools' must be a list of tool names")
    if len(set(tools)) != len(tools):
        raise PlanError("plan 'agent.tools' names a tool twice")
    if AGENT_TOOL in tools:
        raise PlanError("plan 'agent.tools' cannot hold 'agent' itself")
    limits = {}
    for key, default in (("max_turns", DEFAULT_MAX_TURNS), ("max_calls", DEFAULT_MAX_CALLS)):
        value = raw.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= LIMIT_TURNS:
            raise PlanError(f"plan 'agent.{key}' must be a whole number 1-{LIMIT_TURNS}")
        limits[key] = value
    texts = {}
    for key in ("system", "model", "engine"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            raise PlanError(f"plan 'agent.{key}' must be a string")
        texts[key] = value
    if texts["engine"]:
        from .names import ENGINES

        if texts["engine"] not in ENGINES:
            raise PlanError(f"plan 'agent.engine' {texts['engine']!r} is not one of {ENGINES}")
    return AgentSpec(
        tools=tuple(tools),
        max_turns=limits["max_turns"],
        max_calls=limits["max_calls"],
        system=texts["system"],
        model=texts["model"],
        engine=texts["engine"],
    )


def first_turn(
    spec: AgentSpec, goal: str, static_steps: int, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The input of the first turn, which follows ``static_steps`` static steps.

    ``defaults``, the plan's, are kept in it as ``policy``: every step its calls
    append gets them, and every turn those of them that apply to a turn
    (:func:`turn_policy`)."""
    turn: dict[str, Any] = {
        "turn": 0,
        "goal": goal,
        "context": list(range(static_steps)),
        "history": [],
        "calls_so_far": 0,
        "tools": list(spec.tools),
        "max_turns": spec.max_turns,
        "max_calls": spec.max_calls,
        "system": spec.system,
        "model": spec.model,
        "engine": spec.engine,
    }
    if defaults:
        turn["policy"] = dict(defaults)
    return turn


def call_policy(turn: Mapping[str, Any]) -> dict[str, Any] | None:
    """The policy of each step a turn's calls append: the plan's ``defaults``, which
    the tool's own ``on_unknown`` gives way to as it does in a planned step."""
    policy = turn.get("policy")
    return dict(policy) if isinstance(policy, Mapping) and policy else None


def turn_policy(turn: Mapping[str, Any]) -> dict[str, Any] | None:
    """The policy of a turn itself: the plan's ``defaults`` but ``on_unknown``. A
    turn's only effect is the model call, which a kill between its commits asks
    again (at most one call paid twice); blocking the task instead would leave
    ``resolve --done`` a reply without the steps it asks for."""
    policy = {k: v for k, v in (call_policy(turn) or {}).items() if k != "on_unknown"}
    return policy or None


def check_callable(names: Sequence[str], lookup: Callable[[str], Any]) -> None:
    """Every tool in ``names`` exists and declares a JSON Schema, and the validator
    that checks calls against them is installed (:class:`PlanError` if not)."""
    require_validator()
    for name in names:
        tool = lookup(name)
        if getattr(tool, "schema", None) is None:
            raise PlanError(
                f"agent tool {name!r} declares no input schema: a model can only call "
                "tools that declare one"
            )


def require_validator() -> Any:
    """The JSON Schema validator, or a :class:`PlanError` saying how to install it."""
    try:
        import fastjsonschema
    except ImportError:
        raise PlanError(
            "agents check tool calls against JSON Schemas with fastjsonschema: "
            "pip install 'ninelives[agents]'"
        ) from None
    return fastjsonschema
