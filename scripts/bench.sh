#!/usr/bin/env bash
# The full benchmark run behind BENCHMARKS.md: builds dlock and the Rust peers, installs the
# Python peers from PyPI into a venv, starts every store from the test kit, runs `dlock bench`
# for dlock and each peer on the same server instances, writes one JSON report per run into
# bench/results/, and regenerates BENCHMARKS.md and bench/charts/ from them.
#
#   scripts/bench.sh                     # everything (about 30 minutes on 2 cores)
#   BENCH_STORES="redis zookeeper" scripts/bench.sh      # some stores only (the reports of
#                                                        # the others are kept: BENCHMARKS.md
#                                                        # then tells the two runs apart)
#   BENCH_ROUNDS=1 BENCH_DURATION=1s scripts/bench.sh    # shorter runs while developing
#   BENCH_FIRST_ROUND=2 scripts/bench.sh                 # continue a run stopped in round 2
#   BENCH_WATCHDOG=no scripts/bench.sh                   # without the watchdog scenario (on a
#                                                        # machine busy with other work its
#                                                        # 10 000 leases may run out, which
#                                                        # ends the run)
#   BENCH_PROFILE=profiling scripts/bench.sh             # dlock built with symbols and line
#                                                        # tables, for `perf record` (the
#                                                        # release profile ships stripped)
#
# Rounds: every library and scenario runs once per round, all in turn, BENCH_ROUNDS times (3),
# so a change in the machine's load (other builds) falls on all of them alike; the report gives
# min / median / max over the rounds.
#
# Placement: the servers are pinned to CPU $SERVER_CPU, single-client scenarios (uncontended,
# floor, many locks, watchdog) to CPU $CLIENT_CPU; the hand-off's worker processes are not pinned
# (four processes spinning for 1 ms holds on one CPU would measure the scheduler). Each report
# records the placement it ran with. Run it on an otherwise idle machine: the reports record
# the load average, and BENCHMARKS.md shows its range.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET="${CARGO_TARGET_DIR:-target}"
# The Cargo profile dlock and the servers' launcher are built with (see the workspace
# Cargo.toml: `release` is stripped, `profiling` is release with debug info).
PROFILE="${BENCH_PROFILE:-release}"
ROUNDS="${BENCH_ROUNDS:-3}"
# BENCH_FIRST_ROUND=N continues a run that stopped in round N: rounds N and later run again,
# the reports of the rounds before are kept.
FIRST_ROUND="${BENCH_FIRST_ROUND:-1}"
# Runs per invocation (per round).
REPEAT="${BENCH_REPEAT:-1}"
DURATION="${BENCH_DURATION:-3s}"
STORES="${BENCH_STORES:-memory sqlite file redis redis-cluster redlock zookeeper postgres mysql etcd nats}"
WATCHDOG=",watchdog"
[ "${BENCH_WATCHDOG:-yes}" = no ] && WATCHDOG=""
# BENCH_MANY=no leaves out the many-locks scenario (64 tasks can time out waiting for a pool
# connection on a loaded machine).
MANY=",many"
[ "${BENCH_MANY:-yes}" = no ] && MANY=""
CLIENT_CPU="${CLIENT_CPU:-0}"
SERVER_CPU="${SERVER_CPU:-1}"
RESULTS=bench/results
# Peers come from their registries at these versions (the ones measured in BENCHMARKS.md).
PY_PEERS=(redis==8.1.0 kazoo==2.11.0)
# Redis also measures dlock's Python package against redis-py (sync and asyncio); it is built
# from python/ into the same venv the way a user installs it.

for tool in taskset python3.11 cargo; do
    command -v "$tool" >/dev/null || { echo "bench.sh: $tool not found" >&2; exit 1; }
done

echo "== build ($PROFILE)"
# bench-servers lives in the test kit (which is not published), so dlock-bench can ship.
cargo build --profile "$PROFILE" -q -p dlock-cli -p dlock-testkit --bin dlock --bin bench-servers
DLOCK="$TARGET/$PROFILE/dlock"
echo "   $DLOCK: $(stat -c %s "$DLOCK") bytes"
# The Rust peers are Redis clients only.
case " $STORES " in
*" redis "*) cargo build --release -q --manifest-path bench/peers/Cargo.toml --target-dir "$TARGET" ;;
esac
RUST_PEERS="$TARGET/release/dlock-bench-peers"

