"""``ninelives torture``: run fresh tasks of a plan under random SIGKILLs, then prove it.

The tasks are of a plan file, or of a workflow (``--workflow NAME --args JSON``,
from a module named with ``--tools``): each is created as ``create`` would.
Each worker lane (:mod:`ninelives.torture.lanes`) creates a task of the plan
and runs it with the ``ninelives`` command (this interpreter's ``-m ninelives``,
so tools from entry points load as they would in production), SIGKILLs the run
at a random, seeded moment (the runs pause briefly at every crash point so those
moments fall between commits), reads what the database acknowledges as done,
and runs it again, until its share of the kills is spent; each task is then
resumed to the end, and a task that finishes before the next kill is followed
by a fresh one. At the end every task is checked with
:func:`ninelives.verify.verify_store` and the counts below are taken
(:mod:`ninelives.torture.findings`, :mod:`ninelives.torture.report`):

- kills: run processes that died by our SIGKILL (each survived if the task
  still completed cleanly);
- recoveries: ``step_recovered`` events;
- re-executed effects: step attempts beyond the first of each step;
- duplicates: extra publications, each counted once: a published file that
  holds its recorded content k times counts k - 1 (one whose content differs
  otherwise counts 1), and an append log (``AGENT_UNSAFE_EFFECTS=1``) counts
  each entry beyond the done steps that wrote to it;
- lost commits: a step seen ``done`` in a snapshot between kills that is
  later not done, or whose output changed.

The kill moments come from ``random.Random(seed)``: the same seed replays the
same schedule (where a moment lands in the run still depends on the machine).
Violations (``verify`` findings, runs that failed) are listed with the counts.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence

from ..errors import InputError, NineLivesError
from .findings import (
    UNSAFE_SEPARATOR,
    append_log_duplicates,
    count_duplicates,
    lost_commits,
    published_duplicates,
    reexecuted_effects,
)
from .lanes import ARTIFACTS_NAME, DB_NAME, Lane, Session, run_lane
from .report import DEFAULT_PAUSE, TortureReport, take_report

__all__ = [
    "ARTIFACTS_NAME",
    "DB_NAME",
    "DEFAULT_PAUSE",
    "UNSAFE_SEPARATOR",
    "TortureReport",
    "append_log_duplicates",
    "count_duplicates",
    "lost_commits",
    "published_duplicates",
    "reexecuted_effects",
    "torture",
]


def torture(
    plan: str | os.PathLike[str] | None = None,
    *,
    workflow: str | None = None,
    args: str | None = None,
    kills: int = 10,
    seed: int | None = None,
    workers: int = 1,
    folder: str | None = None,
    window: tuple[float, float] | None = None,
    pause: float = DEFAULT_PAUSE,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TortureReport:
    """Torture fresh tasks of ``plan`` with ``kills`` SIGKILLs over ``workers`` lanes.

    Instead of a plan, ``workflow`` names a workflow loaded in this process
    (``--tools`` / ``NINELIVES_TOOLS``, which the runs load too) and ``args``
    its arguments as ``create --args`` takes them (JSON text: an array or an
    object; default ``[]``; a plan takes none).
    ``folder`` (default: a new temporary folder) receives the database and the
    artifacts; it must not hold a database yet. A temporary folder is removed
    again when everything is clean, kept otherwise. ``window`` fixes the range of
    kill delays in seconds (default: calibrated by one uninterrupted run).
    ``pause`` seconds are slept at every crash point of the runs
    (``NINELIVES_CRASH_PAUSE``), so random kills land between every pair of
    commits even when the tools take microseconds; 0 runs at full speed.
    ``env`` adds variables for the runs. Raises :class:`InputError` for bad
    arguments, and :class:`~ninelives.errors.StoreError` when the runs cannot be
    started or refuse to create a task; the findings are in the returned report,
    never raised.
    """
    import shutil

    _check_numbers(kills, workers, pause)
    subject, plan_path = _subject_of(plan, workflow, args)
    seed = int.from_bytes(os.urandom(4), "big") if seed is None else seed
    scratch = folder is None
    folder = _claim_folder(folder)
    session = Session(subject, folder, env, log, pause)
    session.say(f"seed {seed}, {kills} kill(s), {workers} worker(s), folder {folder}")
    started = time.monotonic()
    span, commits = _kill_schedule(session, window, plan_path, scratch=scratch)
    lanes = _lanes(kills, workers, seed)
    errors = _run_lanes(session, lanes, span, commits)
    report = take_report(
        session,
        lanes,
        errors,
        seed=seed,
        workers=workers,
        kills=kills,
        window=span,
        elapsed=time.monotonic() - started,
    )
    report = dataclasses.replace(report, pause=pause, workflow=workflow, args=args or "[]")
    if scratch and report.ok:
        shutil.rmtree(folder, ignore_errors=True)
        report = dataclasses.replace(report, kept=False)
    return report


#: The most kills and parallel tasks a torture run takes: a lane (and its
#: schedule) is made for each worker up front, so a huge number would only
#: exhaust memory, and no run could deliver millions of kills.
MAX_KILLS = 1_000_000
MAX_WORKERS = 256


def _check_numbers(kills: int, workers: int, pause: float) -> None:
    """Refuse kills outside 0-:data:`MAX_KILLS`, workers outside 1-:data:`MAX_WORKERS`,
    or a pause outside 0-60 s (InputError)."""
    if not 0 <= kills <= MAX_KILLS:
        raise InputError(f"--kills must be 0-{MAX_KILLS}, got {kills}")
    if not 1 <= workers <= MAX_WORKERS:
        raise InputError(f"--workers must be 1-{MAX_WORKERS}, got {workers}")
    if not 0 <= pause <= 60:
        raise InputError(f"--pause must be 0-60 seconds, got {pause}")


def _subject_of(
    plan: str | os.PathLike[str] | None, workflow: str | None, args: str | None
) -> tuple[tuple[str, ...], str]:
    """What follows ``create TASK`` for every task, checked as ``create`` would,
    and the plan's absolute path ("" for a workflow)."""
    if (plan is None) == (workflow is None):
        raise InputError("torture takes a plan file or --workflow NAME, not both or neither")
    if workflow is not None:
        args = "[]" if args is None else args
        _check_workflow(workflow, args)
        return ("--workflow", workflow, "--args", args), ""
    if args is not None:  # as create refuses them: a plan would run without them
        raise InputError("--args goes with --workflow: a plan file takes no arguments")
    plan_path = os.path.abspath(os.fspath(plan))  # type: ignore[arg-type]
    _check_plan(plan_path)
    return (plan_path,), plan_path


