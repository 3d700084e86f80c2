"""What redis-py lacks, with the Rust API's names: mutex options, semaphores, read-write locks,
multi-locks, versioned values, inspection."""

from __future__ import annotations

import threading

import pytest

import dlock
from dlock import ConflictError, LockNotOwnedError, LockTimeoutError


def test_mutex_guard(locks, name):
    with locks.mutex(name, ttl=10) as guard:
        assert guard.fence > 0
        assert guard.is_owned()
        assert not guard.lost
        assert locks.mutex(name).try_acquire() is None
        info = locks.inspect(name)
        assert info is not None and info.fence == guard.fence and info.holds == 1
    assert locks.inspect(name) is None
    guard = locks.mutex(name, wait=0).acquire()
    with pytest.raises(LockTimeoutError):
        locks.mutex(name, wait=0.1).acquire()
    guard.release()
    with pytest.raises(LockNotOwnedError):
        guard.release()


def test_reentrant_mutex(locks, name):
    first = locks.mutex(name, reentrant=True).acquire()
    # Another acquisition is another holder, even on this connection: only the guard re-enters.
    with pytest.raises(LockTimeoutError):
        locks.mutex(name, reentrant=True, wait=0).acquire()
    second = first.reenter()
    assert second.fence == first.fence
    assert locks.inspect(name).holds == 2
    second.release()
    assert locks.inspect(name) is not None
    first.release()
    assert locks.inspect(name) is None


def test_guard_extend(locks, name):
    guard = locks.mutex(name, ttl=2).acquire()
    guard.extend(20)
    assert locks.inspect(name).ttl_left > 15
    guard.release()
    with pytest.raises(LockNotOwnedError):
        guard.extend(5)


def test_semaphore_never_exceeds_its_permits(locks, name):
    semaphore = locks.semaphore(name, 2, ttl=10)
    one = semaphore.acquire()
    two = semaphore.acquire()
    assert semaphore.try_acquire() is None
    with pytest.raises(LockTimeoutError):
        locks.semaphore(name, 2, wait=0.1).acquire()
    one.release()
    three = semaphore.try_acquire()
    assert three is not None
    for permit in (two, three):
        permit.release()


def test_semaphore_takes_several_permits_all_or_nothing(locks, name):
    two = locks.semaphore(name, 3, ttl=10, count=2).acquire()
    assert len(two.fences) == 2 and two.fence == max(fence for _, fence in two.fences)
    # One permit is left: two at once cannot be had, and the refused attempt keeps none.
    assert locks.semaphore(name, 3, count=2).try_acquire() is None
    one = locks.semaphore(name, 3).try_acquire()
    assert one is not None
    with pytest.raises(LockTimeoutError):
        locks.semaphore(name, 3, count=2, wait=0.2).acquire()
    two.release()
    again = locks.semaphore(name, 3, count=2).try_acquire()
    assert again is not None
    for permit in (one, again):
        permit.release()


def test_rwlock(locks, name):
    rw = locks.rwlock(name, max_readers=4, ttl=10)
    r1 = rw.read()
    r2 = rw.read()
    assert rw.try_write() is None
    r1.release()
    r2.release()
    with rw.write() as writer:
        assert writer.fence > 0
        assert rw.try_read() is None
    assert rw.try_read() is not None


def test_multi_lock_is_all_or_nothing(locks, name):
    a, b, c = f"{name}/a", f"{name}/b", f"{name}/c"
    single = locks.mutex(b).acquire()
    assert locks.multi_lock([a, b]).try_acquire() is None
    # Nothing of the failed attempt stays held.
    assert locks.inspect(a) is None
    single.release()
    with locks.multi_lock([a, b, c], ttl=10) as guard:
        assert sorted(n for n, _ in guard.fences) == sorted([a, b, c])
        assert guard.fence == max(f for _, f in guard.fences)
        assert guard.is_owned()
        assert locks.mutex(c).try_acquire() is None
    assert locks.mutex(c).try_acquire() is not None


def test_versioned_value(locks, name):
    value = locks.value(name)
    assert value.get() is None
    v1 = value.compare_and_set(None, b"100")
    assert v1 is not None
    assert value.compare_and_set(None, b"x") is None
    assert value.get() == dlock.Versioned(b"100", v1)
    v2 = value.set(b"99")
    assert v2 > v1
    assert value.compare_and_set(v1, b"stale") is None
    updated = value.update(lambda current: str(int(current) - 1).encode())
    assert updated.value == b"98" and updated.version > v2


