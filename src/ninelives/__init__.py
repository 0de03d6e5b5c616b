"""ninelives: a durable runtime for AI agent tasks that survives SIGKILL.

Open a database, create a task from a plan and run it; a killed run resumes
where it stopped, and side effects happen once in outcome::

    import ninelives

    with ninelives.open("state.db") as rt:
        rt.create("demo", "plan.json")
        rt.run("demo")
        print(rt.status("demo").status)

Importing this package stays cheap: the runtime and the backends load on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    BlobDamaged,
    CommitUnknown,
    DamagedTask,
    EffectUnknown,
    InputError,
    InvalidTaskId,
    LeaseLost,
    NineLivesError,
    OutputFailed,
    OutputRefused,
    PermanentError,
    PlanError,
    PlanMismatch,
    PlanTampered,
    StepFailed,
    StoreError,
    TaskBlocked,
    TaskBusy,
    TaskCancelled,
    TaskExists,
    TaskFailed,
    TaskParked,
    TasksLeft,
    TaskWaiting,
    ToolError,
    UnknownTask,
    VerificationFailed,
    WorkflowDiverged,
    WorkflowError,
)
from .models import Event, EventKind, Run, Step, StepStatus, Task, TaskStatus

if TYPE_CHECKING:
    from .durable import current_step, step, workflow
    from .runtime import Runtime
    from .tools import ToolContext, tool

__version__ = "0.1.0"

__all__ = [
    "BlobDamaged",
    "CommitUnknown",
    "DamagedTask",
    "EffectUnknown",
    "Event",
    "EventKind",
    "InputError",
    "InvalidTaskId",
    "LeaseLost",
    "NineLivesError",
    "OutputFailed",
    "OutputRefused",
    "PermanentError",
    "PlanError",
    "PlanMismatch",
    "PlanTampered",
    "Run",
    "Runtime",
    "Step",
    "StepFailed",
    "StepStatus",
    "StoreError",
    "Task",
    "TaskBlocked",
    "TaskBusy",
    "TaskCancelled",
    "TaskExists",
    "TaskFailed",
    "TaskParked",
    "TaskStatus",
    "TaskWaiting",
    "TasksLeft",
    "ToolContext",
    "ToolError",
    "UnknownTask",
    "VerificationFailed",
    "WorkflowDiverged",
    "WorkflowError",
    "__version__",
    "current_step",
    "open",
    "step",
    "tool",
    "workflow",
]


def open(url: str | None = None, **kwargs: Any) -> Runtime:
    """Open a database and return a :class:`~ninelives.runtime.Runtime` over it.

    ``url`` defaults to ``$NINELIVES_DB``, else ``state.db``. See
    :func:`ninelives.runtime.open` for the keyword arguments.
    """
    from .runtime import open as _open

    return _open(url, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from .runtime import Runtime

        return Runtime
    if name in ("workflow", "step", "current_step"):
        from . import durable

        return getattr(durable, name)
    if name in ("tool", "ToolContext"):
        from . import tools

        return getattr(tools, name)
    raise AttributeError(f"module 'ninelives' has no attribute {name!r}")
