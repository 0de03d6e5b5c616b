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
from typing import Any, NoReturn

from .durable import CURRENT
from .errors import CommitUnknown, TaskCancelled, TaskFailed
from .models import Step
from .policy import USER_ERRORS, Limits, StepTimeout, exit_stuck
from .replay import (
    WorkflowContext,
    caller,
    encode_value,
    policy_of,
    step_limits,
    value_of,
)
from .replay_chat import AsyncChatCalls
from .replay_checks import refuse_unrunnable


class AsyncWorkflowContext(AsyncChatCalls, WorkflowContext):
    """``ctx`` of an async workflow: :meth:`step` is awaited; ``now``, ``uuid``
    and ``random`` are awaited too."""

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (awaited when it is a coroutine function) as
        the task's next durable step ``name``; its value."""
        with self.guard():
            refuse_unrunnable(self.task_id, self._next, name, fn, sync=False)
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
        self,
        step: Step,
        attempt: int,
        call: Callable[[], Any],
        policy: Mapping[str, Any],
        *,
        threaded: bool = False,
    ) -> Any:
        """Awaited attempts of a step committed running, until one is done; the value.
        Framework adapters (:mod:`ninelives.integrations`) call it on a sync
        workflow's context too: it only awaits ``call`` between the commits.
        ``threaded``: ``call`` may do its work in a thread (a framework's sync
        tool), which a timeout cannot stop: see :meth:`abandoned`."""
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
                        value = await _limited(value, limits.timeout)
                    encoded = encode_value(value, rt.settings.max_output)
                except CommitUnknown:
                    raise
                except USER_ERRORS as exc:
                    if threaded and isinstance(exc, StepTimeout):
                        AsyncWorkflowContext.abandoned(self, step, attempt, exc, limits)
                    attempt = self._failed(step, attempt, exc, limits)
                    continue
                except BaseException as exc:  # asyncio.wait_for around the step: see cancelled
                    self.cancelled(step, exc)
                    raise
                finally:
                    CURRENT.reset(token)
                    self.kept(step, context)
                return self._done(step, value, encoded, began)
        finally:
            self.running = None

    def abandoned(self, step: Step, attempt: int, exc: StepTimeout, limits: Limits) -> NoReturn:
        """End the process (exit 5) once an attempt that overran its timeout is
        journaled, as a worker's slot does: the framework may still run it in a
        thread, and its effect must not land after the step is retried."""
        assert self._rt is not None
        assert self._run is not None
        rt, run = self._rt, self._run
        rt.say(
            f"{self.task_id}: step {step.idx} {step.tool} overran its {exc.seconds:g}s timeout, "
            "perhaps in a thread, which nothing can interrupt: this process exits"
        )

        def journal() -> None:
            try:
                rt.record_error(run, step, attempt, exc, limits)
            except (TaskFailed, TaskCancelled):
                pass  # journaled all the same; the next run finds the task so

        exit_stuck(journal)


async def _limited(awaitable: Any, timeout: float | None) -> Any:
    if not timeout:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise StepTimeout(timeout) from None
