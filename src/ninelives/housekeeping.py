"""Housekeeping: ``ls``, ``gc`` and ``doctor`` over any store.

``gc`` deletes finished tasks (``done``, ``failed``, ``cancelled``) last changed
before a cutoff, with their steps and journal, in bounded batches: each batch
is one short transaction (journal, then steps, then the task), so it never
holds the write lock for long and a kill leaves every task whole or gone.
A task that is not finished (``pending``, ``running``, ``blocked``,
``waiting``) is never touched, nor one a live runner holds. Artifacts are the
user's output, not the runtime's state: gc leaves them where they are.

``doctor`` reports what is wrong with a database and the folders beside it,
one :class:`Finding` each, with the command that fixes it; it writes nothing
unless asked to fix.

Blobs (large outputs kept out of the row, :mod:`ninelives.blobs`) plug in
through two hooks, :func:`sweep_blobs` (called once by ``gc`` after its last
batch, so that no blob a row still names is removed) and :func:`blob_findings`
(called by ``doctor``): blobs nobody refers to past the grace time, temporary
files whose writer is gone, and referenced blobs missing or damaged.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError, StoreError
from .locking import (
    BLOBS_LOCK,
    TASK_LOCK_NAME,
    lock_folder,
    lock_path,
    odd_lock_files,
)
from .models import StepStatus, TaskStatus, is_workflow

#: The statuses a task never leaves by itself: the only ones gc deletes.
FINISHED = (TaskStatus.DONE.value, TaskStatus.FAILED.value, TaskStatus.CANCELLED.value)
#: Tasks per gc transaction: small enough that runners wait milliseconds for the lock.
GC_BATCH = 500
#: A temporary artifact file older than this is an orphan: a live write links
#: or removes its temporary file within moments.
TEMP_AGE = 15 * 60.0
#: A write-ahead log above this size is reported (a checkpoint is overdue).
WAL_LIMIT = 64 * 1024 * 1024

#: The longest duration accepted (about 1000 years): longer is a typo, and
#: ``now - duration`` must stay a finite timestamp.
MAX_DURATION_DAYS = 365_000
MAX_DURATION = MAX_DURATION_DAYS * 86400.0
#: More digits than this cannot be under MAX_DURATION in any unit.
_MAX_DIGITS = 12

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
#: The temporary names of ninelives.tools.effects.publish_once.
_TEMP = re.compile(r"\..+\.[0-9a-f]{16}\.tmp")


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``15m``, ``0s`` (also ``1h30m``); InputError otherwise."""
    # [0-9], not \d: \d also takes other scripts' digits ("\u0661s" read as 1s),
    # which the one rule for numbers (settings.env_number) refuses.
    parts = re.findall(r"([0-9]+)([smhdw])", text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise InputError(
            f"duration {text!r} is not a number of s, m, h, d or w (such as 30d, 12h, 15m, 0s)"
        )
    # Count the digits before converting: int() of thousands of digits raises
    # ValueError, and a huge int overflows the float the sum is kept in.
    if any(len(n.lstrip("0")) > _MAX_DIGITS for n, _ in parts):
        raise _too_long(text)
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds > MAX_DURATION:
        raise _too_long(text)
    return seconds


def _too_long(text: str) -> InputError:
    shown = text if len(text) <= 40 else text[:37] + "..."
    return InputError(f"duration {shown!r} is too long (at most {MAX_DURATION_DAYS}d)")


def parse_statuses(text: str, allowed: Sequence[str]) -> list[str]:
    """A comma-separated list of statuses, each one of ``allowed``; InputError otherwise."""
    statuses = [s.strip() for s in text.split(",") if s.strip()]
    wrong = [s for s in statuses if s not in allowed]
    if not statuses or wrong:
        raise InputError(
            f"status {', '.join(wrong) or repr(text)} is not one of {', '.join(allowed)}"
        )
    return list(dict.fromkeys(statuses))


# -- gc ---------------------------------------------------------------------------


@dataclass
class GcReport:
    """What a gc removed (or, with ``dry_run``, would remove)."""

    dry_run: bool
    #: ``(task id, status)`` in the order removed.
    removed: list[tuple[str, str]] = field(default_factory=list)
    steps: int = 0
    events: int = 0
    batches: int = 0
    #: Candidates left because a live runner held them or they changed meanwhile.
    skipped: int = 0
    blobs: list[str] = field(default_factory=list)
    #: Temporary blob files whose writer was gone (a run killed while storing one).
    temps: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The ``gc --json`` view."""
        return {
            "dry_run": self.dry_run,
            "tasks": len(self.removed),
            "steps": self.steps,
            "events": self.events,
            "batches": self.batches,
            "skipped": self.skipped,
            "blobs": self.blobs,
            "temps": self.temps,
            "removed": [{"task": t, "status": s} for t, s in self.removed],
        }


def gc(
    store: Any,
    *,
    older_than: float,
    statuses: Sequence[str] = FINISHED,
    dry_run: bool = False,
    batch: int = GC_BATCH,
    now: float | None = None,
    progress: Callable[[list[tuple[str, str]]], None] | None = None,
) -> GcReport:
    """Delete finished tasks of ``statuses`` last changed more than ``older_than``
    seconds ago, with their steps and journal, ``batch`` tasks per transaction;
    then sweep the blobs nothing references any more. ``progress`` is called
    with each batch removed (so a kill mid-gc leaves a record of what went)."""
    for status in statuses:
        if status not in FINISHED:
            raise InputError(
                f"gc deletes only finished tasks ({', '.join(FINISHED)}), not {status}"
            )
    before = (time.time() if now is None else now) - older_than
    report = GcReport(dry_run=dry_run)
    for status in statuses:
        for page in _pages(store, status, before, batch):
            ids = [task_id for task_id, _ in page]
            if dry_run:
                gone = ids
            else:
                deleted = store.delete_tasks(ids, [status], before)
                gone = list(deleted.tasks)
                report.steps += deleted.steps
                report.events += deleted.events
                report.skipped += len(ids) - len(gone)
            report.batches += 1
            done = [(task_id, status) for task_id in gone]
            report.removed.extend(done)
            if progress is not None and done:
                progress(done)
    report.blobs, report.temps = sweep_blobs(store, dry_run=dry_run, now=now)
    return report


def _pages(store: Any, status: str, before: float, batch: int) -> Iterator[list[tuple[str, float]]]:
    # A cursor over (updated_at, id), so that tasks left (held, changed) are
    # passed, not read again forever, and a dry run walks every candidate.
    after: tuple[float, str] = (float("-inf"), "")
    while True:
        page = store.gc_candidates(status, before, after=after, limit=batch)
        if not page:
            return
        yield page
        after = (page[-1][1], page[-1][0])
        if len(page) < batch:
            return


def sweep_blobs(
    store: Any, *, dry_run: bool, now: float | None = None
) -> tuple[list[str], list[str]]:
    """Hook for blobs: remove every blob no stored row references, last written
    over :data:`ninelives.blobs.GRACE` ago, and every temporary blob file whose
    writer is gone; return ``(hashes, temporary names)`` (with ``dry_run``,
    what would go).

    Called once by :func:`gc` after its last batch has committed, so a blob is
    only removed once no row can name it.
    """
    from . import blobs

    found = store.blobs
    cutoff = (time.time() if now is None else now) - blobs.GRACE
    if dry_run:
        stale = blobs.unreferenced(store, cutoff)
        return [b[0] for b in stale], [t[0] for t in found.temps(cutoff)]
    removed = blobs.sweep(store, now=now, temps=False)
    return removed, found.remove_temps(cutoff)


def blob_findings(store: Any, now: float) -> list[Finding]:
    """Hook for blobs: missing blobs and blobs whose content no longer matches
    their hash (``blob``), blobs nobody refers to past the grace time
    (``blob_orphan``) and temporary blob files whose writer is gone
    (``blob_temp``), as doctor findings, each with its fix.
    """
    from . import blobs

    found = store.blobs
    cutoff = now - blobs.GRACE
    findings = [
        Finding("blob", f"{ref.task_id} step {ref.step}", f"{blobs.describe(ref)}: {why}",
                "restore the blobs from a backup taken with the database "
                "(SQLite: the DB.blobs folder; PostgreSQL: the blobs tables)")
        for ref, why in blobs.damaged(store)
    ]  # fmt: skip
    for sha256, size, modified in blobs.unreferenced(store, cutoff):
        findings.append(
            Finding("blob_orphan", sha256,
                    f"blob of {size} bytes that no step refers to, "
                    f"{(now - modified) / 3600:.1f} h old",
                    "ninelives gc or ninelives doctor --fix (removes it)", fixable=True)
        )  # fmt: skip
    for name, size, _modified in found.temps(cutoff):
        findings.append(
            Finding("blob_temp", os.path.join(found.folder, name),
                    f"temporary blob file of {size} bytes whose writer is gone "
                    "(a run killed while storing a blob)",
                    "ninelives gc or ninelives doctor --fix (removes it)", fixable=True)
        )  # fmt: skip
    return findings


# -- doctor -----------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One thing doctor found wrong, and the command that fixes it."""

    kind: str
    subject: str
    detail: str
    fix: str
    #: ``doctor --fix`` repairs it by itself (else the fix is a command to run).
    fixable: bool = False
    #: The lease epoch a lease finding saw (its fix frees only that lease).
    epoch: int = 0

    def line(self) -> str:
        """The human line: what, where, and how to fix it."""
        return f"{self.kind}: {self.subject}: {self.detail} (fix: {self.fix})"

    def as_json(self) -> dict[str, Any]:
        """The ``doctor --json`` view."""
        return {"kind": self.kind, "subject": self.subject, "detail": self.detail,
                "fix": self.fix}  # fmt: skip


def doctor(
    store: Any, *, artifacts: str, now: float | None = None, fix: bool = False
) -> tuple[list[Finding], list[Finding]]:
    """Check ``store`` and the folders beside it; return ``(findings, fixed)``.

    ``artifacts`` is the default artifacts folder (tasks that recorded none
    publish there). With ``fix``, repairs what can be repaired safely (stale
    lock files, orphaned temporary files, an oversized WAL, expired leases of
    finished tasks) and returns what it repaired in ``fixed``; the findings
    are those that remain.
    """
    now = time.time() if now is None else now
    found = _findings(store, artifacts, now)
    if not fix:
        return found, []
    fixed = [f for f in found if f.fixable and _repair(store, f, now)]
    return _findings(store, artifacts, now), fixed


def _findings(store: Any, artifacts: str, now: float) -> list[Finding]:
    findings: list[Finding] = []
    stored, latest = store.schema_version()
    if stored != latest:
        findings.append(
            Finding("schema", store.url, f"schema version {stored}, this ninelives has {latest}",
                    "ninelives doctor --fix (migrates it)", fixable=stored < latest)
        )  # fmt: skip
    for problem in store.integrity_problems():
        findings.append(
            Finding("integrity", store.url, problem,
                    "restore a backup, or sqlite3 DB '.recover' into a new file")
        )  # fmt: skip
    if stored < 5:  # the columns below came with 0002-0005
        return findings
    local = store.local_files()
    wal = local.wal_bytes() if local is not None else 0
    if wal > WAL_LIMIT:
        findings.append(
            Finding("wal", store.url, f"write-ahead log is {wal} bytes",
                    "ninelives doctor --fix (checkpoints it)", fixable=True)
        )  # fmt: skip
    dangling = store.dangling_rows()
    if dangling:
        what = ", ".join(f"{n} {kind}" for kind, n in sorted(dangling.items()))
        findings.append(
            Finding("dangling", store.url, f"{what} of tasks that no longer exist",
                    "ninelives doctor --fix (deletes them)", fixable=True)
        )  # fmt: skip
    findings += _running(store, now)
    findings += _leases(store)
    findings += _lock_files(store)
    findings += _temp_files(store, artifacts, now)
    findings += blob_findings(store, now)
    return findings


def _running(store: Any, now: float) -> list[Finding]:
    found = []
    local = store.local_files()
    for hold in store.tasks_in_status(TaskStatus.RUNNING.value):
        if hold.queue is not None and _released_into_a_wait(store, hold.id, now):
            continue
        if local is not None:  # a kernel lock holds a running task, not a lease
            if local.is_held(hold.id):
                continue
            why = "no live process holds its lock"
        elif hold.lease_owner is None:
            why = "no lease holds it"
        elif hold.expired:
            why = f"the lease of {hold.lease_owner} expired"
        elif store.holder_gone(hold.id, hold.lease_epoch):
            why = f"the process holding its lease ({hold.lease_owner}) is gone"
        else:
            continue
        found.append(_stranded(store, hold.id, why))
    return found


def _stranded(store: Any, task_id: str, why: str) -> Finding:
    """The finding of a running task no process holds. A workflow's run also
    leaves it so when its code no longer matches its journal (exit 12): ``run``
    alone would only stop again, so replay-check comes first in its fix."""
    fix = f"ninelives run {task_id}"
    try:
        workflow = is_workflow(store.get_task(task_id).goal)
    except StoreError:  # damaged: reported for what it is elsewhere
        workflow = False
    if workflow:
        return Finding("running", task_id,
                       f"running, but {why} (its process died, or it stopped at exit 12)",
                       f"ninelives replay-check {task_id}, then {fix}")  # fmt: skip
    return Finding("running", task_id, f"running, but {why} (its process died)", fix)


def _released_into_a_wait(store: Any, task_id: str, now: float) -> bool:
    """Whether a queued task is held by no one because its worker released it
    into a wait (a backoff longer than ``--poll``, a workflow's ``ctx.sleep``):
    no step running and one not due yet. Workers claim it when due; nothing
    died, and ``run`` would only sleep out the wait."""
    try:
        steps = store.get_task(task_id).steps
    except StoreError:  # damaged: reported for what it is elsewhere
        return False
    if any(s.status is StepStatus.RUNNING for s in steps):
        return False
    return any(
        s.status is StepStatus.PENDING and s.not_before is not None and s.not_before > now
        for s in steps
    )


def _leases(store: Any) -> list[Finding]:
    found = []
    for task_id, status, epoch, owner, ago in store.expired_leases():
        if status in (TaskStatus.RUNNING.value,):
            continue  # reported as a running task with its fix
        fixable = status in FINISHED
        fix = "ninelives doctor --fix (frees it)" if fixable else f"ninelives run {task_id}"
        found.append(
            Finding("lease", task_id,
                    f"{status}, leased by {owner}, whose lease expired {ago:.0f} s ago "
                    "(a dead worker)", fix, fixable=fixable, epoch=epoch)
        )  # fmt: skip
    return found


def _lock_files(store: Any) -> list[Finding]:
    # Only task locks can be orphans: the blob store's lock (BLOBS_LOCK) is held
    # by every blob writer and sweep, and a name ninelives does not make is
    # not its to judge.
    local = store.local_files()
    if local is None:
        return []
    folder = lock_folder(local.path)
    odd = odd_lock_files(folder)
    # A symlink or a folder where a lock file goes fails every run that locks
    # through it; a person removes it (a folder may hold anything).
    found = [
        Finding("lock", os.path.join(folder, name),
                "a symlink or a folder where a lock file goes: every run locking through it fails",
                "remove it; ninelives recreates it")
        for name in odd
    ]  # fmt: skip
    names = [
        n for n in local.lock_files()
        if n != BLOBS_LOCK and re.fullmatch(TASK_LOCK_NAME, n) and n not in odd
    ]  # fmt: skip
    if not names:
        return found
    known = {os.path.basename(lock_path(local.path, task_id)) for task_id in store.task_ids()}
    return found + [
        Finding("lock", name, "lock file of a task that no longer exists",
                "ninelives doctor --fix (removes it)", fixable=True)
        for name in names
        if name not in known
    ]  # fmt: skip


def _temp_files(store: Any, artifacts: str, now: float) -> list[Finding]:
    folders = {os.path.abspath(artifacts), *store.artifact_folders()}
    local = store.local_files()
    if local is not None:
        folders.add(os.path.dirname(local.path))
    found = []
    for folder in sorted(folders):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not _TEMP.fullmatch(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            # Temporary files are regular files: a folder so named is not ours to remove.
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= TEMP_AGE:
                found.append(
                    Finding("temp", entry.path,
                            f"orphaned temporary file, {(now - st.st_mtime) / 3600:.1f} h old",
                            "ninelives doctor --fix (removes it)", fixable=True)
                )  # fmt: skip
    return found


def _repair(store: Any, finding: Finding, now: float) -> bool:
    from .blobs import GRACE

    if finding.kind == "blob_orphan":  # deleted only if still unwritten since
        store.blobs.delete(finding.subject, now - GRACE)
        return True
    if finding.kind == "blob_temp":  # removed only if its writer is still gone
        return bool(store.blobs.remove_temp(os.path.basename(finding.subject), now - GRACE))
    if finding.kind == "schema":
        return True  # opening the store for writing migrated it
    if finding.kind == "dangling":
        store.delete_dangling()
        return True
    if finding.kind == "wal":
        return bool(store.checkpoint_wal())
    if finding.kind == "lock":
        return bool(store.remove_lock_file(finding.subject))
    if finding.kind == "temp":
        try:
            os.unlink(finding.subject)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True
    if finding.kind == "lease":
        return bool(store.clear_expired_lease(finding.subject, finding.epoch))
    return False
