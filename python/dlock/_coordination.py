"""Counters and count-down latches (``Locks.counter``, ``Locks.latch``), sync and asyncio: the
Rust core's ``Counter`` and ``CountDownLatch``, on every store with versioned values (not
Redlock, where they raise ``UnsupportedError``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from . import _args
from ._dlock import (
    counter_add,
    counter_compare_and_set,
    counter_get,
    latch_count,
    latch_count_down,
    latch_try_set_count,
    latch_wait,
)

if TYPE_CHECKING:
    from ._dlock import Client

_I64 = (-(2**63), 2**63 - 1)


def _int(value: Any, what: str) -> int:
    """A 64-bit signed int, or ``TypeError`` / ``ValueError`` before any store call."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not _I64[0] <= value <= _I64[1]:
        raise ValueError(f"{what} is outside the range of a 64-bit count: {value}")
    return value


class Counter:
    """The atomic counter ``name`` (``Locks.counter``): ``get``, ``add``, ``compare_and_set``.
    Never written reads 0; a sum outside 64 bits raises ``ValueError`` and writes nothing.

    >>> import dlock
    >>> hits = dlock.connect("memory://").counter("hits")
    >>> hits.add(2), hits.compare_and_set(2, 5), hits.get()
    (2, True, 5)
    """

    def __init__(self, client: "Client", name: str, max_attempts: int) -> None:
        self._client = client
        self.name = name
        self._attempts = max_attempts

    def __repr__(self) -> str:
        return f"<dlock.Counter {self.name!r}>"

    def get(self) -> int:
        return int(counter_get(self._client, self.name, self._attempts))

    def add(self, delta: Any = 1) -> int:
        """Adds ``delta`` (negative to subtract) atomically; the new count."""
        return int(counter_add(self._client, self.name, self._attempts, _int(delta, "delta")))

    def compare_and_set(self, expected: Any, new: Any) -> bool:
        """Sets the count to ``new`` only if it is ``expected``; whether it was set."""
        pair = _int(expected, "expected"), _int(new, "new")
        return bool(counter_compare_and_set(self._client, self.name, self._attempts, *pair))


class CountDownLatch:
    """The count-down latch ``name`` (``Locks.latch``): ``try_set_count`` closes an open latch,
    ``count_down`` (from any client) lowers it, ``wait`` blocks until it is zero. Waiters queue
    on a lock; only its holder reads the count, every ``interval`` seconds (default 0.05).

    >>> import dlock
    >>> latch = dlock.connect("memory://").latch("loaded")
    >>> latch.try_set_count(1), latch.count_down(), latch.wait(timeout=1)
    (True, 0, True)
    """

    def __init__(self, client: "Client", name: str, interval: Any = None) -> None:
        self._client = client
        self.name = name
        self._interval = _args.seconds(interval, "interval", positive=True)

    def __repr__(self) -> str:
        return f"<dlock.CountDownLatch {self.name!r}>"

    def try_set_count(self, count: Any) -> bool:
        """Closes the latch with ``count`` (at least 1) only if it is open; whether it was set."""
        return bool(latch_try_set_count(self._client, self.name, _int(count, "count")))

    def count_down(self) -> int:
        """Lowers the count by one (an open latch stays at 0); the count left."""
        return int(latch_count_down(self._client, self.name))

    def count(self) -> int:
        return int(latch_count(self._client, self.name))

    def wait(self, timeout: Any = None) -> bool:
        """Blocks until the latch is open: ``True``, or ``False`` after ``timeout`` seconds
        (``None``: no limit), as ``threading.Event.wait``."""
        seconds = _args.seconds(timeout, "timeout")
        return bool(latch_wait(self._client, self.name, seconds, self._interval))


class AsyncCounter(Counter):
    """``Counter`` for asyncio (``dlock.asyncio.Locks.counter``): every call is a coroutine."""

    async def get(self) -> int:  # type: ignore[override]
        from .asyncio import _bridge

        return int(await counter_get(self._client, self.name, self._attempts, aio=_bridge()))

    async def add(self, delta: Any = 1) -> int:  # type: ignore[override]
        from .asyncio import _bridge

        step = _int(delta, "delta")
        return int(await counter_add(self._client, self.name, self._attempts, step, aio=_bridge()))

    async def compare_and_set(self, expected: Any, new: Any) -> bool:  # type: ignore[override]
        from .asyncio import _bridge

        pair = _int(expected, "expected"), _int(new, "new")
        return bool(await counter_compare_and_set(self._client, self.name, self._attempts, *pair, aio=_bridge()))


class AsyncCountDownLatch(CountDownLatch):
    """``CountDownLatch`` for asyncio (``dlock.asyncio.Locks.latch``)."""

    async def try_set_count(self, count: Any) -> bool:  # type: ignore[override]
        from .asyncio import _bridge

        return bool(await latch_try_set_count(self._client, self.name, _int(count, "count"), aio=_bridge()))

    async def count_down(self) -> int:  # type: ignore[override]
        from .asyncio import _bridge

        return int(await latch_count_down(self._client, self.name, aio=_bridge()))

    async def count(self) -> int:  # type: ignore[override]
        from .asyncio import _bridge

        return int(await latch_count(self._client, self.name, aio=_bridge()))

    async def wait(self, timeout: Any = None) -> bool:  # type: ignore[override]
        from .asyncio import _bridge

        seconds = _args.seconds(timeout, "timeout")
        return bool(await latch_wait(self._client, self.name, seconds, self._interval, aio=_bridge()))

