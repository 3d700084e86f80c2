"""The synchronous API: ``connect``, ``Locks``, redis-py's ``Lock`` and dlock's primitives.

Every call that talks to the store releases the GIL while it waits, and a blocking wait wakes
every 50 ms to let Python run its signal handlers, so Ctrl-C interrupts it.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Tuple, Type, Union, overload

from . import _args
from ._barrier import Barrier, DoubleBarrier
from ._coordination import CountDownLatch, Counter
from ._election import Election
from ._dlock import DEFAULT_UPDATE_ATTEMPTS as _RUST_DEFAULT_UPDATE_ATTEMPTS
from ._dlock import Client, Hold
from .exceptions import LockError, LockNotOwnedError, LockTimeoutError

logger = logging.getLogger("dlock")

Number = Union[int, float]

#: How many times ``VersionedValue.update`` reads, computes and tries to write by default
#: (the Rust core's ``DEFAULT_UPDATE_ATTEMPTS``).
DEFAULT_UPDATE_ATTEMPTS: int = _RUST_DEFAULT_UPDATE_ATTEMPTS


class LockInfo(NamedTuple):
    """Who holds a lock, as ``Locks.inspect`` and ``Locks.list`` report it."""

    name: str
    fence: int
    label: Optional[str]
    host: str
    pid: int
    acquired_at: float
    """Unix time (seconds) of the acquisition, by the holder's or the store's clock."""
    ttl_left: Optional[float]
    """Lease seconds left as the store sees them; ``None`` for a session lock."""
    holds: int
    waiters: Optional[int] = None
    """How many requests wait for the lock, when the store keeps a queue it can count
    (SQLite, Redis, the PostgreSQL and MySQL lease tables); ``None`` when it cannot."""


class Versioned(NamedTuple):
    """A versioned value and the version that wrote it."""

    value: bytes
    version: int


#: What ``VersionedValue.update`` calls: the current bytes (``None``: never written) to the
#: bytes to write, or ``None`` to write nothing.
Change = Callable[[Optional[bytes]], Optional[bytes]]


class _Attempt:
    """An update's ``change`` as the Rust core calls it, once per attempt: the result is
    checked (``bytes`` or ``None``), and an exception is kept here for the caller instead of
    crossing the native code; the attempt then declines, so the update ends with nothing
    written, and ``result`` raises the exception itself."""

    def __init__(self, change: Change) -> None:
        if not callable(change):
            raise TypeError(f"change must be callable, not {type(change).__name__}")
        self._change = change
        self._error: Optional[BaseException] = None

    def __call__(self, current: Optional[bytes]) -> Optional[bytes]:
        try:
            new = self._change(current)
            return None if new is None else _args.data(new)
        except BaseException as error:  # noqa: BLE001 - raised again by result()
            self._error = error
            return None

    def result(self, written: Optional[Tuple[bytes, int]]) -> Optional[Versioned]:
        error, self._error = self._error, None
        if error is not None:
            raise error
        return None if written is None else Versioned(*written)


def connect(
    url: Optional[str] = None, *, label: Optional[str] = None, watchdog_lease: Optional[Number] = None
) -> "Locks":
    """Connects to the lock store named by ``url`` and returns its ``Locks``.

    ``url`` is any dlock URL: ``sqlite:///var/lib/app/locks.db``, ``redis://[user:pass@]host:port/db``,
    ``rediss://…``, ``redlock://h1:p1,h2:p2,h3:p3``, ``postgres://user@host/db``,
    ``mysql://…``, ``etcd://host:port``, ``zk://host:port``, ``memory://``. Without one, the
    ``DLOCK_URL`` environment variable, else the ``dlock`` command's default: a SQLite file in
    the user's state directory (``~/.local/state/dlock/locks.db``), shared by the processes of
    this machine.

    ``label`` is stored with every lock taken through this connection (``dlock ls`` shows it);
    ``watchdog_lease`` is the lease (seconds, default 30) of locks without a ``timeout``.

    >>> import dlock
    >>> locks = dlock.connect("memory://")
    >>> with locks.lock("orders/42", timeout=10) as lock:
    ...     print(lock.fence > 0)
    True

    Raises ``ValueError`` for a bad URL, ``StoreUnavailableError`` when the store cannot be
    reached. Messages never contain the URL's password.
    """
    lease = _args.seconds(watchdog_lease, "watchdog_lease", positive=True)
    return Locks(Client(_args.url(url), _args.label(label), lease))


class Locks:
    """A connection to one lock store; cheap to share between threads.

    Made by ``dlock.connect``. A forked child reconnects by itself on first use: it shares no
    socket, lease or hold with its parent.
    """

    def __init__(self, client: Client) -> None:
        self._client = client

    @property
    def backend(self) -> str:
        """The store's backend name: ``"sqlite"``, ``"redis"``, ``"postgres"``, …"""
        return self._client.backend

    def __repr__(self) -> str:
        # Never the URL: it may carry a password.
        return f"<dlock.Locks backend={self.backend!r}>"

    def lock(
        self,
        name: Union[str, bytes],
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        lock_class: Optional[Type["Lock"]] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        fair: bool = False,
    ) -> "Lock":
        """redis-py's ``Redis.lock``: a ``Lock`` named ``name`` (see ``Lock``).

        ``fair=True`` (not in redis-py) queues waiters in arrival order across processes, on
        the stores that can (SQLite, Redis, PostgreSQL, MySQL, etcd, ZooKeeper).
        """
        cls = Lock if lock_class is None else lock_class
        return cls(
            self,
            name,
            timeout=timeout,
            sleep=sleep,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
            fair=fair,
        )

    def mutex(
        self,
        name: Union[str, bytes],
        *,
        ttl: Optional[Number] = None,
        wait: Optional[Number] = None,
        fair: bool = False,
        reentrant: bool = False,
        max_hold: Optional[Number] = None,
    ) -> "Mutex":
        """The exclusive lock ``name`` with the Rust API's options; ``acquire()`` or ``with``.

        ``ttl``: a fixed lease in seconds (default: a watchdog lease renewed while held);
        ``wait``: seconds to wait (default: until acquired; ``0``: one try); ``fair``: arrival
        order; ``reentrant``: the guard may be re-entered with ``guard.reenter()`` (a hold count in the store);
        ``max_hold``: with the watchdog, stop renewing after that many seconds.
        """
        return Mutex(self, _args.lock_name(name), ttl=ttl, wait=wait, fair=fair, reentrant=reentrant, max_hold=max_hold)

    def rwlock(
        self,
        name: Union[str, bytes],
        *,
        max_readers: Optional[int] = None,
        ttl: Optional[Number] = None,
        wait: Optional[Number] = None,
        max_hold: Optional[Number] = None,
    ) -> "RwLock":
        """The read-write lock ``name``: many readers (up to ``max_readers``, default 32) or one
        writer; a waiting writer is not starved by new readers."""
        return RwLock(self, _args.lock_name(name), max_readers=max_readers, ttl=ttl, wait=wait, max_hold=max_hold)

    def semaphore(
        self,
        name: Union[str, bytes],
        permits: int,
        *,
        ttl: Optional[Number] = None,
        wait: Optional[Number] = None,
        max_hold: Optional[Number] = None,
        count: int = 1,
    ) -> "Semaphore":
        """The counting semaphore ``name`` with ``permits`` leased permits (never exceeded);
        each ``acquire()`` takes ``count`` of them at once, all or nothing."""
        return Semaphore(self, _args.lock_name(name), _args.count(permits, "permits"), ttl=ttl, wait=wait, max_hold=max_hold, count=_args.count(count, "count"))

    def multi_lock(
        self,
        names: Iterable[Union[str, bytes]],
        *,
        ttl: Optional[Number] = None,
        wait: Optional[Number] = None,
        max_hold: Optional[Number] = None,
    ) -> "MultiLock":
        """All of ``names`` or none, in one canonical order (no deadlock between multi-locks)."""
        return MultiLock(self, _args.lock_names(names), ttl=ttl, wait=wait, max_hold=max_hold)

    def value(self, name: Union[str, bytes], *, max_attempts: int = DEFAULT_UPDATE_ATTEMPTS) -> "VersionedValue":
        """The versioned value ``name`` (bytes), changed only by atomic compare-and-set."""
        return VersionedValue(self, _args.lock_name(name), _args.count(max_attempts, "max_attempts"))

    def election(
        self, name: Union[str, bytes], *, ttl: Optional[Number] = None, wait: Optional[Number] = None, interval: Optional[Number] = None
    ) -> "Election":
        """The leader election ``name``: ``campaign(value)`` (a ``Leadership`` with ``term``,
        ``proclaim``, ``resign``), ``leader()``, ``observe()``. See ``dlock.Election``.

        >>> election = dlock.connect("memory://").election("scheduler")
        >>> with election.campaign(b"node-a") as leading:
        ...     election.leader().value, election.leader().term == leading.term
        (b'node-a', True)
        >>> election.leader() is None
        True
        """
        return Election(self._client, _args.lock_name(name), ttl=ttl, wait=wait, interval=interval)

    def counter(self, name: Union[str, bytes], *, max_attempts: int = DEFAULT_UPDATE_ATTEMPTS) -> "Counter":
        """The atomic counter ``name``: ``get()``, ``add(delta)``, ``compare_and_set(expected, new)``.
        See ``dlock.Counter``.

        >>> visits = dlock.connect("memory://").counter("visits")
        >>> visits.get(), visits.add(3), visits.add(-1)
        (0, 3, 2)
        """
        return Counter(self._client, _args.lock_name(name), _args.count(max_attempts, "max_attempts"))

    def latch(self, name: Union[str, bytes], *, interval: Optional[Number] = None) -> "CountDownLatch":
        """The count-down latch ``name``: ``try_set_count(n)``, ``count_down()``, ``count()``,
        ``wait(timeout)``. See ``dlock.CountDownLatch``.

        >>> started = dlock.connect("memory://").latch("started")
        >>> started.try_set_count(2), started.try_set_count(5), started.count()
        (True, False, 2)
        >>> started.wait(timeout=0.05)
        False
        """
        return CountDownLatch(self._client, _args.lock_name(name), interval)

    def barrier(self, name: Union[str, bytes], *, ttl: Optional[Number] = None) -> "Barrier":
        """The barrier ``name``: ``set(timeout)`` raises it (a ``BarrierGuard``), ``wait(timeout)``
        blocks until it is down, ``remove()`` takes it down from any client. See
        ``dlock.Barrier``.

        >>> gate = dlock.connect("memory://").barrier("gate")
        >>> with gate.set():
        ...     gate.wait(timeout=0.05)
        False
        >>> gate.wait(timeout=1)
        True
        """
        return Barrier(self._client, _args.lock_name(name), ttl)

    def double_barrier(
        self,
        name: Union[str, bytes],
        participants: int,
        *,
        ttl: Optional[Number] = None,
        interval: Optional[Number] = None,
    ) -> "DoubleBarrier":
        """The double barrier ``name`` of ``participants``: ``enter(timeout)`` waits until all
        have entered (an ``Inside``), ``Inside.leave(timeout)`` until all have left. See
        ``dlock.DoubleBarrier``.

        >>> alone = dlock.connect("memory://").double_barrier("solo", 1)
        >>> with alone.enter(timeout=1):
        ...     pass
        """
        count = _args.count(participants, "participants")
        return DoubleBarrier(self._client, _args.lock_name(name), count, ttl, interval)

    def inspect(self, name: Union[str, bytes]) -> Optional[LockInfo]:
        """Who holds ``name`` now, or ``None`` when nobody does."""
        found = self._client.inspect(_args.lock_name(name))
        return None if found is None else LockInfo(*found)

    def list(self, prefix: str = "") -> List[LockInfo]:
        """Every held lock whose name starts with ``prefix``."""
        return [LockInfo(*info) for info in self._client.list(_args.lock_name(prefix, "prefix"))]

    def force_release(self, name: Union[str, bytes]) -> bool:
        """Frees ``name`` whoever holds it (the holder's lost signal fires); true if it was
        held. An operator's tool: the holder may still be running."""
        return self._client.force_release(_args.lock_name(name))


