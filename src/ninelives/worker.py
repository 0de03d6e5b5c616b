"""The queue worker (kept for imports of this name): :mod:`ninelives.runtime.worker`."""

from __future__ import annotations

from .runtime.worker import EXIT_OUTCOME_UNKNOWN as EXIT_OUTCOME_UNKNOWN
from .runtime.worker import Worker as Worker
from .runtime.worker import WorkerOptions as WorkerOptions
