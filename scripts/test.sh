#!/usr/bin/env bash
# Installs what dlock's tests need and runs them all: formatting, lints, unit, conformance
# (every enabled backend on real servers started by the test kit), CLI and doc tests.
#
# Idempotent. As root it installs missing Debian packages; otherwise it says what is missing
# and stops. Servers are never started here: the test kit starts its own, as child processes
# on free loopback ports in temp dirs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use: the real servers (PostgreSQL, MariaDB and ZooKeeper too), and setpriv (util-linux) for the
# file-permission test when running as root, and script (bsdutils) for the terminal test.
# etcd: the server and etcdctl (the tests drive it), and protoc, which the etcd-client crate's
# build script needs (`--all-features` builds the etcd backend).
packages=(redis-server postgresql mariadb-server zookeeper util-linux bsdutils etcd-server etcd-client protobuf-compiler)

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
        echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (https://rustup.rs), then run this script again" >&2
    exit 1
fi

# Every server the suite knows must be found: a missing one is a failure, not a skip.
export DLOCK_TEST_REQUIRE="${DLOCK_TEST_REQUIRE:-all}"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
cargo test --workspace --all-features
