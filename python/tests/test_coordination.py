"""Counters and count-down latches from Python (``Locks.counter``, ``Locks.latch``), sync and
asyncio, on every test store: no lost update between clients, a latch opened by another
client's last count-down, the wait's timeout, bad input raised before any store call."""

from __future__ import annotations

import asyncio
import threading

import pytest

import dlock
import dlock.asyncio


def test_counter_add_and_compare_and_set_lose_no_update_across_clients(store_url, name):
    clients = [dlock.connect(store_url), dlock.connect(store_url)]
    counter = clients[0].counter(name)
    assert counter.get() == 0

    def work(client: dlock.Locks) -> None:
        mine = client.counter(name)
        for _ in range(10):
            mine.add(1)
        won = 0
        while won < 5:
            seen = mine.get()
            won += mine.compare_and_set(seen, seen + 1)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.get() == 60
    assert counter.add(-60) == 0
    assert not counter.compare_and_set(1, 2)


def test_counter_overflow_is_refused_and_writes_nothing(locks, name):
    counter = locks.counter(name)
    assert counter.compare_and_set(0, 2**63 - 1)
    with pytest.raises(ValueError):
        counter.add(1)
    with pytest.raises(ValueError):
        counter.add(2**63)  # not a 64-bit delta: refused before any store call
    with pytest.raises(TypeError):
        counter.add("1")
    assert counter.get() == 2**63 - 1


def test_latch_opens_at_the_last_count_down_in_another_client(store_url, name):
    setter, worker = dlock.connect(store_url), dlock.connect(store_url)
    latch = setter.latch(name, interval=0.01)
    assert latch.try_set_count(2)
    assert not worker.latch(name).try_set_count(3)
    opened = []
    waiter = threading.Thread(target=lambda: opened.append(latch.wait(timeout=30)))
    waiter.start()
    assert worker.latch(name).count_down() == 1
    waiter.join(0.2)
    assert waiter.is_alive(), "the wait returned with the count at 1"
    assert worker.latch(name).count_down() == 0
    waiter.join(30)
    assert opened == [True]
    assert latch.count() == 0 and latch.count_down() == 0


def test_latch_wait_times_out_while_closed(locks, name):
    latch = locks.latch(name)
    assert latch.try_set_count(1)
    assert latch.wait(timeout=0.2) is False
    assert latch.count() == 1
    # Nothing was left queued: the waiters' lock is free.
    assert locks.mutex(f"{name}#latch").try_acquire() is not None


def test_bad_latch_and_counter_input_raises_and_leaves_no_state(locks, name):
    latch = locks.latch(name)
    for bad in (0, -1, -(2**63)):
        with pytest.raises(ValueError):
            latch.try_set_count(bad)
    with pytest.raises(TypeError):
        latch.try_set_count(1.5)
    with pytest.raises(ValueError):
        locks.latch(name, interval=0)
    with pytest.raises(ValueError):
        locks.latch("").count()
    with pytest.raises(ValueError):
        locks.counter("a\0b").add(1)
    assert latch.count() == 0
    assert locks.value(f"{name}#latch").get() is None


def test_async_counter_and_latch(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        counter = locks.counter(name)
        assert await asyncio.gather(*(counter.add(1) for _ in range(8))) is not None
        assert await counter.get() == 8
        assert await counter.compare_and_set(8, 0)
        latch = locks.latch(name, interval=0.01)
        assert await latch.try_set_count(1)
        assert await latch.wait(timeout=0.1) is False
        waiting = asyncio.ensure_future(latch.wait(timeout=30))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        assert await latch.count_down() == 0
        assert await waiting is True
        assert await latch.count() == 0

    asyncio.run(main())


def test_counter_and_latch_on_a_store_without_values_are_unsupported(redis_server, name):
    # Redlock (here over the one test server) keeps no versioned values.
    locks = dlock.connect(redis_server.url.replace("redis://", "redlock://", 1))
    with pytest.raises(dlock.UnsupportedError):
        locks.counter(name).get()
    with pytest.raises(dlock.UnsupportedError):
        locks.latch(name).try_set_count(1)
    with pytest.raises(dlock.UnsupportedError):
        locks.latch(name).wait(timeout=1)
