"""Bytecode kept for installs without it (kda_fuzz.workers.bytecode): decided once by the
command, followed by the processes it starts, written under the chosen folder and never
beside the sources, and nothing changed where an install has its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kda_fuzz.workers import bytecode

ROOT = Path(__file__).resolve().parent.parent


def _library(tmp_path: Path, compiled: bool) -> str:
    """A package ``lib_<compiled>`` under ``tmp_path`` (on sys.path), with or without its
    bytecode beside it."""
    import compileall

    name = f"lib_{int(compiled)}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 7\n")
    if compiled:
        assert compileall.compile_dir(pkg, quiet=1)
    return name


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No choice made yet, no prefix, the library folder on sys.path."""
    monkeypatch.delenv(bytecode.ENV, raising=False)
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_only_a_library_installed_without_bytecode_needs_it_kept(clean: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    bare = _library(clean, compiled=False)
    assert bytecode.needs_keeping(bare)
    assert not bytecode.needs_keeping(_library(clean, compiled=True))
    assert not bytecode.needs_keeping("no_such_library_here")
    monkeypatch.setattr(sys, "pycache_prefix", str(clean / "users"))  # the user's own prefix
    assert not bytecode.needs_keeping(bare)


def test_the_command_decides_once_and_its_processes_follow(clean: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(bytecode, "needs_keeping", lambda library="torch": True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean / "cache"))
    folder = bytecode.keep_bytecode()
    assert folder == str(clean / "cache" / "kda-fuzz" / "bytecode")
    assert os.environ[bytecode.ENV] == folder == os.environ["PYTHONPYCACHEPREFIX"]
    assert sys.pycache_prefix == folder and not sys.dont_write_bytecode
    # a process it starts (the fork server) follows the choice without deciding again
    monkeypatch.setattr(bytecode, "needs_keeping", lambda library="torch": False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert bytecode.keep_bytecode() == folder and sys.pycache_prefix == folder
    # one that only reads (the command: its fork server writes) leaves writing as it was
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.keep_bytecode(write=False) == folder == sys.pycache_prefix
    assert sys.dont_write_bytecode


def test_an_install_with_bytecode_is_left_as_python_handles_it(clean: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setattr(bytecode, "needs_keeping", lambda library="torch": False)
    dont = sys.dont_write_bytecode
    assert bytecode.keep_bytecode() is None
    assert os.environ[bytecode.ENV] == bytecode.OFF and "PYTHONPYCACHEPREFIX" not in os.environ
    assert sys.pycache_prefix is None and sys.dont_write_bytecode == dont
    monkeypatch.setattr(bytecode, "needs_keeping", lambda library="torch": True)
    assert bytecode.keep_bytecode() is None  # (decided: "off" holds for its processes)


def test_no_writable_cache_folder_keeps_nothing(clean: Path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    """Without a home, with a relative cache path or one that cannot be made, bytecode is
    left as Python handles it (nothing written where the command happens to run)."""
    monkeypatch.setattr(bytecode, "needs_keeping", lambda library="torch": True)
    blocked = clean / "file"
    blocked.write_text("")
    for cache in ("relative/cache", str(blocked)):
        monkeypatch.setenv("XDG_CACHE_HOME", cache)
        monkeypatch.delenv(bytecode.ENV, raising=False)
        assert bytecode.keep_bytecode() is None and sys.pycache_prefix is None
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setattr(os.path, "expanduser", lambda p: p)  # (no home to expand to)
    monkeypatch.delenv(bytecode.ENV, raising=False)
    assert bytecode.keep_bytecode() is None and os.environ[bytecode.ENV] == bytecode.OFF
    assert not Path("relative").exists() and not Path("~").exists()


KEEPING = """
import sys
from kda_fuzz.workers.bytecode import keep_bytecode
print(keep_bytecode())
import {name}
print({name}.VALUE, {name}.__cached__)
"""


def test_kept_bytecode_is_written_in_the_folder_not_beside_the_sources(tmp_path: Path
                                                                       ) -> None:
    """Two commands in turn, where writing bytecode is off (PYTHONDONTWRITEBYTECODE): the
    first compiles the library into the chosen folder, the second reads it from there;
    nothing is written beside the sources."""
    name = _library(tmp_path, compiled=False)
    folder = tmp_path / "kept"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update({bytecode.ENV: str(folder), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    cached = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", KEEPING.format(name=name)], env=env,
                             capture_output=True, text=True, check=True)
        chosen, line = run.stdout.split("\n")[:2]
        assert chosen == str(folder) and line.startswith("7 ")
        cached.append(Path(line.split(" ", 1)[1]))
    assert cached[0] == cached[1] and cached[0].is_file()
    assert folder in cached[0].parents
    assert not (tmp_path / name / "__pycache__").exists()


@pytest.mark.slow
def test_the_fork_server_keeps_its_bytecode_where_the_command_chose(tmp_path: Path) -> None:
    """The command line with a folder chosen: the fork server's own modules (which only
    it imports) are compiled into that folder."""
    folder = tmp_path / "kept"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update({bytecode.ENV: str(folder), "PYTHONDONTWRITEBYTECODE": "1"})
    subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--contract", "triton",
                    "--target", "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode",
                    "--max-examples", "2", "--seed", "1", "--no-save"],
                   cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=300)
    import importlib.util

    server_only = ROOT / "kda_fuzz" / "workers" / "preloaded.py"  # (the fork server's alone)
    old = sys.pycache_prefix
    sys.pycache_prefix = str(folder)
    try:
        kept = Path(importlib.util.cache_from_source(str(server_only)))
    finally:
        sys.pycache_prefix = old
    assert kept.is_file(), sorted(p.name for p in kept.parent.glob("*"))
