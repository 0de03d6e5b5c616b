"""A deliberately broken ``ninelives`` command: the negative control of the I/O fault suite.

``python broken_runner.py MODE --db DB run TASK``, MODE being

- ``retry``: a ``done`` commit that failed is tried again (a retried commit);
- ``ignore``: a ``done`` commit that failed is ignored and the step reported done;
- ``effect-retry``: an effect's failed fsync is an ordinary tool error, so the step
  is retried instead of the run stopping (fail-stop removed).

Test-only: the product has no such switch.
"""

from __future__ import annotations

import sys
from typing import Any

from ninelives import cli, diskio
from ninelives.errors import CommitUnknown, EffectUnknown, ToolError
from ninelives.store.sqlite.store import SQLiteStore

MODE = sys.argv.pop(1)
_finish_step = SQLiteStore.finish_step


def finish_step(self: SQLiteStore, *args: Any, **kwargs: Any) -> None:
    try:
        _finish_step(self, *args, **kwargs)
    except CommitUnknown:
        if MODE == "retry":
            _finish_step(self, *args, **kwargs)


SQLiteStore.finish_step = finish_step  # type: ignore[method-assign]

_fsync = diskio.fsync_file


def fsync_or_tool_error(fd: int, path: str) -> None:
    try:
        _fsync(fd, path)
    except EffectUnknown as exc:
        raise ToolError(str(exc)) from None


if MODE == "effect-retry":
    diskio.fsync_file = fsync_or_tool_error

if __name__ == "__main__":
    sys.exit(cli.main())
