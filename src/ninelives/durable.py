"""Durable code: a user's own Python function as a task that survives SIGKILL.

::

    import ninelives

    @ninelives.step(name="post", max_attempts=5)
    def post_note(text):
        key = ninelives.current_step().idem_key        # "<task_id>-<step index>"
        return notes.post(text, idempotency_key=key)

    @ninelives.workflow("triage")
    def triage(ctx, ticket):
        t = ctx.step("read", read_ticket, ticket)
        return {"ticket": ticket, "note": post_note("summary: " + t["text"])["posted"]}

A workflow task is an ordinary task. Its goal is ``workflow:`` followed by
the canonical JSON of the workflow's name, version and arguments (so the plan
digest covers them and every reader gets them with the task row); it is
created with no step. Each ``ctx.step(name, fn, ...)`` call is the task's
next step: the k-th call is step k, a ``steps`` row whose ``tool`` is the
name, ``input`` the call's arguments as canonical JSON (``{"args": [...],
"kwargs": {...}}``, or ``{}`` for arguments JSON cannot hold or larger than a
plan's 1 MiB: they are for people to read, never replayed) and ``output``
``{"value": <what fn returned>}``. On every run the function runs from the
top (:mod:`ninelives.replay`): a done step returns its stored value without
calling ``fn``; a new one is appended and committed ``running`` before ``fn``
runs and ``done`` after, as a plan step is.

This module holds what a user's module imports: the decorators, the
process-wide registry they fill, :func:`current_step`, and the goal's
encoding. It imports nothing heavy: ``import ninelives`` stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import PlanError
from .models import WORKFLOW_GOAL, is_workflow

if TYPE_CHECKING:
    from .plan import Plan
    from .tools import ToolContext

#: A workflow's or a step's name: plain text, as a tool's name is.
NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}"
#: The policy keywords of :func:`step` (the plan step policies, plus ``probe``).
STEP_POLICY = ("max_attempts", "timeout", "backoff", "on_unknown", "probe")

_WORKFLOWS: dict[str, Workflow] = {}
#: The running workflow's context (set by the replay driver around the function).
ACTIVE: ContextVar[Any] = ContextVar("ninelives_workflow", default=None)
#: The running step's context, for :func:`current_step`.
CURRENT: ContextVar[ToolContext | None] = ContextVar("ninelives_step", default=None)


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise PlanError(
            f"invalid {what} name {name!r}: use 1-128 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or '_'"
        )
    return name


def _check_text(text: str, what: str) -> None:
    """:class:`PlanError` for text no store keeps (a lone surrogate is not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PlanError(f"{what} {text!r} is not valid Unicode text (a lone surrogate)") from None


#: ``co_flags`` bit of an ``async def`` (inspect.CO_COROUTINE, without importing inspect).
CO_COROUTINE = 0x80


def is_async_def(fn: object) -> bool:
    """Whether ``fn`` is an ``async def`` function (its code has :data:`CO_COROUTINE`),
    told without importing :mod:`inspect` or :mod:`asyncio`."""
    return bool(getattr(getattr(fn, "__code__", None), "co_flags", 0) & CO_COROUTINE)


class Workflow(NamedTuple):
    """A registered workflow: what :func:`workflow` returns. Give it to
    ``rt.create``/``rt.submit``; :meth:`call` calls the function itself (no durability)."""

    name: str
    fn: Callable[..., Any]
    version: str | None = None
    #: True for an ``async def``: runs on an event loop (asyncio loads then only).
    is_async: bool = False

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, called with ``args`` (a context first): a workflow
        calling another one inside its own run (its steps become the caller's)."""
        return self.fn(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """As :meth:`call`: a workflow is still its function."""
        return self.fn(*args, **kwargs)


def workflow(name: str | Callable[..., Any] | None = None, *, version: str | None = None) -> Any:
    """Register a ``def`` or ``async def`` whose first parameter is the context
    (:class:`~ninelives.replay.WorkflowContext`) as workflow ``name`` (default:
    the function's ``__name__``) in this process; ``version`` is kept with each
    task created from it. Usable bare (``@workflow``) or called. Defining a
    workflow of a name already registered replaces it (a module reloaded).
    """
    if callable(name):
        return workflow()(name)
    if version is not None and not isinstance(version, str):
        raise PlanError(f"workflow version must be a string, got {version!r}")
    if version is not None:
        _check_text(version, "workflow version")

    def register(fn: Callable[..., Any]) -> Workflow:
        found = _check_name(name if name is not None else fn.__name__, "workflow")
        made = Workflow(name=found, fn=fn, version=version, is_async=is_async_def(fn))
        _WORKFLOWS[found] = made
        return made

    return register


def registered() -> dict[str, Workflow]:
    """The workflows this process defines, by name."""
    return dict(_WORKFLOWS)


def lookup(name: str) -> Workflow:
    """The workflow registered as ``name``, else :class:`PlanError` (exit 4)."""
    found = _WORKFLOWS.get(name)
    if found is None:
        known = ", ".join(sorted(_WORKFLOWS)) or "none"
        raise PlanError(
            f"unknown workflow {name!r} (defined here: {known}): name the module that "
            "defines it with --tools MODULE or NINELIVES_TOOLS"
        )
    return found


class StepFunction:
    """A function decorated with :func:`step`: called inside a running workflow it
    is a durable step named ``name`` with ``policy``; anywhere else a plain call."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        policy: Mapping[str, Any],
        probe: Callable[..., Any] | None,
    ) -> None:
        self.name = name
        self.fn = fn
        #: The plan step policy keys it declares (``probe`` apart).
        self.policy = dict(policy)
        #: ``probe(ctx)`` for ``on_unknown="probe"``: the value if the effect happened, or None.
        self.probe = probe
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        active = ACTIVE.get()
        if active is None or CURRENT.get() is not None:
            return self.fn(*args, **kwargs)  # outside a workflow, or inside another step
        return active.step(self.name, self, *args, **kwargs)


def step(name: str | Callable[..., Any] | None = None, **policy: Any) -> Any:
    """Declare a function a durable step named ``name`` (default ``__name__``) with
    the plan step policy keywords ``max_attempts``, ``timeout``, ``backoff``,
    ``on_unknown`` and ``probe`` (a callable taking the step's context, returning
    its output when the effect happened, else None). :class:`PlanError` for
    others or bad values. ``ctx.step(name, f, ...)`` of a decorated ``f``
    honours the policy it declares."""
    if callable(name):
        return step()(name)
    from .plan import POLICY_KEYS, check_policy

    unknown = sorted(set(policy) - set(STEP_POLICY))
    if unknown:
        raise PlanError(f"step policy has unknown keyword(s) {unknown}: use {list(STEP_POLICY)}")
    probe = policy.pop("probe", None)
    if probe is not None and not callable(probe):
        raise PlanError("step policy 'probe' must be a callable")
    if is_async_def(probe):
        # Asked outside the event loop (at a claim, before the step runs again):
        # its coroutine would never run, and would be taken for its answer.
        raise PlanError("step policy 'probe' must be a plain def, not an async def")
    check_policy(policy, "step policy", only=True)
    if probe is None and policy.get("on_unknown") == "probe":
        raise PlanError("step policy on_unknown='probe' needs probe=callable")
    rules = {k: policy[k] for k in POLICY_KEYS if k in policy}

    def declare(fn: Callable[..., Any]) -> StepFunction:
        found = _check_name(name if name is not None else fn.__name__, "step")
        return StepFunction(name=found, fn=fn, policy=rules, probe=probe)

    return declare


def current_step() -> ToolContext | None:
    """Inside a step: its context (``task_id``, ``step``, ``attempt``,
    ``idem_key`` = ``"<task_id>-<step>"``, ``progress``, ``checkpoint(...)``);
    None outside a step."""
    return CURRENT.get()


class WorkflowSpec(NamedTuple):
    """What a workflow task's goal holds: the workflow and its arguments."""

    name: str
    version: str | None
    args: list[Any]
    kwargs: dict[str, Any]

    def as_goal(self) -> str:
        """The goal text: ``workflow:`` and the spec as canonical JSON."""
        from .journal import dumps

        body = {"args": self.args, "kwargs": self.kwargs, "name": self.name}
        if self.version is not None:
            body["version"] = self.version
        return WORKFLOW_GOAL + dumps(body)


def spec_of(goal: str) -> WorkflowSpec | None:
    """The spec a workflow task's goal holds; None for a plan's goal.
    :class:`PlanError` if it begins as a workflow's but does not parse."""
    if not is_workflow(goal):
        return None
    import json

    try:
        body = json.loads(goal[len(WORKFLOW_GOAL) :])
        spec = WorkflowSpec(
            name=body["name"],
            version=body.get("version"),
            args=list(body["args"]),
            kwargs=dict(body["kwargs"]),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise PlanError(f"a workflow task's goal does not parse: {exc}") from None
    if not isinstance(spec.name, str):
        raise PlanError("a workflow task's goal names no workflow")
    return spec


def arguments(raw: Any) -> tuple[list[Any], dict[str, Any]]:
    """``--args`` JSON as positional and keyword arguments: an array is the
    positional ones, an object the keyword ones. :class:`PlanError` otherwise."""
    if isinstance(raw, list):
        return raw, {}
    if isinstance(raw, dict):
        return [], raw
    raise PlanError("--args must be a JSON array (positional) or object (keyword arguments)")


def parse_arguments(text: str) -> tuple[list[Any], dict[str, Any]]:
    """``--args`` text: standard JSON only (no NaN, no ``1e999``), at most
    :data:`~ninelives.models.MAX_DEPTH` deep; :class:`PlanError` (exit 4) otherwise."""
    import json

    from .plan import reject_constant, unique_keys

    try:
        raw = json.loads(text, parse_constant=reject_constant, object_pairs_hook=unique_keys)
    except RecursionError:
        raise PlanError("--args is nested too deeply") from None
    except (ValueError, PlanError) as exc:
        raise PlanError(f"--args is not valid JSON: {exc}") from None
    return arguments(raw)


def _check_call(
    flow: Workflow, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]
) -> None:
    """:class:`PlanError` unless the workflow's function takes these arguments
    (after its context): a task that no run could start is refused at create."""
    import inspect  # at create only: the CLI's start-up stays lean

    try:
        signature = inspect.signature(flow.fn)
    except (TypeError, ValueError):
        return  # a builtin or a C function: nothing to check against
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise PlanError(f"workflow {flow.name!r} does not take these arguments: {exc}") from None


def prepare(
    task_id: str, flow: Workflow, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]
) -> Plan:
    """The plan a workflow task is stored as: its goal (the spec), no step.
    Raises :class:`~ninelives.errors.InvalidTaskId` or :class:`PlanError` for
    arguments a store cannot keep as standard JSON, or nested more than
    :data:`~ninelives.models.MAX_DEPTH` levels; touches no store."""
    from .journal import storable
    from .models import MAX_DEPTH
    from .names import check_task_id
    from .plan import MAX_PLAN_BYTES, Plan, depth

    check_task_id(task_id)
    if not isinstance(flow, Workflow):
        raise PlanError(f"not a workflow: {flow!r} (decorate it with @ninelives.workflow)")
    if any(not isinstance(k, str) for k in kwargs):
        raise PlanError("workflow keyword arguments must have string names")
    _check_text(flow.name, "workflow name")  # a Workflow made by hand is not checked
    if flow.version is not None:
        _check_text(flow.version, "workflow version")
    _check_call(flow, args, kwargs)
    body = [list(args), dict(kwargs)]
    if depth(body[0]) > MAX_DEPTH or depth(body[1]) > MAX_DEPTH:
        raise PlanError(f"workflow arguments are nested more than {MAX_DEPTH} levels deep")
    try:
        storable(body, "an argument")
    except ValueError as exc:
        raise PlanError(f"workflow refused: {exc}") from None
    goal = WorkflowSpec(flow.name, flow.version, list(args), dict(kwargs)).as_goal()
    if "\x00" in goal:
        raise PlanError("workflow refused: its arguments contain a NUL character")
    if len(goal.encode("utf-8")) > MAX_PLAN_BYTES:
        raise PlanError(f"workflow arguments are larger than {MAX_PLAN_BYTES} bytes")
    return Plan(goal=goal, steps=())
