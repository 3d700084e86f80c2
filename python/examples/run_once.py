"""A run-once scheduler: worker processes all try every job each period; each job runs
exactly once per period, whichever worker gets there first.

The job's lock (taken without waiting: a busy lock means another worker has the job) keeps two
workers from running it at once; its "last period" value, claimed with compare-and-set, makes
the run happen once even if a lock expired mid-run.

    python examples/run_once.py [URL]       # default: dlock's SQLite file; or redis://…
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import uuid
from collections import Counter

import dlock

WORKERS = 4
JOBS = 5
PERIODS = 3
PERIOD = 0.5  # seconds


def worker(url: str, run: str, worker_id: int, start: float, log: "multiprocessing.Queue") -> None:
    locks = dlock.connect(url)
    for period in range(PERIODS):
        time.sleep(max(0.0, start + period * PERIOD - time.time()))
        for job in range(JOBS):
            lock = locks.lock(f"{run}/job-{job}", timeout=PERIOD)
            if not lock.acquire(blocking=False):
                continue  # another worker has it
            try:
                last = locks.value(f"{run}/job-{job}/last-period")
                seen = last.get()
                due = seen is None or int(seen.value) < period
                if due and last.compare_and_set(None if seen is None else seen.version, str(period).encode()):
                    log.put((period, job, worker_id, lock.fence))
            finally:
                try:
                    lock.release()
                except dlock.LockNotOwnedError:
                    pass  # the lease ran out: the value's version already kept the run unique
    log.put(None)


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else dlock.default_url()
    run = f"scheduler/{uuid.uuid4().hex}"
    log: multiprocessing.Queue = multiprocessing.Queue()
    start = time.time() + 0.5
    workers = [
        multiprocessing.Process(target=worker, args=(url, run, i, start, log)) for i in range(WORKERS)
    ]
    for process in workers:
        process.start()
    runs = []
    finished = 0
    while finished < WORKERS:
        entry = log.get(timeout=300)
        if entry is None:
            finished += 1
        else:
            runs.append(entry)
            print(f"period {entry[0]}: job {entry[1]} ran on worker {entry[2]} (fence {entry[3]})")
    for process in workers:
        process.join()
    counts = Counter((period, job) for period, job, _, _ in runs)
    expected = {(p, j) for p in range(PERIODS) for j in range(JOBS)}
    ok = set(counts) == expected and all(c == 1 for c in counts.values())
    ok = ok and all(p.exitcode == 0 for p in workers)
    shares = Counter(w for _, _, w, _ in runs)
    print(f"runs={len(runs)} expected={len(expected)} per worker={dict(sorted(shares.items()))} ok={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
