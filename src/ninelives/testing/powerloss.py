"""Power loss, simulated: cut the power at any write or sync, reopen, resume, check.

A scenario runs the guide's 3-step task in-process with its SQLite database
on :class:`~ninelives.testing.disklayer.RecordingVFS` (through
:class:`~ninelives.testing.apswconn.ApswConnection`)
and its artifact folder behind :class:`~ninelives.testing.disklayer.EffectsOS`.
At the chosen operation the power goes: the folder is rebuilt as a restarted
machine would find it (only synced data, or synced data plus a torn part of
the rest), then checked with the ordinary stdlib store:

- ``PRAGMA integrity_check`` is ``ok`` (else a corrupt database);
- the database holds at least what the last write that returned to its caller
  left (a commit is acknowledged where the caller sees it, see
  :class:`~ninelives.testing.apswconn.CommitTracker`): exactly that state, a
  later commit, or the commit in flight at the cut (its outcome was unknown);
  anything older is a lost commit;
- every artifact the journal calls published exists with its recorded sha256.

The next phase resumes (under the VFS again when more cuts are planned), and
the last one runs the normal runtime to the end: the task must be done, every
step finished exactly once, the artifact present once with the expected text,
no temporary file left. :func:`sweep` cuts at every operation of the task;
:func:`campaign` cuts at random, up to three times in a row.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from ..errors import NineLivesError, UnknownTask
from ..runtime import Runtime
from ..runtime import open as open_runtime
from ..settings import Settings
from ..store.sqlite.group import GroupCommitter, early_release
from ..store.sqlite.store import SQLiteStore
from ..tools.builtin import default_registry, stub_summary
from ..verify import verify_store
from .apswconn import EMPTY, ApswConnection, CommitTracker, DbState, read_state
from .disklayer import (
    DiskModel,
    EffectsOS,
    PowerCut,
    Trigger,
    effects_through,
    recording_vfs,
    store_through,
)
from .lab import GUIDE_PLAN, SUMMARY_NOTES

TASK_ID = "t"
DB_NAME = "state.db"
#: ``(PRAGMA synchronous, PRAGMA journal_mode)`` of a safe store connection: FULL, WAL.
SAFE_SETTINGS = (2, "wal")
ARTIFACTS = "artifacts"

# -- scenarios -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Controls:
    """Safety removed on purpose, to prove the checks bite. All off by default."""

    #: Set on the store's connection once the store has opened it (e.g.
    #: ``"NORMAL"``): the store's ``synchronous=FULL`` really removed, as the
    #: read-back (:attr:`ScenarioResult.settings`) shows.
    synchronous: str | None = None
    #: Publish artifacts without fsyncing the file.
    drop_artifact_fsync: bool = False
    #: Publish artifacts without fsyncing their folder.
    drop_artifact_dirsync: bool = False
    #: Create the artifact folder without fsyncing its parent (the old behaviour).
    plain_mkdir: bool = False
    #: A fault, not a control: SQLite's own fsync of the database folder (when it
    #: creates the WAL) fails, and SQLite ignores it. The store's fsync must cover it.
    sqlite_dirsync_lost: bool = False
    #: The store's own fsync of the database folder, before its first commit, does nothing.
    drop_db_dirsync: bool = False
    #: Not a control: outputs over this many bytes go to the blob store
    #: (``state.db.blobs/``); 0 sends every output there.
    blob_threshold: int | None = None
    #: Store blobs without fsyncing the file (with ``blob_threshold``).
    drop_blob_fsync: bool = False
    #: Store blobs without fsyncing their folder (with ``blob_threshold``).
    drop_blob_dirsync: bool = False
    #: Not a control: the run writes through a group committer
    #: (:mod:`ninelives.store.sqlite.group`), as ``worker --group-commit`` does.
    group_commit: bool = False
    #: With ``group_commit``: the committer releases each write to its caller
    #: before the COMMIT that holds it (its test-only switch).
    group_early_release: bool = False


@dataclass(frozen=True, kw_only=True)
class Cut:
    """Where one phase loses power: operation ``at`` (1-based); ``torn`` keeps a
    random part (seeded by ``seed``) of the unsynced writes and folder changes.

    Shown as ``AT`` or ``AT~SEED`` (torn) in problem reports."""

    at: int
    torn: bool = False
    seed: int = 0

    def __str__(self) -> str:
        return f"{self.at}{f'~{self.seed}' if self.torn else ''}"


@dataclass(frozen=True, kw_only=True)
class ScenarioResult:
    """What one scenario did and found."""

    spec: tuple[Cut, ...]
    cuts: int
    torn_cuts: int
    #: Cuts after which a commit not yet acknowledged to its caller (in flight
    #: at the cut, or committed but not yet returned) survived.
    inflight_kept: int
    lost_commits: int
    corrupt: int
    broken_artifacts: int
    duplicates: int
    #: Anything else: a resume that failed, a temporary file left, a phase error.
    other: int
    problems: tuple[str, ...]
    ops: tuple[str, ...] = ()
    #: ``(PRAGMA synchronous, PRAGMA journal_mode)`` read back from every connection
    #: the store committed on, once it had opened it: ``{(2, "wal")}`` is FULL and WAL.
    settings: frozenset[tuple[int, str]] = frozenset()

    @property
    def ok(self) -> bool:
        """True when nothing was lost, corrupt, broken, duplicated or otherwise wrong."""
        return not self.problems


@dataclass
class _Tally:
    cuts: int = 0
    torn: int = 0
    lost: int = 0
    corrupt: int = 0
    broken: int = 0
    duplicates: int = 0
    inflight_kept: int = 0
    other: int = 0
    problems: list[str] = field(default_factory=list)
    settings: set[tuple[int, str]] = field(default_factory=set)


def _settings(folder: str, controls: Controls = Controls()) -> Settings:
    settings = Settings(artifacts=os.path.join(folder, ARTIFACTS), workspace=folder)
    if controls.blob_threshold is not None:
        settings = settings._replace(blob_threshold=controls.blob_threshold)
    return settings


def prepare_folder(folder: str) -> None:
    """A fresh scenario folder: the guide's input file, nothing else."""
    os.makedirs(os.path.join(folder, "input"), exist_ok=True)
    with open(os.path.join(folder, "input", "notes.txt"), "w", encoding="utf-8") as fh:
        fh.write(SUMMARY_NOTES)


