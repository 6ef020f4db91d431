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
    here, path = Path.cwd(), list(sys.path)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:  # the command puts its directory on sys.path (targets): not the session's
        os.chdir(here)
        sys.path[:] = path
    return subprocess.CompletedProcess(["kda-fuzz", *args], code, out.getvalue(),
                                       err.getvalue())
