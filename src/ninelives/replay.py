"""The replay driver: run a workflow task's function from the top, step by step.

Step k of the journal is the k-th step call of the function. A call whose
step is ``done`` returns its stored value and does not call ``fn``; a step
``pending`` again (recovered, retried, or between attempts) runs again under
its idempotency key; a new step is appended and committed ``running`` in one
transaction (:meth:`~ninelives.store.Store.append_step`) before ``fn`` runs,
and ``done`` with its output after: the two commits, events, crash points,
attempt limits, blobs, cancel checks and fencing of a plan step, through the
runner's own methods (:class:`~ninelives.runtime.steps.StepRunner`: ``begin_attempt``,
``record_done``, ``record_error``).

A call of another name than the journal's step k, or a return while the
journal holds more steps, raises :class:`~ninelives.errors.WorkflowDiverged`
(exit 12) having written nothing; it is kept on the context, so a workflow
that catches it and returns is refused all the same.

What code between steps may do: compute from arguments and step results,
branch, loop. What it must not do: read the clock, random numbers, files or
the network directly (use ``ctx.now()``, ``ctx.uuid()``, ``ctx.random()`` or
a step): on replay it must call the same steps in the same order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from . import crashpoints
from .blobs import RAW_KEY, escape, needs_escape
from .durable import ACTIVE, CURRENT, StepFunction, Workflow, WorkflowSpec, spec_of
from .errors import (
    CommitUnknown,
    NineLivesError,
    PlanError,
    StepFailed,
    TaskFailed,
    WorkflowDiverged,
    WorkflowError,
)
from .journal import clean_error, dumps, encode_output, error_text
from .models import AGENT_TOOL, APPROVAL_TOOL, Run, Step, StepStatus, Task
from .policy import USER_ERRORS, Limits, StepTimeout, is_cancel, limits_for
from .replay_chat import ChatCalls
from .replay_checks import (
    discard,
    refuse_unrunnable,
    sleep_seconds,
    step_input,
    storable_text,
)

if TYPE_CHECKING:
    from .runtime.steps import StepRunner
    from .settings import Settings
    from .tools import ToolContext

#: Names a workflow's own step calls cannot take: the runtime gives them meaning.
RESERVED = (AGENT_TOOL, APPROVAL_TOOL)


class Released(BaseException):
    """Unwinds the workflow when its runner stops before a step (a worker's
    ``stop``, a wait past ``max_wait``, a replay-only run reaching new work):
    not an error, and user code cannot swallow it by ``except Exception``."""


def is_approval(step: Step) -> bool:
    """Whether a workflow's stored step is a ``ctx.approval``: its input holds the
    prompt, where a step's holds its ``args`` and ``kwargs`` (or nothing)."""
    return isinstance(step.input, Mapping) and "prompt" in step.input


def value_of(output: Mapping[str, Any] | None) -> Any:
    """What a done workflow step returns: its stored ``{"value": v}``'s ``v``, or
    the whole output when a person wrote another object (``resolve --done``)."""
    if output is not None and set(output) == {"value"}:
        return output["value"]
    return output


