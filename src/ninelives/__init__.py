"""ninelives: a durable runtime for AI agent tasks that survives SIGKILL.

Open a database, create a task from a plan and run it; a killed run resumes
where it stopped, and side effects happen once in outcome::

    import ninelives

    with ninelives.open("state.db") as rt:
        rt.create("demo", "plan.json")
        rt.run("demo")
        print(rt.status("demo").status)

Everything a user needs is importable from here: the runtime (:func:`open`,
``Runtime``), the tool API (``tool``, ``Tool``, ``ToolContext``, ``Registry``,
``default_registry``, ``publish_once``, ``artifacts_folder``), durable code
(``workflow``, ``step``, ``current_step``), ``Settings``, the records and the
whole exception tree of :mod:`ninelives.errors`.

Importing this package stays cheap: the runtime, the tools and the backends
load on first use of their names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    BlobDamaged,
    BlobUnreadable,
    CommitUnknown,
    DamagedTask,
    EffectUnknown,
    InputError,
    InvalidTaskId,
    LeaseLost,
    NineLivesError,
    NotRegularFile,
    OutputFailed,
    OutputRefused,
    PermanentError,
    PlanError,
    PlanMismatch,
    PlanTampered,
    StepFailed,
    StepNotDue,
    StoreError,
    TaskBlocked,
    TaskBusy,
    TaskCancelled,
    TaskExists,
    TaskFailed,
    TaskIdRemoved,
    TaskParked,
    TasksLeft,
    TaskWaiting,
    ToolError,
    UnknownTask,
    VerificationFailed,
    WorkflowDiverged,
    WorkflowError,
)
from .models import (
    Event,
    EventKind,
    Run,
    Step,
    StepProgress,
    StepStatus,
    Task,
    TaskStatus,
    TaskSummary,
)
from .version import __version__

if TYPE_CHECKING:
    from .durable import current_step, step, workflow
    from .runtime import Runtime
    from .settings import Settings
    from .tools import Registry, Tool, ToolContext, tool
    from .tools.builtin import default_registry
    from .tools.effects import artifacts_folder, publish_once


__all__ = [
    "BlobDamaged",
    "BlobUnreadable",
    "CommitUnknown",
    "DamagedTask",
    "EffectUnknown",
    "Event",
    "EventKind",
    "InputError",
    "InvalidTaskId",
    "LeaseLost",
    "NineLivesError",
    "NotRegularFile",
    "OutputFailed",
    "OutputRefused",
    "PermanentError",
    "PlanError",
    "PlanMismatch",
    "PlanTampered",
    "Registry",
    "Run",
    "Runtime",
    "Settings",
    "Step",
    "StepFailed",
    "StepNotDue",
    "StepProgress",
    "StepStatus",
    "StoreError",
    "Task",
    "TaskBlocked",
    "TaskBusy",
    "TaskCancelled",
    "TaskExists",
    "TaskFailed",
    "TaskIdRemoved",
    "TaskParked",
    "TaskStatus",
    "TaskSummary",
    "TaskWaiting",
    "TasksLeft",
    "Tool",
    "ToolContext",
    "ToolError",
    "UnknownTask",
    "VerificationFailed",
    "WorkflowDiverged",
    "WorkflowError",
    "__version__",
    "artifacts_folder",
    "current_step",
    "default_registry",
    "open",
    "publish_once",
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


#: The names loaded on first use (``name: module``), so that ``import ninelives``
#: (and the command's start-up) stays as light as the error tree and the records.
_LAZY = {
    "Runtime": ".runtime",
    "Settings": ".settings",
    "workflow": ".durable",
    "step": ".durable",
    "current_step": ".durable",
    "tool": ".tools",
    "Tool": ".tools",
    "ToolContext": ".tools",
    "Registry": ".tools",
    "default_registry": ".tools.builtin",
    "artifacts_folder": ".tools.effects",
    "publish_once": ".tools.effects",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ninelives' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module, __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
