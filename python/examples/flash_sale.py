"""A flash sale: buyer processes race for a limited stock and nothing is ever oversold.

Each purchase takes the item's lock (redis-py's API) and takes one item from the stock, a
versioned value, with ``update``: it reads the stock and writes it back one lower with
compare-and-set at the version it read, or writes nothing when the stock is gone. Even if the
lock were lost mid-purchase (a paused buyer outliving its lease), a write based on a stale
read would fail and be computed again from the new stock, instead of selling an item twice.

    python examples/flash_sale.py [URL]     # default: dlock's SQLite file; or redis://…
"""

from __future__ import annotations

import multiprocessing
import sys
import uuid
from typing import Optional

import dlock

STOCK = 50
BUYERS = 4
PURCHASES_PER_BUYER = 30


def take_one(current: Optional[bytes]) -> Optional[bytes]:
    """One item less, or ``None`` (write nothing) when the stock is gone."""
    left = int(current or b"0")
    return None if left == 0 else str(left - 1).encode()


def buyer(url: str, item: str, results: "multiprocessing.Queue") -> None:
    locks = dlock.connect(url)
    stock = locks.value(f"{item}/stock")
    sold = rejected = 0
    for _ in range(PURCHASES_PER_BUYER):
        with locks.lock(item, timeout=10, blocking_timeout=30) as lock:
            # The fence would go with a write to an external system; here the version guards.
            assert lock.fence is not None
            if stock.update(take_one) is None:
                rejected += 1
            else:
                sold += 1
    results.put((sold, rejected))


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else None
    locks = dlock.connect(url)
    item = f"flash-sale/{uuid.uuid4().hex}"
    locks.value(f"{item}/stock").set(str(STOCK).encode())
    results: multiprocessing.Queue = multiprocessing.Queue()
    target_url = url or dlock.default_url()
    buyers = [multiprocessing.Process(target=buyer, args=(target_url, item, results)) for _ in range(BUYERS)]
    for process in buyers:
        process.start()
    outcomes = [results.get(timeout=300) for _ in buyers]
    for process in buyers:
        process.join()
    sold = sum(s for s, _ in outcomes)
    rejected = sum(r for _, r in outcomes)
    left = int(locks.value(f"{item}/stock").get().value)
    oversold = max(0, sold - STOCK)
    print(f"backend={locks.backend} sold={sold} rejected={rejected} left={left} oversold={oversold}")
    ok = sold + left == STOCK and oversold == 0 and sold == min(STOCK, BUYERS * PURCHASES_PER_BUYER)
    ok = ok and all(p.exitcode == 0 for p in buyers)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
