#!/usr/bin/env python3
"""Builds the workspace's test binaries once and runs them side by side.

    scripts/run_tests.py [--jobs N] [--split BINARY]... [--job NAME=COMMAND]... [--side NAME=COMMAND]...
                         [--timeout SECONDS] -- CARGO_TEST_ARGS...

`cargo test` runs one test binary after the other, and most of this suite waits on real
servers (leases running out, hand-offs, restarts): one binary alone leaves the machine's cores
idle half of the time. Here `cargo test ARGS --no-run` builds every binary, then up to N of them
run at once, each in its package's folder as cargo runs it, each a process of its own with its
own servers (the test kit starts them per process, on free ports), so no two share a server. A
binary named with --split is run as one job per backend: its tests are listed, grouped by the
first segment of their names (`sqlite::mutex::…` → `sqlite`) and each group runs on its own.
The doc tests (`cargo test ARGS --doc`) are one more job, and so is each --job: a shell command
run from the repository root beside the test binaries (the package check, the Python suite),
whose exit status is its result. A --side command is such a job that takes no place among the
N: it starts with the first jobs, niced, and uses the cores the waiting tests leave idle (the
compile-only checks: lints of other feature sets, the package check).

Every job's output goes to target/test-logs/JOB.log; a failed job's failures are printed. The
end is a table of every job: wall time, and passed / failed / ignored as the binary reported.
The exit status is non-zero when any job failed, timed out, or reported no result.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

# pytest's last line: "316 passed, 2 skipped in 120.50s" (with -q), or framed by '='.
PYTEST_RESULT = re.compile(r"^=*\s*((?:\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed|deselected)(?:, )?)+) in [\d.]+s", re.M)
RESULT = re.compile(
    r"test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured"
)
KIND = re.compile(r"^\[[^\]]*\] ")


@dataclass
class Job:
    name: str
    argv: List[str]
    cwd: Path
    log: Path
    started: float = 0.0
    seconds: float = 0.0
    process: Optional[subprocess.Popen] = None
    status: str = "pending"
    counts: List[int] = field(default_factory=lambda: [0, 0, 0])
    # A command of the caller's (--job): its exit status is its result, no result line needed.
    command: bool = False
    # Run beside the N jobs, not in their places (--side).
    side: bool = False


def build(cargo_args: List[str]) -> List[dict]:
    """`cargo test ARGS --no-run`: the test executables, as cargo's JSON messages name them."""
    command = ["cargo", "test", *cargo_args, "--no-run", "--message-format", "json-render-diagnostics"]
    print("+ " + " ".join(command), flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"run_tests: the build failed (exit {done.returncode})")
    artifacts = []
    for line in done.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable") and message["profile"]["test"]:
            artifacts.append(message)
    return artifacts


def binary_name(artifact: dict) -> str:
    """The integration test's own name; `NAME-unit` for a crate's unit tests."""
    target = artifact["target"]
    if "test" in target["kind"]:
        return target["name"]
    if "bin" in target["kind"]:
        return f"{target['name']}-bin-unit"
    return f"{target['name']}-unit"


def listed(executable: str, cwd: Path) -> List[str]:
    out = subprocess.run([executable, "--list", "--format", "terse"], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"run_tests: {executable} --list failed: {out.stderr.strip()}")
    # libtest-mimic puts a trial's kind first (`[unsupported] etcd::…: test`); filters see the name.
    return [KIND.sub("", line.rsplit(": ", 1)[0]) for line in out.stdout.splitlines() if line.endswith(": test")]


def split_jobs(name: str, executable: str, cwd: Path, logs: Path) -> List[Job]:
    """One job per first name segment, each a substring filter that matches its group only."""
    names = listed(executable, cwd)
    groups: Dict[str, List[str]] = {}
    for test in names:
        groups.setdefault(test.split("::", 1)[0], []).append(test)
    jobs = []
    for group, members in sorted(groups.items()):
        pattern = f"{group}::"
        # libtest filters by substring: the group's filter must not reach into another group.
        reached = [test for test in names if pattern in test]
        if sorted(reached) != sorted(members):
            return [Job(name, [executable], cwd, logs / f"{name}.log")]
        jobs.append(Job(f"{name}[{group}]", [executable, pattern], cwd, logs / f"{name}[{group}].log"))
    return jobs


