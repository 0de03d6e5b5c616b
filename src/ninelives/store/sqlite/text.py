"""Stored text that is not UTF-8: one damaged task, not an unusable database.

SQLite stores whatever bytes it is given in a TEXT column (``CAST(X'FF41' AS
TEXT)``, a row edited by hand or written by another program), and
:mod:`sqlite3` refuses to fetch such a value with an ``OperationalError``
("Could not decode to UTF-8 column ..."). Uncaught, that error reads as the
database being unusable, and a worker polls the same row forever. Here it
becomes :class:`~ninelives.errors.DamagedTask` of the task being read, as a
JSON column that does not parse does.

Only the failure path pays: fetching with a Python ``text_factory`` costs
about twice the default's, so :func:`lenient_rows` is used only after the
default fetch has failed.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...models import damaged

_UNDECODABLE = re.compile(r"could not decode to utf-8 column '([^']*)'", re.IGNORECASE)


def undecodable(exc: BaseException) -> bool:
    """Whether ``exc`` is :mod:`sqlite3`'s refusal of text that is not UTF-8."""
    return isinstance(exc, sqlite3.OperationalError) and bool(_UNDECODABLE.search(str(exc)))


@contextmanager
def utf8_rows(task_id: str, where: str = "task") -> Iterator[None]:
    """Reads of ``task_id``'s rows inside: text that is not UTF-8 raises
    :class:`~ninelives.errors.DamagedTask` of that task (its row ``where``)."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        found = _UNDECODABLE.search(str(exc))
        if found is None:
            raise
        # The column's name, unless it is an expression of the query (its SQL
        # says nothing to the user); never the bytes themselves.
        column = found.group(1)
        what = f"column {column!r}" if column.isidentifier() else "a text column"
        reason = ValueError(f"{what} holds text that is not UTF-8")
        raise damaged(task_id, where, reason) from None


def lenient_rows(conn: sqlite3.Connection, query: str, params: dict[str, Any]) -> list[Any]:
    """The rows of ``query``, text that is not UTF-8 read as bytes (the row
    readers then find it is not text): for a read of many tasks, so that one
    task's bad text does not hide the others."""
    with lenient_text(conn):
        return conn.execute(query, params).fetchall()


@contextmanager
def lenient_text(conn: sqlite3.Connection) -> Iterator[None]:
    """Reads inside give text that is not UTF-8 as bytes (:func:`lenient_rows`)."""
    conn.text_factory = _text_or_bytes
    try:
        yield
    finally:
        conn.text_factory = str


def rows_of_tasks(conn: sqlite3.Connection, query: str, params: dict[str, Any]) -> list[Any]:
    """The rows of ``query``, a read over many tasks: fetched as usual, and again
    by :func:`lenient_rows` only when some text is not UTF-8 (a task id
    included: such a task can be named by no one, so the callers list it as
    damaged or pass it by, and never let it stop the others)."""
    try:
        return conn.execute(query, params).fetchall()
    except sqlite3.OperationalError as exc:
        if not undecodable(exc):
            raise
    return lenient_rows(conn, query, params)


def shown(value: str | bytes) -> str:
    """``value`` as text to show: bytes that are not UTF-8 escaped (``\\xff``)."""
    return value if isinstance(value, str) else value.decode("utf-8", "backslashreplace")


def _text_or_bytes(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def blob_rows(conn: sqlite3.Connection, query: str) -> list[tuple[str, int, str]]:
    """The rows of ``blob_rows`` (``task_id, idx, output``) for gc and doctor:
    an output that is not UTF-8 (or a BLOB) is given with its bad bytes
    replaced, so that the references it still holds are kept and one damaged
    task does not stop the sweep of the whole database."""
    try:
        rows = conn.execute(query).fetchall()
    except sqlite3.OperationalError as exc:
        if not undecodable(exc):
            raise
        rows = lenient_rows(conn, query, {})
    return [(_as_text(r[0]), int(r[1]), _as_text(r[2])) for r in rows]


def _as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
