"""A pytest plugin that points redis-py's own lock tests (``tests/test_lock.py`` of redis-py's
source distribution) at dlock's drop-in: their ``get_lock`` makes ``dlock.redis_py.lock``
instead of redis-py's ``Lock``. Loaded with ``-p redis_py_suite_plugin`` by
``test_redis_py_suite.py``."""

from typing import Any

import pytest

import dlock.redis_py


def _dlock_lock(self: Any, redis: Any, *args: Any, **kwargs: Any) -> Any:
    kwargs.pop("lock_class", None)
    return dlock.redis_py.lock(redis, *args, **kwargs)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: Any) -> None:
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and cls.__name__ == "TestLock" and "get_lock" in vars(cls):
            cls.get_lock = _dlock_lock
