"""Agents: a model chooses the next step, and every decision is a durable step.

A plan may end with an ``agent`` section::

    {"goal": "Write a short report on the notes in input/",
     "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}],
     "agent": {"tools": ["fetch", "write_artifact"], "max_turns": 8,
               "system": "You are a careful analyst.", "model": "qwen2.5:7b"}}

After the static steps the plan holds one step of tool ``agent``: a model
turn. A turn rebuilds the whole conversation from committed outputs (the goal
and the static steps' outputs in the first user message, then each earlier
turn as an assistant message with its tool calls, and each call's committed
result as a tool message answering it by id), asks the model once, and
returns its reply as the step's output: the model request, the tool schemas
and the checks of each call are those of ``ctx.chat`` (:mod:`ninelives.chat`).
When the reply asks for tools, the
transaction that commits the turn ``done`` also appends one step per valid
call and then the next turn (:func:`after_turn`), each journaled
``step_appended``; a reply without calls is the answer and ends the task.
So a restart never repeats a committed model call and never loses one.

A call to a tool the agent may not use, or with arguments that fail the
tool's JSON Schema, does not fail the task: the error becomes that call's
result, which the model reads on its next turn. ``max_turns`` and
``max_calls`` end a runaway loop with ``task_failed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .chat import ask, assistant_message, shown_outputs, tool_message
from .errors import PlanError, ToolError
from .models import AGENT_TOOL

if TYPE_CHECKING:
    from .models import Task

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
        from .llm import ENGINES

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


# -- one turn -----------------------------------------------------------------


def conversation(turn: Mapping[str, Any], ctx: Mapping[int, Any]) -> list[dict[str, Any]]:
    """The messages of a turn (its ``system`` aside), rebuilt from its input and
    the committed outputs."""
    parts = [str(turn.get("goal") or ""), *shown_outputs(turn.get("context", []), ctx)]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "\n\n".join(p for p in parts if p)}
    ]
    for ref in turn.get("history", []):
        earlier = _output(ctx, ref)
        messages.append(assistant_message(earlier))
        for call in earlier.get("tool_calls") or []:
            if call.get("step") is None:
                result: Any = {"error": call.get("error") or "the call was not run"}
            else:
                result = _output(ctx, call["step"])
            messages.append(tool_message(call, result))
    return messages


def _output(ctx: Mapping[int, Any], ref: int) -> Any:
    if ref not in ctx:
        raise ToolError(f"step {ref} has no committed output")
    return ctx[ref]


def run_turn(
    turn: Mapping[str, Any],
    ctx: Mapping[int, Any],
    idx: int,
    lookup: Callable[[str], Any],
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Ask the model once (:func:`ninelives.chat.ask`) and return the turn's
    output: the reply, with each call the step index it will run as, or None
    beside the error that says why it cannot run."""
    request = {
        "messages": conversation(turn, ctx),
        "tools": list(turn.get("tools", [])),
        **{k: turn[k] for k in ("system", "model", "engine") if turn.get(k)},
    }
    reply = ask(request, lookup, env)
    next_idx = idx + 1
    for call in reply["tool_calls"]:
        if call.get("error"):
            call["step"] = None
        else:
            call["step"] = next_idx
            next_idx += 1
    return {"turn": turn.get("turn", 0), **reply}


@dataclass(frozen=True, kw_only=True)
class Continuation:
    """What committing a turn does besides marking it done: the steps it appends
    (``(tool, input, policy)`` in index order, the next turn last), or the reason the task
    fails, or neither (the reply was the answer: the task is done)."""

    append: tuple[tuple[str, dict[str, Any], dict[str, Any] | None], ...] = ()
    fail: str | None = None

    @property
    def final(self) -> bool:
        """True when the turn ends the task (answered, or failed)."""
        return not self.append


def after_turn(idx: int, turn: Mapping[str, Any], output: Mapping[str, Any]) -> Continuation:
    """Decide what the commit of turn step ``idx`` appends, from its input and output."""
    calls = output.get("tool_calls") or []
    if not calls:
        return Continuation()
    number = int(turn.get("turn", 0))
    max_turns = int(turn.get("max_turns", DEFAULT_MAX_TURNS))
    if number + 1 >= max_turns:
        return Continuation(
            fail=f"agent used all {max_turns} turns (max_turns) without a final answer"
        )
    valid = [c for c in calls if c.get("step") is not None]
    calls_so_far = int(turn.get("calls_so_far", 0)) + len(valid)
    max_calls = int(turn.get("max_calls", DEFAULT_MAX_CALLS))
    if calls_so_far > max_calls:
        return Continuation(
            fail=f"agent asked for {calls_so_far} tool calls, more than max_calls ({max_calls})"
        )
    policy = call_policy(turn)
    steps = [(str(c["name"]), dict(c["arguments"]), policy) for c in valid]
    following = {
        **turn,
        "turn": number + 1,
        "history": [*turn.get("history", []), idx],
        "calls_so_far": calls_so_far,
    }
    return Continuation(append=(*steps, (AGENT_TOOL, following, turn_policy(turn))))


def regrant(task: Task) -> tuple[int, list[tuple[str, str, str | None]], dict[str, Any]] | None:
    """What ``retry`` appends to an agent task that ``max_turns`` or ``max_calls``
    failed: the calls its last turn asked for and the next turn, as that turn's
    commit would have, under the agent's budget granted again from there (as
    many turns and calls as the plan gave it); with the ``task_retried`` data.
    None for any other task (a failed step is retried as usual)."""
    from .journal import dumps
    from .models import StepStatus, TaskStatus

    if task.status is not TaskStatus.FAILED or not task.steps:
        return None
    last = task.steps[-1]
    if last.tool != AGENT_TOOL or last.status is not StepStatus.DONE or last.output is None:
        return None
    if any(s.status is StepStatus.FAILED for s in task.steps):
        return None
    first = next(s for s in task.steps if s.tool == AGENT_TOOL).input
    turn = dict(last.input)
    asked = [c for c in last.output.get("tool_calls") or [] if c.get("step") is not None]
    turn["max_turns"] = (
        int(turn.get("turn", 0)) + 1 + int(first.get("max_turns", DEFAULT_MAX_TURNS))
    )
    turn["max_calls"] = (
        int(turn.get("calls_so_far", 0))
        + len(asked)
        + int(first.get("max_calls", DEFAULT_MAX_CALLS))
    )
    follow = after_turn(last.idx, turn, last.output)
    if follow.final:
        return None
    append = [
        (tool, dumps(given), dumps(policy) if policy else None)
        for tool, given, policy in follow.append
    ]
    data = {"after": last.idx, "max_turns": turn["max_turns"], "max_calls": turn["max_calls"]}
    return last.idx, append, data
