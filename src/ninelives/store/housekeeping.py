"""What housekeeping asks of a store beyond its rows.

A store kept in local files (SQLite) has more to look after than its rows: a
kernel lock per running task, lock files that outlive their task, a write-ahead
log. :meth:`local_files` on each store answers with those files
(:class:`LocalFiles`), or None when the store has none (PostgreSQL: a lease
in a row, not a lock file, holds a running task), so that ``doctor`` asks the
store what it is instead of probing it for methods.
"""

from __future__ import annotations

from typing import Protocol


class LocalFiles(Protocol):
    """The local files of a store: its path, its task locks and its write-ahead log."""

    @property
    def path(self) -> str:
        """The database file."""

    def is_held(self, task_id: str) -> bool:
        """Whether a live process holds the task's kernel lock; creates no file."""

    def lock_files(self) -> list[str]:
        """The names in the lock folder (each a hash of a task id)."""

    def wal_bytes(self) -> int:
        """The size of the write-ahead log (0 when there is none)."""
