"""Records read back from a store, and the status Enums.

Records are typed ``NamedTuple`` classes: immutable and checked by mypy like
frozen dataclasses, but each costs a fraction of a millisecond less to define,
and every command imports them at start-up (the CLI aims to start within
twice the bare interpreter's time). Build them with keyword arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from .errors import DamagedTask

E = TypeVar("E", bound=Enum)

#: The tool of an agent's model turn (see :mod:`ninelives.agent`).
AGENT_TOOL = "agent"
#: The built-in tool of a step that waits for a person (see :mod:`ninelives.runtime.waits`).
APPROVAL_TOOL = "approval"
#: What ``ls`` shows as the status of a task whose row cannot be read.
DAMAGED = "damaged"
#: How a workflow task's goal begins: the rest is the canonical JSON of its
#: workflow name, version and arguments (see :mod:`ninelives.workflow`), so the
#: plan digest covers them and every reader gets them with the task row.
WORKFLOW_GOAL = "workflow:"


#: How every workflow task's goal begins: the canonical JSON's first key is "args".
#: A plan an older version stored with a goal that merely begins ``workflow:`` (any
#: text was a goal then) stays a plan; ``create`` refuses the bare prefix for new ones.
WORKFLOW_SPEC = WORKFLOW_GOAL + '{"args":'


def is_workflow(goal: str) -> bool:
    """Whether a task of this goal is a workflow's (its steps come from code)."""
    return goal.startswith(WORKFLOW_SPEC)