class WorkflowContext(ChatCalls):
    """The ``ctx`` a workflow function gets first: every call on it is durable."""

    def __init__(
        self,
        rt: StepRunner | None,
        run: Run | None,
        task: Task,
        *,
        stop: Callable[[], bool] | None = None,
        max_wait: float | None = None,
    ) -> None:
        self._rt = rt  # None: replay-check, which runs no step and writes nothing
        self._run = run
        self.task_id = task.id
        self._steps = {s.idx: s for s in task.steps}
        self._next = 0
        self._stop = stop
        self._max_wait = max_wait
        self._thread = threading.get_ident()
        url = rt.store.url if rt is not None else ""
        #: TEST-ONLY negative controls (see :func:`_unsafe`).
        self._unsafe_names = _unsafe("NINELIVES_TEST_SKIP_NAME_CHECK", url)
        self._unsafe_late = _unsafe("NINELIVES_TEST_SKIP_RUNNING_COMMIT", url)
        #: The error that ends this run whatever the workflow does with it.
        self.dead: BaseException | None = None
        #: The step whose attempts run now (async code could start another meanwhile).
        self.running: Step | None = None
        #: The largest output replay-check (no runner, no settings) lets a result be.
        self.max_output = 64 * 1024 * 1024
        #: Progress the attempts of this run committed, by step: the step records
        #: held here were read before them, and the next attempt resumes from it.
        self._progress: dict[int, Any] = {}

    # -- the user's calls -------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the task's next durable step ``name``
        and return its value (from the journal when it is done already)."""
        with self.guard():
            refuse_unrunnable(self.task_id, self._next, name, fn, sync=True)
            step, attempt = self.enter_step(name, fn, args, kwargs)
            if attempt is None:
                return value_of(step.output)
            return self._attempts(step, attempt, caller(fn, args, kwargs), policy_of(fn))

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Keep what ends the run (the runtime's own errors: cancelled, parked,
        lease lost, a failed step) on the context: a workflow that catches it
        and goes on is stopped at its next call, or at its return."""
        try:
            yield
        except (NineLivesError, StepTimeout) as exc:
            if self.dead is None and not isinstance(exc, PlanError):
                self.dead = exc
            raise

    def approval(self, name: str, prompt: str = "", *, on_reject: str = "fail") -> Any:
        """A durable approval step: the task waits (``run`` exits 8) until
        ``ninelives approve TASK STEP``; approved, ``{"approved": true, "note": ...}``.
        Rejected (``--reject``): with ``on_reject="fail"`` the task fails as a plan's
        approval does; with ``on_reject="answer"`` the task goes on and this call
        returns ``{"approved": false, "note": ...}`` for the code to act on."""
        with self.guard():
            if not isinstance(prompt, str):
                raise PlanError("ctx.approval's prompt must be a string")
            if not storable_text(prompt.replace("\x00", "")):  # a NUL is stored escaped
                raise PlanError(
                    "ctx.approval's prompt cannot be stored: a lone surrogate is not "
                    "valid Unicode text"
                )
            if on_reject not in ("fail", "answer"):
                raise PlanError("ctx.approval's on_reject must be 'fail' or 'answer'")
            given: dict[str, Any] = {"prompt": prompt}
            if on_reject == "answer":
                given["on_reject"] = on_reject
            step, attempt = self.enter_step(name, None, (), {}, given=given, delay=0.0, start=False)
            if attempt is None:
                return step.output
            from .runtime.waits import wait_for_approval

            assert self._rt is not None
            assert self._run is not None
            raise wait_for_approval(self._rt, self._run, step)

    def sleep(self, seconds: float) -> None:
        """A durable timer: the task's next step is not run before ``seconds`` have
        passed since the first run reached this call (a kill does not shorten it;
        a worker's slot does not wait it out: the task is released until due)."""
        with self.guard():
            wait = sleep_seconds(seconds)
            step, attempt = self.enter_step("ctx.sleep", None, (wait,), {}, delay=wait)
            if attempt is not None:
                self._attempts(step, attempt, lambda: wait, {})

    def now(self) -> float:
        """The time (epoch seconds), taken once as a step and replayed."""
        return float(self.step("ctx.now", time.time))

    def uuid(self) -> str:
        """A random UUID (text), taken once as a step and replayed."""
        import uuid

        return str(self.step("ctx.uuid", lambda: str(uuid.uuid4())))

    def random(self) -> float:
        """A random float in [0, 1), taken once as a step and replayed."""
        import random

        return float(self.step("ctx.random", random.random))

    # -- the machinery ----------------------------------------------------

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise self.dead
        if threading.get_ident() != self._thread:
            raise PlanError("ctx.step was called from another thread: call steps from the workflow")
        if CURRENT.get() is not None:
            # The code's error, not the running step's: kept on the context, so
            # that step is neither retried nor failed for it (see _failed).
            self.dead = WorkflowError(
                f"task {self.task_id!r}: ctx.step was called inside a step: steps do not "
                "nest; the step running is left as it was: fix the code and run again"
            )
            raise self.dead
        if self.running is not None:
            # Kept on the context: the step running is cancelled when the loop
            # ends, and this, not its cancel, is what the run reports.
            self.dead = WorkflowError(
                f"task {self.task_id!r}: a step was called while step {self.running.idx} "
                f"({self.running.tool!r}) runs: steps run one after another (asyncio.gather "
                "and tasks run them together: await each in turn)"
            )
            raise self.dead

    def enter_step(
        self,
        name: str,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        given: dict[str, Any] | None = None,
        delay: float | None = None,
        start: bool = True,
    ) -> tuple[Step, int | None]:
        """Step k for a call of ``name``: ``(stored step, None)`` when done, else the
        step record and the attempt committed running now. Raises WorkflowDiverged."""
        self._check_alive()
        if not isinstance(name, str) or name in RESERVED:
            raise PlanError(f"a workflow step cannot be named {name!r}")
        if not storable_text(name):  # as a plan's: SQLite would keep it, PostgreSQL not
            raise PlanError(
                f"a workflow step cannot be named {name!r}: a NUL or a lone surrogate "
                "cannot be stored as text"
            )
        idx = self._next
        self._next += 1
        stored = self._steps.get(idx)
        if stored is not None and not self._unsafe_names:
            if stored.tool != name:
                self._diverge(idx, stored.tool, name)
            # An approval and a step of one name are still other calls: replayed,
            # the approval's answer would be the step's value, its function never run.
            if is_approval(stored) != (given is not None):
                kinds = ("approval", "step") if given is None else ("step", "approval")
                self._diverge(idx, stored.tool, name, kinds)
        if stored is not None and stored.status is StepStatus.DONE:
            return stored, None
        if self._rt is None or self._run is None:
            self._release()  # replay-check: what follows is new work, not a divergence
        if stored is None:
            stored, attempt = self._append(idx, name, fn, args, kwargs, given, delay)
            if stored.status is StepStatus.RUNNING:
                return stored, attempt
        if not start:
            return stored, 0  # an approval: parked, never started
        return self._resume(stored, fn)

    def _release(self) -> NoReturn:
        self.dead = Released()
        raise self.dead

    def _diverge(
        self, idx: int, stored: str, called: str | None, kinds: tuple[str, str] | None = None
    ) -> NoReturn:
        more = len(self._steps) - idx - 1
        held, calls = (f"{kinds[0]} ", f"{kinds[1]} ") if kinds else ("", "")
        did = (
            f"the code calls {calls}{called!r}"
            if called is not None
            else f"the code returns before calling it (and {more} more)"
        )
        self.dead = WorkflowDiverged(
            f"task {self.task_id!r} step {idx}: the journal holds {held}{stored!r}, {did}: the "
            "code no longer matches the task's journal; its steps are left as they were (run it "
            "with the code it was created with)",
            task_id=self.task_id, step=idx, stored=stored, called=called, kinds=kinds,
        )  # fmt: skip
        raise self.dead

    def _append(
        self,
        idx: int,
        name: str,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        given: dict[str, Any] | None,
        delay: float | None,
    ) -> tuple[Step, int]:
        assert self._rt is not None
        assert self._run is not None
        given, stored_input = step_input(args, kwargs) if given is None else (given, dumps(given))
        policy = {"on_unknown": "rerun", **policy_of(fn)}
        if self._stop is not None and self._stop():
            self._release()
        attempt = 1
        if not self._unsafe_late or delay is not None:
            attempt = self._rt.store.append_step(
                self._run, idx, name, stored_input, policy=dumps(policy), delay=delay
            )
        status = StepStatus.RUNNING if delay is None else StepStatus.PENDING
        not_before = time.time() + delay if delay is not None else None
        step = Step(
            task_id=self.task_id, idx=idx, tool=name, input=given, status=status,
            output=None, attempts=attempt, policy=policy, not_before=not_before,
        )  # fmt: skip
        self._steps[idx] = step
        return step, attempt

    def _resume(self, stored: Step, fn: Any) -> tuple[Step, int | None]:
        """A stored step that is not done: left running for its probe, or pending."""
        assert self._rt is not None
        assert self._run is not None
        rt, run = self._rt, self._run
        if stored.status is StepStatus.RUNNING:
            stored = self._probe(stored, fn)
            if stored.status is StepStatus.DONE:
                return stored, None
        if stored.status is not StepStatus.PENDING:
            from .runtime.waits import parked

            raise parked(rt.store.get_task(self.task_id))
        wait = max(0.0, stored.not_before - time.time()) if stored.not_before else 0.0
        attempt = rt.begin_attempt(run, stored, None, self._stop, wait, self._max_wait)
        if attempt is None:
            self._release()
        return stored, attempt

    def _probe(self, step: Step, fn: Any) -> Step:
        """Ask the step's probe whether the effect of the attempt that died happened,
        and commit the answer (:func:`ninelives.runtime.waits.settle_probed`)."""
        assert self._rt is not None
        assert self._run is not None
        rt, run = self._rt, self._run
        probe = fn.probe if isinstance(fn, StepFunction) else None
        output: str | None = None
        block: str | None = None
        if probe is None:
            block = f"on_unknown is probe, but step {step.tool!r} has no probe here"
        else:
            try:
                found = probe(self._tool_context(step, step.attempts))
                if hasattr(found, "__await__"):
                    discard(found)
                    raise TypeError(
                        "the probe returned an awaitable, which is never awaited: "
                        "make it a plain def that returns the output or None"
                    )
                if found is not None:
                    output = encode_output({"value": found}, rt.settings.max_output)
            except (Exception, SystemExit) as exc:  # the probe could not tell (see USER_ERRORS)
                # Kept as a plan's probe's reason is: a lone surrogate escaped (no
                # store keeps one as text) and a long message cut short.
                block = clean_error(f"the probe raised {error_text(exc)}")
        from .runtime.waits import settle_probed

        settle_probed(rt, run, step, output, block)
        settled = rt.store.get_task(run.task_id).steps[step.idx]
        self._steps[step.idx] = settled
        return settled

    def _tool_context(self, step: Step, attempt: int) -> ToolContext:
        from .tools import ToolContext

        assert self._rt is not None
        assert self._run is not None
        return ToolContext(
            task_id=self.task_id, step=step.idx, attempt=attempt, outputs={},
            idem_key=f"{self.task_id}-{step.idx}",
            progress=self._progress.get(step.idx, step.progress),
            saver=self._rt.saver(self._run, step, time.monotonic()),
        )  # fmt: skip

    def _attempts(
        self, step: Step, attempt: int, call: Callable[[], Any], policy: Mapping[str, Any]
    ) -> Any:
        """Attempts of a step committed running, until one is done; the value."""
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
                    encoded = encode_value(value, rt.settings.max_output)
                except CommitUnknown:
                    raise
                except USER_ERRORS as exc:
                    attempt = self._failed(step, attempt, exc, limits)
                    continue
                except BaseException as exc:
                    self.cancelled(step, exc)
                    raise
                finally:
                    CURRENT.reset(token)
                    self.kept(step, context)
                return self._done(step, value, encoded, began)
        finally:
            self.running = None

    def cancelled(self, step: Step, exc: BaseException) -> None:
        """Keep asyncio's cancel of a running step as what ends the run (exit 12):
        its effect stopped midway, its outcome unknown as after a kill, so it is
        left running for the next run to recover, never gone past."""
        if self.dead is None and is_cancel(exc):
            self.dead = WorkflowError(
                f"task {self.task_id!r}: step {step.idx} ({step.tool!r}) was cancelled while "
                "it ran (asyncio.wait_for around it, the workflow returning before it ended, "
                "or its own code): its outcome is unknown and it is left running for the "
                "next run; await each step to its end (a step's time limit is its timeout)"
            )

    def kept(self, step: Step, context: ToolContext) -> None:
        """Keep the progress an attempt committed for the step's next attempt."""
        if context.progress is not None:
            self._progress[step.idx] = context.progress

    def _before(self, step: Step, attempt: int) -> ToolContext:
        assert self._rt is not None
        assert self._run is not None
        self._rt.before_effect(self._run, step.idx, fresh=False)
        return self._tool_context(step, attempt)

    def _failed(self, step: Step, attempt: int, exc: BaseException, limits: Limits) -> int:
        """Record the attempt's step_error; the next attempt once its wait is over.
        An error the step's code met in the runtime (a step called inside it, the
        task cancelled) ends the run instead, the attempt left as it stands."""
        if self.dead is not None:
            raise self.dead from None
        assert self._rt is not None
        assert self._run is not None
        try:
            wait = self._rt.record_error(self._run, step, attempt, exc, limits)
        except TaskFailed as failed:
            self.dead = StepFailed(str(failed))
            raise self.dead from None
        again = self._rt.begin_attempt(self._run, step, None, self._stop, wait, self._max_wait)
        if again is None:
            self._release()
        return again

    def _done(self, step: Step, value: Any, encoded: str, began: float) -> Any:
        assert self._rt is not None
        assert self._run is not None
        # Every replay returns the value as the journal holds it (keys sorted, a
        # tuple as a list): the first run returns that too, or code looping over
        # a dict would call its next steps in another order after a kill.
        output = {"value": decode_value(encoded)}
        value = output["value"]
        if self._unsafe_late and step.attempts == 1 and step.status is StepStatus.RUNNING:
            crashpoints.crash("after_effect", step.idx)  # a kill now leaves no trace of it
            self._rt.store.append_step(
                self._run, step.idx, step.tool, dumps(step.input), policy=dumps(step.policy)
            )
        self._rt.record_done(
            self._run, step, output, encoded, last=False, took=time.monotonic() - began
        )
        self._steps[step.idx] = step._replace(status=StepStatus.DONE, output=output)
        return value

    def finish(self, result: Any) -> None:
        """The function returned ``result``: refuse it if the journal holds more
        steps, else commit the task done with it."""
        if self.dead is not None:
            raise self.dead
        if self._next < len(self._steps):
            self._diverge(self._next, self._steps[self._next].tool, None)
        # Checked by replay-check too: a run of this code would be refused for it.
        limit = self._rt.settings.max_output if self._rt is not None else self.max_output
        try:
            encode_value(result, limit)
            encoded = dumps(result)
        except Exception as exc:
            raise WorkflowError(
                f"task {self.task_id!r}: the workflow's return value cannot be stored: {exc}; "
                "nothing was written (return JSON: dicts, lists, strings, numbers)"
            ) from None
        if self._rt is None or self._run is None:
            return
        crashpoints.crash("before_task_done")
        self._rt.store.finish_task(self._run, result=encoded)


