"""Uncontended acquire+release pairs per second: dlock from Python against redis-py's Lock,
sync and asyncio, on the same redis-server in the same run.

    python benchmarks/uncontended.py [--url redis://127.0.0.1:P/0] [--pairs 2000] [--rounds 5]

Without --url it starts its own redis-server on a free loopback port. Each round takes and
releases one lock --pairs times from one thread (or one task); the report is min / median / max
pairs/s over the rounds, the libraries taking turns round by round so that a noisy neighbour
hurts them alike. Both use a fixed 10 s lease (redis-py's `timeout=10`), so neither renews.
Needs `pip install redis`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable, Dict, List

import redis
import redis.asyncio

import dlock
import dlock.asyncio


def start_redis() -> "tuple[subprocess.Popen, str]":
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server not found (or pass --url)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", tempfile.gettempdir()],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if redis.Redis(port=port).ping():
                return process, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    process.kill()
    sys.exit("redis-server did not start")


def sync_round(make_lock: Callable[[], object], pairs: int) -> float:
    lock = make_lock()
    started = time.perf_counter()
    for _ in range(pairs):
        if not lock.acquire(blocking=False):
            raise RuntimeError("an uncontended lock was busy")
        lock.release()
    return pairs / (time.perf_counter() - started)


async def async_round(make_lock: Callable[[], object], pairs: int) -> float:
    lock = make_lock()
    started = time.perf_counter()
    for _ in range(pairs):
        if not await lock.acquire(blocking=False):
            raise RuntimeError("an uncontended lock was busy")
        await lock.release()
    return pairs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="redis:// URL of a running server (default: start one)")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    server = None
    url = args.url
    if url is None:
        server, url = start_redis()
    try:
        r = redis.Redis.from_url(url)
        locks = dlock.connect(url)
        results: Dict[str, List[float]] = {}

        async def async_rounds(name: str) -> None:
            ar = redis.asyncio.Redis.from_url(url)
            alocks = dlock.asyncio.Locks.from_sync(locks)
            contenders = {
                "dlock asyncio": lambda: alocks.lock(name + "/dlock-aio", timeout=10),
                "redis-py asyncio": lambda: ar.lock(name + "/redis-py-aio", timeout=10),
            }
            for make in contenders.values():  # warm-up: connections, scripts loaded
                await async_round(make, 50)
            for _ in range(args.rounds):
                for label, make in contenders.items():
                    results.setdefault(label, []).append(await async_round(make, args.pairs))
            await ar.aclose()

        name = f"bench/{uuid.uuid4().hex}"
        contenders = {
            "dlock sync": lambda: locks.lock(name + "/dlock", timeout=10),
            "redis-py sync": lambda: r.lock(name + "/redis-py", timeout=10),
        }
        for make in contenders.values():
            sync_round(make, 50)
        for _ in range(args.rounds):
            for label, make in contenders.items():
                results.setdefault(label, []).append(sync_round(make, args.pairs))
        asyncio.run(async_rounds(name))

        print(f"uncontended acquire+release, {args.pairs} pairs x {args.rounds} rounds, one redis-server")
        print(f"{'library':<18} {'min':>9} {'median':>9} {'max':>9}  pairs/s")
        for label, values in results.items():
            print(f"{label:<18} {min(values):>9.0f} {statistics.median(values):>9.0f} {max(values):>9.0f}")
        for mode in ("sync", "asyncio"):
            ours = statistics.median(results[f"dlock {mode}"])
            theirs = statistics.median(results[f"redis-py {mode}"])
            print(f"{mode}: dlock / redis-py median = {ours / theirs:.2f}x")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
