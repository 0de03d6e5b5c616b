"""Running a claimed task's steps: start, run the tool, record; errors, timeouts, backoff.

:class:`StepRunner` is the part of :class:`~ninelives.runtime.Runtime` that
runs steps. A workflow's context (:mod:`ninelives.replay`) runs its steps through
the same public methods (:meth:`StepRunner.begin_attempt`,
:meth:`~StepRunner.record_done`, :meth:`~StepRunner.record_error`,
:meth:`~StepRunner.time_limit`, :meth:`~StepRunner.saver`), so a planned step and
a coded one commit the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .. import crashpoints
from ..blobs import unescape
from ..errors import CommitUnknown, PlanError, StoreError, TaskCancelled, TaskFailed
from ..humanize import duration
from ..journal import dumps, encode_output, out_of_row
from ..models import (
    AGENT_TOOL,
    APPROVAL_TOOL,
    Run,
    Step,
    StepProgress,
    StepStatus,
    Task,
    TaskStatus,
    load_json,
)
from ..policy import (
    USER_ERRORS,
    Limits,
    StepTimeout,
    alarm_held,
    describe,
    encode_progress,
    is_cancel,
    limits_for,
    retry_delay,
    time_limit,
)
from ..settings import Settings
from ..store import StepNotDue, Store
from ..tools import ToolContext

if TYPE_CHECKING:
    from ..agent import Continuation
    from ..tools import Registry, Tool

_ELIDE = 60
#: How often a backoff wait asks whether its task was cancelled meanwhile, in seconds.
CANCEL_LOOK = 0.5


class StepRunner:
    """A store plus the tools and settings that run its steps, and the progress log."""

    def __init__(
        self,
        store: Store,
        *,
        settings: Settings | None = None,
        tools: Registry | None = None,
        log: Callable[[str], None] | None = None,
        on_progress: Callable[[StepProgress], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings.checked() if settings is not None else Settings.from_env()
        self._tools = tools
        self._log = log
        # Called after each committed ctx.checkpoint; None costs nothing per checkpoint.
        self._on_progress = on_progress

    @property
    def tools(self) -> Registry:
        """The tools steps run with: built when first needed (``status`` never needs them)."""
        if self._tools is None:
            from ..tools.builtin import default_registry

            self._tools = default_registry(self.settings)
        return self._tools

    def tool_version(self, name: str) -> str | None:
        """The version tool ``name`` declares here (journaled in ``step_started``), or None."""
        try:
            return self.tools.lookup(name).version
        except PlanError:
            return None

    def run_steps(
        self, run: Run, task: Task, stop: Callable[[], bool] | None, max_wait: float | None
    ) -> Task:
        task_id = run.task_id
        started = run.started  # (idx, attempt) committed running by the claim itself
        pending = [
            s
            for s in task.steps
            if s.status is StepStatus.PENDING or (started is not None and s.idx == started[0])
        ]
        if not pending:
            crashpoints.crash("before_task_done")
            self.store.finish_task(run)
        ctx: dict[int, Any] = task.outputs()
        progress = {s.idx: s.progress for s in pending if s.progress is not None}
        for step in pending:
            tool = self.tools.lookup(step.tool)
            if step.tool == APPROVAL_TOOL:
                from .waits import wait_for_approval

                raise wait_for_approval(self, run, step)
            limits = limits_for(step.policy, self.settings.max_attempts, self.settings.backoff)
            # A wait committed before this run (a restart in the middle of a backoff).
            wait = max(0.0, step.not_before - time.time()) if step.not_before else 0.0
            while True:
                began = time.monotonic()
                attempt = self.begin_attempt(run, step, started, stop, wait, max_wait)
                # The start's commit, fenced, checked the lease just now; the claim's
                # may have had a recovery's work after it.
                fresh = started is None or not run.recovered
                started = None  # only ever the first step's first attempt
                if attempt is None:
                    return self.store.get_task(task_id)  # stopped or parked; nothing running
                result = self.attempt(run, step, tool, ctx, attempt, limits, progress, fresh)
                if isinstance(result, float):  # a step_error was recorded: wait, then retry
                    wait = result
                    continue
                follow = self.record_done(
                    run, step, *result, last=step is pending[-1], took=time.monotonic() - began
                )
                # The later steps read the output as committed, as a resumed run
                # does: never the tool's own objects (a tuple, a dict subclass),
                # nor the escape that kept an output like {"$raw": ...} as it was.
                ctx[step.idx] = unescape(load_json(result[1]))
                if follow is not None:
                    pending.extend(_appended(task_id, step.idx, follow))
                break
        return self.store.get_task(task_id)

    def begin_attempt(
        self,
        run: Run,
        step: Step,
        started: tuple[int, int] | None,
        stop: Callable[[], bool] | None,
        wait: float,
        max_wait: float | None,
    ) -> int | None:
        """Commit the step ``running`` and return its attempt number (the claim
        transaction may have done it already: ``started``), after ``wait``
        seconds of backoff; None when ``stop`` says so or the wait exceeds ``max_wait``."""
        if started is not None and started[0] == step.idx:
            return started[1]
        while True:
            if wait > 0:
                if max_wait is not None and wait > max_wait:
                    self.say(f"{run.task_id}: step {step.idx} due in {wait:.1f}s; released")
                    return None
                _back_off(wait, stop, lambda: self.cancelled(run.task_id))
            if stop is not None and stop():
                return None
            try:
                return self.store.start_step(
                    run, step.idx, step.tool, tool_version=self.tool_version(step.tool)
                )
            except StepNotDue as exc:  # the store's clock says not yet
                wait = exc.wait

    def record_done(
        self,
        run: Run,
        step: Step,
        output: dict[str, Any],
        encoded: str,
        *,
        last: bool,
        took: float = 0.0,
    ) -> Continuation | None:
        """Commit the step ``done`` with its output (the task ``done`` too when ``last``).

        An agent's turn commits in the same transaction the calls it asked for
        and its next turn (returned, to be run next), or fails the task when it
        reached ``max_turns`` or ``max_calls``.
        """
        follow = _continuation(step, output)
        crashpoints.crash("after_effect", step.idx)
        encoded = self.out_of_row(run, step, encoded)
        if follow is None:
            self.store.finish_step(run, step.idx, step.tool, encoded, last=last)
        else:
            self.store.finish_step(
                run, step.idx, step.tool, encoded, last=follow.final, fail=follow.fail,
                append=[
                    (tool, dumps(given), dumps(policy) if policy else None)
                    for tool, given, policy in follow.append
                ],
            )  # fmt: skip
        crashpoints.crash("after_commit", step.idx)
        if self._log is not None:
            again = " (recovered)" if step.idx in run.recovered else ""
            self.say(
                f"{run.task_id}: step {step.idx} {step.tool} done in {duration(took)}{again} "
                f"{_brief(output)}"
            )
        if follow is not None and follow.fail:
            raise TaskFailed(f"task {run.task_id!r} failed: {follow.fail}")
        return follow

    def out_of_row(self, run: Run, step: Step, encoded: str) -> str:
        """:func:`out_of_row` of the step's output, before its ``done`` commit."""
        threshold = self.settings.blob_threshold
        stored = out_of_row(self.store.blobs, threshold, encoded, f"{run.task_id}-{step.idx}")
        if stored is not encoded:
            crashpoints.crash("blob_before_reference", step.idx)
        return stored

    def attempt(
        self,
        run: Run,
        step: Step,
        tool: Tool,
        ctx: dict[int, Any],
        attempt: int,
        limits: Limits,
        progress: dict[int, Any],
        fresh: bool = False,
    ) -> tuple[dict[str, Any], str] | float:
        """Run the tool of a step committed ``running``: its output and the JSON
        text to store, or the seconds to wait once a ``step_error`` is recorded
        (the tool raised or overran its timeout, or its output cannot be
        stored). Raises TaskFailed when the error ends the task. ``fresh``: the
        step's start was committed just before (see :meth:`before_effect`)."""
        self.before_effect(run, step.idx, fresh)
        context = ToolContext(
            task_id=run.task_id, step=step.idx, attempt=attempt, outputs=ctx,
            idem_key=f"{run.task_id}-{step.idx}", progress=progress.get(step.idx),
            saver=self.saver(run, step, time.monotonic()),
        )  # fmt: skip
        try:
            with self.time_limit(run, step, attempt, limits):
                returned = tool.run(step.input, context)
            # Checked before the commit: text that cannot be stored (a lone
            # surrogate, NaN, too big) would otherwise fail the commit on
            # every attempt and leave the step running forever.
            encoded = encode_output(returned, self.settings.max_output)
        except CommitUnknown:
            raise  # storage failed under the effect: stop, never retry
        except USER_ERRORS as exc:
            return self.record_error(run, step, attempt, exc, limits)
        except BaseException as exc:
            # asyncio's CancelledError out of a tool: its own async code was
            # cancelled and it ended, as with any error of its own.
            if not is_cancel(exc):
                raise  # KeyboardInterrupt, a library's own: they end the run
            return self.record_error(run, step, attempt, exc, limits)
        finally:
            if context.progress is not None:
                progress[step.idx] = context.progress
        return (returned if isinstance(returned, dict) else dict(returned)), encoded

    def before_effect(self, run: Run, idx: int, fresh: bool) -> None:
        """Between a step committed ``running`` and its effect: the crash point,
        the test delay, and the lease check. A runner paused past its lease must
        not start an effect that another runner may own by now (its commits
        would be fenced anyway). When ``fresh``, with no delay, the start's own
        commit was that check: fenced on the epoch, and on PostgreSQL renewing
        the lease, just now; reading the epoch again would find what it found."""
        crashpoints.crash("before_effect", idx)
        if self.settings.step_delay:
            time.sleep(self.settings.step_delay)
        elif fresh:
            return
        self.store.check_lease(run)

    def saver(self, run: Run, step: Step, began: float) -> Callable[[Any], None]:
        """``ctx.checkpoint`` of one step: checked like an output, committed fenced,
        then reported to ``on_progress`` (only what was committed is shown)."""
        report = self._on_progress

        def save(value: Any) -> None:
            text = encode_progress(value, self.settings.max_output)
            with alarm_held():
                self.store.checkpoint(run, step.idx, text)
            if report is not None:
                elapsed = time.monotonic() - began
                report(StepProgress(run.task_id, step.idx, step.tool, value, elapsed))

        return save

    def time_limit(
        self, run: Run, step: Step, attempt: int, limits: Limits
    ) -> AbstractContextManager[Any]:
        """The step's timeout: SIGALRM in the main thread, a watchdog elsewhere
        (see :mod:`ninelives.policy`); nothing without a ``timeout``."""
        timeout = limits.timeout or 0.0

        def overrun() -> None:
            self.say(
                f"{run.task_id}: step {step.idx} {step.tool} overran its {timeout:g}s timeout "
                "in a thread, which nothing can interrupt: this process exits"
            )
            # The slot's own store is busy in the tool. The fenced commit renews
            # the lease, so it must keep the running store's length (a worker's
            # --lease), not the default: reopen keeps it.
            other = self.store.reopen()
            try:
                self.record_error(run, step, attempt, StepTimeout(timeout), limits, store=other)
            except (TaskFailed, TaskCancelled):
                pass  # journaled (after a cancel, as a runner owes it); the process exits
            finally:
                other.close()

        return time_limit(limits.timeout, overrun)

    def record_error(
        self,
        run: Run,
        step: Step,
        attempt: int,
        exc: BaseException,
        limits: Limits,
        *,
        store: Store | None = None,
    ) -> float:
        """Journal the attempt's ``step_error`` with the decision taken: the seconds
        to wait before the next attempt (committed as the step's ``not_before``),
        or TaskFailed at the attempt limit or for a :class:`PermanentError`."""
        error, permanent, detail = describe(exc)
        self.say(f"{run.task_id}: step {step.idx} {step.tool} attempt {attempt}: {error}")
        delay = 0.0 if permanent else retry_delay(limits, attempt)
        failed = (store or self.store).record_error(
            run, step.idx, error, limits.max_attempts, delay=delay or None,
            permanent=permanent, detail=detail,
        )  # fmt: skip
        if failed and permanent:
            raise TaskFailed(
                f"task {run.task_id!r} failed: step {step.idx} ({step.tool}) raised a "
                f"permanent error on attempt {attempt}: {error}"
            ) from None
        if failed:
            raise TaskFailed(
                f"task {run.task_id!r} failed: step {step.idx} ({step.tool}) "
                f"failed {attempt} times; last error: {error}"
            ) from None
        return delay

    def cancelled(self, task_id: str) -> bool:
        """Whether ``task_id`` is cancelled now; a read that fails says no (the
        next start's fenced commit finds out what is so)."""
        try:
            return self.store.get_task(task_id).status is TaskStatus.CANCELLED
        except StoreError:
            return False

    def say(self, line: str) -> None:
        """Give ``line`` to the progress log, if there is one."""
        if self._log is not None:
            self._log(line)


