"""Per-task kernel locks for the SQLite backend.

A task's lock dies with the process that holds it, SIGKILL included: no stale
PID files. Locks live in ``<db>.locks/`` beside the database, where ``<db>`` is
the database's real path (symlinks resolved, hard links refused by the store),
so every name of one database file reaches the same locks. Two schemes:

* On 64-bit Linux, a task's lock is one byte of the shared file
  ``tasks.lock``, at an offset taken from the SHA-256 of its id, locked with an
  open file description lock (``F_OFD_SETLK``). Like ``flock``, such a lock
  belongs to the open file, not to the process, so two runners in one process
  exclude each other and the kernel drops it when the file's last descriptor
  closes. No file is made per task: creating one cost more than a whole
  step's two commits.
* Elsewhere (macOS), ``fcntl.flock`` on a file per task, named by 32 hex digits
  of that hash: no id can steer a lock file anywhere else.

Earlier builds used the second scheme on Linux too. So that a process of such a
build, still running through an upgrade, and a process of this one exclude each
other, a task's lock is also taken on its per-task file when one is there (an
earlier build made one for every task it claimed).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys

from .errors import StoreError, TaskBusy

#: The blob store's lock in the lock folder (:class:`ninelives.blobs.FolderBlobs`):
#: writers hold it shared, a sweep exclusive. Never a task's, never removed.
BLOBS_LOCK = "blobs.lock"
#: The shared file whose bytes are the tasks' locks (64-bit Linux).
TASKS_LOCK = "tasks.lock"
#: The name of a task's own lock file: 32 hex digits of the SHA-256 of its id.
TASK_LOCK_NAME = r"[0-9a-f]{32}\.lock"
#: Whether tasks are locked as byte ranges of :data:`TASKS_LOCK`. ``struct
#: flock`` is packed by hand below, in its 64-bit Linux layout.
RANGES = (
    sys.platform.startswith("linux") and hasattr(fcntl, "F_OFD_SETLK") and struct.calcsize("P") == 8
)
#: ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
_FLOCK = struct.Struct("hhqqi4x")
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def lock_folder(db_path: str) -> str:
    """The folder holding the lock files of the database at ``db_path``."""
    return db_path + ".locks"


def _digest(task_id: str) -> str:
    import hashlib

    return hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:32]


def lock_path(db_path: str, task_id: str) -> str:
    """The task's own lock file: a hash of the id, never the id itself."""
    return os.path.join(lock_folder(db_path), f"{_digest(task_id)}.lock")


def _range(fd: int, command: int, kind: int, offset: int) -> int:
    """Apply an OFD lock ``command`` to the byte at ``offset``; the lock type back."""
    packed = fcntl.fcntl(fd, command, _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))
    return int(_FLOCK.unpack(packed)[0])


class TaskLock:
    """An exclusive, non-blocking lock on one task, held until :meth:`release`."""

    def __init__(self, db_path: str, task_id: str) -> None:
        self.path = lock_path(db_path, task_id)
        self.task_id = task_id
        # 60 bits of the hash: a shared byte would only make two tasks wait
        # for each other (TaskBusy), never let two runners hold one task.
        self.offset = int(os.path.basename(self.path)[:15], 16)
        self._fds: list[int] = []

    def acquire(self, *, make: bool = True) -> bool:
        """Take the lock or raise :class:`TaskBusy` at once (never waits).

        Raises :class:`StoreError` if the lock folder is a symlink or not a
        folder: two databases (or two names of one) must never share locks
        through a link, and a link must not steer lock files elsewhere. With
        ``make`` False, only a lock whose folder and file exist is taken (a
        byte of :data:`TASKS_LOCK` where :data:`RANGES`): nothing is made, and
        False says nothing was taken. True when the lock is held.
        """
        if not make and not RANGES:
            return False  # each task has its own file: taking it would make one
        folder = os.path.dirname(self.path)
        try:
            dir_fd = open_lock_folder(folder)
        except FileNotFoundError:
            if not make:
                return False
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                pass  # made by another process meanwhile
            dir_fd = open_lock_folder(folder)
        # The folder is opened without following a link, and the lock file
        # opened inside that very folder (dir_fd): no swap between check and use.
        try:
            own = os.path.basename(self.path)
            if RANGES and not self._take(TASKS_LOCK, dir_fd, create=make, ranged=True):
                return False
            self._take(own, dir_fd, create=not RANGES, ranged=False)
        except BaseException:
            self.release()
            raise
        finally:
            os.close(dir_fd)
        return True

    def _take(self, name: str, dir_fd: int, *, create: bool, ranged: bool) -> bool:
        """Lock file ``name`` in the folder ``dir_fd``: False when it is missing
        and not to be made, else True once locked (TaskBusy if another holds it)."""
        # os.open makes the descriptor non-inheritable, so a tool's child
        # process cannot keep the lock alive after this process dies.
        flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
        try:
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        except FileNotFoundError:
            if create:
                raise
            return False  # no per-task file: no older version has claimed the task
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                raise StoreError(not_a_lock_file(os.path.dirname(self.path), name)) from None
            raise
        self._fds.append(fd)
        try:
            if ranged:
                _range(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, self.offset)
            else:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                raise TaskBusy(f"task {self.task_id!r} is being run by another process") from None
            raise
        return True

    def surely_free(self) -> bool:
        """Whether no process can hold this lock, known without taking it: where
        each task has its own file (not :data:`RANGES`) and this task has none,
        no process has taken its lock, and taking it would make the file. Never
        where locks are bytes of one shared file, which every task shares."""
        return not RANGES and not os.path.exists(self.path)

    def release(self) -> None:
        """Drop the lock; idempotent. A per-task file stays: unlinking it would
        race with a process that has just opened it."""
        while self._fds:
            os.close(self._fds.pop())


