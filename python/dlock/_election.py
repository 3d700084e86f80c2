"""Leader election (``Locks.election``), sync and asyncio: the Rust core's ``Election``.

Leadership is the hold of the election's lock, the term is its fence (strictly greater for
every later leader), and the leader's value is published beside it, fenced by the term."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, NamedTuple, Optional, Tuple

from . import _args
from ._dlock import Hold, Observer, election_campaign, election_leader, election_observe, election_proclaim
from .exceptions import LockTimeoutError

if TYPE_CHECKING:
    from ._dlock import Client


class Leader(NamedTuple):
    """Who leads an election: the term (the leader's fence), the value it published, who it
    is, when its term began (Unix seconds) and its lease seconds left (``None``: a session)."""

    term: int
    value: bytes
    label: Optional[str]
    host: str
    pid: int
    since: float
    ttl_left: Optional[float]


def _leader(found: Optional[Tuple[Any, ...]]) -> Optional[Leader]:
    return None if found is None else Leader(*found)


def _options(ttl: Any, wait: Any, interval: Any) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    return (
        _args.seconds(ttl, "ttl", positive=True),
        _args.seconds(wait, "wait"),
        _args.seconds(interval, "interval", positive=True),
    )


def _elected(name: str, wait: Optional[float], hold: Optional[Hold]) -> Hold:
    if hold is None:
        raise LockTimeoutError(f"election {name!r} was not won within {wait} s", lock_name=name)
    return hold


class Leadership:
    """An elected leader's hold (``Election.campaign``); ``with`` resigns on exit, and so does
    dropping it (in the background)."""

    def __init__(self, hold: Hold) -> None:
        self._hold = hold

    def __repr__(self) -> str:
        return f"<dlock.Leadership {self._hold.name!r} term={self._hold.fence}>"

    @property
    def name(self) -> str:
        return self._hold.name

    @property
    def term(self) -> int:
        """The term: strictly greater than every earlier leader's. Send it with every write."""
        return self._hold.fence

    @property
    def fence(self) -> int:
        return self._hold.fence

    @property
    def lost(self) -> bool:
        return self._hold.is_lost()

    def is_lost(self) -> bool:
        return self._hold.is_lost()

    def wait_lost(self, timeout: Any = None) -> bool:
        """Blocks until leadership is lost (True) or ``timeout`` seconds pass (False)."""
        return bool(self._hold.wait_lost(_args.seconds(timeout, "timeout")))

    def is_owned(self) -> bool:
        return bool(self._hold.is_owned())

    def proclaim(self, value: Any) -> None:
        """Publishes ``value`` without giving up the term; ``LockNotOwnedError`` once lost."""
        election_proclaim(self._hold, _args.data(value))

    def resign(self) -> None:
        """Gives up leadership: the next campaigner is elected."""
        self._hold.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._hold.is_released():
            self._hold.release()


class Election:
    """The election ``name`` (``Locks.election``): ``campaign``, ``leader``, ``observe``.

    ``ttl``: a fixed lease for the term (default: the watchdog's, renewed while leading);
    ``wait``: seconds ``campaign`` waits (default: until elected); ``interval``: how often
    ``observe`` reads the store (default: a third of the watchdog lease, at most 1 s)."""

    def __init__(self, client: "Client", name: str, *, ttl: Any = None, wait: Any = None, interval: Any = None) -> None:
        self._client = client
        self.name = name
        self._ttl, self._wait, self._interval = _options(ttl, wait, interval)

    def campaign(self, value: Any = b"") -> Leadership:
        """Waits to lead, publishes ``value``; ``LockTimeoutError`` when ``wait`` runs out."""
        hold = election_campaign(self._client, self.name, _args.data(value), self._ttl, self._wait)
        return Leadership(_elected(self.name, self._wait, hold))

    def leader(self) -> Optional[Leader]:
        """Who leads now, or ``None``."""
        return _leader(election_leader(self._client, self.name))

    def observe(self) -> Iterator[Optional[Leader]]:
        """The current leader (``None``: nobody), then each change of leader, term or value."""
        observer: Observer = election_observe(self._client, self.name, self._interval)
        while True:
            more, found = observer.next()
            if not more:
                return
            yield _leader(found)


class AsyncLeadership(Leadership):
    """``Leadership`` for asyncio: the store calls are coroutines, ``async with`` resigns."""

    async def wait_lost(self, timeout: Any = None) -> bool:  # type: ignore[override]
        from .asyncio import _bridge

        return bool(await self._hold.wait_lost(_args.seconds(timeout, "timeout"), aio=_bridge()))

    async def is_owned(self) -> bool:  # type: ignore[override]
        from .asyncio import _bridge

        return bool(await self._hold.is_owned(aio=_bridge()))

    async def proclaim(self, value: Any) -> None:  # type: ignore[override]
        from .asyncio import _bridge

        await election_proclaim(self._hold, _args.data(value), aio=_bridge())

    async def resign(self) -> None:  # type: ignore[override]
        from .asyncio import _bridge

        await self._hold.release(aio=_bridge())

    async def __aenter__(self) -> "AsyncLeadership":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self._hold.is_released():
            await self.resign()


class AsyncElection(Election):
    """``Election`` for asyncio (``dlock.asyncio.Locks.election``)."""

    async def campaign(self, value: Any = b"") -> AsyncLeadership:  # type: ignore[override]
        from .asyncio import _bridge

        data = _args.data(value)
        hold = await election_campaign(self._client, self.name, data, self._ttl, self._wait, aio=_bridge())
        return AsyncLeadership(_elected(self.name, self._wait, hold))

    async def leader(self) -> Optional[Leader]:  # type: ignore[override]
        from .asyncio import _bridge

        return _leader(await election_leader(self._client, self.name, aio=_bridge()))

    async def observe(self) -> AsyncIterator[Optional[Leader]]:  # type: ignore[override]
        from .asyncio import _bridge

        observer: Observer = election_observe(self._client, self.name, self._interval)
        while True:
            more, found = await observer.next(aio=_bridge())
            if not more:
                return
            yield _leader(found)
