"""A throwaway PostgreSQL cluster for the test session (and the benchmarks).

:func:`start_server` returns a :class:`PgServer`: the server named by
``NINELIVES_TEST_PG_URL`` when set, otherwise a fresh cluster made with the
machine's ``initdb``/``pg_ctl`` (or, on a machine without PostgreSQL binaries,
those bundled by the ``pgserver`` wheel). PostgreSQL refuses to run as root, so
as root the cluster belongs to a dedicated unprivileged user, ``ninelives-test``
(created with ``useradd`` when missing), and its commands run as that user.
Every failure raises :class:`PgUnavailable`: the callers turn it into a failed
test, never a skip.

The test cluster runs with ``fsync=off``: the suites kill processes, not the
machine, and a killed process never loses what it handed to the kernel. The
benchmarks, and the few tests marked ``fsync_on`` (a second, session-scoped
cluster), ask for ``durable=True``, the server's defaults.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

TEST_USER = "ninelives-test"
_counter = itertools.count(1)


class PgUnavailable(RuntimeError):
    """PostgreSQL cannot be started or reached: the PostgreSQL tests must fail."""


def find_bin_dir() -> Path:
    """The folder with ``initdb``, ``pg_ctl`` and ``postgres``."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "pg_ctl")):
            return Path(candidate)
    # The pgserver wheel bundles a server; only its files are used, not its code.
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise PgUnavailable(
            "no PostgreSQL binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql, and the "
            "'pgserver' wheel is not installed: install one, or set NINELIVES_TEST_PG_URL"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (folder / "pg_ctl").exists():
        raise PgUnavailable(f"pgserver is installed but has no pg_ctl in {folder}")
    return folder


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ensure_user() -> str:
    """The unprivileged account that owns the cluster when we are root."""
    import pwd

    try:
        pwd.getpwnam(TEST_USER)
        return TEST_USER
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    proc = subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in (0, 9):  # 9: created meanwhile by a parallel session
        raise PgUnavailable(f"useradd {TEST_USER} failed: {proc.stderr.strip()}")
    return TEST_USER


class PgServer:
    """A reachable server on which tests create and drop their own databases."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._admin: object | None = None
        self._free: list[str] = []
        self._made: list[str] = []

    def url(self, dbname: str) -> str:
        """``admin_url`` with its database replaced by ``dbname``."""
        parts = urlsplit(self.admin_url)
        return urlunsplit(parts._replace(path="/" + quote(dbname)))

    def _conn(self) -> object:
        import psycopg

        if self._admin is None or self._admin.closed:  # type: ignore[attr-defined]
            try:
                self._admin = psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10)
            except psycopg.Error as exc:
                raise PgUnavailable(f"cannot connect to {self.admin_url}: {exc}") from exc
        return self._admin

    def execute(self, statement: str) -> None:
        """Run one statement on the admin connection (autocommit)."""
        self._conn().execute(statement)  # type: ignore[attr-defined]

    def execute_scalar(self, statement: str) -> object:
        """The first column of the first row of one statement on the admin connection."""
        row = self._conn().execute(statement).fetchone()  # type: ignore[attr-defined]
        return None if row is None else row[0]

    def create_database(self, prefix: str = "nl") -> str:
        """An empty database of its own for one user; returns its name.

        CREATE DATABASE costs a checkpoint or a WAL copy of the template (a few
        hundred milliseconds once the server is busy), so a database given back
        with :meth:`recycle` is emptied and handed out again instead.
        """
        if self._free:
            return self._free.pop()
        name = f"{prefix}_{os.getpid()}_{next(_counter)}"
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        self._made.append(name)
        return name

    def recycle(self, name: str) -> None:
        """Empty a database for its next user: end its sessions (their advisory
        locks die with them) and replace its public schema; drop it if that fails."""
        import psycopg

        try:
            self.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
            gone = wait_until(lambda: not self._sessions(name), timeout=10)
            if not gone:
                raise PgUnavailable(f"sessions of {name} did not end")
            with psycopg.connect(self.url(name), autocommit=True) as conn:
                conn.execute("DROP SCHEMA public CASCADE")
                conn.execute("CREATE SCHEMA public")
        except Exception:
            self.drop_database(name)
            return
        self._free.append(name)

    def _sessions(self, name: str) -> int:
        cur = self._conn().execute(  # type: ignore[attr-defined]
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        return int(cur.fetchone()[0])

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever still uses it."""
        with contextlib.suppress(Exception):
            self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Drop the databases made here and close the admin connection (an
        external server is left running)."""
        if self._admin is not None and self.admin_url:
            for name in self._made:
                self.drop_database(name)
        self._made.clear()
        self._free.clear()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()  # type: ignore[attr-defined]
            self._admin = None


class PgCluster(PgServer):
    """A cluster of our own in a temporary folder, stopped and removed by :meth:`stop`."""

    def __init__(
        self,
        *,
        durable: bool = False,
        listen: Sequence[str] = ("127.0.0.1",),
        max_connections: int = 200,
    ) -> None:
        self.bin_dir = find_bin_dir()
        self.durable = durable
        self.listen = tuple(listen)
        self.max_connections = max_connections
        self.user = _ensure_user() if os.geteuid() == 0 else None
        # Under /tmp, not pytest's 0700 folders: the cluster's owner must reach it.
        self.root = Path(tempfile.mkdtemp(prefix="ninelives-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log = self.root / "server.log"
        self.port = 0
        self.running = False
        super().__init__("")

    def _cmd(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        # As root, run as the cluster's owner (what `runuser -u USER --` does).
        drop: dict[str, Any] = {}
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            drop = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
            **drop,
        )

    def start(self) -> PgCluster:
        """initdb, configure and start; raises :class:`PgUnavailable` with the server log."""
        self.socket_dir.mkdir()
        os.chmod(self.root, 0o755)
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            for path in (self.root, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        init = self._cmd(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--locale=C", *([] if self.durable else ["--no-sync"]),
        )  # fmt: skip
        if init.returncode != 0:
            raise PgUnavailable(f"initdb failed: {init.stderr.strip() or init.stdout.strip()}")
        last_error = ""
        for _ in range(5):  # a port picked free may be taken before the server binds it
            self.port = free_port()
            self._configure()
            proc = self._cmd(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"
            )
            if proc.returncode == 0:
                self.running = True
                self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
                self._conn()
                return self
            last_error = self._log_tail()
        self.stop()
        raise PgUnavailable(f"PostgreSQL did not start: {last_error}")

    def _configure(self) -> None:
        settings = {
            "port": str(self.port),
            "listen_addresses": "'" + ",".join(self.listen) + "'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": str(self.max_connections),
            "shared_buffers": "'64MB'",
            "log_min_messages": "'warning'",
        }
        if not self.durable:
            settings.update(fsync="off", full_page_writes="off", synchronous_commit="on")
        conf = "".join(f"{key} = {value}\n" for key, value in settings.items())
        auto = self.data / "postgresql.auto.conf"
        auto.write_text("# written by tests/pgcluster.py\n" + conf, encoding="utf-8")
        hba = self.data / "pg_hba.conf"
        # trust, but only over the socket, loopback and the test namespaces' link
        # addresses (10.231.0.0/16) that the network-partition test creates.
        hba.write_text(
            "local all all trust\n"
            "host all all 127.0.0.1/32 trust\n"
            "host all all 10.231.0.0/16 trust\n",
            encoding="utf-8",
        )

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no server log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def halt(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session ends, as in a restart); keep its data."""
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()  # type: ignore[attr-defined]
            self._admin = None
        proc = self._cmd("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        if proc.returncode != 0:
            raise PgUnavailable(f"pg_ctl stop failed: {proc.stderr.strip()}")
        self.running = False

    def resume(self) -> None:
        """Start the halted server again, on the same port and data."""
        proc = self._cmd(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"
        )
        if proc.returncode != 0:
            raise PgUnavailable(f"PostgreSQL did not start again: {self._log_tail()}")
        self.running = True
        self._conn()

    def restart(self, mode: str = "fast") -> None:
        """A server restart: every session and session advisory lock ends; data stays."""
        self.halt(mode)
        self.resume()

    def stop(self) -> None:
        """Stop the server at once and remove its folder; idempotent."""
        self._made.clear()  # no need to drop them one by one
        super().stop()
        if self.running:
            self._cmd("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)


def start_server(*, durable: bool = False, listen: Sequence[str] = ("127.0.0.1",)) -> PgServer:
    """The server for this session: ``NINELIVES_TEST_PG_URL`` or a cluster of our own."""
    url = os.environ.get("NINELIVES_TEST_PG_URL")
    if url:
        server = PgServer(url)
        server._conn()
        return server
    return PgCluster(durable=durable, listen=listen).start()


@contextlib.contextmanager
def running_cluster(**options: object) -> Iterator[PgCluster]:
    """A cluster of our own for one block (always ours, whatever the environment says)."""
    cluster = PgCluster(**options)  # type: ignore[arg-type]
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def wait_until(predicate: object, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]
