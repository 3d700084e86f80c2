"""Barriers and double barriers from Python (``Locks.barrier``, ``Locks.double_barrier``), sync
and asyncio, on every test store: a barrier holds its waiters until removed (by its guard, by
another client, or by the setter's lease ending), a double barrier lets its participants in
together and out together, a crashed participant does not wedge the others past its lease,
timeouts, bad input raised before any store call."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import dlock
import dlock.asyncio
from dlock import LockNotOwnedError, LockTimeoutError


def test_a_barrier_holds_its_waiters_until_removed(store_url, name):
    setter, waiter = dlock.connect(store_url), dlock.connect(store_url)
    raised = setter.barrier(name).set(timeout=10)
    assert not raised.lost
    passed = []
    thread = threading.Thread(target=lambda: passed.append(waiter.barrier(name).wait(timeout=30)))
    thread.start()
    time.sleep(0.3)
    assert not passed, "a waiter went through a standing barrier"
    assert not waiter.barrier(name).wait(timeout=0.05)
    raised.remove()
    thread.join(30)
    assert passed == [True]
    with pytest.raises(LockNotOwnedError):
        raised.remove()
    # Removed from another client; a `with` block removes on exit.
    kept = setter.barrier(name).set(timeout=10)
    assert waiter.barrier(name).remove()
    del kept
    assert not waiter.barrier(name).remove()
    with setter.barrier(name).set(timeout=10):
        assert not waiter.barrier(name).wait(timeout=0.05)
    assert waiter.barrier(name).wait(timeout=10)


def test_a_barrier_whose_setter_stops_renewing_comes_down_within_its_lease(store_url, name):
    setter = dlock.connect(store_url)
    raised = setter.barrier(name, ttl=0.5).set(timeout=10)
    started = time.monotonic()
    assert dlock.connect(store_url).barrier(name).wait(timeout=30)
    assert time.monotonic() - started < 30
    assert raised.lost
    with pytest.raises(LockTimeoutError):
        blocker = setter.barrier(f"{name}/busy").set(timeout=10)
        setter.barrier(f"{name}/busy").set(timeout=0.05)
    blocker.remove()


def test_a_double_barrier_lets_its_participants_in_and_out_together(store_url, name):
    entered, left, order = [], [], threading.Lock()

    def participant(i: int) -> None:
        locks = dlock.connect(store_url)
        inside = locks.double_barrier(name, 3).enter(timeout=30)
        with order:
            entered.append((i, time.monotonic()))
        time.sleep(0.05 * i)
        inside.leave(timeout=30)
        with order:
            left.append((i, time.monotonic()))

    threads = [threading.Thread(target=participant, args=(i,)) for i in range(3)]
    for i, t in enumerate(threads):
        t.start()
        if i < 2:
            time.sleep(0.2)
    for t in threads:
        t.join(60)
    assert len(entered) == 3 and len(left) == 3
    # Nobody went in before the last came, and nobody out before the last left.
    assert min(at for _, at in left) >= max(at for _, at in entered)


def test_a_participant_dropped_inside_does_not_wedge_the_others(store_url, name):
    gone_client, staying = dlock.connect(store_url), dlock.connect(store_url)
    held = []
    enter = threading.Thread(target=lambda: held.append(gone_client.double_barrier(name, 2).enter(timeout=30)))
    enter.start()
    inside = staying.double_barrier(name, 2).enter(timeout=30)
    enter.join(30)
    assert held
    del held[:]  # dropped without leaving: it leaves at once
    started = time.monotonic()
    inside.leave(timeout=30)
    assert time.monotonic() - started < 30


def test_a_double_barrier_times_out_without_enough_participants(locks, name):
    with pytest.raises(LockTimeoutError):
        locks.double_barrier(name, 2).enter(timeout=0.2)
    # Nothing is left behind: a round of one goes through at once.
    with locks.double_barrier(f"{name}/one", 1).enter(timeout=10) as inside:
        assert not inside.lost


def test_bad_barrier_input_raises_before_any_store_call(locks, name):
    with pytest.raises(ValueError):
        locks.double_barrier(name, 0)
    with pytest.raises(TypeError):
        locks.double_barrier(name, "2")
    with pytest.raises(ValueError):
        locks.barrier(name, ttl=-1)
    with pytest.raises(ValueError):
        locks.barrier(name).wait(timeout=-1)
    with pytest.raises(ValueError):
        locks.barrier("").wait(timeout=0)
    assert locks.inspect(f"{name}#barrier") is None


def test_async_barrier_and_double_barrier(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        barrier = locks.barrier(name)
        async with await barrier.set(timeout=10):
            assert not await barrier.wait(timeout=0.05)
            waiting = asyncio.ensure_future(barrier.wait(timeout=30))
            await asyncio.sleep(0.1)
            assert not waiting.done()
        assert await waiting
        raised = await barrier.set(timeout=10)
        assert await barrier.remove()
        with pytest.raises(LockNotOwnedError):
            await raised.remove()

        async def participant() -> float:
            async with await locks.double_barrier(f"{name}/double", 2).enter(timeout=30):
                return time.monotonic()

        first = asyncio.ensure_future(participant())
        await asyncio.sleep(0.2)
        assert not first.done(), "went in alone"
        second = await participant()
        assert abs(await first - second) < 30

    asyncio.run(main())
