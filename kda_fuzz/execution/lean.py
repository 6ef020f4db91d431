"""Kernel libraries imported without the optional packages only their autotuners use.

helion imports scikit-learn (and with it SciPy) for the surrogate models of two of its
autotuners, inside ``try``: where the import fails it marks them unavailable and goes on.
A campaign runs Helion's default config unless the user asks for autotuning
(:func:`kda_fuzz.execution.configs.helion_autotunes`), so nothing of it would ever be used;
its import was 1.1-2.5 s of helion's 3.3-4.7 s on the 2-core machine (after torch), on the
critical path of every job's start (the fork server imports helion before its first fork).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

OPTIONAL = ("sklearn",)  # imported by kernel libraries for autotuning alone


@contextlib.contextmanager
def optional_imports_skipped() -> Iterator[None]:
    """Within the block, importing :data:`OPTIONAL` fails as if it were not installed
    (unless autotuning is asked for or it is imported already); afterwards it imports as
    usual again."""
    from kda_fuzz.execution.configs import helion_autotunes

    skipped = [] if helion_autotunes() else [m for m in OPTIONAL if m not in sys.modules]
    for name in skipped:
        sys.modules[name] = None  # type: ignore[assignment]  # (import raises ImportError)
    try:
        yield
    finally:
        for name in skipped:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def import_lean(name: str) -> None:
    """Import ``name`` with :data:`OPTIONAL` skipped; where that fails, as usual (an error
    then is the library's own)."""
    try:
        with optional_imports_skipped():
            importlib.import_module(name)
    except ImportError:
        importlib.import_module(name)