class Lock:
    """redis-py's ``Lock``, on any dlock store, with a fence and a lost signal on every hold.

    The constructor, methods, return values and exceptions are redis-py's. What differs, and
    why:

    * ``timeout=None`` (the default): redis-py's lock then never expires, so a crashed holder
      blocks everyone until an operator deletes the key. dlock instead takes a **watchdog
      lease** (30 s unless ``connect(watchdog_lease=...)``) and renews it every third of the
      lease while this process holds the lock; a crashed holder frees it within one lease. As in
      redis-py, ``extend()`` and ``reacquire()`` still refuse a lock without a timeout.
    * ``sleep`` is accepted and checked, but nobody polls: waiters are woken by the store
      (pub/sub, NOTIFY, watches, file events), and ``blocking_timeout`` is waited in full.
    * ``token``: recorded as ``lock.local.token`` as in redis-py, but the store identifies the
      hold by a token dlock generates for every acquisition, so two ``Lock`` objects given the
      same token cannot release or extend each other's holds.
    * ``extend(t, replace_ttl=True)`` and ``reacquire()`` never shorten a lease: the watchdog's
      local deadline is only safe if the store's lease is at least as long.
    * A forked child never inherits the parent's hold: there ``owned()`` is false and
      ``release()`` raises ``LockNotOwnedError``.
    * ``timeout`` must be greater than zero (redis-py treats ``0`` as "never expires"), and a
      negative ``blocking_timeout`` is a ``ValueError``.

    Beyond redis-py: ``fence`` (send it with every write to the protected resource, which
    rejects lower ones), ``lost`` and ``wait_lost(timeout)``.
    """

    def __init__(
        self,
        locks: Locks,
        name: Union[str, bytes],
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        fair: bool = False,
    ) -> None:
        if not isinstance(locks, Locks):
            raise TypeError(f"locks must be a dlock.Locks (from dlock.connect), not {type(locks).__name__}")
        self.locks = locks
        self.name = _args.lock_name(name)
        self.timeout = _args.seconds(timeout, "timeout", positive=True)
        sleep_value = _args.seconds(sleep, "sleep")
        if sleep_value is None:
            raise TypeError("sleep must be a number of seconds, not None")
        self.sleep = sleep_value
        self.blocking = bool(blocking)
        self.blocking_timeout = _args.seconds(blocking_timeout, "blocking_timeout")
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = bool(raise_on_release_error)
        self.fair = bool(fair)
        if self.timeout is not None and self.sleep > self.timeout:
            raise self._lock_error("'sleep' must be less than 'timeout'")
        self.local: Any = _ThreadHold() if self.thread_local else _SharedHold()

    # The classes raised; dlock.redis_py swaps in classes that are also redis-py's.
    _LockError: Type[LockError] = LockError
    _LockNotOwnedError: Type[LockNotOwnedError] = LockNotOwnedError

    def _lock_error(self, message: str) -> LockError:
        return self._LockError(message, lock_name=self.name)

    def _not_owned(self, message: str) -> LockNotOwnedError:
        return self._LockNotOwnedError(message, lock_name=self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__name__} {self.name!r}>"

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise self._lock_error("Unable to acquire lock within the time specified")

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Acquires the lock; ``True`` once held, ``False`` when ``blocking`` is false and the
        lock is taken, or when ``blocking_timeout`` seconds passed (``None``: wait forever).

        ``sleep`` is checked and otherwise unused (waiters are woken by the store). ``token``
        (str or bytes) becomes ``lock.local.token``; a UUID otherwise.
        """
        _args.seconds(sleep, "sleep")
        token_bytes = _args.token(token)
        if blocking is None:
            blocking = self.blocking
        wait = _args.seconds(blocking_timeout, "blocking_timeout")
        if wait is None:
            wait = self.blocking_timeout
        if not blocking:
            wait = 0.0
        started = time.monotonic()
        hold = self.locks._client.mutex(self.name, self.timeout, wait, self.fair)
        if hold is None:
            return False
        self.local.token = token_bytes
        self.local.hold = hold
        self.local.expires = None if self.timeout is None else started + self.timeout
        return True

    def locked(self) -> bool:
        """Whether anyone (any process) holds the lock."""
        return self.locks._client.inspect(self.name) is not None

    def owned(self) -> bool:
        """Whether this lock (in this thread, with ``thread_local``) holds it; asks the store."""
        hold = self.local.hold
        if self.local.token is None or hold is None:
            return False
        return bool(hold.is_owned())

    def release(self) -> None:
        """Releases the lock. ``LockError`` if this lock does not hold it;
        ``LockNotOwnedError`` if its hold was lost (lease expired, broken)."""
        hold = self.local.hold
        if self.local.token is None or hold is None:
            raise self._lock_error("Cannot release a lock that's not owned or is already unlocked.")
        self.local.token = None
        self.local.hold = None
        self.local.expires = None
        try:
            hold.release()
        except LockNotOwnedError:
            raise self._not_owned("Cannot release a lock that's no longer owned") from None

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Adds ``additional_time`` seconds to the lease (or, with ``replace_ttl``, makes it
        last that long from now; never shorter than it was). ``LockError`` for an unlocked lock
        or one without a timeout; ``LockNotOwnedError`` if the hold was lost."""
        additional = _args.seconds(additional_time, "additional_time")
        if additional is None:
            raise TypeError("additional_time must be a number of seconds, not None")
        if self.local.token is None or self.local.hold is None:
            raise self._lock_error("Cannot extend an unlocked lock")
        if self.timeout is None:
            raise self._lock_error("Cannot extend a lock with no timeout")
        now = time.monotonic()
        if replace_ttl:
            ttl = additional
        else:
            ttl = max(0.0, (self.local.expires or now) - now) + additional
        self._extend(ttl, now, "Cannot extend a lock that's no longer owned")
        return True

    def reacquire(self) -> bool:
        """Resets the lease to ``timeout`` seconds from now (never shorter than it was)."""
        if self.local.token is None or self.local.hold is None:
            raise self._lock_error("Cannot reacquire an unlocked lock")
        if self.timeout is None:
            raise self._lock_error("Cannot reacquire a lock with no timeout")
        self._extend(self.timeout, time.monotonic(), "Cannot reacquire a lock that's no longer owned")
        return True

    def _extend(self, ttl: float, now: float, lost_message: str) -> None:
        try:
            self.local.hold.extend(ttl)
        except LockNotOwnedError:
            raise self._not_owned(lost_message) from None
        self.local.expires = max(self.local.expires or now, now + ttl)

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the current hold (``None`` when not held): strictly greater
        than every earlier holder's. Send it with each write; the resource rejects lower ones."""
        hold = self.local.hold
        return None if hold is None else hold.fence

    @property
    def lost(self) -> bool:
        """Whether the current hold is known to be lost (lease expired, renewal refused,
        broken); dlock notices within one lease. False when not held."""
        hold = self.local.hold
        return hold is not None and hold.is_lost()

    def wait_lost(self, timeout: Optional[Number] = None) -> bool:
        """Blocks until the hold is lost (True) or ``timeout`` seconds pass (False)."""
        limit = _args.seconds(timeout, "timeout")
        hold = self.local.hold
        if hold is None:
            raise self._lock_error("Cannot wait for the loss of an unlocked lock")
        return bool(hold.wait_lost(limit))


