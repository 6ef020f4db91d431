"""Compiled bytecode kept for installs that have none.

An install without bytecode (``pip install --no-compile``, images that strip
``__pycache__``, a read-only site-packages under ``PYTHONDONTWRITEBYTECODE``) makes every
process compile torch's and the kernel libraries' sources as it imports them: on the
2-core machine torch and helion took 10.3-10.9 s that way against 4.5 s from an install's
bytecode, and 4.0 s from bytecode kept as here. Both the command and its fork server import
them before the first example, so the fork server and its jobs keep the bytecode they
compile under the user's cache (``sys.pycache_prefix``; writing it cost the first command
about 2 s there), and the next command and its processes read it.

Nothing changes where torch's own bytecode is installed, where the user chose a prefix
(``PYTHONPYCACHEPREFIX``), or with ``KDA_FUZZ_BYTECODE=off``; ``KDA_FUZZ_BYTECODE=DIR``
keeps it in ``DIR``.
"""

from __future__ import annotations

import importlib.util
import os
import sys

ENV = "KDA_FUZZ_BYTECODE"  # the folder the command chose (its processes follow it), or "off"
OFF = "off"


def default_folder() -> str | None:
    """The user's cache folder for kept bytecode, made where missing (None: no home, or
    not writable)."""
    home = os.path.expanduser("~")
    cache = os.environ.get("XDG_CACHE_HOME") or (None if home.startswith("~")
                                                 else os.path.join(home, ".cache"))
    if not cache or not os.path.isabs(cache):
        return None
    folder = os.path.join(cache, "kda-fuzz", "bytecode")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK) else None


def needs_keeping(library: str = "torch") -> bool:
    """Whether ``library`` is installed without bytecode of its own (and no prefix is set)."""
    if sys.pycache_prefix:
        return False
    spec = importlib.util.find_spec(library)
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return False
    return not os.path.exists(importlib.util.cache_from_source(origin))


def keep_bytecode(write: bool = True) -> str | None:
    """Read this process's bytecode from where the command chose (deciding it in the
    command, where ``KDA_FUZZ_BYTECODE`` is unset; the processes it starts inherit the
    choice) and, with ``write``, keep there what it compiles: the folder, or None where
    bytecode is left as Python handles it. (The command only reads: its fork server,
    importing the same libraries at the same time, writes them once.)"""
    folder = os.environ.get(ENV)
    if folder is None:
        folder = (default_folder() if needs_keeping() else None) or OFF
        os.environ[ENV] = folder
    if folder == OFF or not folder:
        return None
    os.environ["PYTHONPYCACHEPREFIX"] = folder  # (other Pythons it starts read what is kept)
    sys.pycache_prefix = folder
    if write:
        sys.dont_write_bytecode = False  # (into the prefix only: nothing beside the sources)
    return folder
