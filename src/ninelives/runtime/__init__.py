"""The runtime: create tasks, and run them as recover -> start step -> tool -> record.

Each step costs two commits: ``running`` (attempts + 1) before the tool runs
and ``done`` with its output after. A crash between them leaves the step
``running``; the next run finds it, journals ``step_recovered`` and runs it
again, so tools are called at least once and must be idempotent by their key.

The parts: :mod:`~ninelives.runtime.core` (:class:`Runtime`, :func:`open`),
:mod:`~ninelives.runtime.steps` (running a step), :mod:`~ninelives.runtime.waits`
(unknown outcomes, probes, approvals), :mod:`~ninelives.runtime.decisions`
(``resolve``, ``approve``), :mod:`~ninelives.runtime.workflows` (workflow
tasks) and :mod:`~ninelives.runtime.worker` (the queue worker).
"""

from __future__ import annotations

from ..names import check_queue as check_queue
from ..names import check_task_id as check_task_id
from ..names import new_run_id as new_run_id
from .core import DEFAULT_ARTIFACTS as DEFAULT_ARTIFACTS
from .core import Runtime as Runtime
from .core import open as open
from .core import prepare as prepare
from .core import workflow_result as workflow_result
