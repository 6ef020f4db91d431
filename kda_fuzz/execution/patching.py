"""Replacing a method of another library's class once per process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

MARK = "_kda_fuzz_hook"


def wrap_once(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``make(original)`` (wrapped as the original), unless that
    hook (``make``, known by its module and qualified name) is installed there already: a
    second install is a no-op, and hooks of different concerns on one method stack."""
    original = getattr(owner, name)
    tag = f"{getattr(make, '__module__', '')}.{getattr(make, '__qualname__', repr(make))}"
    tags = getattr(original, MARK, frozenset())
    if not isinstance(tags, frozenset):  # a replacement of an older form: one hook
        tags = frozenset({""})
    if tag in tags:
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, MARK, tags | {tag})
    setattr(owner, name, wrapper)


__all__ = ["MARK", "wrap_once"]
