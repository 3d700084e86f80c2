#!/usr/bin/env bash
# Builds the Python package (python/, PyO3 + maturin) into a virtualenv under target/ the way a
# user installs it (`pip install ./python`), and runs its pytest suite against real stores:
# SQLite, and redis-server and PostgreSQL started by the tests themselves.
#
#   scripts/python_test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# The binding is a crate outside the cargo workspace: its formatting and lints are checked here.
cargo fmt --manifest-path python/Cargo.toml -- --check
nice -n 10 cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings

# Debian's python3 needs the python3-venv package for this.
python=${PYTHON:-python3}
venv=target/python-venv
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The build shares the machine: keep it niced, like every cargo build here.
nice -n 10 "$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps ./python
"$venv/bin/python" -m pip install --quiet "pytest>=7" "redis>=5" "mypy>=1.10"

# A missing redis-server or PostgreSQL fails the run rather than skipping its tests.
export DLOCK_TEST_REQUIRE=all
# From python/ so pytest finds its configuration. The pytest script (not `python -m pytest`,
# which would put python/ and its uncompiled dlock/ first on sys.path) tests the installed package.
cd python
# The annotations and the native module's stubs agree (strict, no Any leaking out).
"../$venv/bin/mypy" --strict -p dlock
exec "../$venv/bin/pytest" -p no:cacheprovider "$@"
