"""redis-py's Lock behaviour cases (its tests/test_lock.py), written for dlock: the same
observable behaviour on every store, checked through the API rather than Redis keys."""

from __future__ import annotations

import threading
import time

import pytest

import dlock
from dlock import LockError, LockNotOwnedError


def ttl_left(locks: dlock.Locks, name: str) -> float:
    info = locks.inspect(name)
    assert info is not None, f"{name} should be held"
    assert info.ttl_left is not None
    return info.ttl_left


def test_lock(locks, name):
    lock = locks.lock(name)
    assert lock.acquire(blocking=False)
    assert lock.locked()
    assert lock.owned()
    assert lock.local.token is not None
    lock.release()
    assert not lock.locked()
    assert lock.local.token is None


@pytest.mark.parametrize("thread_local", [True, False])
def test_lock_token(locks, name, thread_local):
    lock = locks.lock(name, thread_local=thread_local)
    assert lock.acquire(blocking=False, token="test")
    assert lock.local.token == b"test"
    lock.release()
    assert lock.local.token is None
    assert lock.acquire(blocking=False, token=b"raw")
    assert lock.local.token == b"raw"
    lock.release()


def test_locked(locks, name):
    lock = locks.lock(name)
    assert lock.locked() is False
    lock.acquire(blocking=False)
    assert lock.locked() is True
    lock.release()
    assert lock.locked() is False


def test_owned(locks, name):
    lock = locks.lock(name)
    assert lock.owned() is False
    lock.acquire(blocking=False)
    assert lock.owned() is True
    lock.release()
    assert lock.owned() is False

    lock2 = locks.lock(name)
    assert lock.owned() is False
    assert lock2.owned() is False
    lock2.acquire(blocking=False)
    assert lock.owned() is False
    assert lock2.owned() is True
    lock2.release()
    assert lock.owned() is False
    assert lock2.owned() is False


def test_competing_locks(locks, name):
    lock1 = locks.lock(name)
    lock2 = locks.lock(name)
    assert lock1.acquire(blocking=False)
    assert not lock2.acquire(blocking=False)
    lock1.release()
    assert lock2.acquire(blocking=False)
    assert not lock1.acquire(blocking=False)
    lock2.release()


def test_competing_connections(store_url, name):
    """Two connections (as two processes would have) exclude each other."""
    one, two = dlock.connect(store_url), dlock.connect(store_url)
    lock1, lock2 = one.lock(name), two.lock(name)
    assert lock1.acquire(blocking=False)
    assert not lock2.acquire(blocking=False)
    lock1.release()
    assert lock2.acquire(blocking=False)
    lock2.release()


def test_timeout(locks, name):
    lock = locks.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert 8 < ttl_left(locks, name) <= 10
    lock.release()


def test_float_timeout(locks, name):
    lock = locks.lock(name, timeout=9.5)
    assert lock.acquire(blocking=False)
    assert 8 < ttl_left(locks, name) <= 9.5
    lock.release()


def test_blocking_timeout(locks, name):
    lock1 = locks.lock(name)
    assert lock1.acquire(blocking=False)
    try:
        lock2 = locks.lock(name, sleep=0.05, blocking_timeout=0.4)
        started = time.monotonic()
        assert not lock2.acquire()
        # It waited the whole blocking_timeout (not one sleep less, as redis-py's loop may).
        assert time.monotonic() - started >= 0.35
        assert not lock2.acquire(blocking_timeout=0.1)
    finally:
        lock1.release()


def test_blocking_waits_for_release(locks, name):
    # Not thread-local: the timer thread releases what this thread acquired.
    holder = locks.lock(name, thread_local=False)
    assert holder.acquire(blocking=False)
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    waiter = locks.lock(name, blocking_timeout=30)
    assert waiter.acquire()
    timer.join()
    waiter.release()


def test_context_manager(locks, name):
    with locks.lock(name, blocking_timeout=0.2) as lock:
        assert lock.owned()
        assert lock.local.token is not None
    assert not lock.locked()


def test_context_manager_raises_when_locked_not_acquired(locks, name):
    holder = locks.lock(name)
    assert holder.acquire(blocking=False)
    try:
        with pytest.raises(LockError) as raised:
            with locks.lock(name, blocking_timeout=0.1):
                pass
        assert raised.value.lock_name == name
        assert "Unable to acquire lock" in str(raised.value)
    finally:
        holder.release()


