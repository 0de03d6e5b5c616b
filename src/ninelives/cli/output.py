"""Everything the ``ninelives`` command writes: stdout and stderr lines, the
escaping of stored text, colour, password redaction, the live progress bar,
and the opening of files a command writes (``report -o``).

Output follows the usual Unix rules: a reader that goes away (EPIPE) raises
:class:`BrokenPipeError`; output that cannot be written (ENOSPC, EIO, a
closed stdout) raises :class:`~ninelives.errors.OutputFailed`. Standard
library only, as the rest of the command's start-up path.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import OutputFailed
from ..humanize import UNSAFE, visible

#: Stored text with every character a terminal would act on escaped: one rule
#: with the web view and the report (:func:`ninelives.humanize.visible`).
printable = visible


def _json_escape(match: Any) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_line(value: Any) -> str:
    """``value`` as one line of JSON in which no character can act on a terminal.

    ``json.dumps`` already escapes C0 controls; C1 controls, DEL and the
    bidirectional formats are escaped as ``\\uXXXX`` too: the same JSON value.
    Non-finite numbers of rows written before they were refused print as ``null``.
    """

    from ..journal import printable_json

    text = re.sub(UNSAFE, _json_escape, printable_json(value))
    if _NARROW_STDOUT:
        # Outside strings JSON is ASCII, so every other character is in one.
        text = re.sub("[^\x00-\x7f]", _json_ascii, text)
    return text


def _json_ascii(match: Any) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: a UTF-16 surrogate pair, as JSON spells it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


#: Whether stdout's encoding cannot write every character (``PYTHONIOENCODING=ascii``,
#: a Latin-1 locale): JSON is then written in ASCII, with ``\\uXXXX`` escapes.
_NARROW_STDOUT = False


def fit_stdout() -> None:
    """Make a stdout whose encoding cannot write all of Unicode escape what it
    cannot write (``\\xe9``; JSON as ``\\u00e9``), instead of failing with
    UnicodeEncodeError halfway through a command's output."""
    import codecs

    global _NARROW_STDOUT
    stream = sys.stdout
    try:
        name = codecs.lookup(stream.encoding).name
    except (AttributeError, LookupError, TypeError):
        return  # no stdout, or not a text stream of a known encoding
    _NARROW_STDOUT = not name.startswith("utf")
    if _NARROW_STDOUT:
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            pass


def _no_secrets(text: str) -> str:
    return text


#: Removes database passwords from every line this process prints (see :func:`redactor`).
_scrub: Callable[[str], str] = _no_secrets


def scrub(text: str) -> str:
    """``text`` without the passwords of the databases this command was given."""
    return _scrub(text)


def redactor(argv: Sequence[str]) -> Callable[[str], str]:
    """A scrubber for the passwords of every URL (or libpq keyword string) this
    command was given.

    The store already keeps them out of its messages; this is the last line
    before the terminal, for anything that echoes its input (a URL given
    where a task id was expected, say).
    """
    urls = []
    for text in (*argv, os.environ.get("NINELIVES_DB", "")):
        # Any scheme: a URL ninelives does not take (postgresql+psycopg://) has one too.
        found = None
        if "://" in text:
            from ..store.conninfo import URL_SCHEME

            found = URL_SCHEME.search(text)
        if found is not None:
            urls.append(text[found.start() :])
        elif "=" in text:  # perhaps a libpq keyword string (host=... password=...)
            from ..store.conninfo import is_keyword_string

            if is_keyword_string(text.removeprefix("--db=")):
                urls.append(text)
    if not urls:
        return _no_secrets
    from ..store.conninfo import Redactor

    return Redactor(urls)


def start(argv: Sequence[str]) -> None:
    """Set up the output of one command run on ``argv``: guard the standard
    descriptors, escape what stdout's encoding cannot write and redact the
    passwords ``argv`` names."""
    global _scrub
    guard_std_fds()
    fit_stdout()
    _scrub = redactor(argv)


