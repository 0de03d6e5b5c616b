"""SQL resources: named queries per dialect and the one ordered list of migrations."""

from __future__ import annotations

import os

_HERE = os.path.dirname(__file__)
_NAME = "-- name: "


def load_queries(dialect: str) -> dict[str, str]:
    """Parse ``<dialect>.sql`` into ``{name: statement}`` (each block after ``-- name:``)."""
    with open(os.path.join(_HERE, f"{dialect}.sql"), encoding="utf-8") as fh:
        text = fh.read()
    # Plain string splitting, not a regex: every command parses this file at
    # start-up, and compiling a pattern costs more than the whole split.
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(_NAME):
            current = queries.setdefault(line[len(_NAME) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(body).strip().rstrip(";").strip() for name, body in queries.items()}


def migrations(dialect: str) -> list[tuple[int, str, str]]:
    """``(version, name, path)`` of each migration of ``dialect``, in order.

    Files are ``migrations/NNNN_name.<dialect>.sql``; both dialects share the
    numbering, so a version means the same schema on SQLite and PostgreSQL.
    Only names are listed here: bodies are read when a migration runs.
    """
    folder = os.path.join(_HERE, "migrations")
    found = []
    suffix = f".{dialect}.sql"
    for filename in sorted(os.listdir(folder)):
        stem = filename.removesuffix(suffix)
        number, _, name = stem.partition("_")
        if stem != filename and len(number) == 4 and number.isdigit() and name:
            found.append((int(number), name, os.path.join(folder, filename)))
    return found


def statements(path: str) -> list[str]:
    """The statements of one migration file (comments dropped, split on ``;``)."""
    with open(path, encoding="utf-8") as fh:
        body = "\n".join(
            line for line in fh.read().splitlines() if not line.lstrip().startswith("--")
        )
    return [s.strip() for s in body.split(";") if s.strip()]
