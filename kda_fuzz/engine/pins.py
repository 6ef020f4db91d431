"""Pins, the family-neutral part: ``FIELD=VALUE`` text (``--layout``, the project's
layout presets) as a mapping of field to value or list of values, and back to one line.
Which fields a family takes, and what a pin means for its layouts, is the family's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class PinError(ValueError):
    """A pin names no field, or gives a value no valid layout can have."""


def describe(pins: Mapping[str, Any]) -> str:
    """``N=16, dtype=bfloat16, bound=None``: pins in one line."""
    def one(v: Any) -> str:
        if isinstance(v, torch.dtype):
            return str(v).removeprefix("torch.")
        if isinstance(v, list | tuple):
            return "|".join(one(x) for x in v)
        return str(v)

    return ", ".join(f"{k}={one(v)}" for k, v in pins.items())


def parse_layout(text: str) -> dict[str, Any]:
    """``"N=16,dtype=bfloat16,B=1|8|64,bound=none"`` as pins (``|``
    separates a list of values)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise PinError(f"layout {text!r}: {part!r} is not FIELD=VALUE")
        values = [scalar_of(v.strip()) for v in value.split("|")]
        out[key.strip()] = values[0] if len(values) == 1 else values
    if not out:
        raise PinError(f"layout {text!r} pins nothing")
    return out


def scalar_of(text: str) -> Any:
    """A pin value from text: none/true/false, an int, a float, else the text."""
    low = text.lower()
    if low in ("none", "null", "off"):
        return None
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "no"):
        return False
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


__all__ = ["PinError", "describe", "parse_layout", "scalar_of"]
