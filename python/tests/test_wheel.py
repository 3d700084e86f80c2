"""The wheel scripts/python_wheel.sh builds installs and works where no Rust toolchain is.

scripts/python_test.sh passes the wheel's path in DLOCK_WHEEL. The wheel goes into a fresh
virtual environment whose PATH has no cargo or rustc, so a source build could not happen: the
lock taken afterwards is the wheel's own native module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


def _wheel() -> Path:
    path = os.environ.get("DLOCK_WHEEL")
    if not path:
        if os.environ.get("DLOCK_TEST_REQUIRE") == "all":
            pytest.fail("DLOCK_WHEEL is not set (scripts/python_test.sh sets it)")
        pytest.skip("DLOCK_WHEEL is not set: run scripts/python_test.sh")
    return Path(path)


def _path_without_rust() -> str:
    """PATH with every folder that holds cargo, rustc or rustup left out."""
    keep = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or any(Path(folder, tool).exists() for tool in ("cargo", "rustc", "rustup")):
            continue
        keep.append(folder)
    return os.pathsep.join(keep)


def test_the_wheel_is_one_abi3_wheel_named_dlock_rs() -> None:
    wheel = _wheel()
    # name-version-python tag-abi tag-platform.whl (PEP 427)
    name, _version, python_tag, abi_tag, platform = wheel.stem.split("-")
    assert (name, python_tag, abi_tag) == ("dlock_rs", "cp39", "abi3")
    assert platform.startswith(("manylinux", "linux"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        fields = archive.read(metadata).decode()
    assert "Name: dlock-rs" in fields.splitlines()
    # The import name stays `dlock`: the package, its stubs and the native module.
    assert "dlock/__init__.py" in names and "dlock/py.typed" in names
    assert any(n.startswith("dlock/_dlock") and n.endswith(".so") for n in names)


def test_the_wheel_installs_and_locks_with_no_rust_toolchain(tmp_path: Path) -> None:
    wheel = _wheel()
    path = _path_without_rust()
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    env = {
        "PATH": path,
        "HOME": str(tmp_path),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
    }
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], env=env, check=True)
    python = venv / "bin" / "python"
    # No index: the wheel alone, nothing fetched and nothing built.
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", str(wheel)],
        env=env,
        check=True,
    )
    script = f"""
import importlib.metadata, pathlib, sys
import dlock
assert pathlib.Path(dlock.__file__).is_relative_to(pathlib.Path(sys.prefix)), dlock.__file__
locks = dlock.connect("sqlite://{tmp_path / 'locks.db'}")
first = locks.lock("wheel/demo", timeout=30)
assert first.acquire(blocking=False)
first_fence = first.fence
second = locks.lock("wheel/demo", timeout=30)
assert not second.acquire(blocking=False), "a second holder got a held lock"
first.release()
assert second.acquire(blocking=False)
second_fence = second.fence
second.release()
print(importlib.metadata.version("dlock-rs"), first_fence, second_fence)
"""
    # -I and a folder of its own: not the source tree's dlock/ (no native module there).
    done = subprocess.run(
        [str(python), "-I", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    version, first_fence, second_fence = done.stdout.split()
    assert version and int(second_fence) > int(first_fence) > 0
