"""Names a person or a runner gives: task ids, queue names, run ids, model engines.

Plain rules with no I/O, below everything that checks a name (plans, workflows,
the runtime, the CLI), so that each checks it the same way.
"""

from __future__ import annotations

import os
import re

from .errors import InputError, InvalidTaskId, UnknownTask

#: The model engines ``ctx.chat``, the ``llm`` tool and a plan's agent may name.
ENGINES = ("stub", "ollama", "openai")

# Patterns as text: re caches them compiled on first use (create), not at import.
TASK_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


def check_task_id(task_id: str) -> str:
    """Return ``task_id`` if it is plain data, else raise :class:`InvalidTaskId`.

    An id is 1-128 characters of letters, digits, ``.``, ``_`` and ``-``,
    starting with a letter or digit: it can never name a path (``..``,
    ``a/b``, ``/abs``), an option (``-x``) or be empty, so artifact names
    built from it stay inside their folder.
    """
    if not isinstance(task_id, str) or not re.fullmatch(TASK_ID_PATTERN, task_id):
        raise InvalidTaskId(
            f"invalid task id {task_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return task_id


def check_stored_id(task_id: str) -> str:
    """Return ``task_id`` if a database can be asked about it, else raise
    :class:`UnknownTask`, having asked nothing.

    Undecodable bytes of a command line or a file name (``keep\\xff``) arrive as
    lone surrogates, which UTF-8 cannot encode, so no driver can send them; no
    stored id holds one either (:func:`check_task_id` refuses it at create).
    Such an id is therefore an unknown task, as the command line reports it.
    One that is not text at all (a library caller's ``5`` or ``None``) is an
    :class:`InvalidTaskId`, as :func:`check_task_id` says.
    """
    if not isinstance(task_id, str):
        check_task_id(task_id)
    try:
        task_id.encode("utf-8")
    except UnicodeEncodeError:
        raise UnknownTask(f"unknown task {task_id!r}") from None
    return task_id


def check_folder_text(folder: str) -> str:
    """Return ``folder`` (an artifacts folder as a database records it) if UTF-8
    can encode it, else raise :class:`InputError`. A folder named in another
    encoding (``caf\\xe9``, from ``AGENT_ARTIFACTS`` or the working directory)
    arrives as lone surrogates, which no database column of text can hold: the
    driver raised ``UnicodeEncodeError`` in the middle of the command."""
    try:
        folder.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"the artifacts folder {folder!r} is not named in UTF-8 (AGENT_ARTIFACTS, or "
            "the working directory it is relative to): the database records it as text; "
            "name the folder in UTF-8"
        ) from None
    return folder


QUEUE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"


def check_queue(queue: str) -> str:
    """Return ``queue`` if it is a plain name (1-64 letters, digits, ``.``, ``_``,
    ``-``, starting with a letter or digit), else raise :class:`InputError`."""
    if not isinstance(queue, str) or not re.fullmatch(QUEUE_PATTERN, queue):
        raise InputError(
            f"invalid queue name {queue!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return queue


def new_run_id() -> str:
    """A fresh run id: 32 hex digits."""
    return os.urandom(16).hex()
