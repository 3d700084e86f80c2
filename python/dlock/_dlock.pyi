"""Type stubs of dlock's native module (the Rust core's bridge). Applications use the ``dlock``
and ``dlock.asyncio`` modules; every method here takes ``aio``: false runs the call (GIL
released), true returns an awaitable."""

from typing import Any, List, Optional, Tuple

InfoTuple = Tuple[str, int, Optional[str], str, int, float, Optional[float], int]

def default_url() -> str:
    """The URL ``dlock.connect()`` uses without one (the ``dlock`` command's default)."""

def enabled_schemes() -> List[str]:
    """The URL schemes this build accepts."""

class Hold:
    """One acquired lock, read or write hold, permit or multi-lock."""

    @property
    def name(self) -> str: ...
    @property
    def fence(self) -> int: ...
    @property
    def fences(self) -> List[Tuple[str, int]]: ...
    def is_lost(self) -> bool: ...
    def is_released(self) -> bool: ...
    def wait_lost(self, timeout: Optional[float] = None, aio: bool = False) -> Any: ...
    def extend(self, ttl: float, aio: bool = False) -> Any: ...
    def is_owned(self, aio: bool = False) -> Any: ...
    def release(self, aio: bool = False) -> Any: ...

class Client:
    """A connection to one lock store."""

    def __init__(self, url: str, label: Optional[str] = None, watchdog_lease: Optional[float] = None) -> None: ...
    @property
    def backend(self) -> str: ...
    @property
    def watchdog_lease(self) -> float: ...
    def mutex(
        self,
        name: str,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        fair: bool = False,
        reentrant: bool = False,
        max_hold: Optional[float] = None,
        aio: bool = False,
    ) -> Any: ...
    def read(
        self,
        name: str,
        max_readers: Optional[int] = None,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        max_hold: Optional[float] = None,
        aio: bool = False,
    ) -> Any: ...
    def write(
        self,
        name: str,
        max_readers: Optional[int] = None,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        max_hold: Optional[float] = None,
        aio: bool = False,
    ) -> Any: ...
    def semaphore(
        self,
        name: str,
        permits: int,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        max_hold: Optional[float] = None,
        aio: bool = False,
    ) -> Any: ...
    def multi_lock(
        self,
        names: List[str],
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        max_hold: Optional[float] = None,
        aio: bool = False,
    ) -> Any: ...
    def inspect(self, name: str, aio: bool = False) -> Any: ...
    def list(self, prefix: str = "", aio: bool = False) -> Any: ...
    def force_release(self, name: str, aio: bool = False) -> Any: ...
    def value_get(self, name: str, aio: bool = False) -> Any: ...
    def value_compare_and_set(self, name: str, expected: Optional[int], data: bytes, aio: bool = False) -> Any: ...
    def value_set(self, name: str, data: bytes, aio: bool = False) -> Any: ...
