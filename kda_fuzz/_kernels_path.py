"""``kda_fuzz_kernels`` from an uninstalled checkout.

Installed, the repository's ``kernels/`` folder is the package ``kda_fuzz_kernels``. Run from
a checkout on ``PYTHONPATH`` (the GPU machine's way), this finder, consulted after every
other, maps that name onto the folder beside ``kda_fuzz/``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

NAME = "kda_fuzz_kernels"
_FOLDER = Path(__file__).resolve().parent.parent / "kernels"


class _CheckoutKernels:
    """A meta path finder for the top-level ``kda_fuzz_kernels`` name only."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        init = _FOLDER / "__init__.py"
        if name != NAME or not init.is_file():
            return None
        return importlib.util.spec_from_file_location(
            NAME, init, submodule_search_locations=[str(_FOLDER)])


def install() -> None:
    """Add the finder once, last, so an installed ``kda_fuzz_kernels`` wins."""
    if not any(isinstance(f, _CheckoutKernels) for f in sys.meta_path):
        sys.meta_path.append(_CheckoutKernels())
