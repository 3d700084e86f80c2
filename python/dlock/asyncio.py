"""``dlock.asyncio``: the same API as ``dlock``, as coroutines and ``async with``.

Store calls run on dlock's own runtime threads; the event loop only awaits them, so it is never
blocked while a lock is waited for, and is woken through a socket when a call ends. Cancelling a task that awaits ``acquire()`` stops the wait
and leaves no lock held (an acquisition that completed at that very moment is released).

>>> import asyncio, dlock.asyncio
>>> async def main():
...     locks = await dlock.asyncio.connect("memory://")
...     async with locks.lock("orders/42", timeout=10) as lock:
...         return lock.fence > 0
>>> asyncio.run(main())
True
"""

from __future__ import annotations

import asyncio as _asyncio
import logging
import os
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Type, Union, overload

from . import _args
from ._barrier import AsyncBarrier, AsyncDoubleBarrier
from ._coordination import AsyncCountDownLatch, AsyncCounter
from ._election import AsyncElection
from ._run import run_while_held_async as run_while_held
from ._dlock import Ask, Client, Hold, Notifier, Task
from ._sync import DEFAULT_UPDATE_ATTEMPTS, Change, LockInfo, Versioned, _Attempt, _rust_hold, _SharedHold, _ThreadHold
from .exceptions import LockError, LockNotOwnedError, LockTimeoutError

__all__ = ["connect", "run_while_held", "Locks", "Lock", "Guard", "Mutex", "RwLock", "Semaphore", "MultiLock", "VersionedValue"]

logger = logging.getLogger("dlock")

Number = Union[int, float]


class _Bridge(Notifier):
    """Delivers the results of dlock's calls to one event loop.

    A call runs on dlock's runtime threads; when it ends, the runtime writes a byte to this
    object's socket, and the loop (watching it with ``add_reader``) turns the result into a
    Python object on its own thread. The runtime never touches Python objects itself: a call
    that needs Python code while it runs (an update's ``change``, once per attempt) asks this
    loop the same way, and its runtime thread waits for the answer.
    """

    def __new__(cls, loop: _asyncio.AbstractEventLoop) -> "_Bridge":
        # The native base takes no arguments.
        return super().__new__(cls)

    def __init__(self, loop: _asyncio.AbstractEventLoop) -> None:
        # Weak: the bridges are kept by loop in a WeakKeyDictionary, whose values must not keep
        # their loop alive (the loop keeps its bridge, through the reader callback).
        self._loop = weakref.ref(loop)
        self.pid = os.getpid()
        self.pending: Dict[int, Tuple[Task, "_asyncio.Future[Any]"]] = {}
        self.answerers: Dict[int, Callable[[Optional[bytes]], Optional[bytes]]] = {}
        loop.add_reader(self.fileno(), self._deliver)

    def watch(
        self, task: Task, answerer: Optional[Callable[[Optional[bytes]], Optional[bytes]]] = None
    ) -> "_asyncio.Future[Any]":
        """The future of ``task``; cancelling it stops the call. ``answerer`` answers the
        call's questions (an update's callback); it must not raise."""
        loop = self._loop()
        if loop is None:
            raise RuntimeError("dlock: the event loop of this call is gone")
        future = loop.create_future()
        self.pending[task.id] = (task, future)
        if answerer is not None:
            self.answerers[task.id] = answerer
        future.add_done_callback(lambda done: self._cancelled(task, done))
        return future

    def _cancelled(self, task: Task, future: "_asyncio.Future[Any]") -> None:
        if future.cancelled():
            self.pending.pop(task.id, None)
            self.answerers.pop(task.id, None)
            task.abort()

    def _answer(self, ask: Ask) -> None:
        answerer = self.answerers.get(ask.task)
        # No answerer: the call was cancelled, and declining makes it end without a write.
        ask.answer(None if answerer is None else answerer(ask.current))

    def _deliver(self) -> None:
        completed = self.take_completed()
        # After take_completed, which drained the wake-ups: a question asked since then has
        # woken the loop again. Answered first: an update's attempt waits on its answer
        # between its read and its write, and the shorter that window, the fewer collisions.
        for ask in self.take_asks():
            self._answer(ask)
        for task_id in completed:
            self.answerers.pop(task_id, None)
            entry = self.pending.pop(task_id, None)
            if entry is None:
                continue  # cancelled: its result (a lock, say) is released with the task
            task, future = entry
            if future.done():
                continue
            try:
                future.set_result(task.result())
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting task
                future.set_exception(error)


