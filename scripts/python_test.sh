#!/usr/bin/env bash
# Builds the Python package (python/, PyO3 + maturin) as the wheel users install
# (scripts/python_wheel.sh), installs that wheel into a virtualenv under target/, and runs the
# pytest suite against real stores: SQLite, and redis-server and PostgreSQL started by the
# tests themselves. One test installs the same wheel into a fresh virtualenv with no Rust
# toolchain on PATH.
#
#   scripts/python_test.sh [--profile dev|release] [pytest args...]
#
# The default profile is release, what users get; the test command passes `--profile dev`,
# which reuses the dependencies `cargo test` compiled (the extension's formatting and lints are
# checked there too: python/ is a workspace member).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
if [ "${1:-}" = "--profile" ]; then
    profile="$2"
    shift 2
fi

wheel="$(scripts/python_wheel.sh --profile "$profile" | tail -n 1)"
echo "wheel: $wheel"

# Debian's python3 needs the python3-venv package for this.
python=${PYTHON:-python3}
venv=target/python-venv
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$venv/bin/python" -m pip install --quiet "pytest>=7" "redis>=5" "mypy>=1.10"
# redis-py's own lock tests (in its source distribution, not its wheel), of the version just
# installed, run on dlock's drop-in by tests/test_redis_py_suite.py.
redis_py_version="$("$venv/bin/python" -c 'import redis; print(redis.__version__)')"
DLOCK_REDIS_PY_SOURCE="$(realpath target)/redis-py-source/redis-$redis_py_version"
if [ ! -f "$DLOCK_REDIS_PY_SOURCE/tests/test_lock.py" ]; then
    mkdir -p target/redis-py-source
    "$venv/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
        -d target/redis-py-source "redis==$redis_py_version"
    tar -xzf "target/redis-py-source/redis-$redis_py_version.tar.gz" -C target/redis-py-source
fi
export DLOCK_REDIS_PY_SOURCE

# A missing redis-server or PostgreSQL fails the run rather than skipping its tests.
export DLOCK_TEST_REQUIRE=all
# The wheel the no-toolchain test installs into a venv of its own.
DLOCK_WHEEL="$(realpath "$wheel")"
export DLOCK_WHEEL
# From python/ so pytest finds its configuration. The pytest script (not `python -m pytest`,
# which would put python/ and its uncompiled dlock/ first on sys.path) tests the installed package.
cd python
# The annotations and the native module's stubs agree (strict, no Any leaking out).
"../$venv/bin/mypy" --strict -p dlock
exec "../$venv/bin/pytest" -p no:cacheprovider "$@"