def _unsafe(name: str, url: str) -> bool:
    """TEST-ONLY switches of the negative controls, thrown as the store's
    (:func:`ninelives.store.fencing_disabled`): ``name`` must hold exactly
    ``unsafe-test-only:`` and this database's URL. ``NINELIVES_TEST_SKIP_NAME_CHECK``
    replays without comparing step names; ``NINELIVES_TEST_SKIP_RUNNING_COMMIT``
    commits a new step only after its function returned."""
    import os
    import sys

    thrown = bool(url) and os.environ.get(name, "") == "unsafe-test-only:" + url
    if thrown:
        print(f"ninelives: WARNING: {name} is set: unsafe, for tests only", file=sys.stderr)
    return thrown


def encode_value(value: Any, max_output: int) -> str:
    """``{"value": value}`` as the JSON text a done commit stores (OutputRefused if not)."""
    encoded = encode_output({"value": value}, max_output)
    return escape(encoded) if needs_escape({"value": value}) else encoded


def decode_value(encoded: str) -> Any:
    """The value :func:`encode_value`'s text holds, as a replay reads it back."""
    import json

    output = json.loads(encoded)
    if needs_escape(output):
        output = output[RAW_KEY]
    return output["value"]


def step_limits(step: Step, declared: Mapping[str, Any], settings: Settings) -> Limits:
    """The limits of a step's attempts: the policy stored when the step was first
    started, as ``verify`` reads it (a later change of the code's
    ``@ninelives.step(...)`` applies to steps started after it); ``declared``
    only for a step stored without one."""
    policy = step.policy if step.policy is not None else {"on_unknown": "rerun", **declared}
    return limits_for(policy, settings.max_attempts, settings.backoff)