_bridges: "weakref.WeakKeyDictionary[_asyncio.AbstractEventLoop, _Bridge]" = weakref.WeakKeyDictionary()


def _bridge() -> _Bridge:
    """The bridge of the running loop (a new one in a forked child)."""
    loop = _asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None or bridge.pid != os.getpid():
        bridge = _Bridge(loop)
        _bridges[loop] = bridge
    return bridge


async def connect(
    url: Optional[str] = None, *, label: Optional[str] = None, watchdog_lease: Optional[Number] = None
) -> "Locks":
    """Connects to the store named by ``url`` (see ``dlock.connect``) without blocking the loop."""
    lease = _args.seconds(watchdog_lease, "watchdog_lease", positive=True)
    target = _args.url(url)
    checked_label = _args.label(label)
    loop = _asyncio.get_running_loop()
    client = await loop.run_in_executor(None, Client, target, checked_label, lease)
    return Locks(client)


class Locks:
    """A connection to one lock store for asyncio code (``await dlock.asyncio.connect(url)``)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @classmethod
    def from_sync(cls, locks: Any) -> "Locks":
        """The asyncio face of a ``dlock.Locks`` (the same connection)."""
        return cls(locks._client)

    @property
    def backend(self) -> str:
        return self._client.backend

    def __repr__(self) -> str:
        return f"<dlock.asyncio.Locks backend={self.backend!r}>"

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
        """redis-py's ``redis.asyncio.Redis.lock`` (see ``dlock.Locks.lock``)."""
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
        """See ``dlock.Locks.mutex``; ``await m.acquire()`` or ``async with m as guard``."""
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
        return Semaphore(self, _args.lock_name(name), _args.count(permits, "permits"), ttl=ttl, wait=wait, max_hold=max_hold, count=_args.count(count, "count"))

    def multi_lock(
        self,
        names: Iterable[Union[str, bytes]],
        *,
        ttl: Optional[Number] = None,
        wait: Optional[Number] = None,
        max_hold: Optional[Number] = None,
    ) -> "MultiLock":
        return MultiLock(self, _args.lock_names(names), ttl=ttl, wait=wait, max_hold=max_hold)

    def value(self, name: Union[str, bytes], *, max_attempts: int = DEFAULT_UPDATE_ATTEMPTS) -> "VersionedValue":
        return VersionedValue(self, _args.lock_name(name), _args.count(max_attempts, "max_attempts"))

    def election(
        self, name: Union[str, bytes], *, ttl: Optional[Number] = None, wait: Optional[Number] = None, interval: Optional[Number] = None
    ) -> "AsyncElection":
        """See ``dlock.Locks.election``: ``await campaign(value)``, ``await leader()``,
        ``async for leader in observe()``."""
        return AsyncElection(self._client, _args.lock_name(name), ttl=ttl, wait=wait, interval=interval)

    def counter(self, name: Union[str, bytes], *, max_attempts: int = DEFAULT_UPDATE_ATTEMPTS) -> "AsyncCounter":
        """See ``dlock.Locks.counter``: ``await get()``, ``await add(delta)``,
        ``await compare_and_set(expected, new)``."""
        return AsyncCounter(self._client, _args.lock_name(name), _args.count(max_attempts, "max_attempts"))

    def latch(self, name: Union[str, bytes], *, interval: Optional[Number] = None) -> "AsyncCountDownLatch":
        """See ``dlock.Locks.latch``: ``await try_set_count(n)``, ``await count_down()``,
        ``await wait(timeout)``."""
        return AsyncCountDownLatch(self._client, _args.lock_name(name), interval)

    def barrier(self, name: Union[str, bytes], *, ttl: Optional[Number] = None) -> "AsyncBarrier":
        """See ``dlock.Locks.barrier``: ``await set(timeout)``, ``await wait(timeout)``,
        ``await remove()``."""
        return AsyncBarrier(self._client, _args.lock_name(name), ttl)

    def double_barrier(
        self,
        name: Union[str, bytes],
        participants: int,
        *,
        ttl: Optional[Number] = None,
        interval: Optional[Number] = None,
    ) -> "AsyncDoubleBarrier":
        """See ``dlock.Locks.double_barrier``: ``await enter(timeout)``, then
        ``await inside.leave(timeout)`` (or ``async with``)."""
        count = _args.count(participants, "participants")
        return AsyncDoubleBarrier(self._client, _args.lock_name(name), count, ttl, interval)

    async def inspect(self, name: Union[str, bytes]) -> Optional[LockInfo]:
        found = await self._client.inspect(_args.lock_name(name), aio=_bridge())
        return None if found is None else LockInfo(*found)

    async def list(self, prefix: str = "") -> List[LockInfo]:
        return [LockInfo(*info) for info in await self._client.list(_args.lock_name(prefix, "prefix"), aio=_bridge())]

    async def force_release(self, name: Union[str, bytes]) -> bool:
        return await self._client.force_release(_args.lock_name(name), aio=_bridge())


