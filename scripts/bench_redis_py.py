#!/usr/bin/env python3
"""redis-py's Lock measured the way `dlock bench` measures dlock, for side-by-side runs.

    pip install redis
    python3 scripts/bench_redis_py.py --url redis://127.0.0.1:6379 [--sleep 0.1] [--repeat 3]

Scenarios (each repeated, reported as median (min, max)):
- uncontended: one client acquires and releases one lock in a loop: pairs/s, p50 and p99;
- handoff: P worker processes contend for one lock for D seconds, each holding it H ms
  (busy-wait, like dlock's workers): acquisitions/s, hand-offs to another worker/s, the gap
  from one release to the next acquisition (p50, p99), Jain's fairness index over per-worker
  counts, the worst single wait, and Redis commands per acquisition (INFO commandstats; the
  server must be the benchmark's alone).
"""

import argparse
import multiprocessing
import statistics
import time
import uuid

import redis


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    rank = round(p * (len(sorted_values) - 1))
    return sorted_values[min(rank, len(sorted_values) - 1)]


def spread(values):
    values = sorted(values)
    return f"{values[len(values) // 2]:10.1f} (min {values[0]:.1f}, max {values[-1]:.1f})"


def client_commands(client):
    """Commands clients sent (commands run inside Lua scripts are not round trips)."""
    stats = client.info("commandstats")
    sent = ("evalsha", "eval", "set", "get", "del", "ping", "script", "info", "client", "hello")
    return sum(v["calls"] for k, v in stats.items() if k.split("|")[0].removeprefix("cmdstat_") in sent)


def uncontended(url, pairs, sleep):
    client = redis.Redis.from_url(url)
    name = f"bench-py/{uuid.uuid4().hex}"
    for _ in range(50):
        lock = client.lock(name, timeout=30, sleep=sleep)
        lock.acquire()
        lock.release()
    latencies = []
    for _ in range(pairs):
        t = time.perf_counter()
        lock = client.lock(name, timeout=30, sleep=sleep)
        lock.acquire()
        lock.release()
        latencies.append((time.perf_counter() - t) * 1e6)
    latencies.sort()
    return pairs / (sum(latencies) / 1e6), percentile(latencies, 0.5), percentile(latencies, 0.99)


def worker(url, name, duration, hold, sleep, out):
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + duration
    lines = []
    while time.monotonic() < deadline:
        asked = time.time_ns()
        lock = client.lock(name, timeout=30, sleep=sleep, blocking_timeout=max(deadline - time.monotonic(), 0.001))
        if not lock.acquire():
            break
        acquired = time.time_ns()
        until = time.perf_counter() + hold
        while time.perf_counter() < until:
            pass
        released = time.time_ns()
        lock.release()
        lines.append((acquired, released, acquired - asked))
    out.put(lines)


def handoff(url, processes, duration, hold, sleep):
    admin = redis.Redis.from_url(url)
    before = client_commands(admin)
    name = f"bench-py/handoff/{uuid.uuid4().hex}"
    out = multiprocessing.Queue()
    workers = [
        multiprocessing.Process(target=worker, args=(url, name, duration, hold, sleep, out))
        for _ in range(processes)
    ]
    for w in workers:
        w.start()
    holds = []
    for index in range(processes):
        holds += [(index, *h) for h in out.get()]
    for w in workers:
        w.join()
    spent = client_commands(admin) - before - 1
    holds.sort(key=lambda h: h[1])
    span = (holds[-1][2] - holds[0][1]) / 1e9
    gaps = sorted(max(b[1] - a[2], 0) / 1e3 for a, b in zip(holds, holds[1:]))
    handoffs = sum(1 for a, b in zip(holds, holds[1:]) if a[0] != b[0])
    counts = [sum(1 for h in holds if h[0] == i) for i in range(processes)]
    jain = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))
    worst = max(h[3] for h in holds) / 1e6
    return (len(holds) / span, handoffs / span, percentile(gaps, 0.5), percentile(gaps, 0.99), jain, worst,
            spent / len(holds))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--sleep", type=float, default=0.1, help="redis-py's polling interval (its default: 0.1)")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=0.001)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenario", choices=["all", "uncontended", "handoff"], default="all")
    args = parser.parse_args()
    print(f"redis-py {redis.__version__} Lock, sleep={args.sleep} ({args.repeat} runs, median (min, max))")
    if args.scenario in ("all", "uncontended"):
        runs = [uncontended(args.url, args.pairs, args.sleep) for _ in range(args.repeat)]
        print(f"uncontended acquire+release, {args.pairs} pairs per run")
        for label, i in (("pairs/s", 0), ("p50 µs", 1), ("p99 µs", 2)):
            print(f"  {label:<12} {spread([r[i] for r in runs])}")
    if args.scenario in ("all", "handoff"):
        runs = [handoff(args.url, args.processes, args.duration, args.hold, args.sleep) for _ in range(args.repeat)]
        print(f"contended hand-off, {args.processes} processes, hold {args.hold * 1e3:g}ms, {args.duration:g}s per run")
        labels = ("acquisitions/s", "hand-offs/s", "gap p50 µs", "gap p99 µs", "fairness (Jain)", "worst wait ms",
                  "store cmds/acq")
        for i, label in enumerate(labels):
            print(f"  {label:<16} {spread([r[i] for r in runs])}")


if __name__ == "__main__":
    main()
