"""Per-task kernel locks for the SQLite backend.

``fcntl.flock`` locks belong to an open file description, so the kernel drops
them when the process dies, SIGKILL included: no stale PID files. Lock files
live in ``<db>.locks/`` beside the database; each name is the SHA-256 of the
task id, so no id can steer a lock file anywhere else.
"""

from __future__ import annotations

import errno
import fcntl
import os

from .errors import TaskBusy


def lock_folder(db_path: str) -> str:
    """The folder holding the lock files of the database at ``db_path``."""
    return db_path + ".locks"


def lock_path(db_path: str, task_id: str) -> str:
    """The lock file of one task: a hash of the id, never the id itself."""
    import hashlib

    digest = hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:32]
    return os.path.join(lock_folder(db_path), f"{digest}.lock")


class TaskLock:
    """An exclusive, non-blocking lock on one task, held until :meth:`release`."""

    def __init__(self, db_path: str, task_id: str) -> None:
        self.path = lock_path(db_path, task_id)
        self.task_id = task_id
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`TaskBusy` at once (never waits)."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        # os.open makes the descriptor non-inheritable, so a tool's child
        # process cannot keep the lock alive after this process dies.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise TaskBusy(f"task {self.task_id!r} is being run by another process") from None
            raise
        self._fd = fd

    def release(self) -> None:
        """Drop the lock; idempotent. The file stays: unlinking it would race
        with a process that has just opened it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
