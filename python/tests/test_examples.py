"""The two seed scenarios, run as the user would run them, on SQLite and Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(params=["sqlite", "redis"])
def example_url(request, workdir):
    if request.param == "sqlite":
        return f"sqlite://{workdir / 'examples.db'}"
    return request.getfixturevalue("redis_server").url


@pytest.mark.parametrize("script", ["flash_sale.py", "run_once.py"])
def test_example(script, example_url):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), example_url], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if script == "flash_sale.py":
        assert "oversold=0" in done.stdout
    else:
        assert "ok=True" in done.stdout
