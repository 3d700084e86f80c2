#!/usr/bin/env bash
# Installs dlock's Python package into a virtual environment (default .venv, or $VENV), the way
# a fresh Debian machine allows it: Debian's own Python refuses `pip install` outside a venv
# (PEP 668), and venvs need the python3-venv package. The wheel is built by maturin from
# python/ with the Rust toolchain (a release build: a few minutes the first time).
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
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (https://rustup.rs), then run this script again" >&2
    exit 1
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install ./python
echo "installed: $venv/bin/python -c 'import dlock'"
