"""Running an ``async def`` tool from the synchronous step machinery.

Loaded only when a tool is an ``async def``, so that asyncio (~55 ms to
import) costs nothing to the CLI or to a plan of plain tools. The coroutine runs
to completion before the step's output is committed, so an async tool is
exactly as durable as a plain one: its attempt starts after the step is
committed ``running`` and its output is committed after it returned.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any


def run_async(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (an ``async def``) run to completion; its value, or its exception.

    Without an event loop running in this thread, :func:`asyncio.run` runs it
    here, so a step timeout's ``SIGALRM`` interrupts the loop and cancels the
    coroutine as it would interrupt a plain tool. Called from inside a running
    loop (an async workflow's ``ctx.call_tool``), that loop cannot run it
    without returning first: it runs in a fresh loop on a short-lived thread
    (:func:`_on_thread`).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(fn(*args))
    return _on_thread(fn, args)


def _on_thread(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run ``fn(*args)`` in its own loop on a new thread and wait for it.

    The thread gets a copy of this thread's context variables (the running step
    that :func:`ninelives.current_step` reads). When the wait is interrupted (a
    step timeout's ``SIGALRM``, Ctrl-C), the coroutine is cancelled and waited
    for before the interruption goes on, so no effect of an abandoned attempt
    lands after the step is retried.
    """
    outcome: dict[str, Any] = {}
    ready, finished = threading.Event(), threading.Event()

    async def main() -> Any:
        outcome["loop"] = asyncio.get_running_loop()
        outcome["task"] = asyncio.current_task()
        ready.set()
        return await fn(*args)

    def work() -> None:
        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as exc:  # handed to the waiting thread, which raises it
            outcome["error"] = exc
        finally:
            ready.set()
            finished.set()

    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(work,), name="ninelives-async-tool"
    )
    thread.start()
    # An Event, not Thread.join: a join interrupted by a signal handler's
    # exception marks the thread stopped, so a second join would not wait.
    try:
        finished.wait()
    except BaseException:
        _cancel(outcome, ready)
        finished.wait()
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _cancel(outcome: dict[str, Any], ready: threading.Event) -> None:
    """Cancel the thread's coroutine, if it is still running."""
    ready.wait()
    task, loop = outcome.get("task"), outcome.get("loop")
    if task is None or loop is None:
        return
    try:
        loop.call_soon_threadsafe(task.cancel)
    except RuntimeError:
        pass  # the loop closed: the coroutine already ended
