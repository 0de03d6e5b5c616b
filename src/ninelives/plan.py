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
from .models import MAX_DEPTH

if TYPE_CHECKING:
    from .agentplan import AgentSpec

MAX_PLAN_BYTES = 1 << 20
MAX_STEPS = 10_000
#: Keys of a step policy, allowed on a step beside ``tool`` and ``input`` and in
#: the plan's ``defaults``.
POLICY_KEYS = ("max_attempts", "timeout", "backoff", "on_unknown")
#: What a step left ``running`` by a crash does at recovery (see docs/guides/step-policies.md).
ON_UNKNOWN = ("rerun", "probe", "refuse")


@dataclass(frozen=True, kw_only=True)
class StepSpec:
    """One planned step: the tool's name and its JSON input."""

    tool: str
    input: dict[str, Any]
    #: The step's policy: the plan's ``defaults`` merged with the step's own keys
    #: (see :data:`POLICY_KEYS`); None when neither sets any.
    policy: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A whole plan, as stored at ``create`` and never recomputed."""

    goal: str
    steps: tuple[StepSpec, ...]
    #: The ``agent`` section, when the plan has one (its first turn is the last step).
    agent: AgentSpec | None = None


def reject_constant(name: str) -> Any:
    """``parse_constant`` for :func:`json.loads`: refuse ``NaN`` and ``Infinity``,
    which standard JSON (and so a store) cannot hold."""
    raise ValueError(f"{name} is not allowed")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads`: refuse an object that repeats a
    key. JSON parsers disagree on which one counts (Python keeps the last), so a
    plan with ``"steps"`` twice would be stored as another plan than its author saw."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r} in an object")
            seen.add(key)
    return value


def depth(value: Any) -> int:
    """How deeply ``value``'s lists and objects nest (1 for a scalar), counted
    without recursion; any depth over :data:`~ninelives.models.MAX_DEPTH` is
    reported as soon as it is seen."""
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


def parse_plan(text: str | bytes, *, name: str = "plan") -> Plan:
    """Parse plan JSON and check its shape (not its tools: see :func:`validate`).
    ``name`` is what its errors call it (``plan file plan.json``)."""
    if len(text) > MAX_PLAN_BYTES:
        raise PlanError(f"{name} is larger than {MAX_PLAN_BYTES} bytes")
    if not text.strip():
        raise PlanError(f"{name} is empty: a plan is a JSON object with a 'steps' list")
    try:
        raw = json.loads(text, parse_constant=reject_constant, object_pairs_hook=unique_keys)
    except RecursionError:
        raise PlanError(f"{name} is nested more than {MAX_DEPTH} levels deep") from None
    except UnicodeDecodeError as exc:
        raise PlanError(
            f"{name} is not valid JSON: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except ValueError as exc:  # json.JSONDecodeError, and NaN/Infinity refused
        raise PlanError(f"{name} is not valid JSON: {exc}") from None
    return plan_from_dict(raw)


def plan_from_dict(raw: Any) -> Plan:
    """Build a :class:`Plan` from decoded JSON, checking its shape."""
    _check_storable(raw)
    if not isinstance(raw, dict):
        raise PlanError("plan must be a JSON object with a 'steps' list")
    goal = raw.get("goal", "")
    if not isinstance(goal, str):
        raise PlanError("plan 'goal' must be a string")
    agent = None
    if "agent" in raw:
        from .agentplan import parse_spec

        agent = parse_spec(raw["agent"])
    steps = raw.get("steps", [] if agent is not None else None)
    if not isinstance(steps, list):
        raise PlanError("plan must have a 'steps' list")
    if not steps and agent is None:
        raise PlanError("plan has no steps")
    if len(steps) > MAX_STEPS:
        raise PlanError(f"plan has more than {MAX_STEPS} steps")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise PlanError("plan 'defaults' must be an object")
    check_policy(defaults, "plan 'defaults'", only=True)
    specs = [_step_spec(idx, step, defaults) for idx, step in enumerate(steps)]
    if agent is not None:
        from .agentplan import first_turn, turn_policy
        from .models import AGENT_TOOL

        # The first model turn follows the static steps; later turns and the
        # calls they ask for are appended as the agent runs, under the defaults.
        turn = first_turn(agent, goal, len(specs), defaults)
        specs.append(StepSpec(tool=AGENT_TOOL, input=turn, policy=turn_policy(turn)))
    return Plan(goal=goal, steps=tuple(specs), agent=agent)


def check_built(plan: Plan) -> Plan:
    """``plan``, built in code rather than parsed, checked as :func:`plan_from_dict`
    checks a parsed one (:class:`PlanError` else): its steps, their policies and
    ``from`` references, and what a store can keep."""
    steps = plan.steps
    if not isinstance(steps, (tuple, list)) or not all(isinstance(s, StepSpec) for s in steps):
        raise PlanError("plan 'steps' must be a tuple of StepSpec")
    static = steps[:-1] if plan.agent is not None else steps  # the last: the agent's turn
    for idx, spec in enumerate(static):
        check_policy(spec.policy or {}, f"step {idx}", only=True)
    raw = [{**(s.policy or {}), "tool": s.tool, "input": s.input} for s in static]
    if plan.agent is None:
        return plan_from_dict({"goal": plan.goal, "steps": raw})
    # An agent's first turn was made from its spec when the plan was parsed.
    if not isinstance(plan.goal, str):
        raise PlanError("plan 'goal' must be a string")
    _check_storable([plan.goal, raw])
    for idx, step in enumerate(raw):
        _step_spec(idx, step, {})
    return plan


def _check_storable(raw: Any) -> None:
    """Refuse JSON data that no store can hold as text: nested too deep, a lone
    surrogate, a NUL character, or not JSON data at all."""
    if depth(raw) > MAX_DEPTH:
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


def _step_spec(idx: int, step: Any, defaults: Mapping[str, Any]) -> StepSpec:
    """Step ``idx`` of a plan's ``steps``, checked, its policy merged over ``defaults``."""
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
    own = {k: step[k] for k in POLICY_KEYS if k in step}
    check_policy(own, f"step {idx}")
    policy = {**defaults, **own}
    return StepSpec(tool=tool, input=step_input, policy=policy or None)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_policy(policy: Mapping[str, Any], where: str, *, only: bool = False) -> None:
    """Check a step policy's values (and, with ``only``, that it has no other keys).

    ``max_attempts``: an integer >= 1; ``timeout``: seconds > 0; ``backoff``:
    ``false`` (none) or ``{"base": s, "cap": s}`` (seconds >= 0, either may be
    left out); ``on_unknown``: one of :data:`ON_UNKNOWN`.
    """
    if only and (unknown := sorted(set(policy) - set(POLICY_KEYS))):
        raise PlanError(f"{where} has unknown key(s) {unknown}: use {list(POLICY_KEYS)}")
    if "max_attempts" in policy:
        value = policy["max_attempts"]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1_000_000:
            raise PlanError(f"{where} 'max_attempts' must be an integer from 1 to 1000000")
    if "timeout" in policy:
        value = policy["timeout"]
        if not _number(value) or not 0 < value <= 31_536_000:
            raise PlanError(f"{where} 'timeout' must be a number of seconds > 0 (at most a year)")
    if "backoff" in policy:
        value = policy["backoff"]
        if value is not False:
            if not isinstance(value, dict) or set(value) - {"base", "cap"}:
                raise PlanError(
                    f"{where} 'backoff' must be false or an object with 'base' and/or 'cap'"
                )
            for key, seconds in value.items():
                if not _number(seconds) or not 0 <= seconds <= 86_400:
                    raise PlanError(f"{where} 'backoff' {key!r} must be seconds from 0 to 86400")
    if "on_unknown" in policy and policy["on_unknown"] not in ON_UNKNOWN:
        raise PlanError(f"{where} 'on_unknown' must be one of {', '.join(ON_UNKNOWN)}")


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
    if not shown:  # a script's `"$PLAN"` with PLAN unset: "not found: " named nothing
        raise PlanError("PLAN_FILE is empty: name the plan file")
    try:
        data = _read_plan_file(shown)
    except FileNotFoundError:
        # `-` is no file here: say how a plan on standard input is given.
        stdin = " (for standard input, give /dev/stdin)" if shown == "-" else ""
        raise PlanError(f"plan file not found: {shown}{stdin}") from None
    except IsADirectoryError:
        raise PlanError(f"plan file is a directory: {shown}") from None
    except OSError as exc:
        raise PlanError(f"cannot read plan file {shown}: {exc.strerror}") from None
    return parse_plan(data, name=f"plan file {shown}")


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
        from .agentplan import call_policy, check_callable

        check_callable(plan.agent.tools, lookup)
        mode = (call_policy(plan.steps[-1].input) or {}).get("on_unknown")
        for name in plan.agent.tools if mode == "probe" else ():
            if getattr(lookup(name), "probe", None) is None:
                raise PlanError(
                    f"agent tool {name!r}: the plan's defaults say on_unknown 'probe', and "
                    f"{name!r} has no probe (use 'rerun' or 'refuse')"
                )
    for idx, step in enumerate(plan.steps):
        tool = lookup(step.tool)
        mode = (step.policy or {}).get("on_unknown")
        if mode == "probe" and getattr(tool, "probe", None) is None:
            raise PlanError(
                f"step {idx} ({step.tool}): on_unknown 'probe' needs a tool with a probe, "
                f"and {step.tool!r} has none (use 'rerun' or 'refuse')"
            )
        check = getattr(tool, "validate", None)
        if check is not None:
            try:
                check(step.input)
            except PlanError as exc:
                raise PlanError(f"step {idx} ({step.tool}): {exc}") from None


def as_mapping(plan: Plan) -> Mapping[str, Any]:
    """The plan as plain JSON data."""
    return {
        "goal": plan.goal,
        "steps": [{"tool": s.tool, "input": s.input, **(s.policy or {})} for s in plan.steps],
    }