class _ThreadHold(threading.local):
    """Per-thread hold of a ``thread_local`` lock; the class attributes are every thread's
    starting values."""

    token: Optional[bytes] = None
    hold: Optional[Hold] = None
    expires: Optional[float] = None


def _SharedHold() -> SimpleNamespace:
    return SimpleNamespace(token=None, hold=None, expires=None)


class Guard:
    """A hold of a mutex, read-write lock, semaphore permit or multi-lock (the Rust API's
    guards). Releases on ``with`` exit; dropping it releases in the background."""

    def __init__(self, hold: Hold) -> None:
        self._hold = hold

    def __repr__(self) -> str:
        return f"<dlock.Guard {self._hold.name!r} fence={self._hold.fence}>"

    @property
    def name(self) -> str:
        return self._hold.name

    @property
    def fence(self) -> int:
        """The fencing token: strictly greater than every earlier holder's of this lock (for a
        multi-lock, the largest of its locks'; see ``fences``)."""
        return self._hold.fence

    @property
    def fences(self) -> List[Tuple[str, int]]:
        """Each store lock's name and fence (a multi-lock has one per name)."""
        return self._hold.fences

    @property
    def lost(self) -> bool:
        """Whether the hold is known to be lost."""
        return self._hold.is_lost()

    def is_lost(self) -> bool:
        return self._hold.is_lost()

    def wait_lost(self, timeout: Optional[Number] = None) -> bool:
        """Blocks until the hold is lost (True) or ``timeout`` seconds pass (False)."""
        return bool(self._hold.wait_lost(_args.seconds(timeout, "timeout")))

    def extend(self, ttl: Number) -> None:
        """Makes the lease last at least ``ttl`` seconds from now; ``LockNotOwnedError`` if lost."""
        self._hold.extend(_required_seconds(ttl, "ttl"))

    def is_owned(self) -> bool:
        """Whether the hold is still this one's: asked of the store for mutexes and
        multi-locks; read, write and permit holds answer from their lost signal."""
        return bool(self._hold.is_owned())

    def reenter(self) -> "Guard":
        """Re-enters a mutex taken with ``reentrant=True``: a new guard of the same hold, with
        the same fence (the lock is free once every guard is released). Re-entry needs the
        guard: another ``acquire()``, even on this connection, is another holder."""
        return Guard(self._hold.reenter())

    def release(self) -> None:
        """Releases now; ``LockNotOwnedError`` if the hold was lost or already released."""
        self._hold.release()

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._hold.is_released():
            self._hold.release()


