#!/usr/bin/env python3
"""kazoo's Lock measured the way `dlock bench` measures dlock, for the ZooKeeper comparison.

    python3 scripts/bench_kazoo.py 127.0.0.1:2181 [--pairs 2000] [--processes 4] [--hold-ms 1]
        [--duration 3] [--repeat 3]

uncontended: one client acquiring and releasing one name (pairs/s, p50/p99 µs).
handoff: P worker processes contend for one name for D seconds, each holding it H ms (busy
loop): acquisitions/s and the gap from one holder's release to the next holder's acquire.
Each scenario runs --repeat times; medians are printed (and min/max).
"""
import argparse
import multiprocessing as mp
import statistics
import time
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout


def uncontended(hosts, pairs):
    zk = KazooClient(hosts=hosts)
    zk.start()
    lock = zk.Lock(f"/kazoo-bench/{uuid.uuid4().hex}", "bench")
    lock.acquire()  # warm-up: creates the parent
    lock.release()
    times = []
    start = time.perf_counter()
    for _ in range(pairs):
        t = time.perf_counter()
        lock.acquire()
        lock.release()
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    zk.stop()
    times.sort()
    return pairs / total, times[len(times) // 2] * 1e6, times[int(len(times) * 0.99)] * 1e6


def worker(hosts, path, duration, hold, out):
    zk = KazooClient(hosts=hosts)
    zk.start()
    lock = zk.Lock(path, "bench")
    deadline = time.monotonic() + duration
    holds = []
    while time.monotonic() < deadline:
        left = deadline - time.monotonic()
        try:
            if not lock.acquire(timeout=max(left, 0.001)):
                break
        except LockTimeout:  # kazoo raises instead of returning False when the wait runs out
            break
        acquired = time.time_ns()
        until = time.perf_counter() + hold
        while time.perf_counter() < until:
            pass
        released = time.time_ns()
        lock.release()
        holds.append((acquired, released))
    zk.stop()
    out.put(holds)


def handoff(hosts, processes, duration, hold):
    path = f"/kazoo-bench/{uuid.uuid4().hex}"
    out = mp.Queue()
    procs = [mp.Process(target=worker, args=(hosts, path, duration, hold, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    holds = []
    for _ in procs:
        holds.extend(out.get())
    for p in procs:
        p.join()
    holds.sort()
    span = (holds[-1][1] - holds[0][0]) / 1e9
    gaps = sorted(max(b[0] - a[1], 0) / 1e3 for a, b in zip(holds, holds[1:]))
    return len(holds) / span, gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.99)]


def spread(values):
    return f"{statistics.median(values):.1f} (min {min(values):.1f}, max {max(values):.1f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hosts")
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--hold-ms", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    runs = [uncontended(args.hosts, args.pairs) for _ in range(args.repeat)]
    print(f"kazoo uncontended acquire+release, {args.pairs} pairs")
    print(f"  pairs/s          {spread([r[0] for r in runs])}")
    print(f"  p50 µs           {spread([r[1] for r in runs])}")
    print(f"  p99 µs           {spread([r[2] for r in runs])}")
    runs = [handoff(args.hosts, args.processes, args.duration, args.hold_ms / 1e3) for _ in range(args.repeat)]
    print(f"kazoo contended hand-off, {args.processes} processes, hold {args.hold_ms} ms, {args.duration} s per run")
    print(f"  acquisitions/s   {spread([r[0] for r in runs])}")
    print(f"  gap p50 µs       {spread([r[1] for r in runs])}")
    print(f"  gap p99 µs       {spread([r[2] for r in runs])}")


if __name__ == "__main__":
    main()
