"""The exceptions dlock raises.

``LockError`` and ``LockNotOwnedError`` are redis-py's: the same names, the same constructor
(``message``, ``lock_name``), the same bases (``LockError`` is also a ``ValueError``), raised in
the same places. The rest name what redis-py reports as connection errors or has no word for.

Bad input (a wrong type, a negative timeout, an invalid name or URL) raises the built-in
``TypeError`` or ``ValueError`` before any store is contacted.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
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


class DlockError(Exception):
    """Base class of every error dlock raises itself (bad input aside)."""

    def __init__(self, message: Optional[str] = None, lock_name: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.lock_name = lock_name


class LockError(DlockError, ValueError):
    """A lock could not be acquired, released, extended or reacquired (redis-py's class).

    Like redis-py's, it derives from ``ValueError`` (redis-py chose that to behave like
    ``threading.Lock``).
    """


class LockNotOwnedError(LockError):
    """The lock is no longer this holder's: its lease ran out, it was broken, or it was
    released already (redis-py's class)."""


class LostError(LockNotOwnedError):
    """A hold was lost while ``run_while_held`` ran its task; ``reason`` says why:
    ``"expired"``, ``"renewal_refused"``, ``"store_unreachable"``, ``"broken"``,
    ``"session_ended"`` or ``"store_signal"``."""

    def __init__(self, message: Optional[str] = None, lock_name: Optional[str] = None, reason: Optional[str] = None) -> None:
        super().__init__(message, lock_name)
        self.reason = reason


class LockTimeoutError(LockError):
    """A primitive's ``acquire()`` (semaphore, read-write lock, multi-lock) gave up waiting."""


class ConflictError(DlockError):
    """A versioned value changed under every attempt of ``update()``."""


class UnsupportedError(DlockError):
    """The store cannot do this (for example fair locks on a store without a queue)."""


class StoreError(DlockError):
    """The store refused or failed the request (authentication, permissions, a foreign key at
    the lock's name, a server error)."""


class StoreUnavailableError(StoreError):
    """The store could not be reached in time; retrying later may succeed."""
