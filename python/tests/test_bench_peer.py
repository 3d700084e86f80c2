"""The bench's peer program for this package (scripts/peers/dlock_py.py) speaks the bench's
protocol and measures a real lock: pair latencies, and hand-off workers whose holds never
overlap. Behaviour only: how fast is the benchmark's business (scripts/bench.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

PEER = Path(__file__).resolve().parents[2] / "scripts" / "peers" / "dlock_py.py"


def run_peer(url: str, *args: str) -> "subprocess.Popen[str]":
    # -I: the installed package, not the source folder; the URL in the environment, as the
    # bench passes it.
    env = dict(os.environ, DLOCK_PEER_URL=url)
    return subprocess.Popen(
        [sys.executable, "-I", str(PEER), *args], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_peer_reports_one_latency_per_pair(redis_server, mode):
    peer = run_peer(redis_server.url, mode, "uncontended", "20")
    out, _ = peer.communicate(timeout=60)
    assert peer.returncode == 0
    latencies = [float(line) for line in out.split()]
    assert len(latencies) == 20
    assert all(latency > 0 for latency in latencies)


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_peer_workers_hold_the_lock_in_turn(redis_server, name, mode):
    workers = [run_peer(redis_server.url, mode, "worker", name, "400", "200") for _ in range(2)]
    holds: List[Tuple[int, int, int]] = []
    for worker_id, worker in enumerate(workers):
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        for line in out.splitlines():
            acquired, released, waited = (int(field) for field in line.split())
            assert acquired <= released and waited >= 0
            holds.append((acquired, released, worker_id))
    assert {worker_id for _, _, worker_id in holds} == {0, 1}, "both workers took the lock"
    holds.sort()
    for (_, released, _), (next_acquired, _, _) in zip(holds, holds[1:]):
        assert released <= next_acquired, "two workers held the lock at once"


def test_peer_rejects_an_unknown_mode(sqlite_url):
    peer = run_peer(sqlite_url, "threads", "uncontended", "1")
    peer.communicate(timeout=60)
    assert peer.returncode != 0
