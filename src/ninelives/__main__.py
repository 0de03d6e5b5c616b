"""``python -m ninelives``: the same as the ``ninelives`` command."""

import sys

from .cli import main

sys.exit(main())