class TaskStatus(str, Enum):
    """Lifecycle of a task; stored as its value in ``tasks.status``."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    #: A step's outcome is unknown and its tool refuses to guess (``on_unknown``
    #: ``refuse``, or a probe that could not tell): ``ninelives resolve`` moves it on.
    BLOCKED = "blocked"
    #: An ``approval`` step waits for ``ninelives approve``.
    WAITING = "waiting"
    #: ``ninelives cancel``: never run again.
    CANCELLED = "cancelled"


class StepStatus(str, Enum):
    """Lifecycle of a step; stored as its value in ``steps.status``.

    ``pending -> running`` is committed before the tool runs and
    ``running -> done`` (with the output) after it; a step found ``running``
    at the start of a run is put back to ``pending`` (``step_recovered``).
    """

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    #: Parked with an unknown outcome until ``ninelives resolve``.
    BLOCKED = "blocked"
    #: An ``approval`` step waiting for ``ninelives approve``.
    WAITING = "waiting"


def _lookup(enum: type[E]) -> Callable[[Any], E]:
    """``enum(value)`` for a stored value, as one dict lookup (a row read calls it
    once per step; the Enum call costs several times more), the same error."""
    members = {m.value: m for m in enum}

    def member(value: Any) -> E:
        try:
            return members[value]
        except KeyError:
            raise ValueError(f"{value!r} is not a valid {enum.__name__}") from None

    return member


_task_status = _lookup(TaskStatus)
_step_status = _lookup(StepStatus)


class EventKind(str, Enum):
    """Journal event kinds of the contract. Stores keep ``kind`` as plain text,
    so journals written by later versions with more kinds still read back."""

    TASK_CREATED = "task_created"
    STEP_RECOVERED = "step_recovered"
    RUN_STARTED = "run_started"
    STEP_STARTED = "step_started"
    STEP_FINISHED = "step_finished"
    STEP_ERROR = "step_error"
    TASK_DONE = "task_done"
    TASK_FAILED = "task_failed"
    #: ``ninelives retry``: a failed task and its failed step back to ``pending``,
    #: the step's attempts reset (data: ``reason`` of the failure it undoes).
    TASK_RETRIED = "task_retried"
    STEP_APPENDED = "step_appended"
    #: A probe found the effect of a step left running had happened: committed done.
    STEP_RECONCILED = "step_reconciled"
    #: A step of unknown outcome was parked (data: ``reason``); the task is blocked.
    STEP_BLOCKED = "step_blocked"
    #: ``ninelives resolve``: a person stated the parked step's outcome, or asked a rerun.
    STEP_RESOLVED = "step_resolved"
    #: ``ctx.checkpoint``: progress committed inside a running step.
    STEP_PROGRESS = "step_progress"
    #: An ``approval`` step now waits for a person; the task is waiting.
    STEP_WAITING = "step_waiting"
    STEP_APPROVED = "step_approved"
    STEP_REJECTED = "step_rejected"
    #: ``ninelives cancel`` (data: ``reason``, and the ``status`` it had): never run again.
    TASK_CANCELLED = "task_cancelled"
    #: The first event of a forked task (data: ``source`` task and ``from`` step).
    TASK_FORKED = "task_forked"


class Step(NamedTuple):
    """One step of a stored plan and its progress."""

    task_id: str
    idx: int
    tool: str
    input: dict[str, Any]
    status: StepStatus
    output: dict[str, Any] | None
    attempts: int
    #: The step's policy (``max_attempts``, ``timeout``, ``backoff``,
    #: ``on_unknown``: the plan's defaults merged with the step's own); None: settings decide.
    policy: dict[str, Any] | None = None
    #: The last progress committed by ``ctx.checkpoint`` (any JSON), or None.
    progress: Any = None
    #: The earliest time (epoch seconds) its next attempt may start (a backoff wait).
    not_before: float | None = None
    #: ``{"sha256", "size"}`` when the output is stored as a blob (:mod:`ninelives.blobs`);
    #: ``output`` is then the blob's content, read and checked.
    output_blob: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, task_id: str, row: Sequence[Any]) -> Step:
        """A step from a ``get_steps`` row: ``(idx, tool, input, status, output,
        attempts, policy, progress, not_before)``.

        Raises :class:`~ninelives.errors.DamagedTask` for a status this version
        does not know or a JSON column that does not parse.
        """
        idx, tool, raw_input, status, output, attempts, policy, progress, not_before = row
        try:
            checked(idx, "integer", "idx")
            checked(attempts, "integer", "attempts")
            checked(not_before, "time?", "not_before")
            return cls(
                task_id=task_id,
                idx=idx,
                tool=checked(tool, "text", "tool"),
                input=load_json_object(raw_input),
                status=_step_status(status),
                output=load_json_object(output) if output is not None else None,
                attempts=attempts,
                policy=load_json_object(policy) if policy is not None else None,
                progress=load_json(progress) if progress is not None else None,
                not_before=not_before,
            )
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            raise damaged(task_id, f"step {idx}", exc) from exc

    def as_status(self) -> dict[str, Any]:
        """The step as ``status`` prints it (the contract's four keys)."""
        return {
            "idx": self.idx,
            "tool": self.tool,
            "status": self.status.value,
            "attempts": self.attempts,
        }


class Task(NamedTuple):
    """A stored task with its whole plan, in step order."""

    id: str
    goal: str
    status: TaskStatus
    created_at: float
    updated_at: float
    steps: tuple[Step, ...]
    lease_epoch: int = 0
    #: The absolute folder recorded at create for its artifacts (on SQLite, one
    #: beside the database moves with it); None for tasks
    #: written by the guide's code or older versions (the runner's settings decide).
    artifacts: str | None = None
    #: SHA-256 of the canonical plan (:func:`ninelives.lineage.plan_digest`), kept
    #: since create; None for tasks of older versions (not checked).
    plan_sha256: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any], steps: tuple[Step, ...]) -> Task:
        """A task from a ``get_task`` row: ``(id, goal, status, created_at,
        updated_at, lease_epoch, artifacts[, plan_sha256])``, with its steps
        (schemas older than 0006 have no ``plan_sha256``)."""
        task_id, goal, status, created_at, updated_at, lease_epoch, artifacts, *rest = row
        try:
            task_status = _task_status(status)
            checked(goal, "text", "goal")
            checked(created_at, "time", "created_at")
            checked(updated_at, "time", "updated_at")
            checked(artifacts, "text?", "artifacts")
            checked(lease_epoch, "epoch?", "lease_epoch")
        except (ValueError, TypeError) as exc:
            raise damaged(task_id, "task", exc) from exc
        return cls(
            id=task_id,
            goal=goal,
            status=task_status,
            created_at=created_at,
            updated_at=updated_at,
            lease_epoch=lease_epoch,
            artifacts=artifacts,
            plan_sha256=rest[0] if rest else None,
            steps=steps,
        )

    def as_status(self) -> dict[str, Any]:
        """The task as ``status --json`` prints it."""
        return {
            "task": self.id,
            "goal": self.goal,
            "status": self.status.value,
            "steps": [s.as_status() for s in self.steps],
        }

    def outputs(self) -> dict[int, Any]:
        """Committed outputs of the done steps, by index (the tools' ``ctx``)."""
        return {s.idx: s.output for s in self.steps if s.status is StepStatus.DONE}


