"""Replacing a method of another library's class once per process, now or as soon as its
module is imported."""

from __future__ import annotations

import functools
import importlib.abc
import sys
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


# module name -> the hooks to run on it once imported, in the order they were asked for
_after_import: dict[str, list[Callable[[Any], None]]] = {}


def after_import(name: str, hook: Callable[[Any], None]) -> None:
    """Call ``hook(module)`` on module ``name``: now if it is imported, and whenever it is
    imported from now on (helion takes seconds to import: nothing here imports it). Hooks
    must be idempotent (:func:`wrap_once`); asking again for the same hook adds nothing."""
    hooks = _after_import.setdefault(name, [])
    if hook not in hooks:
        hooks.append(hook)
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
    if not any(isinstance(f, _HookOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _HookOnImport())


class _HookOnImport(importlib.abc.MetaPathFinder):
    """Runs the hooks of :func:`after_import` on a module right after it executes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _after_import:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is not None:

            def exec_and_hook(module: Any) -> None:
                exec_module(module)
                for hook in list(_after_import.get(fullname, ())):
                    hook(module)

            spec.loader.exec_module = exec_and_hook
        return spec


__all__ = ["MARK", "after_import", "wrap_once"]
