"""Commands that act on a task a person must look at, and housekeeping.

The handlers and argument declarations of ``ninelives`` commands beyond the
contract's (``resolve``, ``approve``, ``cancel``, ``fork``; ``ls``, ``gc``,
``doctor``), kept out of :mod:`ninelives.cli` so that each module stays small.
:data:`OPS` is merged into ``cli.COMMANDS``; exit codes are still decided by
``cli.EXIT_CODES`` alone. Like the rest of the CLI path, this module imports
only the standard library at start-up; a handler imports what it uses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

#: ``name: (handler, help, declare)``, as ``cli.COMMANDS``.
OPS: dict[
    str,
    tuple[
        Callable[[argparse.Namespace], int],
        str,
        Callable[[argparse.ArgumentParser], None],
    ],
] = {}