def _claim_folder(folder: str | None) -> str:
    """The session's folder, absolute and created (a new temporary one for None);
    refused when it is a file or already holds a database."""
    import tempfile

    if folder == "":  # a script's unset variable: never the working directory
        raise InputError("--dir is empty: give a new or empty folder, or leave --dir out")
    if folder is None:
        folder = tempfile.mkdtemp(prefix="ninelives-torture-")
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InputError(f"--dir {folder} is not a folder: give a new or empty folder")
    if os.path.exists(os.path.join(folder, DB_NAME)):
        raise InputError(f"{folder} already holds a database: give a new or empty folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create --dir {folder}: {exc.strerror or exc}") from None
    return folder


def _kill_schedule(
    session: Session, window: tuple[float, float] | None, plan_path: str, *, scratch: bool
) -> tuple[tuple[float, float], int]:
    """The range of kill delays, and the most commits a kill waits for: measured
    by one uninterrupted run unless ``window`` is given for a plan. When that
    run fails, a ``scratch`` folder is removed again before the error goes up."""
    import shutil

    try:
        if window is None or not plan_path:
            # A workflow's steps are known only by running it: its commits are counted too.
            span, commits = session.calibrate()
            span = span if window is None else window
            session.say(f"kill delays {span[0]:.3f}-{span[1]:.3f}s or after 1-{commits} commits")
            return span, commits
        return window, 2 * _plan_steps(plan_path) + 3
    except BaseException:
        # Nothing was tortured yet: a scratch folder of ours holds nothing to look at.
        if scratch:
            shutil.rmtree(session.folder, ignore_errors=True)
        raise


def _lanes(kills: int, workers: int, seed: int) -> list[Lane]:
    """One lane per worker, the kills shared out as evenly as they go, each lane
    drawing its moments from its own seeded random."""
    return [
        Lane(
            number=i,
            quota=kills // workers + (1 if i < kills % workers else 0),
            rng=random.Random(f"{seed}:{i}"),
        )
        for i in range(workers)
    ]


def _run_lanes(
    session: Session, lanes: Sequence[Lane], window: tuple[float, float], commits: int
) -> list[str]:
    """Run every lane in a thread of its own, to the end; one line per lane that
    stopped on an error."""
    import threading

    errors: list[str] = []

    def guarded(lane: Lane) -> None:
        try:
            run_lane(session, lane, window, commits)
        except NineLivesError as exc:
            errors.append(f"lane {lane.number}: {exc}")

    threads = [threading.Thread(target=guarded, args=(lane,)) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _check_plan(path: str) -> None:
    from ..plan import load_plan, validate
    from ..settings import Settings
    from ..tools.builtin import default_registry

    validate(load_plan(path), default_registry(Settings.from_env()).lookup)


def _check_workflow(name: str, args: str) -> None:
    """Refuse a workflow not loaded here or arguments ``create`` would refuse (InputError)."""
    from ..durable import lookup, parse_arguments, prepare
    from ..settings import Settings
    from ..tools.builtin import default_registry

    default_registry(Settings.from_env())  # imports the NINELIVES_TOOLS modules
    positional, keywords = parse_arguments(args)
    prepare("torture-0-0", lookup(name), positional, keywords)


def _plan_steps(path: str) -> int:
    from ..plan import load_plan

    return len(load_plan(path).steps)
