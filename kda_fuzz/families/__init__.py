"""Kernel-family contracts known to kda-fuzz, by name: the built-in ones and a project's own.

A project adds its families without forking kda-fuzz, by naming ``MODULE:ATTRIBUTE`` of a
:class:`~kda_fuzz.engine.contract.Contract` in ``[tool.kda-fuzz] families`` of its
``pyproject.toml`` (the command line and the pytest plugin pass them on to every worker
through ``KDA_FUZZ_FAMILIES``), or as an entry point of the group ``kda_fuzz.families``
of an installed package.

Importing this registry imports no contract (and so no torch): the built-in contracts are
loaded on first use (:func:`get_contract`, ``CONTRACTS``). Each family's own command-line
options (:class:`~kda_fuzz.engine.knobs.Knobs`) are named here by ``MODULE:ATTRIBUTE`` of
a module that imports nothing heavy (:data:`OPTIONS`), so that ``kda-fuzz`` answers
``--help`` and usage errors at once; a project's family declares its own in
``[tool.kda-fuzz] family_options`` or the entry-point group ``kda_fuzz.family_options``.
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import TYPE_CHECKING, Any

from kda_fuzz.engine.targets import TargetError, import_object

if TYPE_CHECKING:  # contracts import torch: loaded on first use
    from kda_fuzz.engine.contract import Contract
    from kda_fuzz.engine.knobs import Knobs

# family -> its contract, MODULE:ATTRIBUTE (imported on first use)
BUILTIN_SPECS = {"kda": "kda_fuzz.families.kda.contract:CONTRACT",
                 "gdn": "kda_fuzz.families.gdn.contract:CONTRACT"}
BUILTIN = tuple(BUILTIN_SPECS)
# family -> its command-line options and sizes, MODULE:ATTRIBUTE of a light module
OPTIONS = {"kda": "kda_fuzz.families.packed.knobs:KNOBS",
           "gdn": "kda_fuzz.families.packed.knobs:KNOBS"}
ENV_VAR = "KDA_FUZZ_FAMILIES"  # comma-separated MODULE:ATTRIBUTE of more families
ENTRY_POINTS = "kda_fuzz.families"
OPTION_ENTRY_POINTS = "kda_fuzz.family_options"
_loaded: set[str] = set()
_contracts: dict[str, Contract] = {}


def _registry() -> dict[str, Contract]:
    """The registered contracts, the built-in ones imported on the first call."""
    if not _contracts:
        for name, spec in BUILTIN_SPECS.items():
            _contracts[name] = import_object(spec, "ATTRIBUTE")
    return _contracts


def __getattr__(name: str) -> Any:
    if name == "CONTRACTS":  # (the dict itself: load_family adds to it)
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from kda_fuzz.engine.contract import Contract

    contracts = _registry()
    try:
        obj = import_object(spec, "ATTRIBUTE")
    except TargetError as e:
        raise ValueError(f"cannot load family {spec!r}: {e}") from e
    if not isinstance(obj, Contract):
        raise ValueError(f"family {spec!r} is a {type(obj).__name__}, not a "
                         "kda_fuzz Contract")
    if obj.name in BUILTIN and contracts[obj.name] is not obj:
        raise ValueError(f"family {spec!r} is named {obj.name!r}, a built-in family's name "
                         "(derive with dataclasses.replace(..., name='...'))")
    contracts[obj.name] = obj
    return obj


def _load_user_families() -> None:
    for spec in _user_specs():
        if spec not in _loaded:
            load_family(spec)
            _loaded.add(spec)


def get_contract(name: str) -> Contract:
    """The contract called ``name`` (``kda``, ``gdn`` or a project's own family)."""
    contracts = _registry()
    if name not in contracts:
        _load_user_families()
    try:
        return contracts[name]
    except KeyError:
        raise ValueError(f"unknown contract family {name!r} (known: {', '.join(contracts)})") \
            from None


def family_names() -> list[str]:
    """Every family known here: the built-in ones and the project's own."""
    _load_user_families()
    return list(_registry())


def family_options(extra: tuple[str, ...] = ()) -> list[Knobs]:
    """The command-line options of the built-in families, then those of ``extra``
    (``MODULE:ATTRIBUTE`` of :class:`~kda_fuzz.engine.knobs.Knobs`: a project's
    ``family_options``) and of the entry-point group ``kda_fuzz.family_options``; imports
    no contract. Raises ``ValueError`` for one that cannot be loaded."""
    from kda_fuzz.engine.knobs import Knobs

    specs = [*OPTIONS.values(), *extra]
    try:
        specs += [ep.value for ep in metadata.entry_points(group=OPTION_ENTRY_POINTS)]
    except Exception:  # a broken installed distribution must not hide the built-ins
        pass
    out: list[Knobs] = []
    for spec in dict.fromkeys(specs):
        try:
            obj = import_object(spec, "ATTRIBUTE")
        except TargetError as e:
            raise ValueError(f"cannot load family options {spec!r}: {e}") from e
        if not isinstance(obj, Knobs):
            raise ValueError(f"family options {spec!r} are a {type(obj).__name__}, not "
                             "kda_fuzz Knobs")
        if obj not in out:
            out.append(obj)
    return out


def knobs_of(name: str) -> Knobs:
    """The options and sizes of the family ``name``: a built-in family's without importing
    its contract, another's from its contract."""
    if name in OPTIONS:
        return import_object(OPTIONS[name], "ATTRIBUTE")
    return get_contract(name).knobs


__all__ = ["CONTRACTS", "ENV_VAR", "family_names", "family_options", "get_contract",
           "knobs_of", "load_family"]