def say(line: str) -> None:
    """A progress line on stderr (escaped, redacted, coloured on a terminal).

    Best effort: a stderr that fails (EIO, a full disk under a log file) must
    not stop a runner whose state is committed.
    """

    def emit() -> None:
        try:
            text = printable(_scrub(line))
            print(_paint(text) if _colour() else text, file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass

    _above_bar(emit)


def error(line: str) -> None:
    """The command's one error line on stderr, as given (already escaped)."""

    def emit() -> None:
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass  # stderr itself is gone: the exit code still tells

    _above_bar(emit)


#: The live progress bar on stderr, once a command asked for one on a terminal.
_BAR: Any = None


def _above_bar(emit: Callable[[], None]) -> None:
    if _BAR is None:
        emit()
    else:
        _BAR.above(emit)  # the line takes the place of the live bar


def progress_bar() -> Callable[[Any], None] | None:
    """The ``on_progress`` callback: a bar on stderr if it is a terminal, else None."""
    global _BAR
    from .bar import terminal_bar

    _BAR = _BAR or terminal_bar(sys.stderr, lambda text: printable(_scrub(text)))
    return None if _BAR is None else _BAR.update


@functools.cache
def _colour() -> bool:
    """Colour on a terminal only, and never with ``NO_COLOR`` set (no-color.org)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (OSError, ValueError):
        return False


_GREEN, _YELLOW, _RED, _RESET = "\x1b[32m", "\x1b[33m", "\x1b[31m", "\x1b[0m"


def _paint(line: str) -> str:
    """Colour the outcome words of a progress line. It runs after :func:`printable`,
    which escapes every control character that stored data could carry, so the
    only escape sequences on the line are these."""

    line = line.replace(" done in ", f" {_GREEN}done{_RESET} in ", 1)
    line = line.replace(" (recovered)", f" {_YELLOW}(recovered){_RESET}", 1)
    line = line.replace(": recovered step(s)", f": {_YELLOW}recovered step(s){_RESET}", 1)
    if line.endswith(": done"):
        line = f"{line[:-4]}{_GREEN}done{_RESET}"
    return re.sub(r"( attempt \d+: )", f"{_RED}\\1{_RESET}", line, count=1)


def on_terminal() -> bool:
    """Whether stdout is a terminal (a person reads it, not a program)."""
    stream = sys.stdout
    try:
        return stream is not None and not _STDOUT_CLOSED and stream.isatty()
    except (OSError, ValueError):
        return False


def out(line: str) -> None:
    """One line on stdout. A reader that went away (EPIPE) raises BrokenPipeError;
    any other failure (ENOSPC, EIO, a closed stdout) raises :class:`OutputFailed`."""
    stream = sys.stdout
    if stream is None or _STDOUT_CLOSED:
        raise OutputFailed("cannot write to stdout: it is closed")
    try:
        stream.write(line + "\n")
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputFailed(f"cannot write to stdout: {exc.strerror or exc}") from None


@contextmanager
def findings() -> Iterator[None]:
    """Around the printing of a check's findings (``verify``, ``torture``,
    ``replay-check``): a reader that goes away (``verify --all | head -1``)
    ends the printing, not the check, whose exit code is its verdict. It was
    exit 0, "no violations", to a script under ``set -o pipefail``."""
    try:
        yield
    except BrokenPipeError:
        drop_stdout()


def confirm(line: str, done: str) -> None:
    """Print a command's confirmation ``line`` now. The change it confirms
    stands whatever happens to stdout, so a failure to write it says so
    (``done, but cannot write ...``): a bare error would invite the same
    command again, which is then refused (a fork's id exists, a retried task
    is no longer failed)."""
    try:
        out(line)
        flush()
    except OutputFailed as exc:
        raise OutputFailed(f"{done}, but {exc}") from None


def flush() -> None:
    """Push buffered output out now, while a failure can still be reported."""
    stream = sys.stdout
    if stream is None:
        return
    try:
        stream.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        raise OutputFailed(
            f"cannot write to stdout: {getattr(exc, 'strerror', None) or exc}"
        ) from None


_STDOUT_CLOSED = False


def drop_stdout() -> None:
    """Send whatever stdout still buffers to /dev/null, so the interpreter's
    last flush cannot fail after the command reported."""
    _occupy(1)


def guard_std_fds() -> None:
    """Occupy a closed stdout or stderr with /dev/null, remembering a closed stdout.

    Otherwise the next file opened (a lock file, a database) would get the
    descriptor, and output meant for the terminal would land in it.
    """
    global _STDOUT_CLOSED
    _STDOUT_CLOSED = False
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _STDOUT_CLOSED = _STDOUT_CLOSED or fd == 1
            _occupy(fd)
    if sys.stderr is None:
        # Python starts with no sys.stderr when fd 2 was closed (`2>&-`), and
        # print(file=None) then writes to sys.stdout: error and progress lines
        # would land in the command's data (`export t 2>&- > journal.jsonl`).
        try:
            sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)
        except OSError:  # fd 2 could not even be pointed at /dev/null
            import io

            sys.stderr = io.StringIO()


def _occupy(fd: int) -> None:
    """Point ``fd`` at /dev/null (whether it was open or closed)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    except OSError:
        pass


# -- files a command writes (report -o FILE) ----------------------------------


