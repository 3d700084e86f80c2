#!/usr/bin/env python3
"""dlock's Python package (`python/`) as a `dlock bench --peer`, sync or asyncio, so that it is
measured by the same code, on the same server, in the same run as redis-py's Lock.

    dlock --url redis://127.0.0.1:6379 bench --peer 'python3 scripts/peers/dlock_py.py sync'

Protocol (the bench appends it; see crates/dlock-bench/src/peer.rs):
    <sync|asyncio> uncontended <pairs>            one pair latency (µs) a line
    <sync|asyncio> worker <name> <duration_ms> <hold_us>
                                                  `acquired_ns released_ns waited_ns` a line

The store's URL is in the environment variable DLOCK_PEER_URL. The calls are redis-py's
(`locks.lock(name, timeout=…)`, `acquire`, `release`), written as in scripts/peers/redis_py.py,
so that the two peers differ only in the library behind them. dlock needs no `sleep`: a waiter
is woken when the lock is released.
"""

import asyncio
import os
import sys
import time
import uuid

import dlock
import dlock.asyncio

TTL = 30  # seconds, as every library in the bench; no lock expires during a run


def busy(seconds):
    # A busy hold like dlock's workers: sleeping would add timer slack.
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def sync_uncontended(url, pairs):
    locks = dlock.connect(url)
    name = f"peer-bench/dlock-py/{uuid.uuid4().hex}"
    latencies = []
    for i in range(50 + pairs):
        t = time.perf_counter()
        lock = locks.lock(name, timeout=TTL)
        lock.acquire()
        lock.release()
        if i >= 50:  # the first 50 warm up the connection and the scripts
            latencies.append((time.perf_counter() - t) * 1e6)
    return latencies


def sync_worker(url, name, duration, hold):
    locks = dlock.connect(url)
    deadline = time.monotonic() + duration
    lines = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        asked = time.time_ns()
        lock = locks.lock(name, timeout=TTL, blocking_timeout=left)
        if not lock.acquire():
            break
        acquired = time.time_ns()
        busy(hold)
        released = time.time_ns()
        lock.release()
        lines.append(f"{acquired} {released} {acquired - asked}")
    return lines


async def async_uncontended(url, pairs):
    locks = await dlock.asyncio.connect(url)
    name = f"peer-bench/dlock-py-asyncio/{uuid.uuid4().hex}"
    latencies = []
    for i in range(50 + pairs):
        t = time.perf_counter()
        lock = locks.lock(name, timeout=TTL)
        await lock.acquire()
        await lock.release()
        if i >= 50:
            latencies.append((time.perf_counter() - t) * 1e6)
    return latencies


async def async_worker(url, name, duration, hold):
    locks = await dlock.asyncio.connect(url)
    deadline = time.monotonic() + duration
    lines = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        asked = time.time_ns()
        lock = locks.lock(name, timeout=TTL, blocking_timeout=left)
        if not await lock.acquire():
            break
        acquired = time.time_ns()
        busy(hold)
        released = time.time_ns()
        await lock.release()
        lines.append(f"{acquired} {released} {acquired - asked}")
    return lines


def main():
    # The URL comes in the environment: on the command line `ps` would show its password.
    url = os.environ["DLOCK_PEER_URL"]
    mode, scenario = sys.argv[1], sys.argv[2]
    if mode not in ("sync", "asyncio"):
        sys.exit(f"unknown mode {mode} (sync or asyncio)")
    if scenario == "uncontended":
        pairs = int(sys.argv[3])
        if mode == "asyncio":
            latencies = asyncio.run(async_uncontended(url, pairs))
        else:
            latencies = sync_uncontended(url, pairs)
        lines = [f"{x:.3f}" for x in latencies]
    elif scenario == "worker":
        name, duration, hold = sys.argv[3], int(sys.argv[4]) / 1e3, int(sys.argv[5]) / 1e6
        if mode == "asyncio":
            lines = asyncio.run(async_worker(url, name, duration, hold))
        else:
            lines = sync_worker(url, name, duration, hold)
    else:
        sys.exit(f"unknown scenario {scenario}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