def test_context_manager_not_raise_on_release_lock_not_owned_error(locks, name):
    try:
        with locks.lock(name, timeout=0.1, raise_on_release_error=False):
            time.sleep(0.3)
    except LockNotOwnedError:
        pytest.fail("LockNotOwnedError should not have been raised")
    with pytest.raises(LockNotOwnedError):
        with locks.lock(name, timeout=0.1, raise_on_release_error=True):
            time.sleep(0.3)


def test_context_manager_not_raise_on_release_lock_error(locks, name):
    try:
        with locks.lock(name, timeout=1, raise_on_release_error=False) as lock:
            lock.release()
    except LockError:
        pytest.fail("LockError should not have been raised")
    with pytest.raises(LockError):
        with locks.lock(name, timeout=1, raise_on_release_error=True) as lock:
            lock.release()


def test_releasing_unlocked_lock_raises_error(locks, name):
    lock = locks.lock(name)
    with pytest.raises(LockError) as raised:
        lock.release()
    assert not isinstance(raised.value, LockNotOwnedError)


def test_releasing_lock_no_longer_owned_raises_error(locks, name):
    lock = locks.lock(name)
    lock.acquire(blocking=False)
    # Taken over: broken by an operator, then acquired by someone else.
    assert locks.force_release(name)
    other = locks.lock(name)
    assert other.acquire(blocking=False)
    with pytest.raises(LockNotOwnedError):
        lock.release()
    # Even though it failed, the token is cleared (as redis-py does).
    assert lock.local.token is None
    # And the other holder's lock was not released by the failed release.
    assert other.owned()
    other.release()


def test_extend_lock(locks, name):
    lock = locks.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert 8 < ttl_left(locks, name) <= 10
    assert lock.extend(10)
    assert 16 < ttl_left(locks, name) <= 20
    lock.release()


def test_extend_lock_replace_ttl(locks, name):
    lock = locks.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert lock.extend(10, replace_ttl=True)
    assert 8 < ttl_left(locks, name) <= 10
    lock.release()


def test_extend_lock_float(locks, name):
    lock = locks.lock(name, timeout=10.5)
    assert lock.acquire(blocking=False)
    old = ttl_left(locks, name)
    assert lock.extend(10.5)
    assert old + 9 < ttl_left(locks, name) <= old + 10.5
    lock.release()


def test_extending_unlocked_lock_raises_error(locks, name):
    lock = locks.lock(name, timeout=10)
    with pytest.raises(LockError):
        lock.extend(10)


def test_extending_lock_with_no_timeout_raises_error(locks, name):
    lock = locks.lock(name)
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError):
        lock.extend(10)
    lock.release()


def test_extending_lock_no_longer_owned_raises_error(locks, name):
    lock = locks.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    locks.force_release(name)
    with pytest.raises(LockNotOwnedError):
        lock.extend(10)


def test_reacquire_lock(locks, name):
    lock = locks.lock(name, timeout=3)
    assert lock.acquire(blocking=False)
    time.sleep(1.0)
    assert ttl_left(locks, name) <= 2.2
    assert lock.reacquire()
    assert 2.2 < ttl_left(locks, name) <= 3
    lock.release()


def test_reacquiring_unlocked_lock_raises_error(locks, name):
    lock = locks.lock(name, timeout=10)
    with pytest.raises(LockError):
        lock.reacquire()


def test_reacquiring_lock_with_no_timeout_raises_error(locks, name):
    lock = locks.lock(name)
    assert lock.acquire(blocking=False)
    with pytest.raises(LockError):
        lock.reacquire()
    lock.release()


def test_reacquiring_lock_no_longer_owned_raises_error(locks, name):
    lock = locks.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    locks.force_release(name)
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()


def test_context_manager_reacquiring_lock_with_no_timeout_raises_error(locks, name):
    with locks.lock(name, timeout=None, blocking=False) as lock:
        with pytest.raises(LockError):
            lock.reacquire()


def test_context_manager_reacquiring_lock_no_longer_owned_raises_error(locks, name):
    with pytest.raises(LockNotOwnedError):
        with locks.lock(name, timeout=10, blocking=False):
            locks.force_release(name)


def test_sleep_above_timeout_is_refused(locks, name):
    with pytest.raises(LockError) as raised:
        locks.lock(name, timeout=0.5, sleep=1)
    assert raised.value.lock_name == name