def write_file(path: str, text: str, *, database: str | None = None) -> bool:
    """Write ``text`` to ``path``; a failure is :class:`~ninelives.errors.OutputFailed`
    (exit 10). Returns False when ``path`` is this process's stdout, which got it.

    ``database`` (the command's ``--db``): a ``path`` that is that database or
    one of its files is refused (:class:`~ninelives.errors.InputError`, exit 4)
    before anything is written, see :func:`refuse_database`.

    A regular file there (or nothing) is replaced whole or not at all: a
    temporary file renamed over it. Anything else is written through as a
    shell's ``>`` would, never replaced: a symlink (to a file, a FIFO,
    ``/dev/stdout``), a FIFO, a character device (``/dev/null``). A folder, a
    block device, a socket or a symlink to nothing is refused.
    """
    import stat

    if database is not None:
        refuse_database(path, database)
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return _write_through(path, text.encode("utf-8"))
    _replace_file(path, text, None if st is None else stat.S_IMODE(st.st_mode) & 0o777)
    return True


#: The files SQLite keeps beside a database: replacing one loses or corrupts commits.
_DATABASE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def refuse_database(path: str, database: str) -> None:
    """Raise :class:`~ninelives.errors.InputError` if writing ``path`` would
    overwrite the SQLite ``database`` or a file of it: its ``-wal``, ``-shm`` or
    ``-journal``, or anything in its blob or lock folder. Any spelling counts:
    a symlink, ``..``, another hard link (the same file). A PostgreSQL
    ``database`` has no files here to protect."""
    from ..blobs import folder_for
    from ..errors import InputError
    from ..locking import lock_folder
    from ..store import is_postgres_url

    if is_postgres_url(database) or path == "-":
        return
    db = database.removeprefix("sqlite://") if database.startswith("sqlite:///") else database
    # realpath, as the store resolves the database: a symlinked --db has its
    # WAL and folders beside the real file.
    real_db, target = os.path.realpath(db), os.path.realpath(path)
    files = {real_db + suffix for suffix in _DATABASE_SUFFIXES}
    folders = (folder_for(real_db), lock_folder(real_db))
    inside = any(os.path.commonpath([f, target]) == f for f in folders)
    if target in files or inside or _same_existing_file(path, db):
        raise InputError(
            f"{path} is the database {database} or one of its files: nothing written "
            "(choose another output file)"
        )


def _same_existing_file(path: str, other: str) -> bool:
    """Whether both exist and are one file (a hard link, a bind mount)."""
    try:
        return os.path.samefile(path, other)
    except (OSError, ValueError):
        return False


def _cannot_write(path: str, exc: OSError | str) -> Exception:
    why = exc if isinstance(exc, str) else exc.strerror or str(exc)
    return OutputFailed(f"cannot write {path}: {why}")


def _replace_file(path: str, text: str, mode: int | None) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over
    ``path``. The page holds step outputs of an owner-only database, so it gets
    the permissions a shell's ``>`` would give it: a new file 0o666 less the
    umask (the kernel applies it at the open), a replaced one its own ``mode``."""
    import secrets

    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".report-{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise _cannot_write(path, exc) from None


#: How long ``report -o FIFO`` waits for a process to open the FIFO for reading.
FIFO_READER_WAIT = 10.0


def _write_through(path: str, data: bytes) -> bool:
    """Write ``data`` into what ``path`` leads to, checked on the descriptor opened."""
    import stat

    try:
        fd = _open_for_writing(path)
    except FileNotFoundError:  # a symlink whose target does not exist
        raise _cannot_write(path, "a symlink to nothing (not followed)") from None
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a file, FIFO or character device"
            raise _cannot_write(path, f"{kind}: nothing written")
        if _same_file(fd, 1):  # -o /dev/stdout: as -o -, in order with the rest of stdout
            out(data.decode("utf-8"))
            return False
        if stat.S_ISREG(mode):
            os.ftruncate(fd, 0)  # a symlink to a file: its content, written as > would
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    finally:
        os.close(fd)
    return True


def _open_for_writing(path: str) -> int:
    """``path`` opened for writing without blocking, never created or truncated.
    A FIFO that no process reads yet (ENXIO) is tried again for
    :data:`FIFO_READER_WAIT` seconds, then refused, instead of blocking forever."""
    import errno
    import stat
    import time

    # A folder, a block device or a socket is refused before it is opened at all.
    mode = os.stat(path).st_mode
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            raise OSError(errno.EINVAL, f"{kind}: nothing written")
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    deadline = time.monotonic() + FIFO_READER_WAIT
    while True:
        try:
            return os.open(path, flags)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        if time.monotonic() >= deadline:
            raise OSError(
                errno.ENXIO,
                f"a FIFO that no process opened for reading within {FIFO_READER_WAIT:g} s",
            )
        time.sleep(0.05)  # no event says a reader came: look again shortly


def _same_file(fd: int, other: int) -> bool:
    try:
        a, b = os.fstat(fd), os.fstat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
