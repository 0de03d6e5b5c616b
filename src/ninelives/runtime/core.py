"""The runtime: create tasks, and run them as recover -> start step -> tool -> record.

Each step costs two commits: ``running`` (attempts + 1) before the tool runs
and ``done`` with its output after. A crash between them leaves the step
``running``; the next run finds it, journals ``step_recovered`` and runs it
again, so tools are called at least once and must be idempotent by their key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import blobs, crashpoints
from ..durable import Workflow
from ..durable import prepare as prepare_workflow
from ..errors import (
    InputError,
    PlanError,
    PlanMismatch,
    TaskExists,
    TaskFailed,
)
from ..journal import dumps, storable
from ..models import (
    AGENT_TOOL,
    WORKFLOW_GOAL,
    Event,
    EventKind,
    Run,
    Step,
    StepProgress,
    StepStatus,
    Task,
    TaskStatus,
    is_workflow,
)
from ..names import check_queue as check_queue
from ..names import check_stored_id
from ..names import check_task_id as check_task_id
from ..names import new_run_id as new_run_id
from ..settings import BLOB_THRESHOLD_OFF, Settings
from ..store import journal, open_store
from ..tools.effects import TASK_ARTIFACTS, remove_orphans
from .steps import StepRunner
from .waits import after_claim, modes, refuse_parked

if TYPE_CHECKING:
    from ..plan import Plan
    from ..tools import Registry

#: ``Settings.artifacts`` when nothing names a folder: a task's recorded folder wins over it.
DEFAULT_ARTIFACTS = "artifacts"


def prepare(
    task_id: str, plan: Plan | Mapping[str, Any] | str | os.PathLike[str], tools: Registry
) -> Plan:
    """Check ``task_id``, load ``plan`` and validate it against ``tools``; touch no store.

    Raises :class:`~ninelives.errors.InvalidTaskId` or :class:`~ninelives.errors.PlanError`.
    """
    # Plans and tools load here, not at import: `status` and `export` need neither.
    from ..plan import Plan, check_built, load_plan, plan_from_dict, validate

    check_task_id(task_id)
    if isinstance(plan, Mapping):
        plan = plan_from_dict(dict(plan))
    elif isinstance(plan, Plan):
        plan = check_built(plan)
    else:
        plan = load_plan(plan)
    validate(plan, tools.lookup)
    _check_storable(plan)
    return plan


def _check_storable(plan: Plan) -> None:
    """Refuse a plan that a store cannot keep as standard JSON and UTF-8 text:
    a number out of range (``1e999`` reads as infinity), a lone surrogate
    (``"\\ud800"``), or a NUL in the goal (PostgreSQL text cannot hold one)."""
    try:
        storable(plan.goal, "the goal")
        if plan.goal.startswith(WORKFLOW_GOAL):
            raise ValueError(f"a goal starting with {WORKFLOW_GOAL!r} is kept for workflow tasks")
        if "\x00" in plan.goal:
            raise ValueError("the goal contains a NUL character")
        for i, step in enumerate(plan.steps):
            storable(step.input, f"step {i} input")
    except ValueError as exc:
        raise PlanError(f"plan refused: {exc}") from None


def _step_index(value: object, option: str) -> None:
    """Refuse ``value`` unless it is a step index: an ``int`` of 0 or more, never a
    ``bool``, a float or text (``retry``'s ``--step``, ``fork``'s ``--from``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{option} must be a step index (0 or more), got {value!r}")


def _same_folder(a: str, b: str) -> bool:
    """Whether absolute folders ``a`` and ``b`` are one: the same name, or two
    names (one through a symlink) of the same real folder."""
    return a == b or os.path.realpath(a) == os.path.realpath(b)


class Runtime(StepRunner):
    """A store plus the tools and settings that run its tasks.

    Get one with :func:`ninelives.open`; use it as a context manager or call
    :meth:`close`.
    """

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
        plan: Plan | Workflow | Mapping[str, Any] | str | os.PathLike[str],
        *args: Any,
        queue: str | None = None,
        **kwargs: Any,
    ) -> Task:
        """Validate and store a task with its whole plan; journal ``task_created``.

        ``plan`` is a :class:`Plan`, a dict of plan JSON, or a plan file path; or a
        workflow (:func:`ninelives.workflow`) called with ``args`` and ``kwargs``
        (stored as canonical JSON with the task).
        With ``queue`` the task is enqueued there for ``worker`` processes.
        Raises :class:`~ninelives.errors.InvalidTaskId`, :class:`~ninelives.errors.PlanError`
        or :class:`~ninelives.errors.TaskExists`; none of them changes anything stored.
        """
        return self._store_task(task_id, self._prepare(task_id, plan, args, kwargs), queue)

    def _store_task(self, task_id: str, prepared: Plan, queue: str | None) -> Task:
        if queue is not None:
            check_queue(queue)
        return self.store.create_task(
            task_id, prepared, queue=queue, artifacts=os.path.abspath(self.settings.artifacts)
        )

    def submit(
        self,
        task_id: str,
        plan: Plan | Workflow | Mapping[str, Any] | str | os.PathLike[str],
        *args: Any,
        queue: str | None = None,
        **kwargs: Any,
    ) -> Task:
        """Create the task, or return it if it already exists with the same plan.

        Safe to call again after a crash or a restart: the second call returns
        the stored task (done, failed or half-way), ready for :meth:`run`, which
        resumes it (an agent task with the steps its turns appended). A task of
        that id with a different goal, steps or step policies raises
        :class:`~ninelives.errors.PlanMismatch`, changing nothing. A workflow
        task is the same when its workflow name, version and arguments are.
        """
        prepared = self._prepare(task_id, plan, args, kwargs)
        try:
            return self._store_task(task_id, prepared, queue)
        except TaskExists:
            pass
        stored = self.store.get_task(task_id)
        # An agent's turns append steps after the plan's own: only those are the plan.
        kept = stored.steps[: len(prepared.steps)] if prepared.agent else stored.steps
        wanted = dumps([prepared.goal, [[s.tool, s.input, s.policy] for s in prepared.steps]])
        found = dumps([stored.goal, [[s.tool, s.input, s.policy] for s in kept]])
        if is_workflow(prepared.goal):  # its steps come from its code, not from create
            wanted, found = prepared.goal, stored.goal
        if wanted != found:
            raise PlanMismatch(
                f"task {task_id!r} already exists with a different plan; "
                "use another task id, or the plan it was created with"
            ) from None
        return stored

    def _prepare(
        self,
        task_id: str,
        plan: Plan | Workflow | Mapping[str, Any] | str | os.PathLike[str],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Plan:
        if isinstance(plan, Workflow):
            return prepare_workflow(task_id, plan, args, kwargs)
        if args or kwargs:
            raise PlanError("arguments are given to a workflow, not to a plan")
        return prepare(task_id, plan, self.tools)

    def result(self, task_id: str) -> Any:
        """A done workflow task's return value (``task_done``'s ``result``).
        :class:`UnknownTask` if absent, :class:`InputError` unless it is a done
        workflow task."""
        task = self.store.get_task(check_stored_id(task_id))
        if not is_workflow(task.goal):
            raise InputError(f"task {task_id!r} is not a workflow task: it has no result")
        if task.status is not TaskStatus.DONE:
            raise InputError(f"task {task_id!r} is {task.status.value}: it has no result yet")
        return workflow_result(self.store.events(task_id))

    def retry(self, task_id: str, *, step: int | None = None) -> Task:
        """Move a failed task back to ``pending`` so that the next run tries again.

        Its failed step goes back to ``pending`` with its attempts reset to 0,
        journaled as ``task_retried`` in the same transaction; done steps keep
        their outputs and are not run again. With ``step``, that must be the
        failed step (a guard for scripts). An agent task that ``max_turns`` or
        ``max_calls`` failed has no failed step: its retry appends what its last
        turn asked for and the next turn, under a budget granted again
        (:func:`ninelives.agent.regrant`), journaled in the same transaction.
        Raises :class:`UnknownTask`,
        :class:`~ninelives.errors.TaskBusy` while a live runner holds the task,
        and :class:`~ninelives.errors.InputError` if it is not failed.
        """
        from ..agent import regrant

        if step is not None:
            _step_index(step, "--step")
        return self.store.retry_task(
            check_stored_id(task_id), new_run_id(), step=step, grant=regrant
        )

    def status(self, task_id: str) -> Task:
        """The task, its steps and their statuses; :class:`UnknownTask` if absent."""
        return self.store.get_task(check_stored_id(task_id))

    def export(self, task_id: str) -> list[Event]:
        """The task's journal in ``seq`` order; :class:`UnknownTask` if absent.

        Also for a task whose output blob is missing or damaged: the journal
        needs no output, and it shows the reference that cannot be read."""
        return journal(self.store, check_stored_id(task_id))

    def run(self, task_id: str) -> Task:
        """Recover the task, then run its pending steps in order until done.

        Returns the task once ``done`` (also when it already was). Raises
        :class:`~ninelives.errors.TaskFailed` when a step reaches the attempt
        limit or the recovery limit (or the task had already failed),
        :class:`~ninelives.errors.TaskBusy` at once if another process runs it,
        :class:`~ninelives.errors.PlanError` if a tool it needs is missing here
        and :class:`~ninelives.errors.DamagedTask` if its rows cannot be read
        (:class:`~ninelives.errors.PlanTampered` if its plan was edited; all
        before anything is written), :class:`~ninelives.errors.TaskCancelled`
        if it is cancelled, at once or at the next step boundary, and
        :class:`~ninelives.errors.CommitUnknown` if a commit fails: then it stops
        without another write, and the next run recovers.
        """
        check_stored_id(task_id)
        try:
            run, task = self._begin_run(task_id)
        except _OtherFolder:
            # The guide reads AGENT_ARTIFACTS when its tool runs, so its users give
            # it to run alone: a task that has never started a step adopts it (the
            # claim refused it before writing); any other keeps the refusal. Only
            # this path pays for it.
            if not self.store.move_artifacts(task_id, os.path.abspath(self.settings.artifacts)):
                raise
            run, task = self._begin_run(task_id)
        try:
            return self.execute(run, task)
        finally:
            self.store.end_run(run)

    def _begin_run(self, task_id: str) -> tuple[Run, Task]:
        # The claim transaction also starts the first pending step: with it, a
        # run costs exactly two commits per step, the floor of this design.
        return self.store.begin_run(
            task_id, new_run_id(), start_first=True, check=self._claimable,
            max_recoveries=self.settings.max_recoveries, tool_version=self.tool_version,
            on_unknown=self.unknown_modes(),
        )  # fmt: skip

    def cancel(self, task_id: str, *, reason: str | None = None) -> tuple[Task, bool]:
        """Cancel the task: it becomes ``cancelled`` (``task_cancelled``) and is never
        run again; a runner holding it stops before its next step (exit 9).

        Returns the task and whether this call cancelled it (False: it already
        was). Raises :class:`UnknownTask`, and :class:`InputError` for a done
        task or a reason a journal cannot keep; neither changes anything.
        """
        from ..lineage import check_reason

        return self.store.cancel_task(
            check_stored_id(task_id), new_run_id(), reason=check_reason(reason)
        )

    def fork(self, task_id: str, new_id: str, *, start: int, queue: str | None = None) -> Task:
        """A new task ``new_id`` with ``task_id``'s plan, its steps before ``start``
        copied done with their outputs (no tool runs for them), the rest pending
        under the new id's own idempotency keys; ``task_forked`` names the source.

        Raises :class:`~ninelives.errors.InvalidTaskId`, :class:`TaskExists`,
        :class:`UnknownTask` and :class:`InputError` (see :meth:`Store.fork_task`),
        each changing nothing.
        """
        check_stored_id(task_id)
        check_task_id(new_id)
        if queue is not None:
            check_queue(queue)
        _step_index(start, "--from")
        return self.store.fork_task(
            task_id, new_id, start, new_run_id(), queue=queue,
            artifacts=os.path.abspath(self.settings.artifacts),
        )  # fmt: skip

    def _claimable(self, task: Task) -> None:
        """``run``'s check before its claim: a parked task, a missing tool, another
        artifacts folder or a blob folder that is a symlink stops it with nothing
        written."""
        refuse_parked(task)
        self.resolve_tools(task)
        # A done or failed task runs nothing and publishes nothing: its run is the
        # contract's exit 0 or 2 whatever folder it was given.
        finished = task.status in (TaskStatus.DONE, TaskStatus.FAILED)
        if self.settings.artifacts != DEFAULT_ARTIFACTS and not finished:
            self._check_artifacts(task)
        if not finished:
            self.refuse_unstorable()

    def refuse_unstorable(self) -> None:
        """Raise :class:`~ninelives.errors.StoreError` if outputs over the blob
        threshold cannot be kept here (a blob folder that is a symlink, not a
        folder or not writable: :meth:`~ninelives.blobs.Blobs.check_writable`). Checked
        before a claim: found after a step's tool ran, the refusal would leave the
        step running, and each run again would count a recovery and run its
        effect again."""
        if self.settings.blob_threshold != BLOB_THRESHOLD_OFF:
            self.store.blobs.check_writable()

    def unknown_modes(self) -> Callable[[Step], str]:
        """``on_unknown(step)`` for a claim: each step's mode for an unknown outcome."""
        return modes(self.tools)

    def resolve_tools(self, task: Task) -> None:
        """Raise :class:`~ninelives.errors.PlanError` unless every tool that the
        task's unfinished steps need is known here. Stores call it before they
        claim a task (``check``), so a tool missing on this host costs no attempt,
        no recovery and no journal event."""
        if task.status not in (TaskStatus.PENDING, TaskStatus.RUNNING):
            return
        if is_workflow(task.goal):
            from ..durable import lookup, spec_of

            spec = spec_of(task.goal)
            assert spec is not None
            _ = self.tools  # imports the --tools / NINELIVES_TOOLS modules: their workflows
            try:
                lookup(spec.name)
            except PlanError as exc:
                raise PlanError(
                    f"task {task.id!r} needs {exc}; it was not started (nothing written)"
                ) from None
            return
        for step in task.steps:
            if step.status in (StepStatus.PENDING, StepStatus.RUNNING):
                # An agent's turn needs the tools it may call as well as its own.
                agent = step.input.get("tools", []) if step.tool == AGENT_TOOL else []
                try:
                    for name in (step.tool, *agent):
                        self.tools.lookup(name)
                except PlanError as exc:
                    raise PlanError(
                        f"task {task.id!r} step {step.idx} needs {exc}; it was not "
                        "started (nothing written): install or register the tool, then run again"
                    ) from None
                if step.tool in ("llm", AGENT_TOOL):
                    from ..llm import check_engine

                    check_engine(task.id, step.idx, step.input, PlanError)

    def execute(
        self,
        run: Run,
        task: Task,
        *,
        stop: Callable[[], bool] | None = None,
        max_wait: float | None = None,
    ) -> Task:
        """Run the pending steps of a task this runner holds (``run`` from
        :meth:`Store.begin_run` or :meth:`Store.claim_next`); the caller ends the run.

        ``stop`` is asked before each step: when it returns True the runner
        returns the task as it stands, unfinished, having left no step running.
        A step's backoff wait is slept through in-process, unless it is longer
        than ``max_wait`` seconds: then the task is returned as it stands too
        (a worker's slot takes other work; the store keeps the wait).
        Raises as :meth:`run` does; :class:`~ninelives.errors.LeaseLost` when
        another runner took the task over (nothing false was written).
        """
        task_id = run.task_id
        if run.recovered:
            self.say(f"{task_id}: recovered step(s) {list(run.recovered)} left running")
        if task.status is TaskStatus.FAILED:
            if run.recovered:  # this claim failed it (the recovery limit): clean up still
                self._remove_orphans(task)
            raise TaskFailed(
                f"task {task_id!r} has failed ({self._failure(task_id)}); it is not run "
                f"again until 'ninelives retry {task_id}' moves it back to pending"
            )
        if task.status is TaskStatus.DONE:
            return task
        if task.status is TaskStatus.CANCELLED:  # cancelled while this run claimed it
            from ..lineage import cancelled

            raise cancelled(task_id)
        crashpoints.crash("after_recovery")  # the claim may have parked it: see after_claim
        folder = self._artifacts_for(task)
        if run.recovered or any(s.attempts and s.status is StepStatus.PENDING for s in task.steps):
            # Only an attempt that died leaves temporary files: its step is found
            # running, or pending again if a kill came after the recovery's commit.
            # A fresh task skips listing folders that grow with every task.
            self._remove_orphans(task, folder)
        token = TASK_ARTIFACTS.set(folder)
        blob_token = blobs.CURRENT.set((self.store.blobs, task_id))
        try:
            if is_workflow(task.goal):  # its code runs the steps; probes when it calls them
                from .workflows import drive

                return drive(self, run, task, stop, max_wait)
            task = after_claim(self, run, task)  # probes; a parked task raises TaskParked
            return self.run_steps(run, task, stop, max_wait)
        finally:
            blobs.CURRENT.reset(blob_token)
            TASK_ARTIFACTS.reset(token)

    def _remove_orphans(self, task: Task, folder: str | None = None) -> None:
        """Delete the temporary files (artifacts, blobs) a killed run of ``task`` left."""
        remove_orphans(folder or self._artifacts_for(task), task.id, log=self._log)
        self.store.blobs.remove_orphans(task.id)

    def _artifacts_for(self, task: Task) -> str:
        """The folder this task publishes to: the one recorded at create; the
        settings' for tasks that recorded none (the guide's own, older versions)."""
        if task.artifacts is None:
            return self.settings.artifacts
        if _same_folder(os.path.abspath(self.settings.artifacts), task.artifacts):
            return self.settings.artifacts  # the same folder, named as the caller names it
        if self.settings.artifacts != DEFAULT_ARTIFACTS:
            self.say(
                f"{task.id}: WARNING: publishing to {task.artifacts}, the folder recorded at "
                f"create, not to {self.settings.artifacts}"
            )
        return task.artifacts

    def _check_artifacts(self, task: Task) -> None:
        configured = os.path.abspath(self.settings.artifacts)
        if task.artifacts is not None and not _same_folder(task.artifacts, configured):
            raise _OtherFolder(
                f"task {task.id!r} publishes to {task.artifacts} (recorded at create), but this "
                f"run was given {configured} (AGENT_ARTIFACTS or Settings.artifacts): an artifact "
                "published there could be published a second time; unset it or give the same folder"
            )

    def _failure(self, task_id: str) -> str:
        """The journaled reason a task failed (read only on that path)."""
        for event in reversed(self.store.events(task_id)):
            if event.kind == EventKind.TASK_FAILED.value:
                return str(event.data.get("reason", "no reason recorded"))
        return "no reason recorded"


class _OtherFolder(InputError):
    """A run given another artifacts folder than its task's (exit 4 unless adopted)."""


def workflow_result(events: list[Event]) -> Any:
    """The result a workflow task's ``task_done`` holds (None if there is none)."""
    for event in reversed(events):
        if event.kind == EventKind.TASK_DONE.value:
            return event.data.get("result")
    return None


def open(
    url: str | None = None,
    *,
    settings: Settings | None = None,
    tools: Registry | None = None,
    create: bool = True,
    readonly: bool = False,
    log: Callable[[str], None] | None = None,
    on_progress: Callable[[StepProgress], None] | None = None,
) -> Runtime:
    """Open the database at ``url`` (a SQLite path or a ``postgresql://`` URL).

    ``url`` defaults to ``$NINELIVES_DB``, else ``state.db``, as on the command
    line. ``settings`` default to the environment (``AGENT_*``,
    ``NINELIVES_*``); ``tools`` to the built-in tools plus those of the
    ``ninelives.tools`` entry point group and of the modules in
    ``settings.tool_modules`` (``NINELIVES_TOOLS``). With ``create`` false a
    missing SQLite file is not created; with ``readonly`` a SQLite file is only
    read (:func:`~ninelives.store.open_store`): :meth:`Runtime.status` and
    :meth:`Runtime.export` work, running does not.

    ``log`` gets each progress line (a step done, an error, a recovery);
    ``on_progress`` gets a :class:`~ninelives.models.StepProgress` after each
    committed ``ctx.checkpoint``. Both are called in the running thread and
    must not raise.
    """
    if url is None:
        url = os.environ.get("NINELIVES_DB") or "state.db"
    settings = settings.checked() if settings is not None else Settings.from_env()
    store = open_store(url, create=create, readonly=readonly)
    return Runtime(store, settings=settings, tools=tools, log=log, on_progress=on_progress)