def test_lock_class_argument(locks, name):
    class MyLock(dlock.Lock):
        pass

    assert isinstance(locks.lock(name, lock_class=MyLock), MyLock)


def test_lock_error_is_a_value_error_as_in_redis_py():
    assert issubclass(LockError, ValueError)
    assert issubclass(LockNotOwnedError, LockError)


# thread_local, as redis-py documents it


def test_thread_local_token_is_not_seen_by_other_threads(locks, name):
    lock = locks.lock(name)
    assert lock.acquire(blocking=False)
    seen = {}

    def other():
        seen["owned"] = lock.owned()
        try:
            lock.release()
        except LockError as error:
            seen["error"] = error

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert seen["owned"] is False
    assert isinstance(seen["error"], LockError)
    assert lock.owned()
    lock.release()


def test_without_thread_local_another_thread_may_release(locks, name):
    lock = locks.lock(name, thread_local=False)
    assert lock.acquire(blocking=False)
    worker = threading.Thread(target=lock.release)
    worker.start()
    worker.join()
    assert not lock.locked()


# Beyond redis-py: fences, the lost signal, the watchdog


def test_fences_increase_across_holders(locks, name):
    fences = []
    for _ in range(3):
        with locks.lock(name, timeout=10) as lock:
            fences.append(lock.fence)
    assert fences == sorted(fences) and len(set(fences)) == 3
    assert lock.fence is None


def test_lost_signal_fires_when_the_lock_is_broken(locks, name):
    lock = locks.lock(name, timeout=5)
    assert lock.acquire(blocking=False)
    assert not lock.lost
    assert lock.wait_lost(0.1) is False
    locks.force_release(name)
    # The keeper notices at its next renewal check: within one lease.
    assert lock.wait_lost(10) is True
    assert lock.lost
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_without_timeout_the_watchdog_keeps_the_lock(store_url, name):
    locks = dlock.connect(store_url, watchdog_lease=0.3)
    lock = locks.lock(name)
    assert lock.acquire(blocking=False)
    time.sleep(1.2)  # four leases
    assert lock.owned()
    assert not lock.lost
    assert not locks.lock(name).acquire(blocking=False)
    lock.release()
    # A fixed timeout is not renewed.
    fixed = locks.lock(name, timeout=0.3)
    assert fixed.acquire(blocking=False)
    time.sleep(1.2)
    assert not fixed.owned()


def test_fair_lock(locks, name):
    lock = locks.lock(name, fair=True)
    assert lock.acquire(blocking=False)
    assert not locks.lock(name, fair=True).acquire(blocking=False)
    lock.release()


def waiting_for(locks: dlock.Locks, name: str, count: int) -> None:
    """Returns once the store counts ``count`` requests waiting for ``name``."""
    deadline = time.monotonic() + 30
    while True:
        info = locks.inspect(name)
        assert info is not None, f"{name} should be held"
        assert info.waiters is not None, "the store should count its waiters"
        if info.waiters == count:
            return
        assert time.monotonic() < deadline, f"{info.waiters} waiters, never {count}"
        time.sleep(0.01)


def test_fair_lock_serves_waiters_in_arrival_order(locks, store_url, name):
    holder = locks.lock(name, timeout=60)
    assert holder.acquire(blocking=False)
    waiting_for(locks, name, 0)
    served = []
    failures = []

    def wait_in_line(place):
        # A connection of its own, as a waiter in another process would have.
        lock = dlock.connect(store_url).lock(name, timeout=60, fair=True)
        try:
            if not lock.acquire(blocking_timeout=60):
                failures.append(f"waiter {place} was not served")
                return
            served.append(place)
            time.sleep(0.02)
            lock.release()
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(error)

    waiters = []
    try:
        for place in range(4):
            waiter = threading.Thread(target=wait_in_line, args=(place,))
            waiter.start()
            waiters.append(waiter)
            # In line behind the holder and every earlier waiter before the next one starts.
            waiting_for(locks, name, place + 1)
        assert served == []
    finally:
        holder.release()
        for waiter in waiters:
            waiter.join(90)
    assert failures == []
    assert served == [0, 1, 2, 3]


def test_gil_is_released_while_waiting(locks, name):
    holder = locks.lock(name)
    assert holder.acquire(blocking=False)
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        assert not locks.lock(name).acquire(blocking_timeout=0.5)
        during = len(ticks)
    finally:
        stop.set()
        ticker.join()
        holder.release()
    # The other Python thread kept running while this one waited in the store.
    assert during >= 10