def test_versioned_value_update_under_contention(locks, name):
    # The default attempts: writers that collide must spread out at the store's own pace (the
    # Rust core's retry pacing), not exhaust their attempts and raise ConflictError.
    value = locks.value(name)
    assert value.max_attempts == dlock.DEFAULT_UPDATE_ATTEMPTS
    value.set(b"0")
    failures = []

    def add():
        try:
            for _ in range(50):
                value.update(lambda current: str(int(current) + 1).encode())
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(error)

    threads = [threading.Thread(target=add) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert value.get().value == b"400"


def test_versioned_value_update_can_decline(locks, name):
    value = locks.value(name)
    seen = []

    def nothing_to_do(current):
        seen.append(current)
        return None

    # Never written: the callback sees None, declines, and nothing is created.
    assert value.update(nothing_to_do) is None
    assert seen == [None]
    assert value.get() is None
    version = value.set(b"0")
    assert value.update(nothing_to_do) is None
    assert seen == [None, b"0"]
    assert value.get() == dlock.Versioned(b"0", version)

    def take_one(current):
        left = int(current)
        return None if left == 0 else str(left - 1).encode()

    value.set(b"1")
    taken = value.update(take_one)
    assert taken is not None and taken.value == b"0"
    assert value.update(take_one) is None
    assert value.get() == taken


class Refused(Exception):
    pass


def test_versioned_value_update_exception_propagates_and_writes_nothing(locks, name):
    value = locks.value(name)
    version = value.set(b"a")
    error = Refused("no")

    def refuse(current):
        raise error

    with pytest.raises(Refused) as raised:
        value.update(refuse)
    assert raised.value is error
    assert value.get() == dlock.Versioned(b"a", version)

    # Raised on a later attempt, after a collision: still nothing written by this update.
    calls = []

    def collide_then_refuse(current):
        calls.append(current)
        if len(calls) == 1:
            locks.value(name).set(b"b")
            return b"c"
        raise error

    with pytest.raises(Refused) as raised:
        value.update(collide_then_refuse)
    assert raised.value is error
    assert calls == [b"a", b"b"]
    after = value.get()
    assert after is not None and after.value == b"b" and after.version > version

    # A result that is not bytes is a TypeError, and nothing is written either.
    with pytest.raises(TypeError):
        value.update(lambda current: "text")
    assert value.get() == after


def test_versioned_value_conflict(locks, name):
    value = locks.value(name, max_attempts=1)
    value.set(b"a")

    def sneaky(current):
        # Another writer gets in between the read and the write, every time.
        locks.value(name).set(b"b")
        return b"c"

    with pytest.raises(ConflictError):
        value.update(sneaky)


def test_list(locks, name):
    held = [locks.mutex(f"{name}/{i}", ttl=10).acquire() for i in range(3)]
    listed = locks.list(f"{name}/")
    assert sorted(info.name for info in listed) == sorted(f"{name}/{i}" for i in range(3))
    for guard in held:
        guard.release()


def test_fenced_write_lands_while_held_and_is_refused_once_expired(locks, name):
    value = locks.value(f"{name}/state")
    guard = locks.mutex(name, ttl=1).acquire()
    version = value.set_fenced(guard, b"mine")
    assert value.get() == dlock.Versioned(b"mine", version)
    # Past the lease, by any clock the store keeps: another holder takes the lock.
    with locks.mutex(name, ttl=30, wait=30).acquire() as newer:
        with pytest.raises(LockNotOwnedError):
            value.set_fenced(guard, b"late")
        assert value.get() == dlock.Versioned(b"mine", version)
        assert value.set_fenced(newer, b"newer") > version
    # A redis-py-style lock works too, and one not held is refused before any store call.
    lock = locks.lock(name, timeout=30)
    with pytest.raises(LockNotOwnedError):
        value.set_fenced(lock, b"unheld")
    with lock:
        assert value.set_fenced(lock, b"by lock") > version
    with pytest.raises(TypeError):
        value.set_fenced(object(), b"not a hold")
