"""kda-fuzz: differential fuzzing and regression tests for packed KDA decode kernels.

Public API for your own tests: :mod:`kda_fuzz.strategies` (``valid_layouts``,
``broken_layouts``), :func:`check` and :func:`assert_conforms`. They load on first use, so
that ``import kda_fuzz`` stays cheap.
"""

from typing import Any

from kda_fuzz import _kernels_path
from kda_fuzz._version import __version__

__all__ = ["__version__", "assert_conforms", "check", "strategies"]

_kernels_path.install()


def _project_family_specs() -> list[str]:
    """The ``[tool.kda-fuzz] families`` of the project the current directory is in."""
    from kda_fuzz.config import project_families

    return project_families()


def _install_project_families() -> None:
    from kda_fuzz import families

    families.PROJECT_FAMILIES = _project_family_specs


_install_project_families()


def __getattr__(name: str) -> Any:
    if name in ("check", "assert_conforms"):
        from kda_fuzz import conformance

        return getattr(conformance, name)
    if name == "strategies":
        import importlib

        return importlib.import_module(".strategies", __name__)
    raise AttributeError(f"module 'kda_fuzz' has no attribute {name!r}")