def _rust_hold(hold: Any) -> Hold:
    """The hold behind a ``Guard``, a ``Leadership`` or a held redis-py-style ``Lock``."""
    inner = getattr(hold, "_hold", None)
    if inner is None and hasattr(hold, "local"):
        inner = getattr(hold.local, "hold", None)
        if inner is None:
            raise LockNotOwnedError("Cannot write fenced by a lock that is not held.", lock_name=getattr(hold, "name", None))
    if not isinstance(inner, Hold):
        raise TypeError(f"a fenced write needs a held lock or leadership, not {type(hold).__name__}")
    return inner


def _required_seconds(value: Any, what: str) -> float:
    result = _args.seconds(value, what)
    if result is None:
        raise TypeError(f"{what} must be a number of seconds, not None")
    return result


class _Acquirable:
    """Shared by the primitives: options checked once, ``acquire`` (raises on timeout),
    ``try_acquire`` (``None`` when taken), and ``with`` (acquire, release on exit)."""

    def __init__(self, locks: Locks, ttl: Any, wait: Any, max_hold: Any) -> None:
        self._locks = locks
        self._ttl = _args.seconds(ttl, "ttl", positive=True)
        self._wait = _args.seconds(wait, "wait")
        self._max_hold = _args.seconds(max_hold, "max_hold", positive=True)
        self._guard: Optional[Guard] = None

    def _take(self, wait: Optional[float]) -> Optional[Hold]:
        raise NotImplementedError

    def _label(self) -> str:
        raise NotImplementedError

    def acquire(self) -> Guard:
        """Waits up to ``wait`` (default: until acquired); ``LockTimeoutError`` when it runs out."""
        hold = self._take(self._wait)
        if hold is None:
            raise LockTimeoutError(f"{self._label()} was not acquired within {self._wait} s", lock_name=self._label())
        return Guard(hold)

    def try_acquire(self) -> Optional[Guard]:
        """One try, no wait: the guard, or ``None`` when held elsewhere."""
        hold = self._take(0.0)
        return None if hold is None else Guard(hold)

    def __enter__(self) -> Guard:
        self._guard = self.acquire()
        return self._guard

    def __exit__(self, *exc: Any) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.__exit__(*exc)


