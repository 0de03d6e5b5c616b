"""The runtime: create tasks, and run them as recover -> start step -> tool -> record.

Each step costs two commits: ``running`` (attempts + 1) before the tool runs
and ``done`` with its output after. A crash between them leaves the step
``running``; the next run finds it, journals ``step_recovered`` and runs it
again, so tools are called at least once and must be idempotent by their key.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import crashpoints
from .errors import CommitUnknown, InputError, InvalidTaskId, TaskFailed
from .journal import dumps
from .models import AGENT_TOOL, Event, Run, Step, StepStatus, Task, TaskStatus
from .settings import Settings
from .store import Store, open_store

if TYPE_CHECKING:
    from .agent import Continuation
    from .plan import Plan
    from .tools import Registry

# Patterns as text: re caches them compiled on first use (create), not at import.
TASK_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_ELIDE = 60


def check_task_id(task_id: str) -> str:
    """Return ``task_id`` if it is plain data, else raise :class:`InvalidTaskId`.

    An id is 1-128 characters of letters, digits, ``.``, ``_`` and ``-``,
    starting with a letter or digit: it can never name a path (``..``,
    ``a/b``, ``/abs``), an option (``-x``) or be empty, so artifact names
    built from it stay inside their folder.
    """
    if not isinstance(task_id, str) or not re.fullmatch(TASK_ID_PATTERN, task_id):
        raise InvalidTaskId(
            f"invalid task id {task_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return task_id


def prepare(
    task_id: str, plan: Plan | Mapping[str, Any] | str | os.PathLike[str], tools: Registry
) -> Plan:
    """Check ``task_id``, load ``plan`` and validate it against ``tools``; touch no store.

    Raises :class:`~ninelives.errors.InvalidTaskId` or :class:`~ninelives.errors.PlanError`.
    """
    # Plans and tools load here, not at import: `status` and `export` need neither.
    from .plan import Plan, load_plan, plan_from_dict, validate

    check_task_id(task_id)
    if isinstance(plan, Mapping):
        plan = plan_from_dict(dict(plan))
    elif not isinstance(plan, Plan):
        plan = load_plan(plan)
    validate(plan, tools.lookup)
    return plan


QUEUE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"


def check_queue(queue: str) -> str:
    """Return ``queue`` if it is a plain name (1-64 letters, digits, ``.``, ``_``,
    ``-``, starting with a letter or digit), else raise :class:`InputError`."""
    if not isinstance(queue, str) or not re.fullmatch(QUEUE_PATTERN, queue):
        raise InputError(
            f"invalid queue name {queue!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return queue


def new_run_id() -> str:
    """A fresh run id: 32 hex digits."""
    return os.urandom(16).hex()


def _brief(output: Mapping[str, Any]) -> str:
    shown = {
        k: (v[:_ELIDE] + "…" if isinstance(v, str) and len(v) > _ELIDE else v)
        for k, v in output.items()
    }
    return json.dumps(shown, sort_keys=True, ensure_ascii=False)


class Runtime:
    """A store plus the tools and settings that run its tasks.

    Get one with :func:`ninelives.open`; use it as a context manager or call
    :meth:`close`.
    """

    def __init__(
        self,
        store: Store,
        *,
        settings: Settings | None = None,
        tools: Registry | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings if settings is not None else Settings.from_env()
        self._tools = tools
        self._log = log

    @property
    def tools(self) -> Registry:
        """The tools steps run with: built when first needed (``status`` never needs them)."""
        if self._tools is None:
            from .tools.builtin import default_registry

            self._tools = default_registry(self.settings)
        return self._tools

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def create(
        self,
        task_id: str,
        plan: Plan | Mapping[str, Any] | str | os.PathLike[str],
        *,
        queue: str | None = None,
    ) -> Task:
        """Validate and store a task with its whole plan; journal ``task_created``.

        ``plan`` is a :class:`Plan`, a dict of plan JSON, or a plan file path.
        With ``queue`` the task is enqueued there for ``worker`` processes.
        Raises :class:`~ninelives.errors.InvalidTaskId`, :class:`~ninelives.errors.PlanError`
        or :class:`~ninelives.errors.TaskExists`; none of them changes anything stored.
        """
        prepared = prepare(task_id, plan, self.tools)
        if queue is not None:
            check_queue(queue)
        return self.store.create_task(task_id, prepared, queue=queue)

    def status(self, task_id: str) -> Task:
        """The task, its steps and their statuses; :class:`UnknownTask` if absent."""
        return self.store.get_task(task_id)

    def export(self, task_id: str) -> list[Event]:
        """The task's journal in ``seq`` order; :class:`UnknownTask` if absent."""
        self.store.get_task(task_id)
        return self.store.events(task_id)

    def run(self, task_id: str) -> Task:
        """Recover the task, then run its pending steps in order until done.

        Returns the task once ``done`` (also when it already was). Raises
        :class:`~ninelives.errors.TaskFailed` when a step reaches the attempt
        limit (or the task had already failed), :class:`~ninelives.errors.TaskBusy`
        at once if another process runs it, and
        :class:`~ninelives.errors.CommitUnknown` if a commit fails: then it stops
        without another write, and the next run recovers.
        """
        # The claim transaction also starts the first pending step: with it, a
        # run costs exactly two commits per step, the floor of this design.
        run, task = self.store.begin_run(task_id, new_run_id(), start_first=True)
        try:
            return self.execute(run, task)
        finally:
            self.store.end_run(run)

    def execute(self, run: Run, task: Task, *, stop: Callable[[], bool] | None = None) -> Task:
        """Run the pending steps of a task this runner holds (``run`` from
        :meth:`Store.begin_run` or :meth:`Store.claim_next`); the caller ends the run.

        ``stop`` is asked before each step: when it returns True the runner
        returns the task as it stands, unfinished, having left no step running.
        Raises as :meth:`run` does; :class:`~ninelives.errors.LeaseLost` when
        another runner took the task over (nothing false was written).
        """
        task_id = run.task_id
        if run.recovered:
            self._say(f"{task_id}: recovered step(s) {list(run.recovered)} left running")
        if task.status is TaskStatus.FAILED:
            raise TaskFailed(f"task {task_id!r} has failed; it is not run again")
        if task.status is TaskStatus.DONE:
            return task
        crashpoints.crash("after_recovery")
        from .tools.effects import remove_orphans

        remove_orphans(self.settings.artifacts, task_id)
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
        for step in pending:
            tool = self.tools.lookup(step.tool)
            last = step is pending[-1]
            while True:
                if started is not None and started[0] == step.idx:
                    attempt, started = started[1], None
                else:
                    if stop is not None and stop():
                        return self.store.get_task(task_id)
                    attempt = self.store.start_step(run, step.idx, step.tool)
                crashpoints.crash("before_effect", step.idx)
                if self.settings.step_delay:
                    time.sleep(self.settings.step_delay)
                # A runner paused past its lease must not start an effect that
                # another runner may own by now (its commits would be fenced anyway).
                self.store.check_lease(run)
                try:
                    output = dict(tool(step.input, ctx, f"{task_id}-{step.idx}"))
                    encoded = dumps(output)
                except CommitUnknown:
                    raise  # storage failed under the effect: stop, never retry
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    self._say(f"{task_id}: step {step.idx} {step.tool} attempt {attempt}: {error}")
                    if self.store.record_error(run, step.idx, error, self.settings.max_attempts):
                        raise TaskFailed(
                            f"task {task_id!r} failed: step {step.idx} ({step.tool}) "
                            f"failed {attempt} times; last error: {error}"
                        ) from None
                    continue
                follow = _continuation(step, output)
                crashpoints.crash("after_effect", step.idx)
                if follow is None:
                    self.store.finish_step(run, step.idx, step.tool, encoded, last=last)
                else:
                    self.store.finish_step(
                        run, step.idx, step.tool, encoded, last=follow.final, fail=follow.fail,
                        append=[(tool, dumps(given)) for tool, given in follow.append],
                    )  # fmt: skip
                crashpoints.crash("after_commit", step.idx)
                self._say(f"{task_id}: step {step.idx} {step.tool} done {_brief(output)}")
                ctx[step.idx] = output
                if follow is not None:
                    if follow.fail:
                        raise TaskFailed(f"task {task_id!r} failed: {follow.fail}")
                    pending.extend(_appended(task_id, step.idx, follow))
                break
        return self.store.get_task(task_id)

    def _say(self, line: str) -> None:
        if self._log is not None:
            self._log(line)


def _continuation(step: Step, output: Mapping[str, Any]) -> Continuation | None:
    """For an agent's turn, the steps its commit appends or why the task fails."""
    if step.tool != AGENT_TOOL:
        return None
    from .agent import after_turn

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
        )
        for idx, (tool, given) in enumerate(follow.append, start=after + 1)
    ]


def open(
    url: str = "state.db",
    *,
    settings: Settings | None = None,
    tools: Registry | None = None,
    create: bool = True,
    log: Callable[[str], None] | None = None,
) -> Runtime:
    """Open the database at ``url`` (a SQLite path or a ``postgresql://`` URL).

    ``settings`` default to the ``AGENT_*`` environment; ``tools`` to the
    built-in tools plus those of the ``ninelives.tools`` entry point group.
    With ``create`` false a missing SQLite file is not created.
    """
    settings = settings if settings is not None else Settings.from_env()
    return Runtime(open_store(url, create=create), settings=settings, tools=tools, log=log)
