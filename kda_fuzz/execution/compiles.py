"""Compiles counted where they happen: Triton's JIT cache misses and Helion's code generation.

Triton: ``knobs.runtime.jit_cache_hook`` runs when a ``@triton.jit`` kernel misses its
in-memory cache, before it compiles (or loads from the on-disk cache), and
``jit_post_compile_hook`` once the kernel is built (both in triton 3.4 through 3.9);
hooks someone else installed keep running; a compile counts once built. Helion:
``BoundKernel.compile_config`` adding a config to the bound kernel's compile cache (the
code generation of that config; on a GPU its Triton compiles at the first launch, a
Triton event of its own). The interpreter compiles nothing, so on CPU a
hand-written Triton kernel reports 0 compiles; a target of plain torch code always does.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from kda_fuzz.execution.patching import wrap_once


@dataclass
class Compiles:
    """Compile events and the wall seconds spent in them."""

    triton: int = 0
    helion: int = 0
    seconds: float = 0.0

    @property
    def count(self) -> int:
        return self.triton + self.helion

    def __sub__(self, other: Compiles) -> Compiles:
        return Compiles(self.triton - other.triton, self.helion - other.helion,
                        self.seconds - other.seconds)


_totals = Compiles()
_lock = threading.Lock()
_interpreted = [0]  # kernel launches run by an interpreter on CPU (see ``interpreted``)
_started: dict[int, float] = {}  # thread id -> when its Triton compile began


def totals() -> Compiles:
    """The compiles of this process since :func:`install` (a copy)."""
    install()
    with _lock:
        return Compiles(_totals.triton, _totals.helion, _totals.seconds)


def note_interpreted() -> None:
    """A kernel launch ran under an interpreter (the CPU execution path): its first call
    of a shape prepares and binds the kernel as a compile would (not a compile event)."""
    _interpreted[0] += 1


def interpreted() -> int:
    """Kernel launches this process ran under an interpreter."""
    return _interpreted[0]


def _count(kind: str, seconds: float) -> None:
    with _lock:
        setattr(_totals, kind, getattr(_totals, kind) + 1)
        _totals.seconds += seconds


def _hook_triton(knobs: Any) -> None:
    runtime = knobs.runtime
    if getattr(runtime.jit_cache_hook, "_kda_fuzz_compiles", False):
        return
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def cache_miss(*args: Any, **kwargs: Any) -> Any:
        skip = before(*args, **kwargs) if before else None
        if not skip:  # a truthy answer skips the compile: none happens
            _started[threading.get_ident()] = time.perf_counter()
        return skip

    def compiled(*args: Any, **kwargs: Any) -> Any:
        t = _started.pop(threading.get_ident(), None)
        if t is not None:
            _count("triton", time.perf_counter() - t)
        return after(*args, **kwargs) if after else None

    cache_miss._kda_fuzz_compiles = True  # type: ignore[attr-defined]
    runtime.jit_cache_hook, runtime.jit_post_compile_hook = cache_miss, compiled


def _hook_helion(module: Any) -> None:
    def counting(compile_config: Any) -> Any:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            cache = getattr(self, "_compile_cache", None)
            n = len(cache) if isinstance(cache, dict) else None
            t = time.perf_counter()
            result = compile_config(self, *args, **kwargs)
            if n is not None and len(cache) > n:  # type: ignore[arg-type]
                _count("helion", time.perf_counter() - t)
            return result
        return counted

    wrap_once(module.BoundKernel, "compile_config", counting)


def install() -> None:
    """Hook the compile events of whichever of triton and helion are imported (cheap when
    already done; call again after importing more: nothing is imported here)."""
    knobs = sys.modules.get("triton.knobs")
    if knobs is not None and hasattr(knobs, "runtime"):
        _hook_triton(knobs)
    helion_kernel = sys.modules.get("helion.runtime.kernel")
    if helion_kernel is not None and hasattr(helion_kernel, "BoundKernel"):
        _hook_helion(helion_kernel)
