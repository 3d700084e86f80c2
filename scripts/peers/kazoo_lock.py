#!/usr/bin/env python3
"""kazoo's Lock (ZooKeeper) as a `dlock bench --peer`.

    dlock --url zk://127.0.0.1:2181/bench bench --peer 'python3 scripts/peers/kazoo_lock.py'

Protocol (the bench appends it; see crates/dlock-bench/src/peer.rs):
    uncontended <pairs>                        one pair latency (µs) a line
    worker <name> <duration_ms> <hold_us>      `acquired_ns released_ns waited_ns` a line

The URL, in the environment variable DLOCK_PEER_URL, is dlock's (`zk://host:port[,host:port]/chroot`); kazoo gets the same hosts and chroot.
"""

import os
import sys
import time
import uuid
from urllib.parse import urlsplit

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout


def connect(url):
    parts = urlsplit(url)
    client = KazooClient(hosts=parts.netloc + (parts.path.rstrip("/") or ""))
    client.start()
    client.ensure_path("/")
    return client


def busy(seconds):
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def uncontended(url, pairs):
    client = connect(url)
    lock = client.Lock(f"/kazoo-bench/{uuid.uuid4().hex}", "bench")
    latencies = []
    for i in range(50 + pairs):
        t = time.perf_counter()
        lock.acquire()
        lock.release()
        if i >= 50:  # the first 50 warm up the session and create the parent node
            latencies.append((time.perf_counter() - t) * 1e6)
    client.stop()
    return [f"{x:.3f}" for x in latencies]


def worker(url, name, duration, hold):
    client = connect(url)
    lock = client.Lock("/kazoo-bench/" + name.replace("/", "_"), "bench")
    deadline = time.monotonic() + duration
    lines = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        asked = time.time_ns()
        try:
            if not lock.acquire(timeout=left):
                break
        except LockTimeout:  # kazoo raises instead of returning False when the wait runs out
            break
        acquired = time.time_ns()
        busy(hold)
        released = time.time_ns()
        lock.release()
        lines.append(f"{acquired} {released} {acquired - asked}")
    client.stop()
    return lines


def main():
    # The URL comes in the environment: on the command line `ps` would show its credentials.
    scenario, url = sys.argv[1], os.environ["DLOCK_PEER_URL"]
    if scenario == "uncontended":
        lines = uncontended(url, int(sys.argv[2]))
    elif scenario == "worker":
        lines = worker(url, sys.argv[2], int(sys.argv[3]) / 1e3, int(sys.argv[4]) / 1e6)
    else:
        sys.exit(f"unknown scenario {scenario}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