echo "== Python peers (venv, PyPI)"
VENV="$TARGET/bench-venv"
[ -x "$VENV/bin/python" ] || python3.11 -m venv "$VENV"
"$VENV/bin/pip" install -q "${PY_PEERS[@]}"
PY="$VENV/bin/python"
case " $STORES " in
*" redis "*)
    echo "== dlock's Python package (pip install ./python: maturin, release build)"
    nice -n 10 "$VENV/bin/pip" install -q --force-reinstall --no-deps ./python ;;
esac

mkdir -p "$RESULTS"
if [ "$FIRST_ROUND" -gt 1 ]; then
    # Continuing a run: the reports of its earlier rounds stay, this round's and later go.
    for round in $(seq "$FIRST_ROUND" "$ROUNDS"); do rm -f "$RESULTS"/*.r"$round".json; done
elif [ -z "${BENCH_STORES:-}" ]; then
    rm -f "$RESULTS"/*.json
else
    # Only the reports of the stores run now are replaced; the report's `backend` names them.
    for store in $STORES; do
        backend="$store"
        [ "$store" = zookeeper ] && backend=zk
        for file in "$RESULTS"/*.json; do
            [ -e "$file" ] || continue
            if grep -q "\"backend\": \"$backend\"" "$file"; then rm -f "$file"; fi
        done
    done
fi

# The stores that need a server, started by the test kit and kept up until its stdin closes.
servers=()
for store in $STORES; do
    case "$store" in memory | sqlite | file) ;; *) servers+=("$store") ;; esac
done
declare -A URL PIDS
SQLITE_DIR="$(mktemp -d)"
URL[memory]="memory://"
URL[sqlite]="sqlite://$SQLITE_DIR/locks.db"
# The file store's lock files beside the SQLite database, on the same disk.
mkdir "$SQLITE_DIR/files"
URL[file]="file://$SQLITE_DIR/files"
if [ ${#servers[@]} -gt 0 ]; then
    coproc SERVERS { "$TARGET/$PROFILE/bench-servers" "${servers[@]}"; }
    while read -r name url pids <&"${SERVERS[0]}"; do
        [ "$name" = ready ] && break
        URL[$name]="$url"
        PIDS[$name]="${pids// /,}"
        for pid in $pids; do
            # -a: every thread, and what the server forks later (PostgreSQL backends) inherits it.
            taskset -a -p -c "$SERVER_CPU" "$pid" >/dev/null
            for child in $(pgrep -P "$pid" || true); do taskset -a -p -c "$SERVER_CPU" "$child" >/dev/null; done
        done
        echo "   $name: $url (pinned to CPU $SERVER_CPU)"
    done
fi
cleanup() {
    [ -n "${SERVERS_PID:-}" ] && { exec {SERVERS[1]}>&-; wait "$SERVERS_PID" || true; }
    rm -rf "$SQLITE_DIR"
}
trap cleanup EXIT

# run FILE STORE PINNED [dlock bench args…]: one `dlock bench` invocation, one JSON report.
run() {
    local file="$1" store="$2" pinned="$3"
    shift 3
    local url="${URL[$store]:-}"
    if [ -z "$url" ]; then
        echo "   (no $store server: $file skipped)"
        return
    fi
    local pin=()
    [ "$pinned" = pinned ] && pin=(taskset -c "$CLIENT_CPU")
    local server=()
    case "$store" in memory | sqlite | file) ;; *) server=(--server-cpus "$SERVER_CPU" --server-pids "${PIDS[$store]}") ;; esac
    echo "== round $round: $file (load $(cut -d' ' -f1-3 /proc/loadavg))"
    "${pin[@]}" "$DLOCK" --url "$url" bench --repeat "$REPEAT" --duration "$DURATION" \
        "${server[@]}" --json "$RESULTS/$file.r$round.json" "$@"
}

# peer FILE STORE LABEL COUNTED_COMMANDS COMMAND [args…]: a peer's uncontended (pinned) and
# hand-off runs; COUNTED_COMMANDS are the Redis commands it sends itself besides scripts.
peer() {
    local file="$1" store="$2" label="$3" counted="$4" command="$5"
    shift 5
    local counting=()
    [ -n "$counted" ] && counting=(--count-commands "$counted")
    run "$file-uncontended" "$store" pinned --scenario uncontended --library "$label" --peer "$command" "$@"
    run "$file-handoff" "$store" unpinned --scenario handoff --library "$label" --peer "$command" "${counting[@]}" "$@"
}

for round in $(seq "$FIRST_ROUND" "$ROUNDS"); do
for store in $STORES; do
    case "$store" in
    memory)
        run memory memory pinned --scenario uncontended$MANY$WATCHDOG ;;
    sqlite)
        run sqlite sqlite pinned --scenario uncontended$MANY$WATCHDOG
        run sqlite-handoff sqlite unpinned --scenario handoff ;;
    redis)
        run redis redis pinned --scenario uncontended$MANY$WATCHDOG
        run redis-handoff redis unpinned --scenario handoff
        # The blocking facade (which the Python package uses) against the blocking floor.
        run redis-blocking redis pinned --scenario blocking --library "dlock (blocking)"
        # dlock's Python package beside redis-py, mode by mode, so the ratios of a round
        # compare runs minutes apart at most.
        for mode in sync asyncio; do
            peer "dlock-py-$mode" redis "dlock (Python) $mode" "" \
                "$PY scripts/peers/dlock_py.py $mode"
            for sleep in 0.1 0.001; do
                peer "redis-py-$mode-$sleep" redis "redis-py $mode, sleep=$sleep" set \
                    "$PY scripts/peers/redis_py.py $mode $sleep"
            done
        done
        peer rslock redis "rslock 0.10 (tokio-comp)" set "$RUST_PEERS rslock"
        peer distributed-lock redis "distributed-lock-redis 0.2" set "$RUST_PEERS distributed-lock" ;;
    redis-cluster)
        # Three primaries with a replica each, all on the server CPU like the one Redis: the
        # many-locks rows compare the cluster's routing with one server's on the same CPU,
        # not a cluster's scaling over machines.
        run redis-cluster redis-cluster pinned --scenario uncontended$MANY
        run redis-cluster-handoff redis-cluster unpinned --scenario handoff ;;
    redlock)
        run redlock redlock pinned --scenario uncontended
        run redlock-handoff redlock unpinned --scenario handoff ;;
    zookeeper)
        run zookeeper zookeeper pinned --scenario "uncontended$MANY" --pairs 500
        run zookeeper-handoff zookeeper unpinned --scenario handoff
        peer kazoo zookeeper "kazoo 2.11" "" "$PY scripts/peers/kazoo_lock.py" --pairs 500 ;;
    postgres | mysql | etcd)
        run "$store" "$store" pinned --scenario "uncontended$MANY" --pairs 500
        run "$store-handoff" "$store" unpinned --scenario handoff ;;
    # Uncontended beside the floor only: each grant flushes its fence counter to disk (file),
    # or is replicated through JetStream (nats).
    file | nats)
        run "$store" "$store" pinned --scenario uncontended --pairs 500 ;;
    *) echo "unknown store $store" >&2; exit 1 ;;
    esac
    # The watchdog scenario on the other stores (issue 36), in a run of its own, so a store
    # that cannot acquire or keep its leases shows it in the log and its row, without ending
    # the run; and 100,000 watched locks where they must fit in 100 MB, in the first round
    # only (acquiring and releasing them one by one takes a minute or two per store).
    if [ -n "$WATCHDOG" ]; then
        case "$store" in
        memory | sqlite | redis) ;;
        *) run "$store-watchdog" "$store" pinned --scenario watchdog ||
            echo "== $store: the watchdog scenario failed" >&2 ;;
        esac
        case "$store" in
        redis | sqlite | postgres)
            if [ "$round" = 1 ]; then
                run "$store-watchdog-100k" "$store" pinned --scenario watchdog --held 100000 \
                    --library "dlock (100 000 held)" ||
                    echo "== $store: the watchdog scenario at 100,000 failed" >&2
            fi ;;
        esac
    fi
done
done

echo "== report"
"$DLOCK" bench --report "$RESULTS" --out BENCHMARKS.md
