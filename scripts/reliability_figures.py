#!/usr/bin/env python3
"""Regenerates RELIABILITY.md's "Figures of the last full run" from the current code.

Runs the whole safety suite (every backend, every fault, every canary; DLOCK_SAFETY=full,
DLOCK_TEST_REQUIRE=all), with DLOCK_SAFETY_REPORT collecting one JSON object a trial, then
rewrites the section from its heading to the end of the file with the tables made from that
report. `--from FILE` renders an earlier report instead of running the suite (FILE's own
date and wall time are then unknown and said so). Exits non-zero when the suite failed; the
figures are written either way, with the failures listed.

    scripts/reliability_figures.py            # about 30 minutes on a 2-core machine
    scripts/reliability_figures.py --from target/safety-figures.jsonl
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "RELIABILITY.md"
HEADING = "## Figures of the last full run"
COMMAND = (
    "DLOCK_TEST_REQUIRE=all DLOCK_SAFETY=full cargo test -p dlock-rs --all-features "
    "--test safety -- --include-ignored"
)

READING = """How to read the columns:

- *overlaps*: two holds at once that exclude each other. *Unsignalled*: the earlier holder had
  not been told by the later's `BEGIN` (+50 ms), a frozen holder aside; violations outside a
  data-losing fault. *Excused*: unsignalled during a data-losing fault (Redis, Redlock kill or
  restart), which the fence must cover, or inside the documented window of a session lock
  whose connection alone was ended (told within its check interval). *After a lost signal*:
  told in time (a frozen holder once continued, a cut-off one).
- *stale writes refused*: writes by a holder whose successor had already written; each came
  from a holder already told. *Unsafe writes accepted* is the same count for the unfenced
  canary: what fencing prevents.
- *lost signals, max lag*: holds whose guard fired, and the largest lag from the moment the
  hold became doubtful, frozen holders aside.
- *struck by the fault*: the holds open when a store or network fault began, how many were
  told, and when the last was told after the fault began.
- *frozen holder*: when the guard of the SIGSTOPped holder fired once it ran again, and how
  many holds others completed meanwhile (0 for session locks: nobody else gets in).
- *recovery*: from the end of the fault (the kill, for SIGKILL) to the next hold.
- *result*: `pass` or `fail` for a trial; `flagged` (as it must be) or `not flagged` for a
  canary."""


def run_suite(report: Path) -> tuple[int, float, str]:
    report.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        DLOCK_TEST_REQUIRE="all",
        DLOCK_SAFETY="full",
        DLOCK_SAFETY_REPORT=str(report),
    )
    args = ["cargo", "test", "-p", "dlock-rs", "--all-features", "--test", "safety", "--",
            "--include-ignored"]
    started = time.monotonic()
    done = subprocess.run(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    elapsed = time.monotonic() - started
    sys.stdout.write(done.stdout[-4000:])
    summary = next((line for line in reversed(done.stdout.splitlines())
                    if line.startswith("test result:")), "no test result")
    return done.returncode, elapsed, summary


def dash(value) -> str:
    return "-" if value is None else str(value)


def mutex_row(t: dict) -> str:
    f = t["figures"]
    a, o, s = f["acquisitions"], f["overlaps"], f["struck"]
    frozen = f["frozen_holder"]
    if frozen is None:
        frozen_text = "-"
    elif frozen["told_after_ms"] is None:
        frozen_text = f"NOT told ({frozen['holds_meanwhile']} holds meanwhile)"
    else:
        frozen_text = (f"told {frozen['told_after_ms']} ms after SIGCONT "
                       f"({frozen['holds_meanwhile']} holds meanwhile)")
    struck = f"{s['told']}/{s['open']}"
    if s["last_told_after_ms"] is not None:
        struck += f", {s['last_told_after_ms']} ms"
    name = t["fault_name"]
    return (f"| {t['backend']} | {name} | {a['attempted']} attempted / {a['ok']} ok / "
            f"{a['timed_out']} timed out / {a['indeterminate']} indeterminate | "
            f"{o['unsignalled']} / {o['during_fault']} / {o['after_lost_signal']} | "
            f"{f['fence_regressions']} | {f['stale_writes_refused']} | "
            f"{f['unsafe_writes_accepted']} | {f['lost_signals']}, {dash(f['max_lag_ms'])} | "
            f"{struck} | {frozen_text} | {dash(f['recovery_ms'])} | {t['result']} |")


def trial_label(t: dict) -> str:
    """The trial's own name (its fault, or the canary), as the suite lists it."""
    return t["trial"].split("::")[-1].removeprefix("canary_").replace("_", " ")


