"""Compiles counted where they happen: Triton's JIT cache misses and Helion's code generation.

Triton: ``knobs.runtime.jit_cache_hook`` runs when a ``@triton.jit`` kernel misses its
in-memory cache, before it compiles (or loads from the on-disk cache), and
``jit_post_compile_hook`` once the kernel is built (both in triton 3.4 through 3.9);
hooks someone else installed keep running; a compile counts once built. Helion:
``BoundKernel.compile_config`` adding a config to the bound kernel's compile cache (the
code generation of that config; on a GPU its Triton compiles at the first launch, a
Triton event of its own). The interpreter compiles nothing, so on CPU a
hand-written Triton kernel reports 0 compiles; a target of plain torch code always does.

A compile in progress (:func:`compiling`: Helion binding a new shape or generating a
config's code, Triton's ``JITFunction._do_compile``) is told to the listener of
:func:`on_compiling` (a job's flight record): a call past its time limit inside one is the
compiler's stall, not the kernel's hang.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
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


_depth = [0]  # compiles in progress in this process (nested: Triton's inside Helion's)
_listener: list[Callable[[float], None]] = []  # see on_compiling


def on_compiling(listener: Callable[[float], None] | None) -> None:
    """Tell ``listener`` when this process's outermost compile starts (its
    ``time.monotonic()``) and ends (``0.0``); ``None``: no one."""
    _listener[:] = [] if listener is None else [listener]


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """A compile in progress (what the hooks below bracket)."""
    _depth[0] += 1
    if _depth[0] == 1 and _listener:
        _listener[0](time.monotonic())
    try:
        yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0:
            # what the compile keeps (the compilers' lazy imports, the kernel's code) out
            # of the collector's walks: each full walk is then as long as what came since
            freeze_heap()
            if _listener:
                _listener[0](0.0)


def freeze_heap(collect: bool = True) -> None:
    """Take every object alive now out of the garbage collector's full walks
    (``gc.freeze``): a job's imports (torch, the kernel libraries and their compilers) are
    millions of objects that live as long as the process, and each full collection walked
    them all (up to 0.3-0.5 s each in an H100 campaign's jobs, 9-14 s of 8 jobs' 40 s).
    ``collect``: collect the garbage first, so that none is kept forever."""
    import gc

    if collect:
        gc.collect()
    gc.freeze()


def in_compile() -> bool:
    """Whether a compile is in progress in this process."""
    return _depth[0] > 0


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


def _cached(cache: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``compile_config`` call finds its config's code compiled already."""
    config = args[0] if args else kwargs.get("config")
    try:
        return isinstance(cache, dict) and config is not None and config in cache
    except TypeError:  # (an unhashable config: a compile, for all we know)
        return False


def _bracket(method: Any) -> Any:
    def bracketed(self: Any, *args: Any, **kwargs: Any) -> Any:
        with compiling():
            return method(self, *args, **kwargs)
    return bracketed


def _hook_helion(module: Any) -> None:
    def counting(compile_config: Any) -> Any:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            cache = getattr(self, "_compile_cache", None)
            n = len(cache) if isinstance(cache, dict) else None
            t = time.perf_counter()
            with contextlib.nullcontext() if _cached(cache, args, kwargs) else compiling():
                result = compile_config(self, *args, **kwargs)
            if n is not None and len(cache) > n:  # type: ignore[arg-type]
                _count("helion", time.perf_counter() - t)
            return result
        return counted

    wrap_once(module.BoundKernel, "compile_config", counting)
    wrap_once(module.BoundKernel, "__init__", _bracket)  # (a new shape: Helion's front end)


def install() -> None:
    """Hook the compile events of whichever of triton and helion are imported (cheap when
    already done; call again after importing more: nothing is imported here)."""
    knobs = sys.modules.get("triton.knobs")
    if knobs is not None and hasattr(knobs, "runtime"):
        _hook_triton(knobs)
    jit = sys.modules.get("triton.runtime.jit")
    if jit is not None and hasattr(getattr(jit, "JITFunction", None), "_do_compile"):
        wrap_once(jit.JITFunction, "_do_compile", _bracket)
    helion_kernel = sys.modules.get("helion.runtime.kernel")
    if helion_kernel is not None and hasattr(helion_kernel, "BoundKernel"):
        _hook_helion(helion_kernel)