class Event(NamedTuple):
    """One journal row. ``kind`` stays a string: unknown kinds read back as-is."""

    seq: int
    ts: float
    task_id: str
    run_id: str
    kind: str
    step_idx: int | None
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Event:
        """An event from an ``events`` row: ``(seq, ts, task_id, run_id, kind, step_idx, data)``."""
        seq, ts, task_id, run_id, kind, step_idx, data = row
        try:
            loaded = load_json_object(data)
            checked(ts, "time", "ts")
            checked(run_id, "text", "run_id")
            checked(kind, "text", "kind")
            checked(step_idx, "integer?", "step_idx")
        except (ValueError, TypeError) as exc:
            raise damaged(task_id, f"journal event seq {seq}", exc) from exc
        return cls(
            seq=seq,
            ts=ts,
            task_id=task_id,
            run_id=run_id,
            kind=kind,
            step_idx=step_idx,
            data=loaded,
        )

    def as_export(self) -> dict[str, Any]:
        """The event as ``export`` prints it: fixed keys first, then its data."""
        row: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run_id,
            "kind": self.kind,
            "step": self.step_idx,
        }
        for key, value in self.data.items():
            row.setdefault(key, value)
        return row


class Run(NamedTuple):
    """A runner's hold on a task: its run id and the lease epoch it must still own.

    Every write a runner makes is conditional on ``epoch`` being the task's
    current ``lease_epoch`` (fencing); ``recovered`` lists the steps that the
    run found ``running`` and put back to ``pending``; ``started`` is the
    ``(step index, attempt)`` that the claim transaction itself committed
    ``running``, when the runner asked for it (``begin_run(start_first=True)``).
    """

    task_id: str
    run_id: str
    epoch: int
    recovered: tuple[int, ...]
    started: tuple[int, int] | None = None


def _readable(value: Any, kind: str) -> bool:
    try:
        checked(value, kind, "")
    except TypeError:
        return False
    return True


def damaged(task_id: str, where: str, exc: Exception) -> DamagedTask:
    """The :class:`DamagedTask` of ``task_id`` whose row ``where`` (``task``,
    ``step 2``, ``journal event seq 9``) cannot be read, for the reason ``exc``."""
    what = str(exc).split("\n")[0][:200]
    return DamagedTask(
        f"task {task_id!r} is damaged: {where}: {what}; it cannot be run or shown "
        "until its rows are repaired (other tasks are not affected)",
        task_id=task_id,
    )


#: The largest stored time (epoch seconds, about the year 5138) a row may hold:
#: every reader can turn it into a date or OTLP nanoseconds without overflow.
MAX_TIMESTAMP = 1e11


#: The largest lease epoch a row may hold: a claim adds one, and one more than
#: this is past SQLite's and PostgreSQL's integers (SQLite made it a float).
MAX_EPOCH = 2**63 - 2

#: How a ``TypeError`` of :func:`checked` names each kind.
_KINDS = {
    "text": "text",
    "integer": "an integer",
    "time": "a time",
    "epoch": "an epoch below 2**63 - 1 (a claim adds one to it)",
}


def checked(value: Any, kind: str, column: str) -> Any:
    """``value`` of a stored ``column`` if it is of ``kind`` (``text``, ``integer``,
    ``time``, ``epoch``; ``?`` after it: or NULL), else ``TypeError`` naming the column.

    SQLite keeps any value in any column (a BLOB in ``goal``, text or 1e308
    in a time, as edited by hand): checked once here, as rows are read, so no
    command meets one as a traceback deep in its code."""
    if (value is None and kind[-1] == "?") or _FITS[kind.rstrip("?")](value):
        return value
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise TypeError(f"column {column!r} holds {shown}, not {_KINDS[kind.rstrip('?')]}")


