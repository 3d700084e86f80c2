#!/usr/bin/env bash
# Builds dlock's Python package (distribution `dlock-rs`, import `dlock`) as one abi3 wheel
# (CPython 3.9 and later, any of them) with maturin. Installing that wheel needs no Rust
# toolchain:
#
#   scripts/python_wheel.sh                  # release build, what users install: target/wheels/
#   scripts/python_wheel.sh --profile dev    # the test run's build, into target/wheels/dev/: it
#                                            # reuses the dependencies `cargo test` compiled
#
# maturin itself comes from PyPI into a tool virtualenv under target/ (Debian's python3 refuses
# `pip install` outside one). Prints the wheel's path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile="$2"; shift 2 ;;
        --release) profile=release; shift ;;
        *) echo "usage: $0 [--profile release|dev]" >&2; exit 2 ;;
    esac
done
if ! command -v cargo >/dev/null; then
    echo "cargo not found: building the wheel needs Rust (https://rustup.rs); installing a built wheel does not" >&2
    exit 1
fi

python=${PYTHON:-python3}
tools=target/python-tools
if [ ! -x "$tools/bin/maturin" ]; then
    [ -x "$tools/bin/python" ] || "$python" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --upgrade pip
    # The same range as python/pyproject.toml's build-system.
    "$tools/bin/python" -m pip install --quiet "maturin>=1.9,<2"
fi

out=target/wheels
# A debug build never lands where scripts/python_install.sh looks for the release wheel.
[ "$profile" = release ] || out="$out/$profile"
mkdir -p "$out"
# One wheel per version and tag: an older build of the same name would be picked up otherwise.
rm -f "$out"/dlock_rs-*.whl
# The build shares the machine: niced, like every cargo build here.
nice -n 10 "$tools/bin/maturin" build --quiet --manifest-path python/Cargo.toml \
    --profile "$profile" --out "$out" >&2
wheel="$(ls "$out"/dlock_rs-*-abi3-*.whl)"
echo "$wheel"
