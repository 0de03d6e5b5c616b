"""SQL resources: named queries per dialect and the one ordered list of migrations."""

from __future__ import annotations

import os
import re

_HERE = os.path.dirname(__file__)
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(dialect: str) -> dict[str, str]:
    """Parse ``<dialect>.sql`` into ``{name: statement}`` (each block after ``-- name:``)."""
    with open(os.path.join(_HERE, f"{dialect}.sql"), encoding="utf-8") as fh:
        text = fh.read()
    parts = _NAME.split(text)
    return {
        name: body.strip().rstrip(";").strip()
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def migrations(dialect: str) -> list[tuple[int, str, str]]:
    """``(version, name, path)`` of each migration of ``dialect``, in order.

    Files are ``migrations/NNNN_name.<dialect>.sql``; both dialects share the
    numbering, so a version means the same schema on SQLite and PostgreSQL.
    Only names are listed here: bodies are read when a migration runs.
    """
    folder = os.path.join(_HERE, "migrations")
    found = []
    for filename in sorted(os.listdir(folder)):
        match = re.fullmatch(rf"(\d{{4}})_(\w+)\.{dialect}\.sql", filename)
        if match:
            found.append((int(match[1]), match[2], os.path.join(folder, filename)))
    return found


def statements(path: str) -> list[str]:
    """The statements of one migration file (comments dropped, split on ``;``)."""
    with open(path, encoding="utf-8") as fh:
        body = "\n".join(
            line for line in fh.read().splitlines() if not line.lstrip().startswith("--")
        )
    return [s.strip() for s in body.split(";") if s.strip()]
