#!/usr/bin/env bash
# The renewal soak: at least 100,000 acquisitions per backend by several contending worker
# processes (release build), every hold and write checked by the safety checker with its strict
# rules. The run is cut into segments of 2,000 acquisitions ($SOAK_SEGMENT), each on a fresh
# lock taken as a mutex, a read-write lock or a semaphore of two in turn, under watchdog holds
# (a 1 s lease): most short, one round in a hundred held for two leases, three or half a lease,
# so renewals happen mid-hold. Each segment ends with a fault the backend offers, in turn (a
# holder killed or frozen, connections reset, the server restarted), judged by its trial's
# rules, the lag rule among them. Not run by CI (CI runs the short `<backend>::soak` trials of
# the safety suite on memory, SQLite and Redis, and the soak's canary, a keeper that stops
# renewing mid-hold, on memory and SQLite).
#
#   scripts/soak.sh                      # every backend, 100,000 acquisitions each
#   scripts/soak.sh redis postgres       # some backends
#   SOAK_ACQUISITIONS=200000 SOAK_WORKERS=6 scripts/soak.sh sqlite
#   SOAK_PROFILE=debug scripts/soak.sh memory   # the test profile's build (no release build)
#
# Each backend's row (backend, acquisitions, holds past their lease, faults, unsignalled
# overlaps, fence regressions, stale writes refused, lost signals, their lag p99 / max in ms,
# violations, wall time) is appended to target/soak-table.md (or $SOAK_TABLE) and printed; the
# rows go into RELIABILITY.md's soak table. A backend whose run finds a violation fails the
# script (after the other backends ran). Runs under `nice`: the machine may be shared.
set -euo pipefail

cd "$(dirname "$0")/.."

backends=("$@")
if [ ${#backends[@]} -eq 0 ]; then
    backends=(memory sqlite redis redis-sentinel redis-cluster redlock postgres postgres-session
        mariadb mariadb-session etcd etcd-cluster zookeeper zookeeper-ensemble file nats
        nats-cluster)
fi
acquisitions=${SOAK_ACQUISITIONS:-100000}
segment=${SOAK_SEGMENT:-2000}
profile=()
if [ "${SOAK_PROFILE:-release}" = release ]; then
    profile=(--release)
fi
workers=${SOAK_WORKERS:-4}
table=${SOAK_TABLE:-target/soak-table.md}
mkdir -p "$(dirname "$table")"

echo "building the safety suite (${SOAK_PROFILE:-release})…" >&2
# With the runs' DLOCK_TEST_REQUIRE: the build script reads it, and a build without it would
# be rebuilt by the first run.
DLOCK_TEST_REQUIRE=all nice -n 10 cargo test "${profile[@]}" -p dlock-rs --all-features --test safety --no-run

failed=()
for backend in "${backends[@]}"; do
    echo "soak: $backend, $acquisitions acquisitions, $workers workers" >&2
    # etcd members run without flushing their log (--unsafe-no-fsync): the soak's faults
    # include no crash of the whole machine, and a flush per Raft entry would measure this
    # machine's disk, not dlock.
    if ! DLOCK_TEST_REQUIRE=all DLOCK_SOAK="$acquisitions" DLOCK_SOAK_WORKERS="$workers" \
        DLOCK_SOAK_SEGMENT="$segment" \
        DLOCK_TEST_ETCD_UNSAFE_NO_FSYNC=1 \
        DLOCK_SOAK_TABLE="$table" \
        nice -n 10 cargo test "${profile[@]}" -p dlock-rs --all-features --test safety -- \
        --exact "$backend::soak"; then
        failed+=("$backend")
    fi
done

echo "| backend | acquisitions | held past their lease | faults | unsignalled overlaps | fence regressions | stale writes refused | lost signals | lag p99 / max (ms) | violations | wall time |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
cat "$table"
if [ ${#failed[@]} -gt 0 ]; then
    echo "soak failed on: ${failed[*]}" >&2
    exit 1
fi