#: Whether a stored value is of each kind of :func:`checked` (a row read checks
#: every column: one call each, no chain of tests).
_FITS: dict[str, Callable[[Any], bool]] = {
    "text": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "epoch": lambda v: type(v) is int and 0 <= v <= MAX_EPOCH,
    # A finite number a date can be made of (NaN fails both comparisons).
    "time": lambda v: type(v) in (int, float) and -MAX_TIMESTAMP <= v <= MAX_TIMESTAMP,
}


#: How deep a plan, a step's output or progress may nest (arrays and objects),
#: as written from now on.
MAX_DEPTH = 32
#: How deep a stored row's JSON may nest (containers in containers) to be read. New
#: rows nest at most 32 levels (plans, outputs, a model's call arguments); this
#: leaves rows of older versions readable while keeping every reader (which may
#: recurse once per level) far from Python's recursion limit.
MAX_READ_DEPTH = 256
# A JSON string (escapes included): removed before counting brackets.
_JSON_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'


def nested_deeper(text: str, limit: int) -> bool:
    """True when the JSON ``text`` nests arrays and objects more than ``limit``
    levels deep. Read from the text, never decoded, so it cannot overflow the
    stack; cheap when the text holds at most ``limit`` brackets."""
    if text.count("[") + text.count("{") <= limit:
        return False
    import re
    from itertools import accumulate

    marks = re.findall(r"[][{}]", re.sub(_JSON_STRING, "", text))
    return max(accumulate(1 if m in "[{" else -1 for m in marks), default=0) > limit


def load_json(text: str) -> Any:
    """Decode stored JSON text; ``ValueError`` for text that does not parse or
    nests more than :data:`MAX_READ_DEPTH` levels (which no reader could walk)."""
    if nested_deeper(text, MAX_READ_DEPTH):
        raise ValueError(f"its JSON nests more than {MAX_READ_DEPTH} levels deep")
    try:
        # Stored text is one JSON value with no space around it: the decoder's
        # scanner reads it at once (every row read decodes several). Any other
        # text takes json.loads, which decodes it or says why it cannot.
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            end = -1
        return value if end == len(text) else json.loads(text)
    except RecursionError:
        raise ValueError("its JSON nests too deeply to decode") from None


#: ``json.loads``' own scanner (an attribute typeshed leaves out): ``(value, end)``
#: of the JSON value at an index, StopIteration when none starts there.
_scan: Callable[[str, int], tuple[Any, int]] = vars(json.JSONDecoder())["scan_once"]


def load_json_object(text: str | None) -> dict[str, Any]:
    """Decode a stored JSON object column; ``NULL`` or empty reads as ``{}``."""
    if not text:
        return {}
    value = load_json(text)
    return value if isinstance(value, dict) else {"value": value}


class TaskSummary(NamedTuple):
    """One line of ``ninelives ls``: a task's progress without its steps' data."""

    id: str
    status: str
    queue: str | None
    goal: str
    created_at: float
    updated_at: float
    steps_done: int
    steps_total: int
    #: Attempts of all its steps together.
    attempts: int
    #: The kind and time of its newest journal event (None for a task without one).
    last_event: str | None
    last_ts: float | None

    def as_json(self, now: float) -> dict[str, Any]:
        """The task as ``ls --json`` and the web view's ``/api/tasks`` show it."""
        return {
            "task": self.id, "status": self.status, "queue": self.queue, "goal": self.goal,
            "steps_done": self.steps_done, "steps_total": self.steps_total,
            "attempts": self.attempts, "created_at": self.created_at,
            "updated_at": self.updated_at, "age": round(now - self.created_at, 3),
            "last_event": self.last_event, "last_ts": self.last_ts,
        }  # fmt: skip

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> TaskSummary:
        """From an ``ls_rows`` row, in the order of the fields."""
        (task_id, status, queue, goal, created, updated, done, total, attempts, kind, ts) = row
        values = (status, queue, goal, created, updated, kind, ts)
        kinds = ("text", "text?", "text", "time", "time", "text?", "time?")
        readable = [_readable(v, k) for v, k in zip(values, kinds, strict=True)]
        if not all(readable):
            # A row that cannot be read is listed as damaged with what can be
            # read of it, the other tasks as they are (status, run and verify
            # say what is wrong with it).
            status = DAMAGED
            queue, goal = (queue if readable[1] else None), (goal if readable[2] else "")
            created = created if readable[3] else 0.0
            updated = updated if readable[4] else created
            kind, ts = (kind, ts) if readable[5] and readable[6] else (None, None)
        return cls(
            id=task_id, status=status, queue=queue, goal=goal, created_at=created,
            updated_at=updated, steps_done=int(done), steps_total=int(total),
            attempts=int(attempts), last_event=kind, last_ts=ts,
        )  # fmt: skip


