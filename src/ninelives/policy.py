"""Step policies: attempt limits, timeouts, backoff with jitter, permanent errors.

A step's policy (the plan's ``defaults`` merged with the step's own keys, stored
in ``steps.policy``) overrides the settings for that step; the settings
(``AGENT_MAX_ATTEMPTS``, ``NINELIVES_BACKOFF``) stay the default.
``NINELIVES_BACKOFF=0`` turns every wait off, a plan's included: it is the
operator's switch.

Backoff is exponential with *equal jitter*: after attempt ``n`` fails, the
wait is ``d/2 + random(0, d/2)`` with ``d = min(cap, base * 2**(n-1))``. The
store commits ``now + wait`` as the step's ``not_before`` in the same
transaction as its ``step_error`` (which carries ``retry_at`` and ``delay``),
and refuses to start the step before then, so a restarted run or another
worker does not retry early.

Timeouts: in the main thread a tool is interrupted by ``SIGALRM``
(:func:`time_limit`), which breaks a ``time.sleep`` or a blocking socket read
at once. No signal can interrupt another thread (a worker's slots), and a tool
abandoned in a thread could still make its effect after the step is retried;
there the overrun is journaled by a watchdog and the process exits (see
:class:`Watchdog`), so nothing of the stuck attempt can land afterwards.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import FrameType
from typing import Any, NamedTuple, NoReturn

from .errors import OutputRefused, PermanentError
from .journal import clean_error, error_text, storable

#: The longest wait between two attempts of a step by default, in seconds.
DEFAULT_CAP = 30.0
#: The exit status of a process that ends because a tool in a thread overran its timeout.
EXIT_STUCK_TOOL = 5


class Limits(NamedTuple):
    """The policy in force for one step."""

    max_attempts: int
    #: Seconds an attempt may run, or None for no limit.
    timeout: float | None
    #: Backoff base and cap in seconds; a base of 0 means no wait.
    base: float
    cap: float


def limits_for(policy: Mapping[str, Any] | None, max_attempts: int, backoff: float) -> Limits:
    """The step's :class:`Limits`: its ``policy`` over the settings' defaults
    (``max_attempts``, ``backoff`` the base). A base of 0 in the settings turns
    backoff off whatever the policy says."""
    if not policy:
        return Limits(max_attempts, None, backoff, DEFAULT_CAP)
    base, cap = backoff, DEFAULT_CAP
    wanted = policy.get("backoff")
    if wanted is False:
        base = 0.0
    elif isinstance(wanted, Mapping) and backoff > 0:
        base = float(wanted.get("base", base))
        cap = float(wanted.get("cap", cap))
    timeout = policy.get("timeout")
    return Limits(
        int(policy.get("max_attempts", max_attempts)),
        float(timeout) if timeout is not None else None,
        base,
        cap,
    )


def retry_delay(limits: Limits, attempt: int, rand: Callable[[], float] | None = None) -> float:
    """Seconds to wait after attempt number ``attempt`` (1-based) failed: equal jitter,
    between half and all of ``min(cap, base * 2**(attempt-1))`` (``rand``: [0, 1))."""
    if limits.base <= 0 or limits.cap <= 0:
        return 0.0
    if rand is None:
        import random  # on the error path only: not paid by commands that never retry

        rand = random.random
    ceiling = min(limits.base * 2 ** min(attempt - 1, 64), limits.cap)
    return float(ceiling / 2 + rand() * ceiling / 2)


def error_data(
    error: str,
    attempt: int,
    detail: Mapping[str, Any] | None,
    *,
    why: str | None,
    retry_at: float | None,
    delay: float | None,
) -> dict[str, Any]:
    """The data of a ``step_error``: the error, the attempt, then the decision:
    ``final`` with ``why`` (``attempt_limit`` or ``permanent``) or, when a wait
    follows, ``retry_at`` (epoch seconds) and ``delay`` (seconds)."""
    data: dict[str, Any] = {"error": error, "attempt": attempt, **(detail or {})}
    if why is not None:
        data.update(final=True, why=why)
    elif retry_at is not None and delay:
        data.update(retry_at=retry_at, delay=delay)
    return data


def describe(exc: BaseException) -> tuple[str, bool, dict[str, Any] | None]:
    """An attempt's failure as journaled: the error text, whether it is permanent,
    and the ``step_error`` detail (a timeout's seconds)."""
    if isinstance(exc, (OutputRefused, StepTimeout)):
        error = clean_error(str(exc))
    else:
        error = clean_error(error_text(exc))
    detail = {"timeout": exc.seconds} if isinstance(exc, StepTimeout) else None
    return error, isinstance(exc, PermanentError), detail


def time_limit(
    timeout: float | None, on_overrun: Callable[[], None]
) -> AbstractContextManager[Any]:
    """The block's timeout: nothing without one; :func:`alarm` in the main thread;
    a :class:`Watchdog` calling ``on_overrun`` (then exiting) in any other."""
    if timeout is None:
        return nullcontext()
    if in_main_thread():
        return alarm(timeout)
    return Watchdog(timeout, on_overrun)


def failure_reason(idx: int, attempts: int, error: str, *, permanent: bool) -> str:
    """The ``task_failed`` reason when a step's error ends the task."""
    if permanent:
        return f"step {idx} failed with a permanent error on attempt {attempts}: {error}"
    return f"step {idx} failed {attempts} times; last error: {error}"


def encode_progress(progress: Any, max_bytes: int) -> str:
    """``ctx.checkpoint``'s value as the JSON text committed, checked like an
    output: standard JSON, valid Unicode, at most ``max_bytes``; else
    :class:`~ninelives.errors.OutputRefused`."""
    try:
        text = storable(progress, "the progress")
    except ValueError as exc:
        raise OutputRefused(f"progress refused: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise OutputRefused(
            f"progress refused: {size} bytes of JSON exceed the maximum output size of "
            f"{max_bytes} bytes (NINELIVES_MAX_OUTPUT)"
        )
    return text


class StepTimeout(BaseException):
    """Raised inside a tool that overran its step's ``timeout`` (main thread).

    A ``BaseException``, so that a tool's ``except Exception`` does not swallow it.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(f"timeout after {seconds:g}s")
        self.seconds = seconds


#: What a tool or a step's function may raise, as its attempt's error. ``sys.exit``
#: in user code (a library's command-line helper) is one too: let through, it ended
#: the process with the code it gave, 0 saying "done" for a task left running.
USER_ERRORS = (Exception, StepTimeout, SystemExit)


def is_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` is asyncio's ``CancelledError`` (a ``BaseException``): no
    code raised it unless asyncio is loaded, so the CLI need not import it."""
    import sys

    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)


