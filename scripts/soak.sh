#!/usr/bin/env bash
# The soak: at least 100,000 acquisitions of one lock per backend, by several contending worker
# processes (release build), every hold and write checked by the safety checker with its strict
# rules. Not run by CI (CI runs the short `<backend>::soak` trials of the safety suite).
#
#   scripts/soak.sh                      # every backend, 100,000 acquisitions each
#   scripts/soak.sh redis postgres       # some backends
#   SOAK_ACQUISITIONS=200000 SOAK_WORKERS=6 scripts/soak.sh sqlite
#
# Each backend's row (backend, acquisitions, overlaps, fence regressions, lost-signal lag p99 /
# max in ms, wall time) is appended to target/soak-table.md (or $SOAK_TABLE) and printed; the
# rows go into RELIABILITY.md's soak table. A backend whose run finds a violation fails the
# script (after the other backends ran). Runs under `nice`: the machine may be shared.
set -euo pipefail

cd "$(dirname "$0")/.."

backends=("$@")
if [ ${#backends[@]} -eq 0 ]; then
    backends=(memory sqlite redis redis-sentinel redis-cluster redlock postgres postgres-session
        mariadb mariadb-session etcd etcd-cluster zookeeper zookeeper-ensemble)
fi
acquisitions=${SOAK_ACQUISITIONS:-100000}
workers=${SOAK_WORKERS:-4}
table=${SOAK_TABLE:-target/soak-table.md}
mkdir -p "$(dirname "$table")"

echo "building the safety suite (release)…" >&2
nice -n 10 cargo test --release -p dlock-rs --all-features --test safety --no-run

failed=()
for backend in "${backends[@]}"; do
    echo "soak: $backend, $acquisitions acquisitions, $workers workers" >&2
    # etcd members run without flushing their log (--unsafe-no-fsync): the soak injects no
    # crash, and a flush per Raft entry would measure this machine's disk, not dlock.
    if ! DLOCK_TEST_REQUIRE=all DLOCK_SOAK="$acquisitions" DLOCK_SOAK_WORKERS="$workers" \
        DLOCK_TEST_ETCD_UNSAFE_NO_FSYNC=1 \
        DLOCK_SOAK_TABLE="$table" \
        nice -n 10 cargo test --release -p dlock-rs --all-features --test safety -- \
        --exact "$backend::soak"; then
        failed+=("$backend")
    fi
done

echo "| backend | acquisitions | overlaps | fence regressions | lost-signal lag p99 / max (ms) | wall time |"
echo "|---|---|---|---|---|---|"
cat "$table"
if [ ${#failed[@]} -gt 0 ]; then
    echo "soak failed on: ${failed[*]}" >&2
    exit 1
fi
