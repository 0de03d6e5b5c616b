"""Unknown outcomes and a person in the loop (kept for imports of this name).

The waits live in :mod:`ninelives.runtime.waits`, the ``resolve`` and
``approve`` decisions in :mod:`ninelives.runtime.decisions` and the
``approval`` tool in :mod:`ninelives.tools.approval`.
"""

from __future__ import annotations

from .runtime.decisions import ANSWER as ANSWER
from .runtime.decisions import ON_REJECT as ON_REJECT
from .runtime.decisions import answers_rejection as answers_rejection
from .runtime.decisions import approve as approve
from .runtime.decisions import resolve as resolve
from .runtime.waits import PARKED as PARKED
from .runtime.waits import Waiter as Waiter
from .runtime.waits import after_claim as after_claim
from .runtime.waits import mode_of as mode_of
from .runtime.waits import modes as modes
from .runtime.waits import parked as parked
from .runtime.waits import refuse_parked as refuse_parked
from .runtime.waits import wait_for_approval as wait_for_approval
from .tools.approval import make_approval as make_approval
