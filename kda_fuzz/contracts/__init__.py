"""Kernel-family contracts known to kda-fuzz, by name."""

from __future__ import annotations

from ..contract import Contract
from .gdn import CONTRACT as GDN
from .kda import CONTRACT as KDA

CONTRACTS: dict[str, Contract] = {KDA.name: KDA, GDN.name: GDN}


def get_contract(name: str) -> Contract:
    """The contract called ``name`` (``kda``)."""
    try:
        return CONTRACTS[name]
    except KeyError:
        raise ValueError(f"unknown contract family {name!r} (known: {', '.join(CONTRACTS)})") \
            from None


__all__ = ["CONTRACTS", "get_contract"]
