"""Kernel-family contracts known to kda-fuzz, by name: the built-in ones and a project's own.

A project adds its families without forking kda-fuzz, by naming ``MODULE:ATTRIBUTE`` of a
:class:`~kda_fuzz.engine.contract.Contract` in ``[tool.kda-fuzz] families`` of its
``pyproject.toml`` (the command line and the pytest plugin pass them on to every worker
through ``KDA_FUZZ_FAMILIES``), or as an entry point of the group ``kda_fuzz.families``
of an installed package.
"""

from __future__ import annotations

import os
from importlib import metadata

from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.targets import TargetError, import_object
from kda_fuzz.families.gdn.contract import CONTRACT as GDN
from kda_fuzz.families.kda.contract import CONTRACT as KDA

CONTRACTS: dict[str, Contract] = {KDA.name: KDA, GDN.name: GDN}
BUILTIN = tuple(CONTRACTS)
ENV_VAR = "KDA_FUZZ_FAMILIES"  # comma-separated MODULE:ATTRIBUTE of more families
ENTRY_POINTS = "kda_fuzz.families"
_loaded: set[str] = set()


def _user_specs() -> list[str]:
    specs = [s.strip() for s in os.environ.get(ENV_VAR, "").split(",") if s.strip()]
    try:
        specs += [ep.value for ep in metadata.entry_points(group=ENTRY_POINTS)]
    except Exception:  # a broken installed distribution must not hide the built-ins
        pass
    return specs


def load_family(spec: str) -> Contract:
    """Import the :class:`Contract` named ``MODULE:ATTRIBUTE`` (the current directory on
    ``sys.path``) and register it; raises ``ValueError`` saying what is wrong."""
    try:
        obj = import_object(spec, "ATTRIBUTE")
    except TargetError as e:
        raise ValueError(f"cannot load family {spec!r}: {e}") from e
    if not isinstance(obj, Contract):
        raise ValueError(f"family {spec!r} is a {type(obj).__name__}, not a "
                         "kda_fuzz Contract")
    if obj.name in BUILTIN and CONTRACTS[obj.name] is not obj:
        raise ValueError(f"family {spec!r} is named {obj.name!r}, a built-in family's name "
                         "(derive with dataclasses.replace(..., name='...'))")
    CONTRACTS[obj.name] = obj
    return obj


def _load_user_families() -> None:
    for spec in _user_specs():
        if spec not in _loaded:
            load_family(spec)
            _loaded.add(spec)


def get_contract(name: str) -> Contract:
    """The contract called ``name`` (``kda``, ``gdn`` or a project's own family)."""
    if name not in CONTRACTS:
        _load_user_families()
    try:
        return CONTRACTS[name]
    except KeyError:
        raise ValueError(f"unknown contract family {name!r} (known: {', '.join(CONTRACTS)})") \
            from None


def family_names() -> list[str]:
    """Every family known here: the built-in ones and the project's own."""
    _load_user_families()
    return list(CONTRACTS)


__all__ = ["CONTRACTS", "ENV_VAR", "family_names", "get_contract", "load_family"]