class Mutex(_Acquirable):
    """The exclusive lock of ``Locks.mutex``."""

    def __init__(self, locks: Locks, name: str, *, ttl: Any, wait: Any, fair: bool, reentrant: bool, max_hold: Any) -> None:
        super().__init__(locks, ttl, wait, max_hold)
        self.name = name
        self._fair = bool(fair)
        self._reentrant = bool(reentrant)

    def _label(self) -> str:
        return self.name

    def _take(self, wait: Optional[float]) -> Optional[Hold]:
        return self._locks._client.mutex(self.name, self._ttl, wait, self._fair, self._reentrant, self._max_hold)


class Semaphore(_Acquirable):
    """The counting semaphore of ``Locks.semaphore``: ``acquire()`` takes ``count`` permits
    (one by default) at once, all or nothing."""

    def __init__(self, locks: Locks, name: str, permits: int, *, ttl: Any, wait: Any, max_hold: Any, count: int = 1) -> None:
        super().__init__(locks, ttl, wait, max_hold)
        self.name = name
        self.permits = permits
        self.count = count

    def _label(self) -> str:
        return self.name

    def _take(self, wait: Optional[float]) -> Optional[Hold]:
        return self._locks._client.semaphore(self.name, self.permits, self._ttl, wait, self._max_hold, count=self.count)