def _brief(output: Mapping[str, Any]) -> str:
    shown = {
        k: (v[:_ELIDE] + "…" if isinstance(v, str) and len(v) > _ELIDE else v)
        for k, v in output.items()
    }
    return json.dumps(shown, sort_keys=True, ensure_ascii=False)


def _back_off(delay: float, stop: Callable[[], bool] | None, cancelled: Callable[[], bool]) -> None:
    """Wait ``delay`` seconds before a failed step's next attempt; return early on
    ``stop``, or once ``cancelled()`` (asked every CANCEL_LOOK seconds) says so."""
    now = time.monotonic()
    deadline, look = now + delay, now + CANCEL_LOOK
    while (left := deadline - time.monotonic()) > 0:
        if stop is not None and stop():
            return
        if time.monotonic() >= look:
            # A wait may last as long as a worker's --poll (an hour): a cancel
            # must not hold the task, and the slot, that long. The start that
            # follows is refused (TaskCancelled), having written nothing.
            if cancelled():
                return
            look = time.monotonic() + CANCEL_LOOK
        time.sleep(min(left, 0.1))


def _continuation(step: Step, output: Mapping[str, Any]) -> Continuation | None:
    """For an agent's turn, the steps its commit appends or why the task fails."""
    if step.tool != AGENT_TOOL:
        return None
    from ..agent import after_turn

    return after_turn(step.idx, step.input, output)


def _appended(task_id: str, after: int, follow: Continuation) -> list[Step]:
    """The steps a turn appended, as the runner's records, ``pending`` after ``after``."""
    return [
        Step(
            task_id=task_id,
            idx=idx,
            tool=tool,
            input=given,
            status=StepStatus.PENDING,
            output=None,
            attempts=0,
            policy=policy,
        )
        for idx, (tool, given, policy) in enumerate(follow.append, start=after + 1)
    ]
