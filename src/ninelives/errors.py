"""The one exception tree of ninelives.

Every error the library raises on purpose derives from :class:`NineLivesError`;
the CLI maps each branch to one exit code in one place (``cli.EXIT_CODES``)::

    NineLivesError
    ├── InputError                 bad input; nothing stored was changed
    │   ├── PlanError              plan file missing, malformed or invalid
    │   ├── InvalidTaskId          an id that is not plain data
    │   ├── TaskExists             create of an id that is already stored
    │   │   └── PlanMismatch       submit of a stored id with a different plan
    │   └── TaskIdRemoved          create of an id whose task gc removed
    ├── UnknownTask                no task with that id
    ├── TaskBusy                   another live runner holds the task
    │   └── LeaseLost              this runner's claim was taken over (fenced)
    ├── TaskFailed                 a step reached the attempt limit
    │   └── StepFailed             ... a workflow's step (raised out of ctx.step)
    ├── TaskParked                 the task waits for a person (exit 8)
    │   ├── TaskBlocked            a step's outcome is unknown: ninelives resolve
    │   └── TaskWaiting            an approval step: ninelives approve
    ├── TaskCancelled              ninelives cancel stopped the task (exit 9)
    ├── StoreError                 the database cannot be used
    │   ├── DamagedTask            one task's stored rows cannot be read; others can
    │   │   ├── PlanTampered       its stored plan no longer matches its SHA-256
    │   │   └── BlobDamaged        a step's output blob is missing or does not match its hash
    │   ├── BlobUnreadable         a blob cannot be read as referenced (becomes BlobDamaged)
    │   ├── StepNotDue             a step started before its backoff ends; nothing written
    │   └── CommitUnknown          a write failed mid-commit; its outcome is unknown
    │       └── EffectUnknown      an effect's write or fsync failed (EIO, ENOSPC)
    ├── ToolError                  a tool refused its input or its effect conflicts
    │   ├── OutputRefused          a tool's output cannot be stored (recorded as step_error)
    │   ├── PermanentError         raised by a tool: fail the task now, no more attempts
    │   └── NotRegularFile         a name a tool reads is a FIFO, device, folder or symlink
    ├── TasksLeft                  a drained worker left tasks it could not run
    ├── WorkflowError              a workflow's code cannot carry its task on (exit 12)
    │   └── WorkflowDiverged       the code no longer matches the task's journal
    ├── VerificationFailed         verify or torture found a broken guarantee
    └── OutputFailed               the command's own output could not be written

Driver exceptions (``sqlite3.Error``, ``psycopg.Error``) never leave a store:
they are translated at the store boundary and chained with ``from exc``.
"""

from __future__ import annotations


class NineLivesError(Exception):
    """Root of every error ninelives raises on purpose."""


class InputError(NineLivesError):
    """The caller's input is wrong; nothing stored was changed."""


class PlanError(InputError):
    """A plan file is missing, is not JSON, has the wrong shape or is invalid."""


class InvalidTaskId(InputError):
    """A task id that could name a path or is otherwise not plain data."""


class TaskExists(InputError):
    """``create`` of a task id that is already stored; the original is untouched."""


class PlanMismatch(TaskExists):
    """``Runtime.submit`` of a stored task id with a different goal or steps;
    the stored task is untouched."""


class TaskIdRemoved(InputError):
    """``create``, ``submit`` or ``fork`` of an id whose task ``gc`` removed: a
    new task would reuse the old one's idempotency keys (``<task_id>-<idx>``),
    and an effect keyed by them would answer it with the old task's outcome.
    Nothing is stored; ``removed_at`` is when gc removed it (epoch seconds)."""

    def __init__(self, message: str, *, removed_at: float) -> None:
        super().__init__(message)
        self.removed_at = removed_at


class UnknownTask(NineLivesError):
    """No task with this id is stored."""


class TaskBusy(NineLivesError):
    """Another live process holds this task (kernel lock or unexpired lease)."""


class LeaseLost(TaskBusy):
    """This runner's lease epoch is no longer current: another runner took the task.

    Raised instead of committing; the fenced runner has written nothing false.
    """


class TaskFailed(NineLivesError):
    """A step reached the attempt limit; the task is ``failed``."""


class StepFailed(TaskFailed):
    """A workflow's step used up its attempts (or raised :class:`PermanentError`):
    the task is failed already when ``ctx.step`` raises this. A workflow may catch
    it only to clean up in memory; the task stays failed whatever it does next
    (a later step call raises it again), until ``ninelives retry``."""


class TaskParked(NineLivesError):
    """The task cannot go on until a person acts; ``run`` stops at once (exit 8).

    The message names the command that moves it on. Workers skip parked tasks
    and pick them up once moved on.
    """


class TaskBlocked(TaskParked):
    """A step's outcome is unknown and its tool may not run it again blindly
    (``on_unknown`` ``refuse``, or a probe that could not tell): the task is
    ``blocked`` until ``ninelives resolve TASK STEP --done JSON | --retry``."""