class Lock:
    """redis-py's ``redis.asyncio.lock.Lock`` on any dlock store; see ``dlock.Lock`` for what
    differs from redis-py and why."""

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
            raise TypeError(
                f"locks must be a dlock.asyncio.Locks (from dlock.asyncio.connect), not {type(locks).__name__}"
            )
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

    _LockError: Type[LockError] = LockError
    _LockNotOwnedError: Type[LockNotOwnedError] = LockNotOwnedError

    def _lock_error(self, message: str) -> LockError:
        return self._LockError(message, lock_name=self.name)

    def _not_owned(self, message: str) -> LockNotOwnedError:
        return self._LockNotOwnedError(message, lock_name=self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__name__} {self.name!r}>"

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise self._lock_error("Unable to acquire lock within the time specified")

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Acquires the lock; ``True`` once held, ``False`` when not blocking and taken, or
        after ``blocking_timeout`` seconds (``None``: wait until acquired)."""
        token_bytes = _args.token(token)
        if blocking is None:
            blocking = self.blocking
        wait = _args.seconds(blocking_timeout, "blocking_timeout")
        if wait is None:
            wait = self.blocking_timeout
        if not blocking:
            wait = 0.0
        started = time.monotonic()
        hold = await self.locks._client.mutex(self.name, self.timeout, wait, self.fair, aio=_bridge())
        if hold is None:
            return False
        self.local.token = token_bytes
        self.local.hold = hold
        self.local.expires = None if self.timeout is None else started + self.timeout
        return True

    async def locked(self) -> bool:
        return (await self.locks._client.inspect(self.name, aio=_bridge())) is not None

    async def owned(self) -> bool:
        hold = self.local.hold
        if self.local.token is None or hold is None:
            return False
        return bool(await hold.is_owned(aio=_bridge()))

    async def release(self) -> None:
        """Releases the lock; see ``dlock.Lock.release``. A release cancelled half-way still
        completes in the background (the hold was already handed to it)."""
        hold = self.local.hold
        if self.local.token is None or hold is None:
            raise self._lock_error("Cannot release a lock that's not owned or is already unlocked.")
        self.local.token = None
        self.local.hold = None
        self.local.expires = None
        try:
            await hold.release(aio=_bridge())
        except LockNotOwnedError:
            raise self._not_owned("Cannot release a lock that's no longer owned") from None

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """See ``dlock.Lock.extend``."""
        additional = _args.seconds(additional_time, "additional_time")
        if additional is None:
            raise TypeError("additional_time must be a number of seconds, not None")
        if self.local.token is None or self.local.hold is None:
            raise self._lock_error("Cannot extend an unlocked lock")
        if self.timeout is None:
            raise self._lock_error("Cannot extend a lock with no timeout")
        now = time.monotonic()
        ttl = additional if replace_ttl else max(0.0, (self.local.expires or now) - now) + additional
        await self._extend(ttl, now, "Cannot extend a lock that's no longer owned")
        return True

    async def reacquire(self) -> bool:
        """See ``dlock.Lock.reacquire``."""
        if self.local.token is None or self.local.hold is None:
            raise self._lock_error("Cannot reacquire an unlocked lock")
        if self.timeout is None:
            raise self._lock_error("Cannot reacquire a lock with no timeout")
        await self._extend(self.timeout, time.monotonic(), "Cannot reacquire a lock that's no longer owned")
        return True

    async def _extend(self, ttl: float, now: float, lost_message: str) -> None:
        hold = self.local.hold
        try:
            await hold.extend(ttl, aio=_bridge())
        except LockNotOwnedError:
            raise self._not_owned(lost_message) from None
        self.local.expires = max(self.local.expires or now, now + ttl)

    @property
    def fence(self) -> Optional[int]:
        """See ``dlock.Lock.fence``."""
        hold = self.local.hold
        return None if hold is None else hold.fence

    @property
    def lost(self) -> bool:
        """See ``dlock.Lock.lost``."""
        hold = self.local.hold
        return hold is not None and hold.is_lost()

    async def wait_lost(self, timeout: Optional[Number] = None) -> bool:
        """Waits until the hold is lost (True) or ``timeout`` seconds pass (False)."""
        limit = _args.seconds(timeout, "timeout")
        hold = self.local.hold
        if hold is None:
            raise self._lock_error("Cannot wait for the loss of an unlocked lock")
        return bool(await hold.wait_lost(limit, aio=_bridge()))


class Guard:
    """See ``dlock.Guard``; the store calls are coroutines, ``async with`` releases."""

    def __init__(self, hold: Hold) -> None:
        self._hold = hold

    def __repr__(self) -> str:
        return f"<dlock.asyncio.Guard {self._hold.name!r} fence={self._hold.fence}>"

    @property
    def name(self) -> str:
        return self._hold.name

    @property
    def fence(self) -> int:
        return self._hold.fence

    @property
    def fences(self) -> List[Tuple[str, int]]:
        return self._hold.fences

    @property
    def lost(self) -> bool:
        return self._hold.is_lost()

    def is_lost(self) -> bool:
        return self._hold.is_lost()

    async def wait_lost(self, timeout: Optional[Number] = None) -> bool:
        return bool(await self._hold.wait_lost(_args.seconds(timeout, "timeout"), aio=_bridge()))

    async def extend(self, ttl: Number) -> None:
        value = _args.seconds(ttl, "ttl")
        if value is None:
            raise TypeError("ttl must be a number of seconds, not None")
        await self._hold.extend(value, aio=_bridge())

    async def is_owned(self) -> bool:
        return bool(await self._hold.is_owned(aio=_bridge()))

    async def reenter(self) -> "Guard":
        """Re-enters a mutex taken with ``reentrant=True`` (see the sync ``Guard.reenter``)."""
        return Guard(await self._hold.reenter(aio=_bridge()))

    async def release(self) -> None:
        await self._hold.release(aio=_bridge())

    async def __aenter__(self) -> "Guard":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self._hold.is_released():
            await self._hold.release(aio=_bridge())


class _Acquirable:
    def __init__(self, locks: Locks, ttl: Any, wait: Any, max_hold: Any) -> None:
        self._locks = locks
        self._ttl = _args.seconds(ttl, "ttl", positive=True)
        self._wait = _args.seconds(wait, "wait")
        self._max_hold = _args.seconds(max_hold, "max_hold", positive=True)
        self._guard: Optional[Guard] = None

    async def _take(self, wait: Optional[float]) -> Optional[Hold]:
        raise NotImplementedError

    def _label(self) -> str:
        raise NotImplementedError

    async def acquire(self) -> Guard:
        """Waits up to ``wait`` (default: until acquired); ``LockTimeoutError`` when it runs out."""
        hold = await self._take(self._wait)
        if hold is None:
            raise LockTimeoutError(f"{self._label()} was not acquired within {self._wait} s", lock_name=self._label())
        return Guard(hold)

    async def try_acquire(self) -> Optional[Guard]:
        hold = await self._take(0.0)
        return None if hold is None else Guard(hold)

    async def __aenter__(self) -> Guard:
        self._guard = await self.acquire()
        return self._guard

    async def __aexit__(self, *exc: Any) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            await guard.__aexit__(*exc)


class Mutex(_Acquirable):
    def __init__(self, locks: Locks, name: str, *, ttl: Any, wait: Any, fair: bool, reentrant: bool, max_hold: Any) -> None:
        super().__init__(locks, ttl, wait, max_hold)
        self.name = name
        self._fair = bool(fair)
        self._reentrant = bool(reentrant)

    def _label(self) -> str:
        return self.name

    async def _take(self, wait: Optional[float]) -> Optional[Hold]:
        return await self._locks._client.mutex(
            self.name, self._ttl, wait, self._fair, self._reentrant, self._max_hold, aio=_bridge()
        )


class Semaphore(_Acquirable):
    def __init__(self, locks: Locks, name: str, permits: int, *, ttl: Any, wait: Any, max_hold: Any, count: int = 1) -> None:
        super().__init__(locks, ttl, wait, max_hold)
        self.name = name
        self.permits = permits
        self.count = count

    def _label(self) -> str:
        return self.name

    async def _take(self, wait: Optional[float]) -> Optional[Hold]:
        return await self._locks._client.semaphore(self.name, self.permits, self._ttl, wait, self._max_hold, aio=_bridge(), count=self.count)


class MultiLock(_Acquirable):
    def __init__(self, locks: Locks, names: List[str], *, ttl: Any, wait: Any, max_hold: Any) -> None:
        super().__init__(locks, ttl, wait, max_hold)
        self.names = names

    def _label(self) -> str:
        return ",".join(self.names)

    async def _take(self, wait: Optional[float]) -> Optional[Hold]:
        return await self._locks._client.multi_lock(self.names, self._ttl, wait, self._max_hold, aio=_bridge())


class RwLock:
    def __init__(self, locks: Locks, name: str, *, max_readers: Any, ttl: Any, wait: Any, max_hold: Any) -> None:
        self._locks = locks
        self.name = name
        self._max_readers = None if max_readers is None else _args.count(max_readers, "max_readers")
        self._ttl = _args.seconds(ttl, "ttl", positive=True)
        self._wait = _args.seconds(wait, "wait")
        self._max_hold = _args.seconds(max_hold, "max_hold", positive=True)

    async def _take(self, write: bool, wait: Optional[float]) -> Optional[Hold]:
        take = self._locks._client.write if write else self._locks._client.read
        return await take(self.name, self._max_readers, self._ttl, wait, self._max_hold, aio=_bridge())

    async def _must(self, write: bool) -> Guard:
        hold = await self._take(write, self._wait)
        if hold is None:
            kind = "write" if write else "read"
            raise LockTimeoutError(f"{kind} lock {self.name!r} was not acquired within {self._wait} s", lock_name=self.name)
        return Guard(hold)

    async def read(self) -> Guard:
        return await self._must(False)

    async def write(self) -> Guard:
        return await self._must(True)

    async def try_read(self) -> Optional[Guard]:
        hold = await self._take(False, 0.0)
        return None if hold is None else Guard(hold)

    async def try_write(self) -> Optional[Guard]:
        hold = await self._take(True, 0.0)
        return None if hold is None else Guard(hold)


class VersionedValue:
    """See ``dlock.VersionedValue``; the calls are coroutines."""

    def __init__(self, locks: Locks, name: str, max_attempts: int) -> None:
        self._locks = locks
        self.name = name
        self.max_attempts = max_attempts

    async def get(self) -> Optional[Versioned]:
        found = await self._locks._client.value_get(self.name, aio=_bridge())
        return None if found is None else Versioned(*found)

    async def compare_and_set(self, expected: Optional[int], value: bytes) -> Optional[int]:
        return await self._locks._client.value_compare_and_set(
            self.name, _args.version(expected), _args.data(value), aio=_bridge()
        )

    async def set(self, value: bytes) -> int:
        return await self._locks._client.value_set(self.name, _args.data(value), aio=_bridge())

    async def set_fenced(self, hold: Any, value: bytes) -> int:
        """See ``dlock.VersionedValue.set_fenced``."""
        return await self._locks._client.value_set_fenced(
            self.name, _rust_hold(hold), _args.data(value), aio=_bridge()
        )

    @overload
    async def update(self, change: Callable[[Optional[bytes]], bytes]) -> Versioned: ...
    @overload
    async def update(self, change: Change) -> Optional[Versioned]: ...
    async def update(self, change: Change) -> Optional[Versioned]:
        """See ``dlock.VersionedValue.update``: the Rust core's update, ``None`` when ``change``
        declined. ``change`` is a plain function, called on the event loop's thread (between
        the store calls, which run on dlock's runtime)."""
        attempt = _Attempt(change)
        written = await self._locks._client.value_update(self.name, self.max_attempts, attempt, aio=_bridge())
        return attempt.result(written)
