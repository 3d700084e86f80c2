"""Run under a hold: ``dlock.run_while_held`` and ``dlock.asyncio.run_while_held``, the Rust
core's ``run_while_held`` for a mutex, read or write hold, permit, multi-lock, leadership or
redis-py style ``Lock``.

A coroutine is cancelled as soon as the hold is lost. A plain function cannot be stopped from
outside, so it is handed a ``threading.Event`` set at the loss, which it checks between steps
(or waits on instead of sleeping). Either way the result counts only if the hold lasted until
the task ended; otherwise ``LostError`` is raised, with the reason in ``.reason``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

from ._dlock import Hold
from .exceptions import LockError, LostError

T = TypeVar("T")

# How often the watcher of a plain function looks whether the function has ended; the loss
# itself wakes it at once.
_WATCH_STEP = 0.1


def _hold_of(held: Any) -> Hold:
    hold = getattr(held, "_hold", None)
    if hold is None:
        # A redis-py style Lock: the hold of the current owner (this thread's, if thread-local).
        hold = getattr(getattr(held, "local", None), "hold", None)
    if not isinstance(hold, Hold):
        raise LockError("run_while_held needs a held guard, leadership or acquired lock")
    return hold


def _lost(hold: Hold) -> LostError:
    reason = hold.lost_reason() or "store_signal"
    return LostError(f"the hold of {hold.name!r} was lost ({reason})", lock_name=hold.name, reason=reason)


def run_while_held(held: Any, task: Callable[[threading.Event], T]) -> T:
    """Runs ``task(lost)`` on this thread while ``held`` lasts and returns its result; ``lost``
    is a ``threading.Event`` set as soon as the hold is lost, and ``task`` must return when it
    sees it. Raises ``LostError`` (``.reason``: ``"expired"``, ``"broken"``…) when the hold was
    lost before ``task`` returned (an exception ``task`` raised is then its ``__cause__``), or
    was lost already (``task`` never starts).

    >>> import dlock
    >>> locks = dlock.connect("memory://run-while-held-doc")
    >>> with locks.mutex("reports").acquire() as guard:
    ...     dlock.run_while_held(guard, lambda lost: 40 + 2)
    42
    """
    hold = _hold_of(held)
    if hold.is_lost():
        raise _lost(hold)
    lost, done = threading.Event(), threading.Event()

    def watch() -> None:
        while not done.is_set():
            if hold.wait_lost(_WATCH_STEP):
                lost.set()
                return

    watcher = threading.Thread(target=watch, name="dlock-run-while-held", daemon=True)
    watcher.start()
    try:
        result = task(lost)
    except BaseException as error:
        if hold.is_lost():
            raise _lost(hold) from error
        raise
    finally:
        done.set()
    if hold.is_lost():
        raise _lost(hold)
    return result


async def run_while_held_async(held: Any, task: Awaitable[T]) -> T:
    """``dlock.asyncio.run_while_held``: awaits ``task`` while ``held`` lasts and returns its
    result; cancels it as soon as the hold is lost (and waits for it to end), then raises
    ``LostError`` with the reason. A hold already lost never starts it. Cancelling this call
    cancels ``task``; the hold is untouched either way."""
    from .asyncio import _bridge

    hold = _hold_of(held)
    if hold.is_lost():
        if asyncio.iscoroutine(task):
            task.close()
        raise _lost(hold)
    work = asyncio.ensure_future(task)
    watcher = asyncio.ensure_future(hold.wait_lost(None, aio=_bridge()))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work.cancel()
        watcher.cancel()
        raise
    # The loss first, as the Rust core does: a task that ended as the hold was lost reports
    # the loss.
    if hold.is_lost():
        work.cancel()
        try:
            await work
        except BaseException:
            pass
        watcher.cancel()
        raise _lost(hold)
    watcher.cancel()
    return work.result()
