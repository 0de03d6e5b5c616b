"""I/O faults: fail each fsync, fdatasync and write of a real ``run`` (or
``worker --drain``) in turn.

The CLI runs under ``strace -e inject=SYSCALL:error=ERRNO:when=N``: the N-th
call of that syscall is not made and returns the error instead. The calls are
first counted on an unfaulted run of the same task, then each is failed in
turn with ``EIO`` and with ``ENOSPC``. For every case:

- the fault was really injected (strace marks it ``INJECTED``);
- the run ends cleanly: exit 0 (the fault hit nothing that matters), 5
  (database unusable) or 6 (a commit, or an effect's durability, has an
  unknown outcome), with one ``ninelives: error:`` line and no traceback;
- no step it reported done is missing from the database afterwards;
- after a failed write or sync of a database file, no further transaction was
  attempted (no WAL frame written after it): a failed commit is never retried;
- a failed ``fsync`` (the database folder's, an artifact's or its folders')
  stops the run with exit 6: never retried, never ignored;
- ``PRAGMA integrity_check`` is ``ok``;
- the next ``run``, without faults, finishes the task exactly once: done,
  every step finished once, the artifact present once with the right bytes,
  no temporary file left, and ``verify`` finds nothing.

:func:`full_disk` does the same on a real, small tmpfs that fills up.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..tools.builtin import stub_summary
from .lab import SUMMARY_NOTES, Lab, Result, cli_command

SYSCALLS = ("fsync", "fdatasync", "write", "pwrite64")
ERRORS = ("EIO", "ENOSPC")
TASK_ID = "t"
CLEAN_EXITS = (0, 5, 6)
#: The commands a sweep can fault: each runs the lab's task ``t`` to the end.
COMMANDS: dict[str, tuple[str, ...]] = {
    "run": ("run", TASK_ID),
    "worker": ("worker", "--drain", "--poll", "0.05"),
}
_CALL = re.compile(r"^(?:\d+\s+)?(\w+)\((\d+)?")
_OPENED = re.compile(r'openat\([^"]*"([^"]+)".*\)\s+=\s+(\d+)')
_DONE_LINE = re.compile(rf"^{TASK_ID}: step (\d+) \S+ done ")


class StraceMissing(RuntimeError):
    """``strace`` is not installed: I/O faults cannot be injected."""


def strace_path() -> str:
    """The ``strace`` binary, or :class:`StraceMissing`."""
    found = shutil.which("strace")
    if found is None:
        raise StraceMissing("strace is not installed (Debian/Ubuntu: apt-get install strace)")
    return found


@dataclass(frozen=True, kw_only=True)
class FaultCase:
    """Fail call number ``when`` of ``syscall`` with ``error``."""

    syscall: str
    error: str
    when: int

    def __str__(self) -> str:
        return f"{self.syscall}#{self.when}={self.error}"


@dataclass(frozen=True, kw_only=True)
class FaultOutcome:
    """One faulted run and its resume, checked."""

    case: FaultCase
    exit_code: int
    target: str
    problems: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class FaultReport:
    """Every case of a sweep. ``ok`` is the verdict."""

    counts: dict[str, int]
    errors: tuple[str, ...]
    outcomes: tuple[FaultOutcome, ...]
    elapsed: float

    @property
    def faults(self) -> int:
        """Faulted runs made."""
        return len(self.outcomes)

    @property
    def problems(self) -> list[str]:
        """Every problem, prefixed with its case."""
        return [f"{o.case}: {p}" for o in self.outcomes for p in o.problems]

    @property
    def ok(self) -> bool:
        """True when every case ended cleanly and resumed exactly once."""
        return not self.problems

    def exit_codes(self) -> dict[int, int]:
        """How many faulted runs ended with each exit code."""
        return dict(Counter(o.exit_code for o in self.outcomes))

    def summary_lines(self) -> list[str]:
        """A few lines for people."""
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(self.exit_codes().items()))
        lines = [
            f"I/O faults: {self.faults} ({counts} calls x {'/'.join(self.errors)}), "
            f"{self.elapsed:.1f}s; exit codes {codes}",
            f"problems: {len(self.problems)}",
        ]
        return lines + [f"  {p}" for p in self.problems[:10]]


def prepare_lab(folder: Path) -> Lab:
    """A lab with the guide's input and plan and the task ``t`` created, in the
    default queue (so that ``run`` and ``worker`` alike can run it)."""
    lab = Lab(folder)
    plan = lab.guide_setup()
    created = lab.cli("create", TASK_ID, plan.name, "--enqueue")
    if created.returncode != 0:
        raise RuntimeError(f"create failed: {created.stderr.strip()}")
    return lab


def _traced(
    lab: Lab,
    log: Path,
    syscalls: Iterable[str],
    inject: str | None,
    runner: Sequence[str] | None = None,
    command: str = "run",
) -> Result:
    # openat names the fds; pwrite64 shows whether a transaction followed a fault.
    names = ",".join(sorted({*syscalls, "openat", "pwrite64"}))
    argv = [strace_path(), "-f", "-qq", "-o", str(log), "-e", f"trace={names}"]
    if inject is not None:
        argv += ["-e", f"inject={inject}"]
    traced = Lab(lab.root, db=lab.db, command=[*argv, *(runner or cli_command())])
    return traced.cli(*COMMANDS[command])


def count_calls(
    lab: Lab, syscalls: Sequence[str] = SYSCALLS, command: str = "run"
) -> dict[str, int]:
    """How often an unfaulted ``run`` (or ``command``) of the lab's task makes each syscall.

    The lab's folder is used up (the task runs to the end).
    """
    log = lab.root / "count.strace"
    result = _traced(lab, log, syscalls, None, command=command)
    if result.returncode != 0:
        raise RuntimeError(f"unfaulted run failed: {result.stderr.strip()}")
    counts = Counter(
        m.group(1) for line in log.read_text().splitlines() if (m := _CALL.match(line))
    )
    return {name: counts.get(name, 0) for name in syscalls}


def _db_fds(log_lines: list[str]) -> dict[int, str]:
    fds: dict[int, str] = {}
    for line in log_lines:
        m = _OPENED.search(line)
        if m:
            fds[int(m.group(2))] = os.path.basename(m.group(1))
    return fds


def _fault_target(log_lines: list[str], case: FaultCase) -> tuple[int | None, str]:
    """Index of the injected line and the file its fd named (as opened so far)."""
    for i, line in enumerate(log_lines):
        if "(INJECTED)" in line:
            m = _CALL.match(line)
            fd = int(m.group(2)) if m and m.group(2) else -1
            return i, _db_fds(log_lines[:i]).get(fd, f"fd {fd}")
    return None, ""


def check_case(
    folder: Path, case: FaultCase, runner: Sequence[str] | None = None, command: str = "run"
) -> FaultOutcome:
    """Run the lab's task in ``folder`` with ``case`` injected, then resume and check.

    ``runner`` replaces the ``ninelives`` command for the faulted run (negative
    controls run a deliberately broken runner); ``command`` is ``run`` or
    ``worker`` (``worker --drain``); the resume is always a real ``run``.
    """
    lab = Lab(folder)
    log = folder / "fault.strace"
    inject = f"{case.syscall}:error={case.error}:when={case.when}"
    faulted = _traced(lab, log, [case.syscall], inject, runner, command)
    lines = log.read_text().splitlines()
    at, target = _fault_target(lines, case)
    problems: list[str] = []
    if at is None:
        problems.append("the fault was not injected (fewer calls than counted)")
    code = faulted.returncode
    if code not in CLEAN_EXITS:
        problems.append(f"faulted run exited {code}: {faulted.stderr.strip()[-300:]}")
    if "Traceback" in faulted.stderr:
        problems.append("faulted run printed a traceback")
    last = faulted.stderr.strip().splitlines()[-1:] or [""]
    if code != 0 and not last[0].startswith("ninelives: error:"):
        problems.append(f"faulted run did not end with one error line: {faulted.stderr!r}")
    if at is not None and target.startswith("state.db") and _wal_written_after(lines, at):
        problems.append("a transaction was written after the failed database write or sync")
    if at is not None and case.syscall == "fsync" and code != 6:
        # Every fsync of a run is ninelives' own (SQLite syncs with fdatasync):
        # the database folder's, and an artifact's file and folders. A failed
        # one leaves durability unknown: the run must stop at once, exit 6.
        problems.append(
            f"the failed fsync of {target} did not stop the run (exit {code}, not 6): "
            "it was retried or ignored"
        )
    reported = _reported_done([faulted])
    problems += _check_db(folder, reported, "after the faulted run")
    resumed = lab.cli("run", TASK_ID)
    if resumed.returncode != 0:
        problems.append(f"resume exited {resumed.returncode}: {resumed.stderr.strip()[-300:]}")
    problems += _check_done(lab)
    return FaultOutcome(case=case, exit_code=code, target=target, problems=tuple(problems))


def _wal_written_after(lines: list[str], at: int) -> bool:
    """True if a WAL frame was written after log line ``at`` (a new transaction)."""
    wal = {fd for fd, name in _db_fds(lines).items() if name == "state.db-wal"}
    for line in lines[at + 1 :]:
        m = _CALL.match(line)
        if m and m.group(1) == "pwrite64" and m.group(2) and int(m.group(2)) in wal:
            return True
    return False


def _reported_done(results: Iterable[Result]) -> set[int]:
    """Steps the runs printed as done."""
    return {
        int(m.group(1))
        for r in results
        for line in r.stderr.splitlines()
        if (m := _DONE_LINE.match(line))
    }


def _check_db(folder: Path, reported_done: set[int], when: str) -> list[str]:
    db = folder / "state.db"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        check = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        done = {r[0] for r in conn.execute("SELECT idx FROM steps WHERE status = 'done'")}
    finally:
        conn.close()
    problems = [] if check == ["ok"] else [f"{when}: integrity_check {check[:3]}"]
    if not reported_done <= done:
        problems.append(f"{when}: steps {sorted(reported_done - done)} reported done, not stored")
    return problems


def _check_done(lab: Lab) -> list[str]:
    """The task is done exactly once: statuses, journal, artifact, ``verify``'s checks."""
    from ..store import open_store
    from ..verify import verify_store

    store = open_store(str(lab.root / "state.db"), create=False)
    try:
        task = store.get_task(TASK_ID)
        events = store.events(TASK_ID)
        report = verify_store(store, [TASK_ID], artifacts=str(lab.artifacts_dir))
    finally:
        store.close()
    if task.status.value != "done":
        return [f"task is {task.status.value} after the resume"]
    problems = [f"verify: {v}" for v in report.violations]
    finished = Counter(e.step_idx for e in events if e.kind == "step_finished")
    if finished != Counter({0: 1, 1: 1, 2: 1}):
        problems.append(f"step_finished per step {dict(finished)}, not once each")
    expected = {f"{TASK_ID}-2.md": stub_summary(SUMMARY_NOTES)}
    if lab.artifacts() != expected:
        problems.append(f"artifacts {lab.artifacts()!r} != {expected!r}")
    return problems


