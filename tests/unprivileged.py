"""A lab whose commands run without root's powers over files.

When the tests run as root (a container, a CI image), a file's mode binds
nobody: root writes a 0444 file and removes entries from a 0500 folder through
CAP_DAC_OVERRIDE. Cases about files a user may not write drop those powers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ninelives.testing import Lab


class UserLab(Lab):
    """A lab whose commands run as they are when this user is not root, else as
    root with every capability dropped, so its files' modes bind it like any owner.

    Dropping capabilities rather than switching to another account keeps the
    files root's own, so the test does not depend on that account reaching the
    interpreter and the checkout (a clone in a 0700 folder is out of its reach).
    """

    def argv(self, args: Sequence[str]) -> list[str]:
        if os.geteuid() != 0:
            return super().argv(args)
        # setpriv (util-linux): an empty bounding set leaves root no capability after exec.
        return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", *super().argv(args)]
