"""Plan files: parsing and validation (pure apart from reading the file).

A plan is ``{"goal": str, "steps": [{"tool": str, "input": {...}}, ...]}``.
``"from": N`` in a step's input names the committed output of an earlier step.
Everything that can be checked before running is checked here, at ``create``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import PlanError

if TYPE_CHECKING:
    from .agent import AgentSpec

MAX_PLAN_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_STEPS = 10_000


@dataclass(frozen=True, kw_only=True)
class StepSpec:
    """One planned step: the tool's name and its JSON input."""

    tool: str
    input: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A whole plan, as stored at ``create`` and never recomputed."""

    goal: str
    steps: tuple[StepSpec, ...]
    #: The ``agent`` section, when the plan has one (its first turn is the last step).
    agent: AgentSpec | None = None


def _reject_constant(name: str) -> Any:
    raise PlanError(f"plan is not valid JSON: {name} is not allowed")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > MAX_DEPTH:
            return level  # deep enough to refuse; also ends the walk of a cyclic dict
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def _has_nul(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\0" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_plan(text: str | bytes) -> Plan:
    """Parse plan JSON and check its shape (not its tools: see :func:`validate`)."""
    if len(text) > MAX_PLAN_BYTES:
        raise PlanError(f"plan is larger than {MAX_PLAN_BYTES} bytes")
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise PlanError(f"plan is nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"plan is not valid JSON: {exc}") from None
    return plan_from_dict(raw)


def plan_from_dict(raw: Any) -> Plan:
    """Build a :class:`Plan` from decoded JSON, checking its shape."""
    if _depth(raw) > MAX_DEPTH:
        raise PlanError(f"plan is nested more than {MAX_DEPTH} levels deep")
    try:
        # JSON allows "\ud800", but a lone surrogate cannot be stored as UTF-8
        # text: refuse it here rather than fail inside the store's transaction.
        json.dumps(raw, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise PlanError("plan holds text that is not valid Unicode (a lone surrogate)") from None
    except (TypeError, ValueError) as exc:
        raise PlanError(f"plan is not JSON data: {exc}") from None
    if _has_nul(raw):
        # PostgreSQL text and jsonb cannot hold U+0000: refuse it on every backend alike.
        raise PlanError("plan holds a NUL character (\\u0000), which cannot be stored as text")
    if not isinstance(raw, dict):
        raise PlanError("plan must be a JSON object with a 'steps' list")
    goal = raw.get("goal", "")
    if not isinstance(goal, str):
        raise PlanError("plan 'goal' must be a string")
    agent = None
    if "agent" in raw:
        from .agent import parse_spec

        agent = parse_spec(raw["agent"])
    steps = raw.get("steps", [] if agent is not None else None)
    if not isinstance(steps, list):
        raise PlanError("plan must have a 'steps' list")
    if not steps and agent is None:
        raise PlanError("plan has no steps")
    if len(steps) > MAX_STEPS:
        raise PlanError(f"plan has more than {MAX_STEPS} steps")
    specs = []
    for idx, step in enumerate(steps):
        if not isinstance(step, dict):
            raise PlanError(f"step {idx} must be an object")
        tool = step.get("tool")
        if not isinstance(tool, str) or not tool:
            raise PlanError(f"step {idx} has no tool")
        step_input = step.get("input", {})
        if not isinstance(step_input, dict):
            raise PlanError(f"step {idx} input must be an object")
        if "from" in step_input:
            _check_from(idx, step_input["from"])
        specs.append(StepSpec(tool=tool, input=step_input))
    if agent is not None:
        from .agent import first_turn
        from .models import AGENT_TOOL

        # The first model turn follows the static steps; later turns and the
        # calls they ask for are appended as the agent runs.
        specs.append(StepSpec(tool=AGENT_TOOL, input=first_turn(agent, goal, len(specs))))
    return Plan(goal=goal, steps=tuple(specs), agent=agent)


def _check_from(idx: int, ref: Any) -> None:
    """``from`` names one earlier step, or a list of them (tools such as ``llm``
    read several outputs)."""
    refs = ref if isinstance(ref, list) else [ref]
    for one in refs:
        if not isinstance(one, int) or isinstance(one, bool):
            raise PlanError(f"step {idx} 'from' must be a step index or a list of them")
        if not 0 <= one < idx:
            raise PlanError(
                f"step {idx} 'from' is {one}: it must name an earlier step (0..{idx - 1})"
                if idx
                else "step 0 'from' must name an earlier step, and there is none"
            )


#: How long ``create`` waits for a writer to open a FIFO given as its plan file.
FIFO_WRITER_WAIT = 10.0


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and parse a plan file; every problem is a one-line :class:`PlanError`.

    A regular file is read as it is. A pipe or FIFO (``/dev/stdin``, ``<(...)``,
    ``mkfifo``) is read to its end, however slow its writer; a FIFO that no
    process has open for writing is waited on for :data:`FIFO_WRITER_WAIT`
    seconds, then refused, instead of blocking ``create`` forever.
    """
    shown = os.fspath(path)
    try:
        data = _read_plan_file(shown)
    except FileNotFoundError:
        raise PlanError(f"plan file not found: {shown}") from None
    except IsADirectoryError:
        raise PlanError(f"plan file is a directory: {shown}") from None
    except OSError as exc:
        raise PlanError(f"cannot read plan file {shown}: {exc.strerror}") from None
    return parse_plan(data)


def _read_plan_file(path: str) -> bytes:
    import stat

    # O_NONBLOCK: opening a FIFO must not wait for a writer (open(2) would, forever).
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        chunks = [_first_of_fifo(fd, path)] if stat.S_ISFIFO(mode) else []
        os.set_blocking(fd, True)
        size = len(chunks[0]) if chunks else 0
        while size <= MAX_PLAN_BYTES and (chunk := os.read(fd, MAX_PLAN_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _first_of_fifo(fd: int, path: str) -> bytes:
    """What a FIFO holds now, once some process has it open for writing.

    A non-blocking read of a FIFO says which case it is: data, EAGAIN (a writer
    holds it open, nothing written yet: read on, however slow it is) or EOF
    (no writer at all). Without a writer, wait up to :data:`FIFO_WRITER_WAIT`.
    """
    import select

    deadline_ms = int(FIFO_WRITER_WAIT * 1000)
    for wait in (0, deadline_ms):
        if wait:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(wait)  # returns when a writer writes or hangs up
        try:
            data = os.read(fd, MAX_PLAN_BYTES + 1)
        except BlockingIOError:
            return b""
        if data:
            return data
    raise PlanError(
        f"plan file {path} is a FIFO that no process opened for writing within "
        f"{FIFO_WRITER_WAIT:g} s"
    )


def validate(plan: Plan, lookup: Callable[[str], Any]) -> None:
    """Check every step's tool exists and accepts its input.

    ``lookup(name)`` returns a tool (see :mod:`ninelives.tools`) or raises
    :class:`PlanError` for an unknown name.
    """
    if plan.agent is not None:
        from .agent import check_spec_tools

        check_spec_tools(plan.agent, lookup)
    for idx, step in enumerate(plan.steps):
        tool = lookup(step.tool)
        check = getattr(tool, "validate", None)
        if check is not None:
            try:
                check(step.input)
            except PlanError as exc:
                raise PlanError(f"step {idx} ({step.tool}): {exc}") from None


def as_mapping(plan: Plan) -> Mapping[str, Any]:
    """The plan as plain JSON data."""
    return {"goal": plan.goal, "steps": [{"tool": s.tool, "input": s.input} for s in plan.steps]}