class TaskWaiting(TaskParked):
    """An ``approval`` step waits: the task is ``waiting`` until
    ``ninelives approve TASK STEP [--reject]``."""


class TaskCancelled(NineLivesError):
    """``ninelives cancel`` stopped the task; it is never run again (exit 9)."""


class StoreError(NineLivesError):
    """The database cannot be opened or used (missing folder, corrupt, not a database)."""


class DamagedTask(StoreError):
    """A stored task's rows cannot be read: a status this version does not know
    (written by a newer one, or by hand) or a JSON column that does not parse.

    Only that task is unusable: ``run`` refuses it (exit 5) without writing,
    workers skip it with a logged reason, ``verify`` names it, and every other
    task goes on. ``task_id`` names it.
    """

    def __init__(self, message: str, *, task_id: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class PlanTampered(DamagedTask):
    """A task's stored goal or steps no longer match the SHA-256 recorded when it
    was created (an edit of the database by hand): ``run`` and workers refuse
    it and ``verify`` names it (exit 5), having written nothing."""


class BlobDamaged(DamagedTask):
    """A step's output is stored as a blob (:mod:`ninelives.blobs`) that is
    missing or whose content does not match the SHA-256 its reference records.

    Raised instead of ever returning a wrong value; the message names the task,
    the step and the blob. ``step`` is the step's index.
    """

    def __init__(self, message: str, *, task_id: str, step: int | None) -> None:
        super().__init__(message, task_id=task_id)
        self.step = step


class BlobUnreadable(StoreError):
    """A blob is missing or does not match its reference. Raised by the blob
    stores (:mod:`ninelives.blobs`), which know no task: where the task and
    step are known it becomes :class:`BlobDamaged` naming them."""


class StepNotDue(StoreError):
    """``Store.start_step`` of a step still waiting out its backoff: ``wait``
    seconds remain (on the store's clock). Nothing was written; the runtime
    waits and starts it again."""

    def __init__(self, task_id: str, idx: int, wait: float) -> None:
        super().__init__(f"task {task_id!r} step {idx} is not due for {wait:.3f}s (backoff)")
        self.wait = wait


class CommitUnknown(StoreError):
    """A write transaction failed with an I/O error: it may or may not be durable.

    The runner stops at once and never retries; the next ``run`` recovers from
    whatever the database holds.
    """

    def __init__(self, message: str, *, failed: str | None = None) -> None:
        super().__init__(message)
        #: What failed, without the advice to run again: a command that no run
        #: recovers (``create``, ``fork``) gives its own.
        self.failed = failed or message


class EffectUnknown(CommitUnknown):
    """A tool's durable write (write, link, fsync) failed with an I/O error.

    Whether the effect is durable is unknown, and a failed fsync is never
    retried (the kernel may have dropped the dirty pages, and a second fsync
    can report success for data that is gone): the runner stops at once
    without recording an attempt error; the next ``run`` recovers the step.
    """


class ToolError(NineLivesError):
    """A tool refused its input or found a conflicting effect; recorded as ``step_error``."""


class PermanentError(ToolError):
    """Raise it from a tool when another attempt cannot help (a 4xx answer, a
    rejected card): the task fails at once, whatever attempts are left."""


class OutputRefused(ToolError):
    """A tool returned something that cannot be stored: not a JSON object, a
    number JSON has no text for (NaN, infinity), text that is not valid Unicode
    (a lone surrogate), or more than the maximum output size. Recorded as the
    attempt's ``step_error`` before anything is committed."""


class NotRegularFile(ToolError):
    """The name exists but is not a regular file (a FIFO, a device, a folder, a
    symlink): refused instead of read or written through (:mod:`ninelives.files`)."""


class TasksLeft(NineLivesError):
    """``worker --drain`` ran everything it could, but left tasks it could not run
    (a tool missing on this host, a damaged task), each named; exit code 11."""


class WorkflowError(NineLivesError):
    """A workflow's code cannot carry its task on (exit 12), nothing written for it:
    it raised outside a step, or returned a value that cannot be stored."""


class WorkflowDiverged(WorkflowError):
    """A workflow's code calls, at step k, another name than the task's journal
    holds, or returns while the journal holds more steps (exit 12). Nothing was
    written: the task is left as it was, for the code that matches it. Once
    raised in a run it stands even if the workflow catches it.

    ``task_id``, ``step`` (k), ``stored`` (the journal's name) and ``called``
    (the code's, None when it returned) say where; ``kinds`` (the journal's and
    the code's, such as ``("approval", "step")``) when the names are the same
    but one is an approval and the other a step."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str,
        step: int,
        stored: str,
        called: str | None,
        kinds: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.step = step
        self.stored = stored
        self.called = called
        self.kinds = kinds


class VerificationFailed(NineLivesError):
    """``verify`` or ``torture`` found violations, each printed with the event
    ``seq`` numbers involved; exit code 7."""


class OutputFailed(NineLivesError):
    """The command's output could not be written (a full disk, ``EIO``, a closed
    stdout); exit code 10. What the command did before printing stands: a
    ``create`` whose confirmation failed has stored its task, and says so."""
