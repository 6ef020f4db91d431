"""``kda-fuzz`` run in the test's own process (``kda_fuzz.cli.main(argv)``), for tests whose
behaviour does not need a process of its own: no torch import and no fork server start per
run (a few seconds each). What does need one (the console script's exit, signals, a clean
environment, a user project's modules) keeps running ``python -m kda_fuzz``."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kda_fuzz(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``kda-fuzz ARGS`` in ``cwd``, in this process: its exit code, stdout and stderr, as
    ``subprocess.run(..., capture_output=True, text=True)`` gives them."""
    from kda_fuzz.cli import main

    out, err = io.StringIO(), io.StringIO()
    here, path, loaded = Path.cwd(), list(sys.path), set(sys.modules)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:  # the command puts its directory on sys.path (targets): not the session's
        os.chdir(here)
        sys.path[:] = path
        _forget_modules_of(Path(cwd).resolve(), set(sys.modules) - loaded)
    return subprocess.CompletedProcess(["kda-fuzz", *args], code, out.getvalue(),
                                       err.getvalue())


def _forget_modules_of(directory: Path, names: set[str]) -> None:
    """A user project's modules (``my_project.decode``) are not the session's: another
    test's project may have its own module of that name. This repository's own modules
    stay (other tests hold them)."""
    if directory.is_relative_to(ROOT):
        return
    for name in names:
        where = getattr(sys.modules.get(name), "__file__", None)
        if where and Path(where).resolve().is_relative_to(directory):
            del sys.modules[name]
