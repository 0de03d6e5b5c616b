"""``ninelives`` whose SQLite writes start with a deferred ``BEGIN``: the negative
control of the contention tests (``python deferred_runner.py --db DB COMMAND ...``).

The store's connections are made with a connection class that turns its
``BEGIN IMMEDIATE`` into a plain ``BEGIN``; nothing else changes. If the store
never sent ``BEGIN IMMEDIATE`` the control would remove nothing, so the process
then fails with exit 99 instead of passing for the wrong reason.
Test-only: the product has no such switch.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from ninelives import cli
from ninelives.store.sqlite.store import SQLiteStore

REWRITTEN: list[str] = []


class Deferred(sqlite3.Connection):
    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if sql.strip().upper() == "BEGIN IMMEDIATE":
            REWRITTEN.append(sql)
            sql = "BEGIN"
        return super().execute(sql, *args)


_defaults = SQLiteStore.__init__.__kwdefaults__
assert _defaults is not None
_connect = _defaults["connect"]
_defaults["connect"] = lambda path, **kw: _connect(path, factory=Deferred, **kw)

if __name__ == "__main__":
    code = cli.main()
    if not REWRITTEN and code == 0:
        print("deferred_runner: the store sent no BEGIN IMMEDIATE to defer", file=sys.stderr)
        code = 99
    sys.exit(code)