class _AckingStore(SQLiteStore):
    """The ordinary store, telling the tracker what each write left once the
    write returns to its caller: the moment the caller may act on it."""

    def __init__(self, path: str, *, tracker: CommitTracker, connect: Any) -> None:
        self._tracker = tracker
        super().__init__(path, connect=connect)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with super()._write() as conn:
            yield conn
            # Still inside the write (its transaction or savepoint), on the
            # connection that holds it: what the caller will be told is durable.
            made = read_state(lambda q: conn.execute(q).fetchall())
        self._tracker.acknowledge(made)


def _create(rt: Runtime) -> None:
    try:
        rt.status(TASK_ID)
    except UnknownTask:
        rt.create(TASK_ID, GUIDE_PLAN)


def _phase(
    folder: str, cut: Cut | None, controls: Controls, acked: DbState
) -> tuple[Trigger, DiskModel, CommitTracker]:
    """Create (if needed) and run the task under the recording layer until the cut."""
    model = DiskModel.scan(folder)
    trigger = Trigger(cut.at if cut is not None else None)
    tracker = CommitTracker(acked)
    vfs = recording_vfs()
    vfs.model, vfs.trigger = model, trigger
    vfs.dirsync_lost = controls.sqlite_dirsync_lost
    blob_drops = controls.drop_blob_fsync or controls.drop_blob_dirsync
    proxy = EffectsOS(
        model,
        trigger,
        drop_file_fsync=controls.drop_blob_fsync if blob_drops else controls.drop_artifact_fsync,
        drop_dir_fsync=controls.drop_blob_dirsync if blob_drops else controls.drop_artifact_dirsync,
        drop_under=DB_NAME + ".blobs" if blob_drops else None,
    )
    # The store's own fsync of the database folder goes to the model as well.
    store_os = EffectsOS(model, trigger, drop_dir_fsync=controls.drop_db_dirsync)

    def connect(path: str, *, timeout: float = 5.0, **_: Any) -> sqlite3.Connection:
        conn = ApswConnection(path, vfs=vfs.NAME, trigger=trigger, tracker=tracker, timeout=timeout)
        return cast(sqlite3.Connection, conn)

    settings = _settings(folder, controls)
    try:
        with effects_through(proxy, plain_mkdir=controls.plain_mkdir), store_through(store_os):
            # Two opens, as two commands would: `create`, then `run`.
            for action in (_create, lambda rt: rt.run(TASK_ID)):
                db = os.path.join(folder, DB_NAME)
                store = _AckingStore(db, tracker=tracker, connect=connect)
                conn = cast(ApswConnection, store._conn)
                if controls.synchronous is not None:
                    conn.execute(f"PRAGMA synchronous={controls.synchronous}")
                tracker.settings.add(conn.safety_settings())
                group = None if action is _create else _group(store, connect, tracker, controls)
                try:
                    with Runtime(store, settings=settings, tools=default_registry(settings)) as rt:
                        action(rt)
                finally:
                    if group is not None:
                        group.close()
    except PowerCut:
        if not trigger.dead:
            raise
    except NineLivesError as exc:
        if not trigger.dead:  # after a cut, any error is the cut's
            tracker.error = f"{type(exc).__name__}: {exc}"
    finally:
        vfs.model, vfs.trigger, vfs.dirsync_lost = None, Trigger(), False
    return trigger, model, tracker


