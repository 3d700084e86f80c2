"""Barriers and double barriers (``Locks.barrier``, ``Locks.double_barrier``), sync and
asyncio: the Rust core's ``Barrier`` and ``DoubleBarrier``.

A barrier stands while the lock ``<name>#barrier`` is held: ``set`` raises it, ``wait`` blocks
until it comes down (``BarrierGuard.remove``, ``Barrier.remove`` from any client, or the
setter's lease ending when it crashes), on every store. A double barrier of N lets its
participants in together once N have entered and out together once all have left; each
participant's presence is a lease, so one that crashes is not waited for past its lease. It
needs versioned values: every store but Redlock (``UnsupportedError`` there)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from . import _args
from ._dlock import BarrierHold, Participant, barrier_remove, barrier_set, barrier_wait, double_barrier_enter

if TYPE_CHECKING:
    from ._dlock import Client


class BarrierGuard:
    """A raised barrier (``Barrier.set``): it stands until ``remove()``, the end of a ``with``
    block, the guard's drop (removed in the background), or the loss of its lease."""

    def __init__(self, hold: BarrierHold) -> None:
        self._hold = hold

    def __repr__(self) -> str:
        return f"<dlock.BarrierGuard {self._hold.name!r}>"

    @property
    def name(self) -> str:
        return self._hold.name

    @property
    def lost(self) -> bool:
        """Whether its lease is known to be lost: the barrier is down."""
        return self._hold.is_lost()

    def remove(self) -> None:
        """Removes the barrier: every waiter goes on. ``LockNotOwnedError`` when it was already
        down (lease lost, or removed before)."""
        self._hold.remove()

    def __enter__(self) -> "BarrierGuard":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._hold.is_removed() and not self._hold.is_lost():
            self._hold.remove()


class Barrier:
    """The barrier ``name`` (``Locks.barrier``). ``ttl``: the setter's fixed lease (default:
    the watchdog's, renewed while it stands).

    >>> import dlock
    >>> barrier = dlock.connect("memory://").barrier("deploy")
    >>> raised = barrier.set()
    >>> barrier.wait(timeout=0.05)
    False
    >>> raised.remove(); barrier.wait(timeout=1)
    True
    """

    def __init__(self, client: "Client", name: str, ttl: Any = None) -> None:
        self._client = client
        self.name = name
        self._ttl = _args.seconds(ttl, "ttl", positive=True)

    def __repr__(self) -> str:
        return f"<dlock.Barrier {self.name!r}>"

    def set(self, timeout: Any = None) -> BarrierGuard:
        """Raises the barrier, waiting at most ``timeout`` seconds (``None``: no limit) for one
        already raised to come down (``LockTimeoutError`` then)."""
        seconds = _args.seconds(timeout, "timeout")
        return BarrierGuard(barrier_set(self._client, self.name, self._ttl, seconds))

    def wait(self, timeout: Any = None) -> bool:
        """Blocks until the barrier is down: ``True``, or ``False`` after ``timeout`` seconds
        (``None``: no limit), as ``threading.Event.wait``."""
        return bool(barrier_wait(self._client, self.name, _args.seconds(timeout, "timeout")))

    def remove(self) -> bool:
        """Removes the barrier whoever raised it; whether it stood."""
        return bool(barrier_remove(self._client, self.name))


class Inside:
    """One participant inside a double barrier (``DoubleBarrier.enter``). ``leave`` waits for
    the others; a ``with`` block leaves on exit; dropping it leaves at once without waiting."""

    def __init__(self, participant: Participant) -> None:
        self._participant = participant

    def __repr__(self) -> str:
        return f"<dlock.Inside {self._participant.name!r}>"

    @property
    def lost(self) -> bool:
        """Whether this participant's presence lease is known to be lost."""
        return self._participant.is_lost()

    def leave(self, timeout: Any = None) -> None:
        """Leaves, then waits at most ``timeout`` seconds (``None``: no limit) until every
        participant has left or is gone (``LockTimeoutError`` then)."""
        self._participant.leave(_args.seconds(timeout, "timeout"))

    def __enter__(self) -> "Inside":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._participant.has_left():
            self.leave()


