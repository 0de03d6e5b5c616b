"""Per-task kernel locks for the SQLite backend.

``fcntl.flock`` locks belong to an open file description, so the kernel drops
them when the process dies, SIGKILL included: no stale PID files. Lock files
live in ``<db>.locks/`` beside the database; each name is the SHA-256 of the
task id, so no id can steer a lock file anywhere else. ``<db>`` is the
database's real path (symlinks resolved, hard links refused by the store), so
every name of one database file reaches the same locks.
"""

from __future__ import annotations

import errno
import fcntl
import os

from .errors import StoreError, TaskBusy

#: The blob store's lock in the lock folder (:class:`ninelives.blobs.FolderBlobs`):
#: writers hold it shared, a sweep exclusive. Never a task's, never removed.
BLOBS_LOCK = "blobs.lock"
#: The name of a task's lock file: 32 hex digits of the SHA-256 of its id.
TASK_LOCK_NAME = r"[0-9a-f]{32}\.lock"


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
        """Take the lock or raise :class:`TaskBusy` at once (never waits).

        Raises :class:`StoreError` if the lock folder is a symlink or not a
        folder: two databases (or two names of one) must never share locks
        through a link, and a link must not steer lock files elsewhere.
        """
        folder = os.path.dirname(self.path)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        # The folder is opened without following a link, and the lock file
        # created inside that very folder (dir_fd): no swap between check and use.
        try:
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreError(
                    f"lock folder {folder} is not a plain folder (a symlink or a file): "
                    "remove it; ninelives recreates it"
                ) from None
            raise
        try:
            # os.open makes the descriptor non-inheritable, so a tool's child
            # process cannot keep the lock alive after this process dies.
            fd = os.open(
                os.path.basename(self.path),
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                0o600,
                dir_fd=dir_fd,
            )
        finally:
            os.close(dir_fd)
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


def is_held(db_path: str, task_id: str) -> bool:
    """Whether a live process holds the task's lock. Creates nothing (a reader
    may call it): no lock file means nobody holds the lock."""
    try:
        fd = os.open(lock_path(db_path, task_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)
    return False


def remove_lock(lock: TaskLock) -> None:
    """Unlink the file of a lock this process holds (a task that is gone).

    Held while unlinked, so no other process has it at that moment; one that
    opened the file before and locks it after the release holds a lock on a
    name that no longer exists, for a task that no longer exists either: its
    claim finds no task (a new task of the same id gets a new file).
    """
    try:
        os.unlink(lock.path)
    except FileNotFoundError:
        pass
