"""Checks of arguments shared by the sync and asyncio APIs: wrong types raise ``TypeError``,
out-of-range values ``ValueError``, both before any store is contacted."""

from __future__ import annotations

import math
import os
import uuid
from typing import Any, Iterable, List, Optional, Union

Number = Union[int, float]


def seconds(value: Any, what: str, *, positive: bool = False) -> Optional[float]:
    """``None`` stays ``None``; a number of seconds becomes a float; anything else raises."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, not {type(value).__name__}")
    result = float(value)
    if math.isnan(result) or math.isinf(result):
        raise ValueError(f"{what} must be a finite number of seconds, not {value!r}")
    if result < 0 or (positive and result == 0):
        bound = "greater than zero" if positive else "zero or more"
        raise ValueError(f"{what} must be {bound} seconds, not {value!r}")
    return result


def lock_name(name: Any, what: str = "name") -> str:
    """Lock names are text; bytes are accepted as UTF-8 (redis-py accepts both)."""
    if isinstance(name, str):
        return name
    if isinstance(name, (bytes, bytearray)):
        try:
            return bytes(name).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} must be valid UTF-8 when given as bytes") from None
    raise TypeError(f"{what} must be str or bytes, not {type(name).__name__}")


def lock_names(names: Any) -> List[str]:
    if isinstance(names, (str, bytes, bytearray)):
        raise TypeError("names must be an iterable of lock names, not a single name")
    if not isinstance(names, Iterable):
        raise TypeError(f"names must be an iterable of lock names, not {type(names).__name__}")
    return [lock_name(n, "each name") for n in names]


def token(value: Any) -> bytes:
    """redis-py's token rules: bytes as given, text and numbers encoded; a fresh UUID if None."""
    if value is None:
        return uuid.uuid4().hex.encode()
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value).encode()
    raise TypeError(f"token must be str or bytes, not {type(value).__name__}")


def data(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        raise TypeError("a versioned value is bytes: encode text first (for example value.encode())")
    raise TypeError(f"a versioned value must be bytes, not {type(value).__name__}")


def count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be at least 1, not {value}")
    if value > 2**32 - 1:
        raise ValueError(f"{what} is too large: {value}")
    return value


def version(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected version must be an int or None, not {type(value).__name__}")
    if value < 0 or value > 2**64 - 1:
        raise ValueError(f"expected version out of range: {value}")
    return value


def url(value: Any) -> str:
    if value is None:
        from ._dlock import default_url

        return os.environ.get("DLOCK_URL") or default_url()
    if isinstance(value, os.PathLike):
        raise TypeError("url must be a dlock URL string such as 'sqlite:///path/locks.db', not a path")
    if not isinstance(value, str):
        raise TypeError(f"url must be str, not {type(value).__name__}")
    return value


def label(value: Any) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"label must be str or None, not {type(value).__name__}")