def _group(
    store: SQLiteStore, connect: Any, tracker: CommitTracker, controls: Controls
) -> GroupCommitter | None:
    """With ``controls.group_commit``: the store's writes go through a committer
    whose own connection runs on the recording layer too."""
    if not controls.group_commit:
        return None
    carrier = _AckingStore(store.path, tracker=tracker, connect=connect)
    conn = cast(ApswConnection, carrier._conn)
    if controls.synchronous is not None:  # the connection that commits loses it too
        conn.execute(f"PRAGMA synchronous={controls.synchronous}")
    tracker.settings.add(conn.safety_settings())
    early = controls.group_early_release
    with _early_release(carrier.path, early):
        # Released early, callers run ahead of a commit for up to the linger: a wide window.
        group = GroupCommitter(carrier, linger=0.05 if early else 0.002)
    store.join_group(group)
    return group


@contextmanager
def _early_release(path: str, on: bool) -> Iterator[None]:
    """The committer's test-only early-release switch, on while it is built."""
    name = "NINELIVES_TEST_GROUP_EARLY_RELEASE"
    old = os.environ.get(name)
    if on:
        os.environ[name] = f"unsafe-test-only:{path}"
        assert early_release(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _inspect(folder: str, tracker: CommitTracker, tally: _Tally, where: str) -> DbState:
    """Check the folder as the cut left it; return the database state found."""
    db = os.path.join(folder, DB_NAME)
    state = EMPTY
    if os.path.exists(db):
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            check = [str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall()]
            state = read_state(lambda q: conn.execute(q).fetchall())
        except sqlite3.DatabaseError as exc:
            check = [f"unreadable: {exc}"]
        finally:
            conn.close()
        if check != ["ok"]:
            tally.corrupt += 1
            tally.problems.append(f"{where}: corrupt database: {'; '.join(check[:3])}")
            return state
    valid = tracker.valid()
    if state != tracker.acked and state in valid:
        tally.inflight_kept += 1
    if state not in valid:
        missing = [t for t, rows in tracker.acked.tables if not frozenset(rows) <= state.rows(t)]
        if missing or state.version < tracker.acked.version:
            tally.lost += 1
            tally.problems.append(
                f"{where}: lost acknowledged commit (rows missing from {missing or 'schema'})"
            )
        else:
            tally.corrupt += 1
            tally.problems.append(
                f"{where}: state is neither the acknowledged nor the in-flight one"
            )
    if state.rows("tasks"):
        store = SQLiteStore(db)
        try:
            report = verify_store(store, None, artifacts=os.path.join(folder, ARTIFACTS))
        finally:
            store.close()
        for v in report.violations:
            if v.check == "stray_temp":
                continue  # a killed publish leaves one; the next run removes it
            if v.check.startswith("artifact") or v.check == "blob":
                tally.broken += 1
            else:
                tally.corrupt += 1
            tally.problems.append(f"{where}: {v}")
    return state


def _finish(folder: str, tally: _Tally, controls: Controls = Controls()) -> None:
    """Resume with the normal runtime to the end and check the outcome."""
    settings = _settings(folder, controls)
    artifacts = os.path.join(folder, ARTIFACTS)
    try:
        with open_runtime(os.path.join(folder, DB_NAME), settings=settings) as rt:
            _create(rt)
            rt.run(TASK_ID)
            task = rt.status(TASK_ID)
            events = rt.store.events(TASK_ID)
            report = verify_store(rt.store, None, artifacts=artifacts)
    except NineLivesError as exc:
        tally.other += 1
        tally.problems.append(f"resume failed: {type(exc).__name__}: {exc}")
        return
    if task.status.value != "done":
        tally.other += 1
        tally.problems.append(f"resumed task is {task.status.value}")
    for v in report.violations:
        tally.problems.append(f"final: {v}")
        if v.check.startswith("artifact") or v.check == "blob":
            tally.broken += 1
        elif v.check == "stray_temp":
            tally.other += 1
        else:
            tally.corrupt += 1
    for step in task.steps:
        finished = sum(e.kind == "step_finished" and e.step_idx == step.idx for e in events)
        if finished > 1:
            tally.duplicates += finished - 1
            tally.problems.append(f"step {step.idx} finished {finished} times")
    expected = {f"{TASK_ID}-2.md": stub_summary(SUMMARY_NOTES).encode()}
    found = {}
    for name in sorted(os.listdir(artifacts)) if os.path.isdir(artifacts) else ():
        with open(os.path.join(artifacts, name), "rb") as fh:
            found[name] = fh.read()
    if found != expected:
        # Missing, partial and temporary files are verify findings above; a
        # second published file is a duplicate.
        tally.duplicates += len([n for n in found if n not in expected and not n.startswith(".")])
        tally.problems.append(f"artifacts {sorted(found)} != {sorted(expected)} (or content)")


def run_scenario(
    folder: str, spec: Sequence[Cut], *, controls: Controls = Controls()
) -> ScenarioResult:
    """Run the task in a fresh ``folder`` with one power cut per entry of ``spec``.

    Each phase resumes where the previous cut left the folder; a phase that
    finishes before its cut ends the cutting. Then the normal runtime finishes
    the task and everything is checked.
    """
    prepare_folder(folder)
    tally = _Tally()
    acked = EMPTY
    ops: tuple[str, ...] = ()
    for n, cut in enumerate(spec):
        trigger, model, tracker = _phase(folder, cut, controls, acked)
        ops = tuple(trigger.ops)
        for sync, mode in sorted(tracker.settings - tally.settings):
            if (sync, mode) != SAFE_SETTINGS:
                tally.problems.append(
                    f"phase {n + 1}: the store committed with synchronous={sync}, "
                    f"journal_mode={mode} (not FULL and wal)"
                )
        tally.settings |= tracker.settings
        if tracker.error is not None:
            tally.other += 1
            tally.problems.append(f"phase {n + 1}: {tracker.error}")
        if not trigger.dead:
            break
        tally.cuts += 1
        tally.torn += cut.torn
        model.rebuild(model.survivors(random.Random(cut.seed) if cut.torn else None))
        where = f"cut {n + 1} at {trigger.ops[-1]!r}"
        before = tally.corrupt
        acked = _inspect(folder, tracker, tally, where)
        if tally.corrupt > before:
            break  # nothing sound is left to resume
    if not tally.corrupt:
        _finish(folder, tally, controls)
    return ScenarioResult(
        spec=tuple(spec),
        cuts=tally.cuts,
        torn_cuts=tally.torn,
        inflight_kept=tally.inflight_kept,
        lost_commits=tally.lost,
        corrupt=tally.corrupt,
        broken_artifacts=tally.broken,
        duplicates=tally.duplicates,
        other=tally.other,
        problems=tuple(tally.problems),
        ops=ops,
        settings=frozenset(tally.settings),
    )


def reference_ops(folder: str, *, controls: Controls = Controls()) -> list[str]:
    """The durable-state operations of one uninterrupted create + run, in order."""
    prepare_folder(folder)
    trigger, _, _ = _phase(folder, None, controls, EMPTY)
    return list(trigger.ops)


# -- sessions ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PowerLossReport:
    """Totals of many scenarios. ``ok`` is the verdict."""

    scenarios: int
    cuts: int
    torn_cuts: int
    inflight_kept: int
    #: Cuts in scenarios where some check failed (0 when ``ok``).
    failed_cuts: int
    lost_commits: int
    corrupt: int
    broken_artifacts: int
    duplicates: int
    other: int
    problems: tuple[str, ...]
    elapsed: float
    #: Every ``(synchronous, journal_mode)`` read back from the store's connections.
    settings: frozenset[tuple[int, str]] = frozenset()

    @property
    def ok(self) -> bool:
        """True when no scenario found anything wrong."""
        return not self.problems

    def summary_lines(self) -> list[str]:
        """A few lines for people."""
        lines = [
            f"power cuts: {self.cuts} ({self.torn_cuts} torn, {self.inflight_kept} kept the "
            f"commit in flight) in {self.scenarios} scenarios, {self.elapsed:.1f}s",
            f"lost commits: {self.lost_commits}, corrupt: {self.corrupt}, broken artifacts: "
            f"{self.broken_artifacts}, duplicates: {self.duplicates}, other: {self.other}",
        ]
        return lines + [f"  {p}" for p in self.problems[:10]]


def _scratch(base: str | None) -> str | None:
    # The model, not the medium, decides what survives a cut, so scenarios run
    # on a RAM-backed folder when there is one: the real fsyncs of the checks
    # and of the final resume then cost nothing.
    if base is not None:
        return base
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _session(
    specs: Iterable[Sequence[Cut]], controls: Controls, base: str | None, stop_after: int | None
) -> PowerLossReport:
    start = time.monotonic()
    root = tempfile.mkdtemp(prefix="powerloss-", dir=_scratch(base))
    totals = _Tally()
    scenarios = failed = 0
    try:
        for spec in specs:
            if stop_after is not None and totals.cuts >= stop_after:
                break
            folder = os.path.join(root, f"s{scenarios}")
            result = run_scenario(folder, spec, controls=controls)
            scenarios += 1
            totals.cuts += result.cuts
            totals.torn += result.torn_cuts
            totals.inflight_kept += result.inflight_kept
            totals.lost += result.lost_commits
            totals.corrupt += result.corrupt
            totals.broken += result.broken_artifacts
            totals.duplicates += result.duplicates
            totals.other += result.other
            totals.settings |= result.settings
            # The spec replays the scenario: run_scenario(folder, spec).
            label = ", ".join(map(str, spec))
            totals.problems.extend(f"[cuts {label}] {p}" for p in result.problems)
            failed += result.cuts if result.problems else 0
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return PowerLossReport(
        scenarios=scenarios,
        cuts=totals.cuts,
        torn_cuts=totals.torn,
        inflight_kept=totals.inflight_kept,
        failed_cuts=failed,
        lost_commits=totals.lost,
        corrupt=totals.corrupt,
        broken_artifacts=totals.broken,
        duplicates=totals.duplicates,
        other=totals.other,
        problems=tuple(totals.problems),
        elapsed=time.monotonic() - start,
        settings=frozenset(totals.settings),
    )


def sweep(
    *, controls: Controls = Controls(), torn_seeds: int = 1, base: str | None = None
) -> PowerLossReport:
    """Cut at every operation of the task once with synced data only, and at every
    sync ``torn_seeds`` more times with a torn part of the unsynced writes."""
    scratch = tempfile.mkdtemp(prefix="powerloss-ref-", dir=_scratch(base))
    try:
        ops = reference_ops(scratch, controls=controls)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    specs: list[list[Cut]] = [[Cut(at=i)] for i in range(1, len(ops) + 1)]
    for i, op in enumerate(ops, start=1):
        if op.startswith(("sync", "dirsync")):
            specs += [[Cut(at=i, torn=True, seed=i * 1000 + s)] for s in range(torn_seeds)]
    return _session(specs, controls, base, None)


def campaign(
    cuts: int, *, seed: int = 0, controls: Controls = Controls(), base: str | None = None
) -> PowerLossReport:
    """At least ``cuts`` random power cuts, one to three per scenario, half of them torn.

    The same ``seed`` replays the same cut schedule.
    """
    scratch = tempfile.mkdtemp(prefix="powerloss-ref-", dir=_scratch(base))
    try:
        total = len(reference_ops(scratch, controls=controls))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rng = random.Random(seed)

    def specs() -> Iterable[list[Cut]]:
        while True:
            yield [
                Cut(at=rng.randint(1, total), torn=rng.random() < 0.5, seed=rng.randrange(1 << 30))
                for _ in range(rng.choice((1, 1, 2, 3)))
            ]

    return _session(specs(), controls, base, cuts)