class MultiLock(_Acquirable):
    """All-or-nothing hold of several locks (``Locks.multi_lock``)."""

    def __init__(self, locks: Locks, names: List[str], *, ttl: Any, wait: Any, max_hold: Any) -> None:
        super().__init__(locks, ttl, wait, max_hold)
        self.names = names

    def _label(self) -> str:
        return ",".join(self.names)

    def _take(self, wait: Optional[float]) -> Optional[Hold]:
        return self._locks._client.multi_lock(self.names, self._ttl, wait, self._max_hold)


class RwLock:
    """The read-write lock of ``Locks.rwlock``: ``read()`` / ``write()`` (raise
    ``LockTimeoutError`` when ``wait`` runs out), ``try_read()`` / ``try_write()``."""

    def __init__(self, locks: Locks, name: str, *, max_readers: Any, ttl: Any, wait: Any, max_hold: Any) -> None:
        self._locks = locks
        self.name = name
        self._max_readers = None if max_readers is None else _args.count(max_readers, "max_readers")
        self._ttl = _args.seconds(ttl, "ttl", positive=True)
        self._wait = _args.seconds(wait, "wait")
        self._max_hold = _args.seconds(max_hold, "max_hold", positive=True)

    def _take(self, write: bool, wait: Optional[float]) -> Optional[Hold]:
        take = self._locks._client.write if write else self._locks._client.read
        return take(self.name, self._max_readers, self._ttl, wait, self._max_hold)

    def _must(self, write: bool) -> Guard:
        hold = self._take(write, self._wait)
        if hold is None:
            kind = "write" if write else "read"
            raise LockTimeoutError(f"{kind} lock {self.name!r} was not acquired within {self._wait} s", lock_name=self.name)
        return Guard(hold)

    def read(self) -> Guard:
        return self._must(False)

    def write(self) -> Guard:
        return self._must(True)

    def try_read(self) -> Optional[Guard]:
        hold = self._take(False, 0.0)
        return None if hold is None else Guard(hold)

    def try_write(self) -> Optional[Guard]:
        hold = self._take(True, 0.0)
        return None if hold is None else Guard(hold)


