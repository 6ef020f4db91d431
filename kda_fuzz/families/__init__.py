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

Outside the command line and pytest (a script, a notebook), the first lookup of a family
not known yet reads the ``families`` of the project the current directory is in (its
``pyproject.toml``, as the command line does: :data:`PROJECT_FAMILIES`, installed by
``kda_fuzz``'s own ``__init__``); :func:`register` adds a contract object directly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from kda_fuzz.engine.targets import TargetError, import_object
from kda_fuzz.names import BUILTINS

if TYPE_CHECKING:  # contracts import torch: loaded on first use
    from kda_fuzz.engine.contract import Contract
    from kda_fuzz.engine.knobs import Knobs

# (both from kda_fuzz.names.BUILTINS, the one list of the built-in families)
# family -> its contract, MODULE:ATTRIBUTE (imported on first use)
BUILTIN_SPECS = {name: b.contract for name, b in BUILTINS.items()}
BUILTIN = tuple(BUILTIN_SPECS)
# family -> its command-line options and sizes, MODULE:ATTRIBUTE of a light module
OPTIONS = {name: b.options for name, b in BUILTINS.items()}
ENV_VAR = "KDA_FUZZ_FAMILIES"  # comma-separated MODULE:ATTRIBUTE of more families
ENTRY_POINTS = "kda_fuzz.families"
OPTION_ENTRY_POINTS = "kda_fuzz.family_options"
_loaded: set[str] = set()
_contracts: dict[str, Contract] = {}
# the MODULE:ATTRIBUTE specs of the families of the project the current directory is in
# (its [tool.kda-fuzz] families); set by the front end (kda_fuzz/__init__.py), which may
# read configuration files, as this layer may not
PROJECT_FAMILIES: Callable[[], list[str]] | None = None


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
    try:
        obj = import_object(spec, "ATTRIBUTE")
    except TargetError as e:
        raise ValueError(f"cannot load family {spec!r}: {e}") from e
    return register(obj, spec)


def register(contract: Contract, spec: str | None = None) -> Contract:
    """Make ``contract`` known by its name (to :func:`get_contract`, the corpus, replay);
    raises ``ValueError`` for what is not a :class:`Contract` or takes a built-in family's
    name (``spec``: where it came from, for the message)."""
    from kda_fuzz.engine.contract import Contract

    contracts = _registry()
    what = f"family {spec!r}" if spec else "the family"
    if not isinstance(contract, Contract):
        raise ValueError(f"{what} is a {type(contract).__name__}, not a kda_fuzz Contract")
    if contract.name in BUILTIN and contracts[contract.name] is not contract:
        raise ValueError(f"{what} is named {contract.name!r}, a built-in family's name "
                         "(derive with dataclasses.replace(..., name='...'))")
    contracts[contract.name] = contract
    return contract


def contract_of(family: str | Contract) -> Contract:
    """The contract a family name names (:func:`get_contract`), or ``family`` itself when
    it is a :class:`Contract` (registered, so that its cases can be judged and saved)."""
    return get_contract(family) if isinstance(family, str) else register(family)


def _load_user_families(project: bool = False) -> None:
    specs = _user_specs()
    if project and PROJECT_FAMILIES is not None:  # the current directory's project's
        specs += PROJECT_FAMILIES()
    for spec in dict.fromkeys(specs):
        if spec not in _loaded:
            load_family(spec)
            _loaded.add(spec)


def get_contract(name: str) -> Contract:
    """The contract called ``name`` (``kda``, ``gdn`` or a project's own family)."""
    contracts = _registry()
    if name not in contracts:
        _load_user_families()
    if name not in contracts:
        _load_user_families(project=True)
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
    specs = [*OPTIONS.values(), *extra]
    try:
        specs += [ep.value for ep in metadata.entry_points(group=OPTION_ENTRY_POINTS)]
    except Exception:  # a broken installed distribution must not hide the built-ins
        pass
    out: list[Knobs] = []
    for spec in dict.fromkeys(specs):
        obj = _load_knobs(spec)
        if obj not in out:
            out.append(obj)
    return out


def _load_knobs(spec: str) -> Any:
    """The :class:`~kda_fuzz.engine.knobs.Knobs` that ``MODULE:ATTRIBUTE`` names;
    ``ValueError`` saying what is wrong."""
    from kda_fuzz.engine.knobs import Knobs

    try:
        obj = import_object(spec, "ATTRIBUTE")
    except TargetError as e:
        raise ValueError(f"cannot load family options {spec!r}: {e}") from e
    if not isinstance(obj, Knobs):
        raise ValueError(f"family options {spec!r} are a {type(obj).__name__}, not "
                         "kda_fuzz Knobs")
    return obj


def option_owners(named: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Each flag the families declare -> the families that take it (in order): the
    built-in families' (:data:`OPTIONS`) and those of ``named`` (family ->
    ``MODULE:ATTRIBUTE`` of its :class:`~kda_fuzz.engine.knobs.Knobs`: a project's
    ``family_options`` table); imports no contract. Raises ``ValueError`` for options
    that cannot be loaded."""
    owners: dict[str, list[str]] = {}
    for family, spec in {**OPTIONS, **(named or {})}.items():
        for k in _load_knobs(spec).options:
            owners.setdefault(k.flag, []).append(family)
    return {flag: tuple(names) for flag, names in owners.items()}


def knobs_of(name: str) -> Knobs:
    """The options and sizes of the family ``name``: a built-in family's without importing
    its contract, another's from its contract."""
    if name in OPTIONS:
        return import_object(OPTIONS[name], "ATTRIBUTE")
    return get_contract(name).knobs


__all__ = ["CONTRACTS", "ENV_VAR", "contract_of", "family_names", "family_options",
           "get_contract", "knobs_of", "load_family", "option_owners", "register"]