class MetricCounts(NamedTuple):
    """Whole-database counts for ``ninelives ui``'s ``/metrics``."""

    tasks: dict[str, int]
    steps: dict[str, int]
    #: Attempts of every step together: steps started, counting each retry and rerun.
    attempts: int
    #: ``step_recovered`` events: steps found running after a crash.
    recoveries: int
    #: ``step_started`` events in the journal.
    started: int = 0
    #: Durations of the finished step attempts, one series per outcome.
    durations: tuple[DurationSeries, ...] = ()


class DurationSeries(NamedTuple):
    """The step attempts of one outcome (``done`` or ``error``), as a histogram."""

    outcome: str
    #: ``(upper bound in seconds, attempts that took at most that)``, bounds ascending.
    buckets: tuple[tuple[float, int], ...]
    #: All of them (the ``+Inf`` bucket), and the seconds they took together.
    attempts: int
    seconds: float


#: Upper bounds (seconds) of the ``/metrics`` step duration histogram: the
#: ``metric_durations`` query of each dialect buckets by the same numbers.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0, 1800.0)  # fmt: skip


def step_durations(rows: Sequence[Sequence[Any]]) -> tuple[int, tuple[DurationSeries, ...]]:
    """The started count and the duration series (``done`` and ``error``, cumulative
    buckets) from the rows of the ``metric_durations`` query of either dialect."""
    per_bucket: dict[str, dict[float | None, tuple[int, float]]] = {"done": {}, "error": {}}
    started = 0
    for bucket, outcome, n, seconds in rows:
        if outcome is None:
            started = int(n)
            continue
        key = None if bucket is None else float(bucket)
        per_bucket.setdefault(str(outcome), {})[key] = (int(n), float(seconds or 0.0))
    series = []
    for outcome, found in sorted(per_bucket.items()):
        buckets, below = [], 0
        for bound in DURATION_BUCKETS:
            below += found.get(bound, (0, 0.0))[0]
            buckets.append((bound, below))
        attempts = sum(n for n, _ in found.values())
        seconds = sum(s for _, s in found.values())
        series.append(DurationSeries(outcome, tuple(buckets), attempts, seconds))
    return started, tuple(series)


class StepProgress(NamedTuple):
    """One committed ``ctx.checkpoint``, as the runtime reports it to an ``on_progress``
    callback (the CLI draws a progress bar from it on a terminal)."""

    task_id: str
    step: int
    tool: str
    #: What the tool checkpointed (any JSON); ``{"done": N, "total": M}`` draws a bar.
    progress: Any
    #: Seconds since the attempt's tool was called.
    elapsed: float


class TaskHold(NamedTuple):
    """Who holds a task, as ``doctor`` sees it: its lease (PostgreSQL) or epoch."""

    id: str
    queue: str | None
    lease_epoch: int
    lease_owner: str | None
    lease_expires_at: float | None
    #: The lease has an owner and expired on the database's clock (PostgreSQL).
    expired: bool


class Deleted(NamedTuple):
    """What one ``gc`` batch removed, committed together."""

    tasks: tuple[str, ...]
    steps: int
    events: int