class VersionedValue:
    """A small named value (bytes) with a version that strictly increases per write; changed
    only by atomic compare-and-set (``Locks.value``). Values and locks have separate names."""

    def __init__(self, locks: Locks, name: str, max_attempts: int) -> None:
        self._locks = locks
        self.name = name
        self.max_attempts = max_attempts

    def get(self) -> Optional[Versioned]:
        """The value and its version, or ``None`` if never written."""
        found = self._locks._client.value_get(self.name)
        return None if found is None else Versioned(*found)

    def compare_and_set(self, expected: Optional[int], value: bytes) -> Optional[int]:
        """Writes ``value`` if the version is still ``expected`` (``None``: never written);
        the new version, or ``None`` when another writer came first."""
        return self._locks._client.value_compare_and_set(self.name, _args.version(expected), _args.data(value))

    def set(self, value: bytes) -> int:
        """Writes ``value`` whatever the version; the new version."""
        return self._locks._client.value_set(self.name, _args.data(value))

    def set_fenced(self, hold: Any, value: bytes) -> int:
        """Writes ``value`` only while ``hold`` (a mutex ``Guard``, a held ``Lock`` or a
        ``Leadership``) is still its lock's current holder, the store checking and writing in one
        step; the new version. ``LockNotOwnedError`` once the hold is not current (released,
        expired and taken by another, broken): nothing was written. A holder paused past its
        lease thus never overwrites what the next holder wrote.

        >>> import dlock
        >>> locks = dlock.connect("memory://")
        >>> with locks.mutex("orders/42").acquire() as guard:
        ...     locks.value("orders/42/state").set_fenced(guard, b"paid") > 0
        True
        """
        return self._locks._client.value_set_fenced(self.name, _rust_hold(hold), _args.data(value))

    @overload
    def update(self, change: Callable[[Optional[bytes]], bytes]) -> Versioned: ...
    @overload
    def update(self, change: Change) -> Optional[Versioned]: ...
    def update(self, change: Change) -> Optional[Versioned]:
        """Reads, computes ``change(current)`` and writes the result with compare-and-set,
        again from a fresh read while another writer got in between, at most ``max_attempts``
        times (then ``ConflictError``). The ``Versioned`` written.

        ``current`` is ``None`` when the value was never written. ``change`` may be called more
        than once, and returns ``None`` to leave the value as it is (stock already at zero):
        ``update`` then writes nothing and returns ``None``. An exception raised by ``change``
        ends the update with nothing written and propagates as it was raised.

        This is the Rust core's ``update``: a writer that lost waits before it reads again, a
        random time in a window counted in its own measured read-and-write cycle that doubles
        with each loss, so colliding writers spread out at the pace of their store.
        ``change`` runs on the calling thread, with the GIL held.

        >>> stock = dlock.connect("memory://").value("stock/sku-2")
        >>> stock.set(b"1") > 0
        True
        >>> def take_one(current):
        ...     left = int(current)
        ...     return None if left == 0 else str(left - 1).encode()  # sold out: no write
        >>> stock.update(take_one).value
        b'0'
        >>> stock.update(take_one) is None
        True
        """
        attempt = _Attempt(change)
        return attempt.result(self._locks._client.value_update(self.name, self.max_attempts, attempt))
