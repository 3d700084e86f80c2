#!/usr/bin/env python3
"""redis-py's Lock as a `dlock bench --peer`: sync or asyncio, with a given polling `sleep`.

    dlock --url redis://127.0.0.1:6379 bench --peer 'python3 scripts/peers/redis_py.py sync 0.1'

Protocol (the bench appends it; see crates/dlock-bench/src/peer.rs):
    <sync|asyncio> <sleep> uncontended <pairs>    one pair latency (µs) a line
    <sync|asyncio> <sleep> worker <name> <duration_ms> <hold_us>
                                                  `acquired_ns released_ns waited_ns` a line

The store's URL is in the environment variable DLOCK_PEER_URL.
"""

import asyncio
import os
import sys
import time
import uuid

import redis
import redis.asyncio

TTL = 30  # seconds; long enough that no lock expires during a run


def busy(seconds):
    # A busy hold like dlock's workers: sleeping would add timer slack.
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def sync_uncontended(url, pairs, sleep):
    client = redis.Redis.from_url(url)
    name = f"peer-bench/redis-py/{uuid.uuid4().hex}"
    latencies = []
    for i in range(50 + pairs):
        t = time.perf_counter()
        lock = client.lock(name, timeout=TTL, sleep=sleep)
        lock.acquire()
        lock.release()
        if i >= 50:  # the first 50 warm up the connection and the release script
            latencies.append((time.perf_counter() - t) * 1e6)
    return latencies


def sync_worker(url, name, duration, hold, sleep):
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + duration
    lines = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        asked = time.time_ns()
        lock = client.lock(name, timeout=TTL, sleep=sleep, blocking_timeout=left)
        if not lock.acquire():
            break
        acquired = time.time_ns()
        busy(hold)
        released = time.time_ns()
        lock.release()
        lines.append(f"{acquired} {released} {acquired - asked}")
    return lines


async def async_uncontended(url, pairs, sleep):
    client = redis.asyncio.Redis.from_url(url)
    name = f"peer-bench/redis-py-asyncio/{uuid.uuid4().hex}"
    latencies = []
    for i in range(50 + pairs):
        t = time.perf_counter()
        lock = client.lock(name, timeout=TTL, sleep=sleep)
        await lock.acquire()
        await lock.release()
        if i >= 50:
            latencies.append((time.perf_counter() - t) * 1e6)
    await client.aclose()
    return latencies


async def async_worker(url, name, duration, hold, sleep):
    client = redis.asyncio.Redis.from_url(url)
    deadline = time.monotonic() + duration
    lines = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        asked = time.time_ns()
        lock = client.lock(name, timeout=TTL, sleep=sleep, blocking_timeout=left)
        if not await lock.acquire():
            break
        acquired = time.time_ns()
        busy(hold)
        released = time.time_ns()
        await lock.release()
        lines.append(f"{acquired} {released} {acquired - asked}")
    await client.aclose()
    return lines


def main():
    # The URL comes in the environment: on the command line `ps` would show its password.
    url = os.environ["DLOCK_PEER_URL"]
    mode, sleep, scenario = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    if scenario == "uncontended":
        pairs = int(sys.argv[4])
        if mode == "asyncio":
            lines = [f"{x:.3f}" for x in asyncio.run(async_uncontended(url, pairs, sleep))]
        else:
            lines = [f"{x:.3f}" for x in sync_uncontended(url, pairs, sleep)]
    elif scenario == "worker":
        name, duration, hold = sys.argv[4], int(sys.argv[5]) / 1e3, int(sys.argv[6]) / 1e6
        if mode == "asyncio":
            lines = asyncio.run(async_worker(url, name, duration, hold, sleep))
        else:
            lines = sync_worker(url, name, duration, hold, sleep)
    else:
        sys.exit(f"unknown scenario {scenario}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
