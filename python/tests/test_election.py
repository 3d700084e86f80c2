"""Leader election from Python (``Locks.election``), sync and asyncio, on every test store:
one leader at a time with rising terms, proclaim seen by leader() and observe(), resign hands
over, a broken leader is told and refused, bad input raises before any store call."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import dlock
import dlock.asyncio
from dlock import LockNotOwnedError, LockTimeoutError


def test_campaign_leader_proclaim_and_resign(locks, name):
    election = locks.election(name)
    assert election.leader() is None
    leading = election.campaign(b"node-a")
    assert leading.term > 0 and not leading.lost
    now = election.leader()
    assert now is not None
    assert (now.term, now.value) == (leading.term, b"node-a")
    assert now.pid > 0 and now.ttl_left is not None and now.ttl_left > 0
    leading.proclaim(b"node-a:ready")
    assert election.leader().value == b"node-a:ready"
    with pytest.raises(LockTimeoutError):
        locks.election(name, wait=0.05).campaign(b"b")
    leading.resign()
    assert election.leader() is None


def test_resign_hands_over_with_a_greater_term(store_url, name):
    first_client, second_client = dlock.connect(store_url), dlock.connect(store_url)
    first = first_client.election(name).campaign(b"a")
    elected = []
    waiter = threading.Thread(target=lambda: elected.append(second_client.election(name).campaign(b"b")))
    waiter.start()
    time.sleep(0.2)
    assert not elected, "two leaders at once"
    first.resign()
    waiter.join(10)
    assert elected and elected[0].term > first.term
    assert first_client.election(name).leader().value == b"b"
    elected[0].resign()


def test_a_broken_leader_is_told_and_refused(store_url, name):
    locks = dlock.connect(store_url, watchdog_lease=1)
    leading = locks.election(name).campaign(b"a")
    assert locks.force_release(name)
    assert leading.wait_lost(10), "the broken leader was not told"
    with pytest.raises(LockNotOwnedError):
        leading.proclaim(b"late")
    assert locks.election(name).leader() is None


def test_observe_reports_each_leader_once_in_rising_terms(locks, name):
    election = locks.election(name, interval=0.02)
    changes = election.observe()
    assert next(changes) is None
    terms = []
    for who in (b"a", b"b"):
        leading = election.campaign(who)
        seen = next(changes)
        assert (seen.term, seen.value) == (leading.term, who)
        leading.proclaim(who + b"!")
        assert next(changes).value == who + b"!"
        terms.append(leading.term)
        leading.resign()
        assert next(changes) is None
    assert terms[0] < terms[1]


def test_bad_election_input_raises_before_the_store(locks, name):
    with pytest.raises(ValueError):
        locks.election("").campaign(b"x")
    with pytest.raises(ValueError):
        locks.election(name).campaign(b"x" * (256 * 1024))
    with pytest.raises(ValueError):
        locks.election(name, ttl=-1)
    with pytest.raises(TypeError):
        locks.election(name).campaign(12)
    assert locks.election(name).leader() is None
    assert locks.mutex(name).try_acquire() is not None


def test_async_election(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        election = locks.election(name, interval=0.02)
        changes = election.observe()
        assert await changes.__anext__() is None
        async with await election.campaign(b"a") as leading:
            assert (await election.leader()).term == leading.term
            seen = await changes.__anext__()
            assert (seen.term, seen.value) == (leading.term, b"a")
            await leading.proclaim(b"b")
            assert (await election.leader()).value == b"b"
            assert (await changes.__anext__()).value == b"b"
            with pytest.raises(LockTimeoutError):
                await locks.election(name, wait=0.05).campaign(b"c")
        assert await election.leader() is None
        assert await changes.__anext__() is None
        # A cancelled campaign leaves nothing behind: the next one is elected at once.
        holder = await election.campaign(b"d")
        waiting = asyncio.ensure_future(election.campaign(b"e"))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await holder.resign()
        again = await locks.election(name, wait=5).campaign(b"f")
        assert again.term > holder.term
        await again.resign()

    asyncio.run(main())
