"""dlock.asyncio: redis-py's asyncio Lock cases, cancellation, the primitives as coroutines."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import dlock
import dlock.asyncio
from dlock import LockError, LockNotOwnedError


def run(coro):
    return asyncio.run(coro)


def test_async_lock(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        lock = locks.lock(name, timeout=10)
        assert await lock.acquire(blocking=False)
        assert await lock.locked()
        assert await lock.owned()
        assert lock.fence > 0
        assert not await locks.lock(name).acquire(blocking=False)
        assert await lock.extend(5)
        assert await lock.reacquire()
        await lock.release()
        assert not await lock.locked()
        with pytest.raises(LockError):
            await lock.release()

    run(main())


def test_async_with(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        async with locks.lock(name, blocking_timeout=1) as lock:
            assert await lock.owned()
            with pytest.raises(LockError) as raised:
                async with locks.lock(name, blocking_timeout=0.1):
                    pass
            assert raised.value.lock_name == name
        assert not await lock.locked()
        with pytest.raises(LockNotOwnedError):
            async with locks.lock(name, timeout=10):
                await locks.force_release(name)

    run(main())


def test_waiting_does_not_block_the_event_loop(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        holder = locks.lock(name)
        assert await holder.acquire(blocking=False)
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        assert not await locks.lock(name).acquire(blocking_timeout=0.5)
        ticker.cancel()
        await holder.release()
        return ticks

    assert run(main()) >= 10


def test_cancelled_acquire_leaves_nothing_held(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        holder = locks.lock(name)
        assert await holder.acquire(blocking=False)
        waiter = locks.lock(name)
        task = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiter.local.token is None
        await holder.release()
        # The cancelled waiter does not get the lock afterwards behind our back.
        await asyncio.sleep(0.3)
        assert not await holder.locked()
        other = locks.lock(name)
        assert await other.acquire(blocking=False)
        await other.release()

    run(main())


def test_wait_for_timeout_cancels_the_wait(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        holder = locks.lock(name)
        assert await holder.acquire(blocking=False)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(locks.lock(name).acquire(), 0.2)
        await holder.release()
        await asyncio.sleep(0.3)
        assert not await holder.locked()

    run(main())


def test_async_lost_signal(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        lock = locks.lock(name, timeout=5)
        assert await lock.acquire()
        assert await lock.wait_lost(0.1) is False
        await locks.force_release(name)
        assert await lock.wait_lost(10) is True
        assert lock.lost

    run(main())


def test_async_primitives(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        async with locks.mutex(name, ttl=10) as guard:
            assert guard.fence > 0 and await guard.is_owned()
            assert await locks.mutex(name).try_acquire() is None
        semaphore = locks.semaphore(name + "/sem", 1)
        permit = await semaphore.acquire()
        assert await semaphore.try_acquire() is None
        await permit.release()
        both = await locks.semaphore(name + "/sem2", 2, count=2).acquire()
        assert len(both.fences) == 2
        assert await locks.semaphore(name + "/sem2", 2).try_acquire() is None
        await both.release()
        rw = locks.rwlock(name + "/rw")
        reader = await rw.read()
        assert await rw.try_write() is None
        await reader.release()
        async with locks.multi_lock([name + "/a", name + "/b"]) as both:
            assert len(both.fences) == 2
        value = locks.value(name + "/v")
        await value.set(b"1")
        updated = await value.update(lambda v: v + b"1")
        assert updated.value == b"11"
        assert (await value.get()).value == b"11"

    run(main())


def test_async_update_under_contention(store_url, name):
    # As the sync case: the default attempts are enough, the total is exact.
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        value = locks.value(name)
        assert value.max_attempts == dlock.DEFAULT_UPDATE_ATTEMPTS
        await value.set(b"0")

        async def add():
            for _ in range(50):
                await value.update(lambda current: str(int(current) + 1).encode())

        await asyncio.gather(*(add() for _ in range(8)))
        assert (await value.get()).value == b"400"

    run(main())


def test_async_update_can_decline_or_raise(store_url, name):
    class Refused(Exception):
        pass

    async def main():
        locks = await dlock.asyncio.connect(store_url)
        value = locks.value(name)
        assert await value.update(lambda current: None) is None
        assert await value.get() is None
        version = await value.set(b"0")
        loop_thread = threading.get_ident()
        threads = []

        def nothing_to_do(current):
            threads.append(threading.get_ident())
            return None

        assert await value.update(nothing_to_do) is None
        # The callback runs on the event loop's thread, as the rest of the coroutine's code.
        assert threads == [loop_thread]
        assert await value.get() == dlock.Versioned(b"0", version)
        error = Refused("no")

        def refuse(current):
            raise error

        with pytest.raises(Refused) as raised:
            await value.update(refuse)
        assert raised.value is error
        assert await value.get() == dlock.Versioned(b"0", version)
        with pytest.raises(TypeError):
            await value.update(lambda current: "text")
        assert await value.get() == dlock.Versioned(b"0", version)

    run(main())


def test_async_update_cancelled_writes_at_most_once_and_leaves_nothing_stuck(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        value = locks.value(name)
        written = await value.set(b"0")
        for _ in range(20):
            calls = []

            def bump(current):
                calls.append(current)
                return str(int(current) + 1).encode()

            task = asyncio.ensure_future(value.update(bump))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Cancelled before or after its write went out: unchanged, or written once.
            after = await value.get()
            assert len(calls) <= 1
            if calls:
                assert after.value in (b"0", b"1")
            else:
                assert after.version == written
            # The call asked the loop (or was told no): nothing waits on an answer forever.
            updated = await value.update(lambda current: b"0")
            assert updated is not None
            written = updated.version

    run(main())


def test_async_from_sync_connection(store_url, name):
    sync_locks = dlock.connect(store_url)

    async def main():
        locks = dlock.asyncio.Locks.from_sync(sync_locks)
        async with locks.lock(name):
            assert sync_locks.lock(name).acquire(blocking=False) is False

    run(main())


def test_several_event_loops_in_turn(store_url, name):
    # asyncio.run makes a new loop each time; the runtime serves them all.
    for _ in range(3):
        test_async_lock(store_url, f"{name}/{time.monotonic_ns()}")


EXIT_SCRIPT = """
import asyncio, sys, dlock, dlock.asyncio
# Connected without an executor thread: asyncio.run's executor shutdown would delay the exit.
locks = dlock.asyncio.Locks.from_sync(dlock.connect(sys.argv[1]))
async def main():
    for _ in range(3000):
        await locks.inspect("exit-test")
asyncio.run(main())
"""


@pytest.mark.parametrize("where", ["memory", "store"])
def test_interpreter_exit_right_after_async_calls_is_clean(store_url, where):
    # The runtime's threads never touch Python objects: an exit while they wind down must not
    # crash. With results delivered from those threads (pyo3-async-runtimes) this script
    # aborted or segfaulted in about a third of the runs.
    import subprocess
    import sys

    url = "memory://exit" if where == "memory" else store_url
    for _ in range(8):
        done = subprocess.run([sys.executable, "-I", "-c", EXIT_SCRIPT, url], capture_output=True, timeout=300)
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_async_fenced_write(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        value = locks.value(f"{name}/state")
        async with locks.mutex(name, ttl=30) as guard:
            version = await value.set_fenced(guard, b"mine")
            assert (await value.get()) == dlock.Versioned(b"mine", version)
        with pytest.raises(LockNotOwnedError):
            await value.set_fenced(guard, b"after release")
        assert (await value.get()) == dlock.Versioned(b"mine", version)

    run(main())
