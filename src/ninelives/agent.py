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

# The plan's agent rules live below the plan checker; re-exported here, where they
# were first defined.
from .agentplan import (
    DEFAULT_MAX_CALLS as DEFAULT_MAX_CALLS,
)
from .agentplan import (
    DEFAULT_MAX_TURNS as DEFAULT_MAX_TURNS,
)
from .agentplan import (
    LIMIT_TURNS as LIMIT_TURNS,
)
from .agentplan import (
    AgentSpec as AgentSpec,
)
from .agentplan import (
    call_policy as call_policy,
)
from .agentplan import (
    first_turn as first_turn,
)
from .agentplan import (
    parse_spec as parse_spec,
)
from .agentplan import (
    turn_policy as turn_policy,
)
from .chat import ask, assistant_message, shown_outputs, tool_message
from .errors import ToolError
from .models import AGENT_TOOL

if TYPE_CHECKING:
    from .models import Task

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
