"""dlock.connect() without a URL: DLOCK_URL if set, else the dlock command's default SQLite file
in the user's state directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import dlock

SCRIPT = textwrap.dedent(
    """
    import dlock
    locks = dlock.connect()
    with locks.lock("default-url-test", timeout=10) as lock:
        print(locks.backend, lock.fence > 0)
    """
)


def run_without_url(env_changes):
    env = {k: v for k, v in os.environ.items() if k != "DLOCK_URL"}
    env.update(env_changes)
    done = subprocess.run([sys.executable, "-I", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_default_is_a_sqlite_file_in_the_state_dir(tmp_path):
    state = tmp_path / "state"
    assert run_without_url({"XDG_STATE_HOME": str(state)}) == ["sqlite", "True"]
    assert (state / "dlock" / "locks.db").exists()


def test_dlock_url_environment_variable(tmp_path, redis_server):
    assert run_without_url({"XDG_STATE_HOME": str(tmp_path), "DLOCK_URL": redis_server.url}) == ["redis", "True"]
    assert not (tmp_path / "dlock").exists()


def test_default_url_matches_the_cli():
    url = dlock.default_url()
    assert url.startswith("sqlite://") and url.endswith("/dlock/locks.db?create_dirs=true")


def test_enabled_schemes_cover_every_store():
    schemes = set(dlock.enabled_schemes())
    assert {"sqlite", "memory", "redis", "rediss", "redlock", "postgres", "mysql", "etcd", "zk"} <= schemes
