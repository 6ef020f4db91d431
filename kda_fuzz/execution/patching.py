"""Replacing a method of another library's class once per process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

MARK = "_kda_fuzz_hook"


def wrap_once(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``make(original)`` (wrapped as the original), unless it
    is a replacement of ours already (a second install is a no-op)."""
    original = getattr(owner, name)
    if getattr(original, MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, MARK, True)
    setattr(owner, name, wrapper)


__all__ = ["MARK", "wrap_once"]
