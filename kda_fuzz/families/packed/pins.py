"""Pins: fixing some fields of a packed decode layout while the rest is drawn.

A pin gives one field of :class:`~kda_fuzz.families.kda.layouts.KdaLayout` a value, a list
of values (one is drawn) or a Hypothesis strategy. Pinned sizes take precedence over the
layout budget; everything left free is drawn as usual, within what the pins allow (HV a
multiple of a pinned H, B at most a pinned ``num_slots``...).

Field names are the layout's (``B``, ``H``, ``HV``, ``K``, ``V``, ``state_dtype``,
``lower_bound``...), plus a few short names (``state``, ``dtype``, ``indices``,
``l2norm``, ``slots``) and ``strides`` (False: every tensor contiguous, no padded rows or
slots, no guard cells). Dtypes may be given as ``torch.dtype`` or by name (``"bfloat16"``,
``"bf16"``, ``"int32"``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from kda_fuzz.engine.pins import PinError

ALIASES = {
    "state": "state_dtype", "dtype": "qkv_dtype", "activations": "qkv_dtype",
    "indices": "idx_dtype", "index_dtype": "idx_dtype", "l2norm": "use_qk_l2norm_in_kernel",
    "slots": "num_slots",
}
SIZES = ("B", "H", "HV", "K", "V")
DTYPES = ("qkv_dtype", "ab_dtype", "param_dtype", "out_dtype", "state_dtype", "idx_dtype")
PADS = ("qkv_row_pad", "a_row_pad", "b_row_pad", "slot_pad", "guard")
FIELDS = (*SIZES, "num_slots", "spare_slots", *DTYPES, "padding", "pad_value", *PADS,
          "strides", "use_qk_l2norm_in_kernel", "lower_bound", "scale", "values")
PADDING_KINDS = ("none", "some", "first", "last", "all")
PAD_VALUES = ("-1", "any", "min")
_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "float": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "int32": torch.int32, "int64": torch.int64, "long": torch.int64, "int": torch.int32,
}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)




def dtype_of(value: Any) -> torch.dtype:
    """A ``torch.dtype`` from a dtype or its name (``"bf16"``, ``"torch.float16"``)."""
    if isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.").lower()
    if name not in _DTYPE_NAMES:
        raise PinError(f"unknown dtype {value!r} (use one of: "
                       f"{', '.join(sorted(_DTYPE_NAMES))})")
    return _DTYPE_NAMES[name]


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_value(name: str, value: Any, variant: str) -> Any:
    """``value`` of field ``name`` converted and checked; raises :class:`PinError`."""
    if name in DTYPES:
        dt = dtype_of(value)
        allowed = INDEX_DTYPES if name == "idx_dtype" else FLOAT_DTYPES
        if dt not in allowed:
            raise PinError(f"{name}={value!r}: valid layouts use "
                           f"{', '.join(str(d).removeprefix('torch.') for d in allowed)}")
        return dt
    if name in (*SIZES, "num_slots", "spare_slots", *PADS):
        if isinstance(value, bool) or not isinstance(value, int):
            raise PinError(f"{name}={value!r}: an integer is needed")
        low = 0 if name in ("spare_slots", *PADS) else 1
        if value < low:
            raise PinError(f"{name}={value}: a valid layout has {name} >= {low}")
        if name in ("K", "V") and variant == "helion" and not _pow2(value):
            raise PinError(f"{name}={value}: the helion variant accepts powers of two only "
                           "(check 14); pin variant='triton' for other sizes")
        return value
    if name in ("strides", "use_qk_l2norm_in_kernel"):
        if not isinstance(value, bool):
            raise PinError(f"{name}={value!r}: True or False")
        return value
    if name == "padding":
        if value not in PADDING_KINDS:
            raise PinError(f"padding={value!r}: one of {', '.join(PADDING_KINDS)}")
        return value
    if name == "pad_value":
        value = str(value)
        if value not in PAD_VALUES:
            raise PinError(f"pad_value={value!r}: one of {', '.join(PAD_VALUES)}")
        return value
    if name in ("lower_bound", "scale"):
        if value is None and name == "lower_bound":
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise PinError(f"{name}={value!r}: a finite number"
                           + (" or None" if name == "lower_bound" else ""))
        return float(value)
    return value  # values: a Values profile, passed as is


def normalize(pins: Mapping[str, Any] | None, variant: str,
              exclude: tuple[str, ...] = ()) -> dict[str, st.SearchStrategy[Any]]:
    """Pins as one strategy per layout field, aliases resolved and plain values checked.

    ``exclude`` names fields the family does not have (a pin on one is an error)."""
    out: dict[str, st.SearchStrategy[Any]] = {}
    for raw, value in (pins or {}).items():
        name = ALIASES.get(raw, raw)
        if name not in FIELDS or name in exclude:
            known = ", ".join(f for f in FIELDS if f not in exclude)
            raise PinError(f"unknown layout field {raw!r} (pin one of: {known}; "
                           f"short names: {', '.join(sorted(ALIASES))})")
        if name in out:
            raise PinError(f"{name} is pinned twice ({raw!r})")
        if isinstance(value, st.SearchStrategy):
            out[name] = value
        elif isinstance(value, list | tuple | set | frozenset):
            values = [_check_value(name, v, variant) for v in value]
            if not values:
                raise PinError(f"{name}: an empty list of values")
            out[name] = st.sampled_from(values)
        else:
            out[name] = st.just(_check_value(name, value, variant))
    _check_heads(out)
    return out


def pin_values(s: st.SearchStrategy[Any]) -> list[Any] | None:
    """The values of a pin given as a value or list (None for a user's strategy)."""
    inner = getattr(s, "wrapped_strategy", s)
    if hasattr(inner, "elements"):
        return list(inner.elements)
    if hasattr(inner, "value"):
        return [inner.value]
    return None


def _check_heads(out: dict[str, st.SearchStrategy[Any]]) -> None:
    hs = pin_values(out["H"]) if "H" in out else None
    hvs = pin_values(out["HV"]) if "HV" in out else None
    if hs and hvs and not any(hv % h == 0 for h in hs for hv in hvs):
        raise PinError(f"no pinned HV {hvs} is a multiple of a pinned H {hs} "
                       "(value heads are grouped over key heads)")


def _domain(name: str) -> list[Any] | None:
    if name == "idx_dtype":
        return list(INDEX_DTYPES)
    if name in DTYPES:
        return list(FLOAT_DTYPES)
    if name == "use_qk_l2norm_in_kernel":
        return [False, True]
    if name == "padding":
        return list(PADDING_KINDS)
    if name == "pad_value":
        return list(PAD_VALUES)
    return None


FEATURES = {  # a feature a target may not support, and the pin that leaves it out
    "lower_bound": ("lower_bound", [None]),
    "strides": ("strides", [False]),
    "padding": ("padding", ["none"]),
    "l2norm": ("use_qk_l2norm_in_kernel", [False]),
}


def restrictions(unsupported: Iterable[str], variant: str,
                 exclude: tuple[str, ...] = ()) -> dict[str, list[Any]]:
    """Pins that leave out what a target does not support: a feature (``lower_bound``,
    ``strides``, ``padding``, ``l2norm``) or one value of a field (``state=float16``,
    ``idx_dtype=int64``, ``l2norm=False``, ``padding=all``)."""
    out: dict[str, list[Any]] = {}
    for item in unsupported:
        raw, sep, value = (s.strip() for s in item.partition("="))
        if not sep:
            if raw not in FEATURES:
                raise PinError(f"unsupported {item!r}: name a feature ({', '.join(FEATURES)})"
                               " or FIELD=VALUE (e.g. state=float16)")
            name, allowed = FEATURES[raw]
        else:
            name = ALIASES.get(raw, raw)
            domain = _domain(name)
            if domain is None or name in exclude:
                raise PinError(f"unsupported {item!r}: {raw} is not a field whose values can "
                               "be left out (dtypes, l2norm, padding, pad_value); pin the "
                               "sizes the target supports instead (--layout)")
            if name in ("use_qk_l2norm_in_kernel",):
                gone = value.lower() in ("true", "1", "on")
            elif name in DTYPES:
                gone = dtype_of(value)
            else:
                gone = value
            allowed = [v for v in out.get(name, domain) if v != gone]
            if not allowed:
                raise PinError(f"unsupported {item!r} leaves no valid {name}")
        prev = out.get(name)
        out[name] = [v for v in (prev if prev is not None else allowed) if v in allowed]
        if not out[name]:
            raise PinError(f"unsupported {item!r} leaves no valid {name}")
    if exclude:
        out = {k: v for k, v in out.items() if k not in exclude}
    return out





