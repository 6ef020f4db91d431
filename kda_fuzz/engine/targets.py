"""Targets: the callables under test, loaded from ``MODULE:CALLABLE`` specs."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: loading targets must not import torch
    from kda_fuzz.engine.contract import Contract


class TargetError(Exception):
    """A ``--target`` that cannot be imported or called."""


@dataclass(frozen=True)
class Target:
    """A callable under test and the name it was given by."""

    name: str
    fn: Callable[..., Any]


def import_object(spec: str, what: str = "CALLABLE") -> Any:
    """The object ``MODULE:ATTRIBUTE`` names, imported with the current directory on
    ``sys.path``; raises :class:`TargetError` saying what is wrong."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise TargetError(f"{spec!r} is not of the form MODULE:{what}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # a Helion kernel giving no config of its own runs Helion's default config here, unless
    # the user asks for autotuning (configs.helion_autotunes); helion is not imported here
    from kda_fuzz.execution.configs import install_defaults

    install_defaults()
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        hint = (" (kda-fuzz's own kernels are the package 'kda_fuzz_kernels' now)"
                if module.split(".")[0] == "kernels" else "")
        raise TargetError(f"cannot import {module!r}: {type(e).__name__}: {e}{hint}") from e
    obj: Any = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise TargetError(f"module {module!r} has no attribute {attr!r}")
    return obj


def load_target(spec: str) -> Target:
    """Import ``MODULE:CALLABLE`` with the current directory on ``sys.path``."""
    if ":" not in spec or spec.startswith(":") or spec.endswith(":"):
        raise TargetError(f"target {spec!r} is not of the form MODULE:CALLABLE")
    fn = import_object(spec)
    if not callable(fn):
        raise TargetError(f"{spec!r} is not callable")
    return Target(spec, fn)


def check_signature(target: Target, contract: Contract) -> None:
    """Raise ``TargetError`` unless ``target`` can be called with the contract's arguments
    (all of them, positionally)."""
    try:
        sig = inspect.signature(target.fn)
    except (TypeError, ValueError):  # builtins and extensions may have none: trust them
        return
    try:
        sig.bind(*contract.signature)
    except TypeError as e:
        raise TargetError(
            f"{target.name} cannot take the {contract.name} contract's {len(contract.signature)} "
            f"arguments ({', '.join(contract.signature)}): {e}") from None


def default_targets(contract: Contract, variant: str) -> list[Target]:
    """The project's own kernels for a contract variant."""
    return [load_target(s) for s in contract.default_targets.get(variant, ())]


@dataclass(frozen=True)
class TargetChoice:
    """The targets a corpus file is replayed against and where they come from:
    ``option`` (command line), ``config`` (``[tool.kda-fuzz.targets]``), ``default``
    (the contract's own kernels, when a caller allows them) or ``none``."""

    specs: tuple[str, ...]
    source: str


SOURCES = {"option": "chosen on the command line", "config": "configured in pyproject.toml",
           "default": "kda-fuzz's own kernels", "none": "no target configured"}


def recorded_targets(origin: Mapping[str, Any] | None) -> list[str]:
    """The target(s) a corpus file's ``origin.target`` names (a peer failure ``A vs B``
    names two); empty when the file records none."""
    target = (origin or {}).get("target")
    if not isinstance(target, str) or not target.strip():
        return []
    return [t.strip() for t in target.split(" vs ") if t.strip()]
