"""The context of an ``async def`` workflow: ``await ctx.step(...)``.

Loaded only when an async workflow runs (with asyncio). The durable
machinery is :class:`~ninelives.replay.WorkflowContext`'s, run in the event
loop's thread between awaits: the commits block the loop for their time, as
they block a sync workflow. ``fn`` may be sync or async; an async ``fn``'s
``timeout`` is :func:`asyncio.wait_for`'s (SIGALRM cannot interrupt a loop).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

from .durable import CURRENT
from .errors import CommitUnknown, WorkflowError
from .models import Step
from .policy import USER_ERRORS, StepTimeout
from .replay import WorkflowContext, caller, encode_value, policy_of, step_limits, value_of
from .replay_chat import AsyncChatCalls


class AsyncWorkflowContext(AsyncChatCalls, WorkflowContext):
    """``ctx`` of an async workflow: :meth:`step` is awaited; ``now``, ``uuid``
    and ``random`` are awaited too."""

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (awaited when it is a coroutine function) as
        the task's next durable step ``name``; its value."""
        with self.guard():
            step, attempt = self.enter_step(name, fn, args, kwargs)
            if attempt is None:
                return value_of(step.output)
            call = caller(fn, args, kwargs)
            return await self.attempts_async(step, attempt, call, policy_of(fn))

    async def approval(self, name: str, prompt: str = "", *, on_reject: str = "fail") -> Any:
        """See :meth:`WorkflowContext.approval`."""
        return WorkflowContext.approval(self, name, prompt, on_reject=on_reject)

    async def sleep(self, seconds: float) -> None:  # type: ignore[override]
        """See :meth:`WorkflowContext.sleep` (the wait blocks this workflow's loop)."""
        WorkflowContext.sleep(self, seconds)

    async def now(self) -> float:  # type: ignore[override]
        """The time (epoch seconds), taken once as a step and replayed."""
        return float(await self.step("ctx.now", time.time))

    async def uuid(self) -> str:  # type: ignore[override]
        """A random UUID (text), taken once as a step and replayed."""
        import uuid

        return str(await self.step("ctx.uuid", lambda: str(uuid.uuid4())))

    async def random(self) -> float:  # type: ignore[override]
        """A random float in [0, 1), taken once as a step and replayed."""
        import random

        return float(await self.step("ctx.random", random.random))

    async def attempts_async(
        self, step: Step, attempt: int, call: Callable[[], Any], policy: Mapping[str, Any]
    ) -> Any:
        """Awaited attempts of a step committed running, until one is done; the value.
        Framework adapters (:mod:`ninelives.integrations`) call it on a sync
        workflow's context too: it only awaits ``call`` between the commits."""
        assert self._rt is not None
        assert self._run is not None
        rt, run = self._rt, self._run
        limits = step_limits(step, policy, rt.settings)
        self.running = step
        try:
            while True:
                began = time.monotonic()
                context = self._before(step, attempt)
                token = CURRENT.set(context)
                try:
                    with rt.time_limit(run, step, attempt, limits):
                        value = call()
                    if inspect.isawaitable(value):
                        value = await _awaited(self, step, value, limits.timeout)
                    encoded = encode_value(value, rt.settings.max_output)
                except CommitUnknown:
                    raise
                except USER_ERRORS as exc:
                    attempt = self._failed(step, attempt, exc, limits)
                    continue
                finally:
                    CURRENT.reset(token)
                    self.kept(step, context)
                return self._done(step, value, encoded, began)
        finally:
            self.running = None


async def _awaited(ctx: WorkflowContext, step: Step, awaitable: Any, timeout: float | None) -> Any:
    """The step's awaited value. A cancel from outside (``asyncio.wait_for``
    around the step, the workflow returning before the step ends) stops the
    effect midway: its outcome is unknown, as after a kill, so the run ends
    (exit 12) with the step left running for the next run to recover, instead
    of going on past it and committing the task done. ``ctx`` may be a sync
    workflow's context (the framework adapters await steps on it)."""
    try:
        return await _limited(awaitable, timeout)
    except asyncio.CancelledError:
        if ctx.dead is not None:  # the error that made the loop cancel it says more
            raise
        ctx.dead = WorkflowError(
            f"task {ctx.task_id!r}: step {step.idx} ({step.tool!r}) was cancelled while it "
            "ran (asyncio.wait_for around it, or the workflow returned before it ended): "
            "its outcome is unknown and it is left running for the next run; await each "
            "step to its end (a step's time limit is its timeout policy)"
        )
        raise


async def _limited(awaitable: Any, timeout: float | None) -> Any:
    if not timeout:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise StepTimeout(timeout) from None
