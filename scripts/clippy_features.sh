#!/usr/bin/env bash
# Lints the library as users build it with some backends only (the default is SQLite alone):
# each such build must be free of warnings too (code shared by backends, used in part). Each
# feature of `full` alone (crates/dlock/Cargo.toml lists every backend there, so a new backend
# is linted alone without a line here), plus the default and no feature at all. The whole
# workspace with every feature is linted by scripts/test.sh's clippy stage; this runs beside
# the tests there (compile-only work, on the cores the waiting tests leave idle).
set -euo pipefail
cd "$(dirname "$0")/.."
# A target dir of its own: the test run's jobs that build (the Python package, the doc tests)
# would otherwise wait on cargo's lock of target/ for as long as these lints take.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/clippy-features"

features=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
package = next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "dlock-rs")
print(" ".join(package["features"]["full"]))')
cargo clippy -p dlock-rs --lib -- -D warnings
cargo clippy -p dlock-rs --lib --no-default-features -- -D warnings
for feature in $features; do
    cargo clippy -p dlock-rs --lib --no-default-features --features "$feature" -- -D warnings
done
echo "clippy_features: the default, none and each of: $features"
