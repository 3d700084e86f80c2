"""dlock: distributed locks with fencing tokens and lost-lock signals, with redis-py's ``Lock``
API over every dlock store (SQLite, Redis, Redlock, PostgreSQL, MySQL/MariaDB, etcd,
ZooKeeper).

>>> import dlock
>>> locks = dlock.connect("memory://")          # any dlock URL; none: a SQLite file
>>> lock = locks.lock("orders/42", timeout=10)   # redis-py's Redis.lock signature
>>> lock.acquire(blocking=False)
True
>>> lock.owned(), lock.fence > 0
(True, True)
>>> lock.release()

Moving from redis-py: ``dlock.redis_py.lock(r, name, ...)`` takes an existing ``redis.Redis``
client. asyncio: ``dlock.asyncio``. The locking itself is dlock's Rust core: this package
releases the GIL while it talks to the store, and Ctrl-C interrupts a blocking acquire.
"""

from __future__ import annotations

from ._barrier import Barrier, BarrierGuard, DoubleBarrier, Inside
from ._coordination import CountDownLatch, Counter
from ._dlock import default_url, enabled_schemes
from ._election import Election, Leader, Leadership
from ._run import run_while_held
from ._sync import (
    DEFAULT_UPDATE_ATTEMPTS,
    Guard,
    Lock,
    LockInfo,
    Locks,
    MultiLock,
    Mutex,
    RwLock,
    Semaphore,
    Versioned,
    VersionedValue,
    connect,
)
from .exceptions import (
    ConflictError,
    DlockError,
    LockError,
    LockNotOwnedError,
    LockTimeoutError,
    LostError,
    StoreError,
    StoreUnavailableError,
    UnsupportedError,
)

__all__ = [
    "connect",
    "run_while_held",
    "default_url",
    "enabled_schemes",
    "Locks",
    "Lock",
    "Guard",
    "Election",
    "Leadership",
    "Leader",
    "Counter",
    "CountDownLatch",
    "Barrier",
    "BarrierGuard",
    "DoubleBarrier",
    "Inside",
    "Mutex",
    "RwLock",
    "Semaphore",
    "MultiLock",
    "VersionedValue",
    "Versioned",
    "LockInfo",
    "DEFAULT_UPDATE_ATTEMPTS",
    "DlockError",
    "LockError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LostError",
    "ConflictError",
    "UnsupportedError",
    "StoreError",
    "StoreUnavailableError",
]