def sweep(
    *,
    syscalls: Sequence[str] = SYSCALLS,
    errors: Sequence[str] = ERRORS,
    workers: int = 2,
    base: str | None = None,
    select: Callable[[FaultCase], bool] | None = None,
    runner: Sequence[str] | None = None,
    command: str = "run",
) -> FaultReport:
    """Fail every call of ``syscalls`` made by one ``run`` (or ``worker --drain``
    with ``command="worker"``), in turn, with each error.

    ``select`` keeps only some cases; ``runner`` and ``command`` are passed to
    :func:`check_case`.
    """
    start = time.monotonic()
    # The injected errors do not depend on the medium: a RAM-backed folder,
    # when there is one, keeps the real fsyncs of the other calls cheap.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="iofault-", dir=base or shm))
    try:
        counts = count_calls(prepare_lab(root / "count"), syscalls, command)
        cases = [
            FaultCase(syscall=s, error=e, when=n)
            for s in syscalls
            for n in range(1, counts[s] + 1)
            for e in errors
        ]
        cases = [c for c in cases if select is None or select(c)]

        def one(item: tuple[int, FaultCase]) -> FaultOutcome:
            # Each case creates its own task rather than copying one: a task
            # records its artifacts folder at create, so copies would all
            # publish into (and race on) the first folder's.
            folder = prepare_lab(root / f"case{item[0]}").root
            outcome = check_case(folder, item[1], runner, command)
            if not outcome.problems:
                shutil.rmtree(folder, ignore_errors=True)
            return outcome

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            outcomes = tuple(pool.map(one, enumerate(cases)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return FaultReport(
        counts=counts, errors=tuple(errors), outcomes=outcomes, elapsed=time.monotonic() - start
    )


# -- a real full disk ------------------------------------------------------------


class SmallDiskUnavailable(RuntimeError):
    """No small file system can be mounted here (needs root, or user namespaces)."""


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` (``mount -o size=``) at ``path``, unmounted afterwards.

    Needs root (or CAP_SYS_ADMIN); :func:`full_disk` falls back to a user and
    mount namespace when it is not root.
    """
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        raise SmallDiskUnavailable(f"mount -t tmpfs failed: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, check=False)


def fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` with a file until writes fail, then free ``leave`` bytes of it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    chunk = b"\xff" * 65536
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    chunk = chunk[:4096]
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 4096:
                    break
                chunk = chunk[:4096]
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


@dataclass(frozen=True, kw_only=True)
class FullDiskOutcome:
    """One run on a disk that filled up, then the resume once space was freed."""

    name: str
    free: int
    exit_codes: tuple[int, ...]
    messages: tuple[str, ...]
    problems: tuple[str, ...]


def _clean_exit(result: Result, what: str) -> list[str]:
    problems = []
    if result.returncode not in CLEAN_EXITS:
        problems.append(f"{what} exited {result.returncode}: {result.stderr.strip()[-300:]}")
    if "Traceback" in result.stderr:
        problems.append(f"{what} printed a traceback")
    last = result.stderr.strip().splitlines()[-1:] or [""]
    if result.returncode != 0 and not last[0].startswith("ninelives: error:"):
        problems.append(f"{what} did not end with one error line: {result.stderr!r}")
    return problems


def full_disk_case(
    disk: Path,
    name: str,
    leave: int,
    *,
    artifacts_disk: Path | None = None,
    leftover_temp: bool = False,
) -> FullDiskOutcome:
    """Create the task on ``disk``, fill ``disk`` (or ``artifacts_disk``, where the
    artifacts then go) leaving ``leave`` bytes, run twice, free the space, resume.

    With ``leftover_temp`` a run is first SIGKILLed with its artifact written but
    not linked, so a temporary file waits for the next start to remove it.
    """
    env = {"AGENT_ARTIFACTS": str(artifacts_disk / "artifacts")} if artifacts_disk else {}
    lab = Lab(disk / name, base_env=env)
    created = lab.cli("create", TASK_ID, lab.guide_setup().name)
    problems: list[str] = []
    if created.returncode != 0:
        failed = f"create failed: {created.stderr.strip()}"
        return FullDiskOutcome(
            name=name, free=leave, exit_codes=(), messages=(), problems=(failed,)
        )
    if leftover_temp:
        killed = lab.cli("run", TASK_ID, AGENT_CRASH_AT="artifact_before_link:2")
        temps = [n for n in lab.artifacts() if n.endswith(".tmp")]
        if killed.returncode != -9 or len(temps) != 1:
            problems.append(f"the killed run left {temps} (exit {killed.returncode})")
    filler = fill(artifacts_disk or disk, leave)
    runs = [lab.cli("run", TASK_ID) for _ in range(2)]
    for n, result in enumerate(runs, start=1):
        problems += _clean_exit(result, f"run {n} on the full disk")
    reported = _reported_done(runs)
    filler.unlink()
    problems += _check_db(lab.root, reported, "once space was freed")
    resumed = lab.cli("run", TASK_ID)
    if resumed.returncode != 0:
        problems.append(f"resume exited {resumed.returncode}: {resumed.stderr.strip()[-300:]}")
    problems += _check_done(lab)
    messages = tuple(r.stderr.strip().splitlines()[-1] for r in runs if r.returncode != 0)
    return FullDiskOutcome(
        name=name,
        free=leave,
        exit_codes=tuple(r.returncode for r in runs),
        messages=messages,
        problems=tuple(problems),
    )


#: Free bytes left on the database's disk: the run fails at different commits.
FREE_LEVELS = (0, 4096, 8192, 16384, 32768, 49152, 65536, 98304, 131072, 163840)


def full_disk(
    base: str | None = None, *, levels: Sequence[int] = FREE_LEVELS
) -> list[FullDiskOutcome]:
    """Every full-disk case: the database's disk full at each of ``levels``, the
    artifacts' own disk full, and a leftover temporary file on a full disk.

    Runs in this process as root; otherwise inside ``unshare --user
    --map-root-user --mount`` (this module run as a script), else raises
    :class:`SmallDiskUnavailable`.
    """
    if os.geteuid() != 0:
        return _full_disk_unshared(base, levels)
    root = Path(tempfile.mkdtemp(prefix="fulldisk-", dir=base))
    outcomes = []
    try:
        for n, leave in enumerate(levels):
            with small_disk(root / f"d{n}", "1m") as disk:
                outcomes.append(full_disk_case(disk, f"free{leave}", leave))
        with small_disk(root / "db", "2m") as disk, small_disk(root / "art", "64k") as art:
            outcomes.append(full_disk_case(disk, "artifacts-full", 0, artifacts_disk=art))
        with small_disk(root / "tmp", "1m") as disk:
            outcomes.append(full_disk_case(disk, "leftover-temp", 0, leftover_temp=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return outcomes


def _full_disk_unshared(base: str | None, levels: Sequence[int]) -> list[FullDiskOutcome]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SmallDiskUnavailable("not root, and unshare(1) is not installed")
    script = [sys.executable, "-m", __name__, "--levels", ",".join(map(str, levels))]
    command = [unshare, "--user", "--map-root-user", "--mount", "--", *script]
    if base is not None:
        command += ["--base", base]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SmallDiskUnavailable(f"unshare failed: {done.stderr.strip()[-500:]}")
    return [
        FullDiskOutcome(
            name=str(row["name"]),
            free=int(row["free"]),
            exit_codes=tuple(row["exit_codes"]),
            messages=tuple(row["messages"]),
            problems=tuple(row["problems"]),
        )
        for row in json.loads(done.stdout)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ninelives.testing.iofault``: the full-disk cases, as JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ninelives.testing.iofault")
    parser.add_argument("--levels", default=",".join(map(str, FREE_LEVELS)))
    parser.add_argument("--base")
    args = parser.parse_args(argv)
    outcomes = full_disk(args.base, levels=[int(x) for x in args.levels.split(",")])
    print(json.dumps([dataclasses.asdict(o) for o in outcomes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