def render(trials: list[dict], header: str) -> str:
    for t in trials:
        t["fault_name"] = trial_label(t)
    order = []
    for t in trials:
        if t["backend"] not in order:
            order.append(t["backend"])
    mutexes = [t for t in trials if t["primitive"] == "mutex"]
    others = defaultdict(list)
    for t in trials:
        if t["primitive"] != "mutex":
            others[(t["backend"], t["primitive"])].append(t)
    lines = [HEADING, "", header, "", READING, "", "Mutexes (and the canaries):", "",
             "| backend | trial | acquisitions: attempted / ok / timed out / indeterminate | "
             "overlaps: unsignalled / excused / after a lost signal | fence regressions | "
             "stale writes refused | unsafe writes accepted | lost signals, max lag ms | "
             "struck by the fault: told / open, last signal after its start | frozen holder | "
             "recovery ms | result |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for backend in order:
        lines += [mutex_row(t) for t in mutexes if t["backend"] == backend]
    lines += ["", "Read-write locks, semaphores (two permits, three workers) and multi-locks, "
              "per backend:", "",
              "| backend | primitive | trials (faults) | overlaps: unsignalled / after a lost "
              "signal | fence regressions | stale writes refused | lost signals, max lag ms | "
              "result |",
              "|---|---|---|---|---|---|---|---|"]
    for backend in order:
        for prim in ("rwlock", "semaphore", "multi-lock"):
            group = others.get((backend, prim))
            if not group:
                continue
            figs = [t["figures"] for t in group]
            lags = [f["max_lag_ms"] for f in figs if f["max_lag_ms"] is not None]
            failed = [t["fault_name"] for t in group if t["result"] != "pass"]
            result = "pass" if not failed else "fail: " + ", ".join(failed)
            lines.append(
                f"| {backend} | {prim} | {len(group)} ({', '.join(t['fault_name'] for t in group)}) | "
                f"{sum(f['overlaps']['unsignalled'] for f in figs)} / "
                f"{sum(f['overlaps']['after_lost_signal'] for f in figs)} | "
                f"{sum(f['fence_regressions'] for f in figs)} | "
                f"{sum(f['stale_writes_refused'] for f in figs)} | "
                f"{sum(f['lost_signals'] for f in figs)}, {dash(max(lags) if lags else None)} | "
                f"{result} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path,
                        help="render this report instead of running the suite")
    args = parser.parse_args()
    if args.source:
        report, status = args.source, 0
        when = f"from {args.source.name} (an earlier run; its date and wall time not recorded)"
        summary = ""
    else:
        report = ROOT / "target" / "safety-figures.jsonl"
        report.parent.mkdir(exist_ok=True)
        status, elapsed, summary = run_suite(report)
        today = datetime.date.today().isoformat()
        when = (f"{today}, debug build, {os.cpu_count()} cores, {elapsed:.0f} s; "
                f"libtest: `{summary.removeprefix('test result: ')}`")
    trials = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    bad = [t for t in trials if t["result"] in ("fail", "not flagged")]
    failures = "none." if not bad else "; ".join(
        f"`{t['trial']}` ({t['result']}: {'; '.join(t['violations'])[:300]})" for t in bad)
    header = (f"Made by `scripts/reliability_figures.py`, which runs `{COMMAND}` and renders "
              f"its report: {when}. {len(trials)} trials and canaries reported. Failures: "
              f"{failures} Every trial: three worker processes, one lock, a 1 s lease. Holder "
              "faults use a fixed TTL and 40 ms holds; store and network faults use the watchdog "
              "(a 1 s lease renewed every third) and 1.2 s holds, struck while a lock is held. "
              "ZooKeeper's session timeout is 3 s, and a frozen ZooKeeper holder is stopped for "
              "6 s (3 s elsewhere).")
    text = DOC.read_text()
    at = text.find(HEADING)
    if at < 0:
        print(f"{DOC}: no '{HEADING}' section", file=sys.stderr)
        return 2
    DOC.write_text(text[:at] + render(trials, header))
    print(f"wrote {len(trials)} trials into {DOC.relative_to(ROOT)}")
    return 1 if status != 0 or bad else 0


if __name__ == "__main__":
    sys.exit(main())
