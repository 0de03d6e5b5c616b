"""A deliberately broken ``ninelives`` command: the negative control of the I/O fault suite.

``python broken_runner.py MODE --db DB run TASK``, MODE being

- ``retry``: a ``done`` commit that failed is tried again (a retried commit);
- ``ignore``: a ``done`` commit that failed is ignored and the step reported done.

Test-only: the product has no such switch.
"""

from __future__ import annotations

import sys
from typing import Any

from ninelives import cli
from ninelives.errors import CommitUnknown
from ninelives.store.sqlite import SQLiteStore

MODE = sys.argv.pop(1)
_finish_step = SQLiteStore.finish_step


def finish_step(self: SQLiteStore, *args: Any, **kwargs: Any) -> None:
    try:
        _finish_step(self, *args, **kwargs)
    except CommitUnknown:
        if MODE == "retry":
            _finish_step(self, *args, **kwargs)


SQLiteStore.finish_step = finish_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main())