def start(job: Job) -> None:
    job.log.parent.mkdir(parents=True, exist_ok=True)
    out = open(job.log, "wb")
    job.started = time.monotonic()
    # A session of its own, so a timeout stops the job's servers and children with it.
    job.process = subprocess.Popen(job.argv, cwd=job.cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    job.status = "running"


def stop(job: Job) -> None:
    assert job.process is not None
    try:
        os.killpg(job.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.process.wait()


def finish(job: Job, code: int) -> None:
    job.seconds = time.monotonic() - job.started
    text = job.log.read_text(errors="replace")
    results = RESULT.findall(text)
    for passed, failed, ignored, _measured in results:
        job.counts[0] += int(passed)
        job.counts[1] += int(failed)
        job.counts[2] += int(ignored)
    for summary in PYTEST_RESULT.findall(text):
        for count, word in re.findall(r"(\d+) (\w+)", summary):
            slot = {"passed": 0, "failed": 1, "error": 1, "errors": 1, "skipped": 2}.get(word)
            if slot is not None:
                job.counts[slot] += int(count)
    if job.status == "timed out":
        pass
    elif code != 0:
        job.status = "FAILED"
    elif not results and not job.command:
        job.status = "FAILED"  # a binary that exits 0 without a result line did not run its tests
    else:
        job.status = "ok"
    line = f"{job.status:>9}  {job.name}  {job.seconds:.0f} s  ({job.counts[0]} passed, {job.counts[1]} failed, {job.counts[2]} ignored)"
    print(line, flush=True)
    if job.status != "ok":
        # libtest prints "failures:" twice: each failure's output, then the list of names.
        start_at = text.find("\nfailures:\n")
        shown = text[start_at:] if start_at >= 0 else "\n".join(text.splitlines()[-150:])
        print(f"---- {job.log} ----\n{shown}\n---- end of {job.name} ----", flush=True)


def digest(job: Job) -> str:
    """The first lines of each failure of a failed job, printed again after the table: a CI
    log that keeps only its head and tail still says why each test failed."""
    text = job.log.read_text(errors="replace")
    blocks = re.findall(r"^---- (\S+) (?:stdout )?----\n(.*?)(?=^---- |^failures:$|\Z)", text, re.S | re.M)
    lines = [f"why {job.name} failed ({job.status}):"]
    for name, body in blocks[:8]:
        kept = [line for line in body.splitlines() if line.strip()][:6]
        lines.append(f"  {name}:")
        lines.extend(f"    {line[:300]}" for line in kept)
    if not blocks:
        lines.extend(f"    {line[:300]}" for line in text.splitlines()[-12:])
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("DLOCK_TEST_JOBS", "3")))
    parser.add_argument("--split", action="append", default=[], help="run this binary as one job per backend")
    parser.add_argument("--first", action="append", default=[], help="start jobs whose name begins so first")
    parser.add_argument("--job", action="append", default=[], metavar="NAME=COMMAND", help="a shell command to run beside the tests")
    parser.add_argument("--side", action="append", default=[], metavar="NAME=COMMAND", help="a shell command run niced beside the N jobs")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds one job may take")
    parser.add_argument("cargo_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    cargo_args = [a for a in options.cargo_args if a != "--"]

    root = Path.cwd()
    logs = root / "target" / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.glob("*.log"):
        old.unlink()
    built = time.monotonic()
    jobs: List[Job] = []
    for artifact in build(cargo_args):
        name = binary_name(artifact)
        cwd = Path(artifact["manifest_path"]).parent
        if name in options.split:
            jobs.extend(split_jobs(name, artifact["executable"], cwd, logs))
        else:
            jobs.append(Job(name, [artifact["executable"]], cwd, logs / f"{name}.log"))
    binaries = len(jobs)
    jobs.append(Job("doc-tests", ["cargo", "test", *cargo_args, "--doc"], root, logs / "doc-tests.log"))
    for spec in options.job:
        name, _, command = spec.partition("=")
        jobs.append(Job(name, ["bash", "-c", command], root, logs / f"{name}.log", command=True))
    for spec in options.side:
        name, _, command = spec.partition("=")
        argv = ["nice", "-n", "10", "bash", "-c", command]
        jobs.append(Job(name, argv, root, logs / f"{name}.log", command=True, side=True))
    print(f"built the test binaries in {time.monotonic() - built:.0f} s; running {len(jobs)} jobs, {options.jobs} at a time", flush=True)

    def rank(job: Job) -> int:
        for index, prefix in enumerate(options.first):
            if job.name.startswith(prefix):
                return index
        return len(options.first)

    pending = sorted((job for job in jobs if not job.side), key=rank)
    running: List[Job] = []
    began = time.monotonic()
    sides = [job for job in jobs if job.side]
    while pending or running or sides:
        while pending and sum(not job.side for job in running) < options.jobs:
            job = pending.pop(0)
            start(job)
            running.append(job)
        # After the first jobs: a first job that builds takes cargo's lock on target/ first.
        while sides:
            job = sides.pop(0)
            start(job)
            running.append(job)
        time.sleep(0.2)
        for job in list(running):
            assert job.process is not None
            code = job.process.poll()
            if code is None and time.monotonic() - job.started > options.timeout:
                job.status = "timed out"
                stop(job)
                code = -1
            if code is not None:
                running.remove(job)
                finish(job, code)

    wall = time.monotonic() - began
    print(f"\n{'job':<40} {'seconds':>8} {'passed':>7} {'failed':>7} {'ignored':>8}  status")
    for job in sorted(jobs, key=lambda j: -j.seconds):
        print(f"{job.name:<40} {job.seconds:>8.0f} {job.counts[0]:>7} {job.counts[1]:>7} {job.counts[2]:>8}  {job.status}")
    total = [sum(job.counts[i] for job in jobs) for i in range(3)]
    busy = sum(job.seconds for job in jobs)
    print(f"{'all (' + str(len(jobs)) + ' jobs)':<40} {wall:>8.0f} {total[0]:>7} {total[1]:>7} {total[2]:>8}  ({busy:.0f} s of job time in {wall:.0f} s)")
    bad = [job.name for job in jobs if job.status != "ok"]
    for job in jobs:
        if job.status != "ok":
            print(digest(job), flush=True)
    if bad:
        print(f"run_tests: {len(bad)} job(s) failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
