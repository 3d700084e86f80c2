"""The drop-in: dlock.redis_py takes an existing redis-py client (redis-py is only a test
dependency of dlock)."""

from __future__ import annotations

import asyncio

import pytest

redis = pytest.importorskip("redis")
import redis.asyncio  # noqa: E402
import redis.exceptions  # noqa: E402

import dlock  # noqa: E402
import dlock.redis_py  # noqa: E402


@pytest.fixture
def r(redis_server):
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, db=0)
    yield client
    client.close()


def test_lock_from_a_redis_py_client(r, name):
    lock = dlock.redis_py.Lock(r, name, timeout=10)
    assert isinstance(lock, dlock.Lock)
    assert lock.redis is r
    assert lock.acquire(blocking=False)
    assert lock.owned() and lock.locked()
    assert lock.fence > 0
    assert not dlock.redis_py.lock(r, name).acquire(blocking=False)
    lock.release()
    assert not lock.locked()


def test_errors_are_redis_py_errors_too(r, name):
    lock = dlock.redis_py.lock(r, name, timeout=10)
    with pytest.raises(redis.exceptions.LockError) as raised:
        lock.release()
    assert isinstance(raised.value, dlock.LockError)
    assert raised.value.lock_name == name
    assert lock.acquire(blocking=False)
    dlock.connect(dlock.redis_py.url_from_client(r)).force_release(name)
    with pytest.raises(redis.exceptions.LockNotOwnedError) as not_owned:
        lock.extend(5)
    assert isinstance(not_owned.value, dlock.LockNotOwnedError)
    with pytest.raises(redis.exceptions.LockError):
        with dlock.redis_py.lock(r, name, blocking_timeout=0.1) as held:
            assert held.owned()
            with dlock.redis_py.lock(r, name, blocking_timeout=0.1):
                pass


def test_lock_class_argument(r, name):
    class MyLock(dlock.redis_py.Lock):
        pass

    assert isinstance(dlock.redis_py.lock(r, name, lock_class=MyLock), MyLock)


def test_connection_settings_are_read(redis_server):
    client = redis.Redis(
        host="127.0.0.1", port=redis_server.port, db=3, username="u", password="p@ss/word", socket_timeout=2.5
    )
    url = dlock.redis_py.url_from_client(client)
    assert url.startswith(f"redis://u:p%40ss%2Fword@127.0.0.1:{redis_server.port}/3?")
    assert "timeout=2500ms" in url.split("?")[1].split("&")
    tls = redis.Redis(host="localhost", port=6380, ssl=True, ssl_cert_reqs="none")
    tls_url = dlock.redis_py.url_from_client(tls)
    assert tls_url.startswith("rediss://localhost:6380/0") and tls_url.endswith("#insecure")
    with pytest.raises(TypeError):
        dlock.redis_py.url_from_client(object())


def test_password_protected_server(r, redis_server, name):
    r.acl_setuser("lockuser", enabled=True, passwords=["+hunter22"], keys=["*"], channels=["*"], commands=["+@all"])
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, username="lockuser", password="hunter22")
    lock = dlock.redis_py.Lock(client, name)
    assert lock.acquire(blocking=False)
    lock.release()


def test_asyncio_client(redis_server, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
        lock = dlock.redis_py.Lock(client, name, timeout=10)
        assert isinstance(lock, dlock.redis_py.AsyncLock)
        async with lock:
            assert await lock.owned()
            assert not await dlock.redis_py.lock(client, name).acquire(blocking=False)
        with pytest.raises(redis.exceptions.LockError):
            await lock.release()
        await client.aclose()

    asyncio.run(main())


def test_redis_py_and_dlock_holders_exclude_each_other_both_ways(r, name):
    import threading
    import time

    from redis.lock import Lock as RedisPyLock

    theirs = RedisPyLock(r, name, timeout=10)
    ours = dlock.redis_py.Lock(r, name, timeout=10)
    # redis-py holds: dlock is refused, and redis-py's key is the one it wrote.
    assert theirs.acquire(blocking=False)
    assert r.get(name) == theirs.local.token
    assert not ours.acquire(blocking=False)
    assert ours.locked()
    theirs.release()
    # dlock holds: redis-py is refused; the key holds a token with an expiry, as redis-py's.
    assert ours.acquire(blocking=False)
    first_fence = ours.fence
    assert r.get(name) is not None and 0 < r.pttl(name) <= 10_000
    assert not theirs.acquire(blocking=False)
    assert theirs.locked()
    ours.release()
    assert r.get(name) is None
    # A dlock waiter behind a redis-py holder gets the lock once redis-py lets it go, and its
    # fence is above the last dlock holder's.
    assert theirs.acquire(blocking=False)
    got = []

    def wait_behind_redis_py() -> None:
        # The hold is the waiting thread's (thread_local): read and release it there.
        acquired = ours.acquire(blocking_timeout=10)
        got.append((acquired, ours.fence))
        if acquired:
            ours.release()

    waiter = threading.Thread(target=wait_behind_redis_py)
    waiter.start()
    time.sleep(0.3)
    assert not got, "dlock got in beside a redis-py holder"
    theirs.release()
    waiter.join(15)
    assert len(got) == 1 and got[0][0], got
    assert got[0][1] > first_fence


def test_the_dlock_layout_is_kept_on_request(r, name):
    locks = dlock.connect(dlock.redis_py.url_from_client(r, layout="dlock"))
    lock = locks.lock(name, timeout=10)
    assert lock.acquire(blocking=False)
    assert r.get(name) is None, "dlock's own layout keeps the lock under its prefix"
    lock.release()
    with pytest.raises(ValueError):
        dlock.redis_py.url_from_client(r, layout="other")
