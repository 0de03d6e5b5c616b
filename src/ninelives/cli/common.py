"""What the command modules share: the record of a command, and the opening of
the runtime, a reader or an existing database for one command's arguments.

Standard library only at import; each opener imports what it opens.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from . import output

Handler = Callable[[argparse.Namespace], int]


class Command(NamedTuple):
    """One ``ninelives`` command: what runs it, its one-line help, what declares
    its arguments, and the example that ends its ``--help`` (a test checks each has one)."""

    handler: Handler
    help: str
    declare: Callable[[argparse.ArgumentParser], None]
    example: str


def settings_of(args: argparse.Namespace) -> Any:
    """The environment's settings, with ``--tools`` in place of ``NINELIVES_TOOLS``."""
    from ..settings import Settings, parse_tool_modules

    settings = Settings.from_env()
    tools = getattr(args, "tools", None)
    if tools is not None:
        settings = settings._replace(tool_modules=parse_tool_modules(tools))
    return settings


def open_runtime(
    args: argparse.Namespace,
    *,
    create: bool = True,
    readonly: bool = False,
    task: str = "",
    check: Callable[[Any], object] | None = None,
) -> Any:
    """The runtime over ``--db``, logging to stderr unless ``--quiet``. A writable
    one for a command on ``task`` first makes sure an older file holds it, and
    that ``check`` (the command's own refusals, given the task as stored) passes."""
    from ..runtime import open as open_rt

    if task and not readonly:
        _known_before_migrating(args.db, task, check)
    quiet = getattr(args, "quiet", False)
    log = None if quiet else output.say
    return open_rt(
        args.db, settings=settings_of(args), create=create, readonly=readonly, log=log,
        on_progress=None if quiet or readonly else output.progress_bar(),
    )  # fmt: skip


def _known_before_migrating(
    db: str, task_id: str, check: Callable[[Any], object] | None = None
) -> None:
    """Raise :class:`UnknownTask` for a task an older SQLite file does not hold,
    and what ``check`` raises for the task it holds.

    Opening it writable migrates it for good (an older ninelives then refuses
    it), and a command refused before it writes (a typo in the id, a done task
    to cancel, a step that is not waiting) writes nothing else: it is answered
    from a read-only look, the file left as it was. Any other error of that look
    is left to the writable open, which may mend it (a hot journal is rolled
    back there)."""
    from ..errors import NineLivesError, UnknownTask
    from ..store import open_store, sqlite_behind

    if not sqlite_behind(db):
        return
    try:
        store = open_store(db, readonly=True)
        try:
            task = store.get_task(task_id)
        finally:
            store.close()
    except UnknownTask:
        raise
    except NineLivesError:
        return
    if check is not None:
        check(task)  # raises the refusal the command itself would, after migrating


def open_reader(args: argparse.Namespace) -> Any:
    """The database opened for reading only, for commands that only read: no
    runtime, settings or tools imported (a cold ``status`` starts faster)."""
    from contextlib import closing

    from ..store import open_store

    return closing(open_store(args.db, readonly=True))


def open_existing(args: argparse.Namespace, *, write: bool) -> Any:
    """The store of ``--db`` for a housekeeping command: read-only unless ``write``;
    a database that does not exist is an error, never created."""
    from ..errors import StoreError
    from ..store import MissingStore, open_store

    store = open_store(args.db, create=False, readonly=not write)
    if isinstance(store, MissingStore):
        raise StoreError(f"no database at {args.db} ('ninelives create' makes one)")
    return store


@contextmanager
def stored_or_unknown(task_id: str, command: str) -> Iterator[None]:
    """Around a command that stores a new task: a commit whose outcome is
    unknown (an I/O error, a full disk) says how to find out whether the task
    was stored, since no run recovers a task that may not exist."""
    from ..errors import CommitUnknown

    try:
        yield
    except CommitUnknown as exc:
        raise CommitUnknown(
            f"{exc.failed}: whether task {task_id!r} was stored is unknown; "
            f"'ninelives status {task_id}' tells (if it answers unknown task, {command} it again)"
        ) from None


def plural(count: int, noun: str) -> str:
    """``1 step``, ``3 steps``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def queue_of(args: argparse.Namespace) -> str:
    """``--queue`` as given (even empty: checked as given), else ``$NINELIVES_QUEUE``,
    else ``default``."""
    if args.queue is not None:
        return str(args.queue)
    return os.environ.get("NINELIVES_QUEUE") or "default"


QUEUE_HELP = "the workers' queue (default: $NINELIVES_QUEUE or 'default')"


def stored_id(text: str) -> str:
    """The argparse ``type`` of the ``TASK`` of a command about a stored task.

    Undecodable bytes on the command line (``keep\\xff``) arrive as lone
    surrogates, which no stored id holds (``create`` refuses them) and which no
    database can be asked about (UTF-8 cannot encode them): such an id is an
    unknown task (exit 1), as ``../x`` is, before anything is opened.
    """
    from ..names import check_stored_id

    return check_stored_id(text)


def integer(text: str) -> int:
    """The argparse ``type`` of a whole-number option (``--limit``, ``--from``, a
    STEP): the number rule of the ``NINELIVES_*`` variables (ASCII digits, no
    ``_``, no padding), which ``int`` alone does not keep (it reads ``1_0`` as
    10 and other scripts' digits as ours)."""
    return int(_plain_number(text))


def number(text: str) -> float:
    """As :func:`integer`, for an option in seconds (``--lease``, ``--poll``)."""
    return float(_plain_number(text))


def _plain_number(text: str) -> str:
    if not text.isascii() or "_" in text or text != text.strip():
        raise ValueError(text)  # argparse: "invalid integer value: '1_0'", exit 4
    return text


def task_arg(p: argparse.ArgumentParser, metavar: str = "TASK_ID") -> None:
    """The one positional ``TASK_ID`` of a command about a stored task."""
    p.add_argument("task_id", metavar=metavar, type=stored_id)