class DoubleBarrier:
    """The double barrier ``name`` of ``participants`` (``Locks.double_barrier``). ``ttl``: each
    participant's fixed presence lease (default: the watchdog's); ``interval``: how often the
    one waiter that reads the members does so (default 0.05 s).

    >>> import dlock, threading
    >>> locks = dlock.connect("memory://")
    >>> def step():
    ...     with locks.double_barrier("batch", 2).enter(timeout=10):
    ...         pass  # both participants work here
    >>> other = threading.Thread(target=step); other.start(); step(); other.join()
    """

    def __init__(self, client: "Client", name: str, participants: int, ttl: Any = None, interval: Any = None) -> None:
        self._client = client
        self.name = name
        self.participants = participants
        self._ttl = _args.seconds(ttl, "ttl", positive=True)
        self._interval = _args.seconds(interval, "interval", positive=True)

    def __repr__(self) -> str:
        return f"<dlock.DoubleBarrier {self.name!r} of {self.participants}>"

    def _enter(self, timeout: Optional[float], **aio: Any) -> Any:
        return double_barrier_enter(self._client, self.name, self.participants, self._ttl, self._interval, timeout, **aio)

    def enter(self, timeout: Any = None) -> Inside:
        """Enters, then waits at most ``timeout`` seconds (``None``: no limit) until every
        participant has entered (``LockTimeoutError`` then)."""
        return Inside(self._enter(_args.seconds(timeout, "timeout")))


class AsyncBarrierGuard(BarrierGuard):
    """``BarrierGuard`` for asyncio: ``await remove()``, ``async with`` removes on exit."""

    async def remove(self) -> None:  # type: ignore[override]
        from .asyncio import _bridge

        await self._hold.remove(aio=_bridge())

    async def __aenter__(self) -> "AsyncBarrierGuard":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self._hold.is_removed() and not self._hold.is_lost():
            await self.remove()


class AsyncBarrier(Barrier):
    """``Barrier`` for asyncio (``dlock.asyncio.Locks.barrier``): every call is a coroutine."""

    async def set(self, timeout: Any = None) -> AsyncBarrierGuard:  # type: ignore[override]
        from .asyncio import _bridge

        seconds = _args.seconds(timeout, "timeout")
        return AsyncBarrierGuard(await barrier_set(self._client, self.name, self._ttl, seconds, aio=_bridge()))

    async def wait(self, timeout: Any = None) -> bool:  # type: ignore[override]
        from .asyncio import _bridge

        return bool(await barrier_wait(self._client, self.name, _args.seconds(timeout, "timeout"), aio=_bridge()))

    async def remove(self) -> bool:  # type: ignore[override]
        from .asyncio import _bridge

        return bool(await barrier_remove(self._client, self.name, aio=_bridge()))


class AsyncInside(Inside):
    """``Inside`` for asyncio: ``await leave()``, ``async with`` leaves on exit."""

    async def leave(self, timeout: Any = None) -> None:  # type: ignore[override]
        from .asyncio import _bridge

        await self._participant.leave(_args.seconds(timeout, "timeout"), aio=_bridge())

    async def __aenter__(self) -> "AsyncInside":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self._participant.has_left():
            await self.leave()


class AsyncDoubleBarrier(DoubleBarrier):
    """``DoubleBarrier`` for asyncio (``dlock.asyncio.Locks.double_barrier``)."""

    async def enter(self, timeout: Any = None) -> AsyncInside:  # type: ignore[override]
        from .asyncio import _bridge

        return AsyncInside(await self._enter(_args.seconds(timeout, "timeout"), aio=_bridge()))
