"""The finding every check returns, and the list the checks collect them in."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken guarantee: which check, which task, and the journal events involved."""

    task_id: str
    check: str
    message: str
    seqs: tuple[int, ...] = ()

    def __str__(self) -> str:
        where = f" [seq {', '.join(map(str, self.seqs))}]" if self.seqs else ""
        return f"{self.task_id or '(database)'}: {self.check}: {self.message}{where}"


class Findings(list[Violation]):
    """The violations found in one task, in the order the checks found them."""

    def __init__(self, task_id: str) -> None:
        super().__init__()
        self.task_id = task_id

    def add(self, check: str, message: str, seqs: Iterable[int] = ()) -> None:
        """Record one violation of ``check`` in this task."""
        self.append(Violation(task_id=self.task_id, check=check, message=message, seqs=tuple(seqs)))
