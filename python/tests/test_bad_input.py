"""Bad input: a clear Python exception, before any store is touched, no lock left behind, and
never a secret from the URL in a message."""

from __future__ import annotations

import asyncio
import math

import pytest

import dlock
import dlock.asyncio
from dlock import StoreUnavailableError

SECRET = "s3cr3t-pa55"


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"timeout": -1}, ValueError),
        ({"timeout": 0}, ValueError),
        ({"timeout": math.nan}, ValueError),
        ({"timeout": math.inf}, ValueError),
        ({"timeout": "10"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"blocking_timeout": -0.5}, ValueError),
        ({"blocking_timeout": "soon"}, TypeError),
        ({"sleep": -1}, ValueError),
        ({"sleep": None}, TypeError),
        ({"timeout": 0.001}, ValueError),  # below dlock's smallest lease (10 ms)
    ],
)
def test_bad_lock_options(locks, name, kwargs, error):
    with pytest.raises(error):
        lock = locks.lock(name, **kwargs)
        lock.acquire(blocking=False)
    # Nothing was taken.
    assert locks.inspect(name) is None


@pytest.mark.parametrize("bad", [None, 42, 3.5, ["a"], object()])
def test_bad_name_type(locks, bad):
    with pytest.raises(TypeError, match="name must be str or bytes"):
        locks.lock(bad)


@pytest.mark.parametrize("bad", ["", "x" * 600, "nul\0byte"])
def test_bad_name_value(locks, bad):
    with pytest.raises(ValueError, match="invalid lock name"):
        locks.lock(bad).acquire(blocking=False)


def test_bytes_name_is_accepted_as_in_redis_py(locks, name):
    lock = locks.lock(name.encode())
    assert lock.name == name
    assert lock.acquire(blocking=False)
    lock.release()


def test_bad_acquire_arguments(locks, name):
    lock = locks.lock(name)
    with pytest.raises(ValueError):
        lock.acquire(blocking_timeout=-1)
    with pytest.raises(TypeError):
        lock.acquire(token=object())
    with pytest.raises(ValueError):
        lock.acquire(sleep=-1)
    assert not lock.locked()


def test_bad_extend_arguments(locks, name):
    lock = locks.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    with pytest.raises(ValueError):
        lock.extend(-1)
    with pytest.raises(TypeError):
        lock.extend("10")
    with pytest.raises(ValueError):
        lock.wait_lost(-1)
    assert lock.owned()
    lock.release()


def test_bad_primitive_arguments(locks, name):
    with pytest.raises(ValueError):
        locks.semaphore(name, 0)
    with pytest.raises(TypeError):
        locks.semaphore(name, 2.5)
    with pytest.raises(ValueError):
        locks.semaphore(name, 2, count=0)
    with pytest.raises(TypeError):
        locks.semaphore(name, 2, count=1.5)
    with pytest.raises(TypeError):
        locks.multi_lock(name)  # a single string, not a list of names
    with pytest.raises(ValueError):
        locks.multi_lock([]).acquire()
    with pytest.raises(TypeError):
        locks.value(name).set("text")
    with pytest.raises(TypeError):
        locks.value(name).compare_and_set("1", b"x")
    with pytest.raises(ValueError):
        locks.value(name).set(b"x" * (256 * 1024 + 1))
    with pytest.raises(ValueError):
        locks.mutex(name, ttl=-1)
    with pytest.raises(ValueError):
        locks.rwlock(name, max_readers=0)


@pytest.mark.parametrize(
    "url",
    [
        "carrier-pigeon://coop",
        "not a url",
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:6379/0?prefix_typo=x",
        "postgres://user@127.0.0.1:5432/db?mode=telepathy",
    ],
)
def test_bad_urls(url):
    with pytest.raises(ValueError):
        dlock.connect(url)


@pytest.mark.parametrize("bad", [42, b"redis://x", ["memory://"]])
def test_bad_url_types(bad):
    with pytest.raises(TypeError):
        dlock.connect(bad)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://app:{SECRET}@127.0.0.1:1/0",
        f"redis://app:{SECRET}@127.0.0.1:1/0?prefix_typo=1",
        f"redis://app:{SECRET}@127.0.0.1:notaport/0",
        f"postgres://app:{SECRET}@127.0.0.1:1/db",
        f"postgres://app:{SECRET}@127.0.0.1:1/db?mode=bogus",
        f"rediss://app:{SECRET}@127.0.0.1:1/0?ca=/nonexistent/ca.pem",
    ],
)
def test_no_secret_in_errors(url):
    with pytest.raises(Exception) as raised:
        dlock.connect(url)
    error = raised.value
    assert isinstance(error, (ValueError, dlock.DlockError)), repr(error)
    for text in (str(error), repr(error), repr(error.args)):
        assert SECRET not in text


def test_unreachable_store_is_unavailable():
    with pytest.raises(StoreUnavailableError):
        dlock.connect("redis://127.0.0.1:1/0?connect_timeout=200ms")


def test_wrong_locks_type():
    with pytest.raises(TypeError):
        dlock.Lock("redis://127.0.0.1:6379", "name")


def test_repr_hides_the_url(redis_server):
    redis = pytest.importorskip("redis")
    admin = redis.Redis(port=redis_server.port)
    admin.acl_setuser("pyapp", enabled=True, passwords=[f"+{SECRET}"], keys=["*"], channels=["*"], commands=["+@all"])
    locks = dlock.connect(f"redis://pyapp:{SECRET}@127.0.0.1:{redis_server.port}/0")
    assert SECRET not in repr(locks)
    lock = locks.lock("repr-test")
    assert SECRET not in repr(lock)
    assert lock.acquire(blocking=False)
    lock.release()


def test_async_bad_input(store_url, name):
    async def main():
        locks = await dlock.asyncio.connect(store_url)
        with pytest.raises(ValueError):
            locks.lock(name, timeout=-1)
        with pytest.raises(ValueError):
            await locks.lock(name).acquire(blocking_timeout=-1)
        with pytest.raises(ValueError):
            await locks.lock("").acquire()
        with pytest.raises(ValueError):
            await dlock.asyncio.connect("carrier-pigeon://coop")

    asyncio.run(main())