def in_main_thread() -> bool:
    """True where ``SIGALRM`` can interrupt the running code."""
    return threading.current_thread() is threading.main_thread()


@contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`StepTimeout` in the block once it ran ``seconds`` (main thread only).

    The handler raises out of whatever the tool is blocked in (``time.sleep``,
    ``socket.recv``): Python retries an interrupted call only when the handler
    returns. The previous handler and timer are restored on the way out.
    """

    def expired(signum: int, frame: FrameType | None) -> None:
        raise StepTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def alarm_held() -> Iterator[None]:
    """Hold ``SIGALRM`` back during a commit (``ctx.checkpoint``): a timeout that
    expires meanwhile is raised right after, never half-way through a transaction."""
    if not in_main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})


class Watchdog:
    """The timeout of a tool running in a thread that no signal can interrupt.

    When the tool overruns, ``on_overrun`` journals the failed attempt (through
    a store of its own) and the whole process exits with
    :data:`EXIT_STUCK_TOOL`: the stuck thread dies with it, so no effect of the
    abandoned attempt can land after the step is retried. The lock or lease dies
    with the process; the next claimer finds the step ``pending`` (the timeout
    committed) or, if the commit failed, ``running`` and recovers it. A tool
    that returns first wins the race under ``_lock``; one that returns after the
    overrun never commits.
    """

    def __init__(self, seconds: float, on_overrun: Callable[[], None]) -> None:
        self.seconds = seconds
        self._on_overrun = on_overrun
        self._lock = threading.Lock()
        self._state = "running"
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            if self._state == "running":
                self._state = "returned"
                return
        threading.Event().wait()  # overrun: the process is exiting; never commit

    def _fire(self) -> None:
        with self._lock:
            if self._state != "running":
                return
            self._state = "overrun"
        exit_stuck(self._on_overrun)


def exit_stuck(journal: Callable[[], None]) -> NoReturn:
    """Journal an attempt that overran its timeout in a thread (``journal``), then
    end the process with :data:`EXIT_STUCK_TOOL`: the thread dies with it, so the
    abandoned attempt's effect cannot land after the step is retried."""
    try:
        journal()
    except BaseException as exc:  # exiting anyway: the next claimer recovers the step
        print(f"ninelives: could not journal the timeout: {exc}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_STUCK_TOOL)
