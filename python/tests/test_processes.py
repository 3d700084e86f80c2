"""Processes: exclusion across multiprocessing workers, Ctrl-C during a wait, fork."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import dlock
from dlock import LockNotOwnedError


def _increment(url: str, name: str, counter: str, rounds: int) -> None:
    locks = dlock.connect(url)
    for _ in range(rounds):
        with locks.lock(name, timeout=30):
            # A read-modify-write with a pause in the middle: without exclusion, increments
            # of other processes get lost.
            path = Path(counter)
            value = int(path.read_text())
            time.sleep(0.001)
            path.write_text(str(value + 1))


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_processes_exclude_each_other(store_url, name, tmp_path, start_method):
    counter = tmp_path / "counter"
    counter.write_text("0")
    context = multiprocessing.get_context(start_method)
    workers = [context.Process(target=_increment, args=(store_url, name, str(counter), 20)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    assert counter.read_text() == "80"


# The waiter installs Python's own Ctrl-C handler: a process started with SIGINT ignored (any
# command a non-interactive shell runs in the background, CI runners among them) would
# otherwise keep ignoring it, and no interrupt would reach the acquire.
WAITER = textwrap.dedent(
    """
    import signal, sys, dlock
    signal.signal(signal.SIGINT, signal.default_int_handler)
    locks = dlock.connect(sys.argv[1])
    lock = locks.lock(sys.argv[2])
    print("waiting", flush=True)
    try:
        lock.acquire()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(42)
    print("acquired", flush=True)
    sys.exit(1)
    """
)


def test_ctrl_c_interrupts_a_blocking_acquire(store_url, name):
    locks = dlock.connect(store_url)
    holder = locks.lock(name)
    assert holder.acquire(blocking=False)
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", WAITER, store_url, name], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # well inside the acquire
        child.send_signal(signal.SIGINT)
        assert child.wait(30) == 42
        assert child.stdout.read().strip() == "interrupted"
    finally:
        if child.poll() is None:
            child.kill()
    # The interrupted waiter left nothing behind, not even its place in the waiters' queue (a
    # dead waiter's place would only expire after a second): the released lock is free at once.
    holder.release()
    other = dlock.connect(store_url).lock(name)
    assert other.acquire(blocking_timeout=0.5)
    other.release()


# A forked child that hangs fails its test after this long (and is killed), rather than
# hanging the suite.
CHILD_LIMIT = 60.0


def _wait_child(pid: int, limit: float) -> int:
    """The child's wait status; a child still running after `limit` seconds is killed and
    the test fails."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"a forked child was still running after {limit} s: hung")


def test_forked_child_does_not_inherit_holds(store_url, name):
    locks = dlock.connect(store_url)
    lock = locks.lock(name, timeout=30)
    assert lock.acquire(blocking=False)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never run pytest's teardown
        code = 0
        try:
            os.close(read)
            checks = [
                lock.owned() is False,  # the parent's hold is not the child's
                lock.lost is True,
                lock.locked() is True,  # still held by the parent, seen through a new connection
                not locks.lock(name).acquire(blocking=False),
            ]
            try:
                lock.release()
                checks.append(False)
            except LockNotOwnedError:
                checks.append(True)
            # The runtime works in the child: a fresh lock can be taken and released.
            other = locks.lock(name + "/child", timeout=5)
            checks.append(other.acquire(blocking=False))
            other.release()
            os.write(write, bytes(int(c) for c in checks))
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            os.write(write, repr(error).encode()[:200])
            code = 3
        os._exit(code)
    os.close(write)
    status = _wait_child(pid, CHILD_LIMIT)
    report = os.read(read, 256)
    os.close(read)
    assert os.WEXITSTATUS(status) == 0, report
    assert report == bytes([1] * 6), report
    # The parent still holds its lock; the child's failed release did not free it.
    assert lock.owned()
    lock.release()


def test_fork_while_other_threads_use_the_store(store_url, name):
    """Forks while a thread of the parent locks and unlocks all the time: each child must be
    able to use the store. A thread inside the store's client library at the fork leaves that
    library's locks held in the child (SQLite: its allocator's mutex), and the child's first
    call hung (CI: 1 fork in 4 on SQLite)."""
    locks = dlock.connect(store_url)
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        lock = locks.lock(name + "/churn", timeout=30)
        try:
            while not stop.is_set():
                lock.acquire()
                lock.release()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for round_ in range(20):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    mine = locks.lock(f"{name}/child/{round_}", timeout=5)
                    if mine.acquire(blocking=False):
                        mine.release()
                        code = 0
                finally:
                    os._exit(code)
            status = _wait_child(pid, CHILD_LIMIT)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child {round_}: {status}"
    finally:
        stop.set()
        churner.join(30)
    assert not errors, errors
