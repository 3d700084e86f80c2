"""A drop-in for redis-py's ``Lock``: the same constructor, taking an existing redis-py client.

Switching an application is one import::

    # before: from redis.lock import Lock
    from dlock.redis_py import Lock

    lock = Lock(r, "orders/42", timeout=10)      # r: your redis.Redis (or redis.asyncio.Redis)
    # or: lock = dlock.redis_py.lock(r, "orders/42", timeout=10)

The client's connection settings (host, port, db, username, password, TLS, socket timeouts)
are read once and dlock opens its own connection to the same server; the exceptions raised are
both dlock's and redis-py's (``except redis.exceptions.LockError`` keeps working).

Locks are kept in redis-py's own layout (``?layout=redis-py`` in dlock's URL): the key is the
lock's name and holds the holder's token with a ``PX`` expiry, as redis-py writes it, so a
process still on redis-py's ``Lock`` and one already on dlock exclude each other, and a fleet
can move one process at a time. dlock keeps what redis-py has no place for (the fence, the
owner) in a key of its own beside the lock, which redis-py never reads; releases by dlock wake
dlock's waiters at once, and a dlock waiter behind a redis-py holder looks again at most every
250 ms (redis-py's own waiters poll every ``sleep`` seconds). Two differences remain: a lock
taken by dlock always has a lease (with ``timeout=None`` a watchdog renews it while held, so
a crashed holder frees it within 30 s, where redis-py's would stay locked for ever), and a
``token`` passed to ``acquire`` is recorded as ``lock.local.token`` while the store keeps a
token dlock generates, unique per acquisition.

redis-py is not a dependency of dlock: it is imported only when one of these is called.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Tuple, Type, Union
from urllib.parse import quote

from . import _sync
from . import asyncio as _aio
from ._dlock import Client
from .exceptions import LockError as _DlockLockError
from .exceptions import LockNotOwnedError as _DlockNotOwned
from .exceptions import UnsupportedError

__all__ = ["Lock", "AsyncLock", "lock", "url_from_client"]

Number = Union[int, float]

_clients: Dict[str, Client] = {}
_clients_lock = threading.Lock()
_errors: Optional[Tuple[Type[_DlockLockError], Type[_DlockNotOwned]]] = None


def _error_classes() -> Tuple[Type[_DlockLockError], Type[_DlockNotOwned]]:
    """Exception classes that are dlock's and redis-py's at once."""
    global _errors
    if _errors is None:
        import redis.exceptions as redis_exceptions

        class LockError(_DlockLockError, redis_exceptions.LockError):
            """dlock's ``LockError`` that is also redis-py's."""

        class LockNotOwnedError(LockError, _DlockNotOwned, redis_exceptions.LockNotOwnedError):
            """dlock's ``LockNotOwnedError`` that is also redis-py's."""

        LockError.__module__ = LockNotOwnedError.__module__ = __name__
        _errors = (LockError, LockNotOwnedError)
    return _errors


def url_from_client(redis: Any, layout: str = "redis-py") -> str:
    """The dlock URL of the server a redis-py client talks to (it contains the password, if
    any: keep it out of logs), with its locks in ``layout``: ``"redis-py"`` (redis-py's own
    keys, so both exclude each other) or ``"dlock"`` (dlock's keys: reentrant and fair locks,
    listing)."""
    if layout not in ("redis-py", "dlock"):
        raise ValueError(f"layout must be 'redis-py' or 'dlock', not {layout!r}")
    pool = getattr(redis, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        raise TypeError(
            f"expected a redis.Redis or redis.asyncio.Redis client, not {type(redis).__name__}"
        )
    if kwargs.get("path"):
        raise UnsupportedError("dlock's Redis backend connects over TCP; this client uses a Unix socket")
    connection_class = getattr(pool, "connection_class", type(None)).__name__
    tls = "SSL" in connection_class
    host = str(kwargs.get("host") or "localhost")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = int(kwargs.get("port") or 6379)
    db = int(kwargs.get("db") or 0)
    username = kwargs.get("username")
    password = kwargs.get("password")
    userinfo = ""
    if password:
        userinfo = f"{quote(str(username or ''), safe='')}:{quote(str(password), safe='')}@"
    elif username:
        userinfo = f"{quote(str(username), safe='')}@"
    options = [f"layout={layout}"]
    for ours, theirs in (("timeout", "socket_timeout"), ("connect_timeout", "socket_connect_timeout")):
        value = kwargs.get(theirs)
        if isinstance(value, (int, float)) and value > 0:
            options.append(f"{ours}={max(1, int(value * 1000))}ms")
    if tls and kwargs.get("ssl_ca_certs"):
        options.append(f"ca={quote(str(kwargs['ssl_ca_certs']), safe='/')}")
    query = f"?{'&'.join(options)}"
    fragment = "#insecure" if tls and kwargs.get("ssl_cert_reqs") in ("none", 0) else ""
    return f"{'rediss' if tls else 'redis'}://{userinfo}{host}:{port}/{db}{query}{fragment}"


def _client(redis: Any) -> Client:
    """One dlock connection per server, shared by every lock made from its clients."""
    url = url_from_client(redis)
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = Client(url)
            _clients[url] = client
        return client


def _is_async(redis: Any) -> bool:
    return type(redis).__module__.startswith("redis.asyncio")


class Lock(_sync.Lock):
    """redis-py's ``redis.lock.Lock(redis, name, ...)`` on dlock; see ``dlock.Lock``.

    Given a ``redis.asyncio.Redis`` client, makes an ``AsyncLock`` instead.
    """

    def __new__(cls, redis: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is Lock and _is_async(redis):
            return AsyncLock(redis, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes],
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        self._LockError, self._LockNotOwnedError = _error_classes()
        super().__init__(
            _sync.Locks(_client(redis)),
            name,
            timeout=timeout,
            sleep=sleep,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
        )
        self.redis = redis


class AsyncLock(_aio.Lock):
    """redis-py's ``redis.asyncio.lock.Lock(redis, name, ...)`` on dlock.

    The constructor is synchronous, as redis-py's: the first lock made for a server opens
    dlock's connection to it (one round trip, once per process and server)."""

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes],
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> None:
        self._LockError, self._LockNotOwnedError = _error_classes()
        super().__init__(
            _aio.Locks(_client(redis)),
            name,
            timeout=timeout,
            sleep=sleep,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
        )
        self.redis = redis


def lock(
    redis: Any,
    name: Union[str, bytes],
    timeout: Optional[Number] = None,
    sleep: Number = 0.1,
    blocking: bool = True,
    blocking_timeout: Optional[Number] = None,
    lock_class: Optional[type] = None,
    thread_local: bool = True,
    raise_on_release_error: bool = True,
) -> Any:
    """redis-py's ``r.lock(name, ...)`` as a function of the client: a dlock ``Lock`` (or
    ``AsyncLock`` for an asyncio client), or ``lock_class(redis, name, ...)`` if given."""
    if lock_class is None:
        lock_class = AsyncLock if _is_async(redis) else Lock
    return lock_class(
        redis,
        name,
        timeout=timeout,
        sleep=sleep,
        blocking=blocking,
        blocking_timeout=blocking_timeout,
        thread_local=thread_local,
        raise_on_release_error=raise_on_release_error,
    )