def open_lock_folder(folder: str) -> int:
    """A descriptor of the lock folder ``folder``, opened without following a
    link. Raises :class:`StoreError` if it is a symlink or not a folder (a run
    refuses it, and housekeeping must neither judge nor remove another folder's
    files through it); :class:`FileNotFoundError` if it is missing."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StoreError(
                f"lock folder {folder} is not a plain folder (a symlink or a file): "
                "remove it; ninelives recreates it"
            ) from None
        raise


def not_a_lock_file(folder: str, name: str) -> str:
    """What is wrong with a symlink or a folder at a lock file's place, and what to do."""
    return (
        f"lock file {os.path.join(folder, name)} is not a plain file (a symlink or a "
        "folder): no lock can be taken through it; remove it, ninelives recreates it"
    )


def open_lock_file(path: str) -> int:
    """A descriptor of the lock file ``path`` (the blob store's), made if
    missing, in its lock folder, made if missing and opened without following
    a link, as a task's lock is; :class:`StoreError` says what is wrong."""
    folder, name = os.path.split(path)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StoreError(f"cannot make the lock folder {folder}: {exc.strerror}") from None
    try:
        dir_fd = open_lock_folder(folder)  # a symlink or a file: named as such
    except OSError as exc:
        raise StoreError(f"lock folder {folder} cannot be used: {exc.strerror}") from None
    try:
        return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        check_lock_file(path)  # a symlink or a folder: named as such
        raise StoreError(f"cannot open {path}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)


def check_lock_file(path: str | None) -> None:
    """Raise :class:`StoreError` if a symlink or a folder is where the lock file
    ``path`` goes (None: no lock): checked before a claim by the lock taken
    after a step's tool ran (the blob store's), whose refusal then would leave
    the step running."""
    import stat

    if path is None:
        return
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # absent (made when taken), or its folder is judged where it is opened
    if stat.S_ISLNK(mode) or stat.S_ISDIR(mode):
        raise StoreError(not_a_lock_file(*os.path.split(path)))


def odd_lock_files(folder: str) -> list[str]:
    """The lock files ninelives makes in ``folder`` (:data:`TASKS_LOCK`,
    :data:`BLOBS_LOCK`, a task's own) that are symlinks or folders: a run
    refuses to lock through them. A missing or unusable ``folder`` has none
    (:func:`open_lock_folder` judges the folder itself)."""
    import re
    import stat

    try:
        fd = open_lock_folder(folder)
    except (OSError, StoreError):
        return []
    try:
        odd = []
        for name in sorted(os.listdir(fd)):
            if name not in (TASKS_LOCK, BLOBS_LOCK) and not re.fullmatch(TASK_LOCK_NAME, name):
                continue  # a name ninelives does not make is not its to judge
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISLNK(mode) or stat.S_ISDIR(mode):
                odd.append(name)
        return odd
    finally:
        os.close(fd)


def is_held(db_path: str, task_id: str) -> bool:
    """Whether a live process holds the task's lock. Creates nothing (a reader
    may call it): no lock file means nobody holds the lock."""
    lock = TaskLock(db_path, task_id)
    shared = os.path.join(os.path.dirname(lock.path), TASKS_LOCK)
    return (RANGES and _held(shared, lock.offset)) or _held(lock.path, None)


def _held(path: str, offset: int | None) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if offset is not None:
            return _range(fd, fcntl.F_OFD_GETLK, fcntl.F_RDLCK, offset) != fcntl.F_UNLCK
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in _BUSY
    finally:
        os.close(fd)
    return False


def remove_lock(lock: TaskLock) -> None:
    """Unlink the per-task file of a lock this process holds (a task that is gone).

    Held while unlinked, so no other process has it at that moment; one that
    opened the file before and locks it after the release holds a lock on a
    name that no longer exists, for a task that no longer exists either: its
    claim finds no task (a new task of the same id gets a new file). A byte
    of ``tasks.lock`` needs no removal.
    """
    try:
        os.unlink(lock.path)
    except FileNotFoundError:
        pass
