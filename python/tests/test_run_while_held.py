"""Run under a hold from Python (``dlock.run_while_held``, ``dlock.asyncio.run_while_held``),
on every test store: the task's result while the hold lasts; a hold broken mid-task
(``force_release``) stops the task (a coroutine is cancelled, a function is told through its
event) and raises ``LostError`` with the reason; a hold already lost never starts the task."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import dlock
import dlock.asyncio
from dlock import LockError, LockNotOwnedError, LostError


def _guards(locks, name):
    """Holds whose store lock has their own name, to break it by: a mutex, leadership."""
    return [
        (locks.mutex(f"{name}/mutex").acquire(), f"{name}/mutex"),
        (locks.election(f"{name}/leader").campaign(b"a"), f"{name}/leader"),
    ]


def test_the_result_while_the_hold_lasts(locks, name):
    held = _guards(locks, name) + [(locks.rwlock(f"{name}/rw").write(), ""), (locks.semaphore(f"{name}/sem", 2).acquire(), "")]
    for guard, _ in held:
        assert dlock.run_while_held(guard, lambda lost: (lost.is_set(), guard.fence)) == (False, guard.fence)
        assert not guard.is_lost()
        guard.release() if hasattr(guard, "release") else guard.resign()
    lock = locks.lock(f"{name}/redis-py", timeout=30)
    assert lock.acquire()
    assert dlock.run_while_held(lock, lambda lost: 7) == 7
    lock.release()


def test_a_broken_hold_tells_the_task_and_raises_lost_with_the_reason(store_url, name):
    # A short watchdog lease: a store without a native signal finds the break at a renewal.
    locks = dlock.connect(store_url, watchdog_lease=1)
    for guard, lock_name in _guards(locks, name):
        told = []

        def task(lost: threading.Event) -> str:
            assert locks.force_release(lock_name)
            told.append(lost.wait(10))
            return "never returned"

        with pytest.raises(LostError) as raised:
            dlock.run_while_held(guard, task)
        assert told == [True], f"{guard!r}: the task was not told"
        # Told by the store's own signal, or by the next renewal the store refused.
        assert raised.value.reason in ("broken", "renewal_refused")
        assert isinstance(raised.value, LockNotOwnedError)


def test_an_error_of_a_task_whose_hold_was_lost_is_the_cause(store_url, name):
    locks = dlock.connect(store_url, watchdog_lease=1)
    guard = locks.mutex(name).acquire()

    def task(lost: threading.Event) -> None:
        locks.force_release(name)
        lost.wait(10)
        raise RuntimeError("stopped")

    with pytest.raises(LostError) as raised:
        dlock.run_while_held(guard, task)
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_hold_already_lost_never_starts_the_task(locks, name):
    guard = locks.mutex(name, ttl=0.3).acquire()
    assert guard.wait_lost(10)
    started = []
    with pytest.raises(LostError) as raised:
        dlock.run_while_held(guard, lambda lost: started.append(1))
    assert not started and raised.value.reason == "expired"


def test_an_unheld_lock_is_a_lock_error(locks, name):
    with pytest.raises(LockError):
        dlock.run_while_held(locks.lock(name), lambda lost: None)
    with pytest.raises(LockError):
        dlock.run_while_held(object(), lambda lost: None)


def test_async_run_while_held_cancels_the_task(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url, watchdog_lease=1)
        guard = await locks.mutex(name).acquire()

        async def quick() -> int:
            await asyncio.sleep(0.01)
            return 42

        assert await dlock.asyncio.run_while_held(guard, quick()) == 42
        cancelled = asyncio.Event()

        async def endless() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def breaker() -> None:
            await asyncio.sleep(0.1)
            assert await locks.force_release(name)

        breaking = asyncio.ensure_future(breaker())
        started = time.monotonic()
        with pytest.raises(LostError) as raised:
            await asyncio.wait_for(dlock.asyncio.run_while_held(guard, endless()), 10)
        await breaking
        assert cancelled.is_set(), "the task was not cancelled"
        assert raised.value.reason in ("broken", "renewal_refused")
        assert time.monotonic() - started < 10
        # Leadership too, and a hold already lost never starts the coroutine.
        leading = await locks.election(f"{name}/leader").campaign(b"a")
        assert await locks.force_release(f"{name}/leader")
        assert await leading.wait_lost(10)
        ran = []

        async def never() -> None:
            ran.append(1)

        with pytest.raises(LostError):
            await dlock.asyncio.run_while_held(leading, never())
        assert not ran

    asyncio.run(main())