def policy_of(fn: Any) -> dict[str, Any]:
    """The step policy ``fn`` declares with :func:`ninelives.step` (``{}`` if none)."""
    return dict(fn.policy) if isinstance(fn, StepFunction) else {}


def caller(fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Callable[[], Any]:
    """A call of ``fn`` (the function a declared step wraps) with these arguments."""
    target = fn.fn if isinstance(fn, StepFunction) else fn
    return lambda: target(*args, **kwargs)


def task_spec(task: Task) -> WorkflowSpec:
    """The workflow and arguments a workflow task was created with (PlanError if none)."""
    spec = spec_of(task.goal)
    if spec is None:
        raise PlanError(f"task {task.id!r} is not a workflow task")
    return spec


def call(flow: Workflow, ctx: WorkflowContext, spec: WorkflowSpec) -> Any:
    """Call the workflow's function with ``ctx`` and the stored arguments; any
    error its own code raises (outside a step) ends the run as a
    :class:`WorkflowError` having written nothing for it."""
    token = ACTIVE.set(ctx)
    try:
        if flow.is_async:
            import asyncio  # only when an async workflow runs: the CLI stays lean

            return asyncio.run(flow.fn(ctx, *spec.args, **spec.kwargs))
        return flow.fn(ctx, *spec.args, **spec.kwargs)
    except (Released, CommitUnknown):
        raise
    except BaseException as exc:  # SystemExit: see USER_ERRORS
        if not isinstance(exc, (Exception, SystemExit)) and not is_cancel(exc):
            raise  # KeyboardInterrupt, a test harness's crash
        if ctx.dead is not None:
            raise ctx.dead from None
        if isinstance(exc, NineLivesError) and not isinstance(exc, PlanError):
            raise  # the runtime's own (cancelled, parked, lease lost): as for a plan
        raise WorkflowError(
            f"task {ctx.task_id!r}: workflow {flow.name!r} raised outside a step, after "
            f"{ctx._next} step call(s): {clean_error(error_text(exc))}; nothing was written for "
            "it: fix the code and run again"
        ) from None
    finally:
        ACTIVE.reset(token)
