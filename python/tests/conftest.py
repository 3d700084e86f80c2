"""Real stores for the tests: SQLite (a file, no server), and redis-server and PostgreSQL
started here as child processes on free loopback ports, stopped at the end of the session.

A missing server binary skips its tests, unless DLOCK_TEST_REQUIRE=all (set by
scripts/python_test.sh), which makes it a failure.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

PG_BIN = Path("/usr/lib/postgresql")


def _require(what: str) -> None:
    if os.environ.get("DLOCK_TEST_REQUIRE") == "all":
        pytest.fail(f"{what} is required (DLOCK_TEST_REQUIRE=all) but not available")
    pytest.skip(f"{what} not available")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(check, what: str, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready")
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready within {timeout} s")


def _redis_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            _require("redis-server")
        self.process = None
        for _attempt in range(5):
            # Another process may grab the port between our probe and the server's bind: retry.
            self.port = free_port()
            log = open(workdir / f"redis-{self.port}.log", "wb")
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(workdir)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                _wait_for(lambda: _redis_ready(self.port), "redis-server", self.process)
                return
            except RuntimeError:
                self.stop()
        raise RuntimeError("redis-server did not start on any of 5 ports")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class PostgresServer:
    def __init__(self) -> None:
        versions = sorted(PG_BIN.glob("*/bin/postgres")) if PG_BIN.exists() else []
        if not versions:
            _require("PostgreSQL (postgresql-15)")
        bin_dir = versions[-1].parent
        as_root = os.geteuid() == 0
        if as_root:
            # initdb and postgres refuse to run as root: run them as the postgres user.
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                _require("the postgres system user")
            user_args = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        else:
            account = None
            user_args = {}
        self.dir = Path(tempfile.mkdtemp(prefix="dlock-py-pg-"))
        if account is not None:
            os.chown(self.dir, account.pw_uid, account.pw_gid)
        data = self.dir / "data"
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
             "--locale=C", "--no-sync", "--no-instructions"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **user_args,
        )
        self.process = None
        for _attempt in range(5):
            self.port = free_port()
            log = open(self.dir / f"pg-{self.port}.log", "wb")
            self.process = subprocess.Popen(
                [str(bin_dir / "postgres"), "-D", str(data), "-k", str(self.dir), "-p", str(self.port),
                 "-h", "127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=200"],
                stdout=log,
                stderr=subprocess.STDOUT,
                **user_args,
            )
            try:
                _wait_for(self._ready, "postgres", self.process)
                return
            except RuntimeError:
                self.stop()
        raise RuntimeError("postgres did not start on any of 5 ports")

    def _ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
        except OSError:
            return False
        probe = shutil.which("pg_isready")
        if probe is None:
            return True
        return subprocess.run([probe, "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True).returncode == 0

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # SIGINT is PostgreSQL's fast shutdown (SIGTERM waits for clients to leave).
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dlock")


@pytest.fixture(scope="session")
def redis_server(workdir) -> Iterator[RedisServer]:
    server = RedisServer(workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def sqlite_url(workdir) -> str:
    return f"sqlite://{workdir / 'locks.db'}"


STORES: List[str] = ["sqlite", "redis", "postgres"]


@pytest.fixture(params=STORES)
def store_url(request) -> str:
    """The URL of each store the behaviour cases run on."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    return request.getfixturevalue("postgres_server").url


@pytest.fixture
def locks(store_url):
    import dlock

    return dlock.connect(store_url)


@pytest.fixture
def name() -> str:
    """A lock name no other test uses, so the stores are shared by the whole session."""
    return f"test/{uuid.uuid4().hex}"
