#!/usr/bin/env bash
# Installs dlock's Python package (distribution `dlock-rs`, `import dlock`) into a virtual
# environment (default .venv, or $VENV), the way a fresh Debian machine allows it: Debian's own
# Python refuses `pip install` outside a venv (PEP 668), and venvs need the python3-venv package.
#
# It installs the abi3 wheel in target/wheels/ when there is one (no Rust toolchain needed),
# and otherwise builds it first with scripts/python_wheel.sh (a release build: a few minutes
# the first time). To install a newer checkout, run scripts/python_wheel.sh again.
#
#   ./scripts/python_install.sh && .venv/bin/python -c 'import dlock; print(dlock.connect())'
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${VENV:-.venv}

if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    else
        echo "python3 cannot make a venv: install it with" >&2
        echo "  sudo apt-get install -y --no-install-recommends python3-venv" >&2
        exit 1
    fi
fi

shopt -s nullglob
wheels=(target/wheels/dlock_rs-*-abi3-*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    wheels=("$(scripts/python_wheel.sh | tail -n 1)")
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "${wheels[0]}"
echo "installed ${wheels[0]}: $venv/bin/python -c 'import dlock'"
