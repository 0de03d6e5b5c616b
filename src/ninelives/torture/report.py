"""A torture session's verdict: :class:`TortureReport`, and how it is taken
from the lanes, the database and the artifacts folder (:func:`take_report`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..models import EventKind, Task
from ..verify import read_consistent, verify_store
from .findings import count_duplicates, lost_commits, reexecuted_effects
from .lanes import Lane, Session

#: Seconds the runs sleep at every crash point (``NINELIVES_CRASH_PAUSE``).
DEFAULT_PAUSE = 0.01


@dataclass(frozen=True, kw_only=True)
class TortureReport:
    """What one torture session did and found. ``ok`` is the verdict."""

    plan: str
    seed: int
    workers: int
    folder: str
    window: tuple[float, float]
    tasks: int
    runs: int
    kills: int
    recoveries: int
    reexecuted_effects: int
    duplicates: int
    lost_commits: int
    violations: tuple[str, ...]
    elapsed: float
    kills_asked: int = 0
    kept: bool = True
    #: The workflow tortured instead of a plan (``plan`` is then empty), and its arguments.
    workflow: str | None = None
    args: str = "[]"
    #: One line per duplicate and lost commit found (violations are listed apart).
    details: tuple[str, ...] = ()
    pause: float = DEFAULT_PAUSE

    @property
    def ok(self) -> bool:
        """True when no duplicate, lost commit or violation was found."""
        return not (self.duplicates or self.lost_commits or self.violations)

    def replay_command(self) -> str:
        """The command line that replays this session's kill schedule."""
        import shlex

        extra = f" --workers {self.workers}" if self.workers != 1 else ""
        extra += f" --pause {self.pause:g}" if self.pause != DEFAULT_PAUSE else ""
        subject = self.plan
        if self.workflow is not None:
            subject = f"--workflow {shlex.quote(self.workflow)} --args {shlex.quote(self.args)}"
        return f"ninelives torture {subject} --kills {self.kills_asked} --seed {self.seed}{extra}"

    def summary_lines(self) -> list[str]:
        """The human summary: replay line, counts, then each violation."""
        lo, hi = self.window
        lines = [
            f"seed {self.seed} (replay: {self.replay_command()})",
            f"{self.tasks} task(s), {self.runs} run process(es), kill delay "
            f"{lo:.3f}-{hi:.3f}s, {self.elapsed:.1f}s, folder {self.folder}"
            + ("" if self.kept else " (removed: all clean)"),
            f"kills {self.kills}  recoveries {self.recoveries}  re-executed effects "
            f"{self.reexecuted_effects}  duplicates {self.duplicates}  lost commits "
            f"{self.lost_commits}  violations {len(self.violations)}",
        ]
        lines.extend(f"  {line}" for line in (*self.details, *self.violations))
        return lines


def take_report(
    session: Session,
    lanes: Sequence[Lane],
    errors: Sequence[str],
    *,
    seed: int,
    workers: int,
    kills: int,
    window: tuple[float, float],
    elapsed: float,
) -> TortureReport:
    """Verify the database and count what the session did and found."""
    from ..store import open_store

    problems = list(errors)
    for lane in lanes:
        problems.extend(lane.problems)
    details: list[str] = []
    recoveries = reexecuted = lost = duplicates = 0
    store = open_store(session.db, create=False)
    try:
        verdict = verify_store(store, artifacts=session.artifacts)
        tasks: list[Task] = []
        for task_id in store.task_ids():
            task, events = read_consistent(store, task_id)
            tasks.append(task)
            recoveries += sum(1 for e in events if e.kind == EventKind.STEP_RECOVERED.value)
            reexecuted += reexecuted_effects(events)
    finally:
        store.close()
    by_id = {t.id: t for t in tasks}
    for lane in lanes:
        for task_id, seen in lane.observed.items():
            if task_id in by_id:
                found = lost_commits(seen, by_id[task_id])
                lost += len(found)
                details.extend(f"lost commit: {line}" for line in found)
    problems.extend(str(violation) for violation in verdict.violations)
    duplicates, found = count_duplicates(tasks, session.artifacts)
    details.extend(f"duplicate: {line}" for line in found)
    return TortureReport(
        plan=os.path.relpath(session.subject[0]) if len(session.subject) == 1 else "",
        seed=seed,
        workers=workers,
        folder=session.folder,
        window=window,
        tasks=sum(len(lane.tasks) for lane in lanes),
        runs=sum(lane.runs for lane in lanes),
        kills=sum(lane.kills for lane in lanes),
        recoveries=recoveries,
        reexecuted_effects=reexecuted,
        duplicates=duplicates,
        lost_commits=lost,
        violations=tuple(problems),
        elapsed=elapsed,
        kills_asked=kills,
        details=tuple(details),
    )
