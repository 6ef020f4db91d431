"""Which compiled variant of a kernel each launch ran: variant coverage.

A variant is what a kernel compiles to for one launch: a Helion kernel's config, a Triton
kernel's specialisation (its constexpr values and argument dtypes; on a GPU the compiled
kernel of Triton's JIT cache, whose ``hash`` covers its whole cache key: the
specialisation ``jit_cache_hook`` is given on the miss, options included) and a
``@triton.autotune`` kernel's chosen config. While :func:`recording` is active, every launch
adds its :class:`Variant` to the set it yields (the oracle records one target call at a
time: ``Outcome.variants``).

Where each is seen:

* a Triton launch on a GPU: ``JITFunction.run`` returns the compiled kernel it launched
  (hooked here, labelled once per compiled kernel);
* a Triton launch under the interpreter (CPU): nothing compiles there and the JIT cache
  hook never fires, so the specialisation is derived from the launch itself, the
  constexpr values and the dtypes of the tensor arguments (:func:`interpreted`, called by
  :mod:`kda_fuzz.execution.cpu` for every interpreted launch);
* a Helion kernel: ``BoundKernel.compile_config`` (hooked here) registers the Triton
  kernels of the code it generated for a config; their launches count as that config (on
  a GPU and on CPU alike; Helion's eager mode compiles no config and shows none);
* an autotuner: ``Autotuner.run`` notes its chosen config (``best_config``) with the
  number of configs it declares; its benchmark launches (``_bench``), and Helion's
  autotuning, are not variants that ran.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kda_fuzz.execution.patching import wrap_once

CONFIG_SPACE = -1  # Variant.space of a kernel with a config space to draw others from


@dataclass(frozen=True)
class Variant:
    """One compiled variant of a kernel.

    ``label``: short and readable (the kernel's name, the values that set it apart, a
    digest of the rest); ``detail``: all of it (the whole config, the dtypes); ``space``:
    how many variants the kernel declares (an autotuner's configs), ``CONFIG_SPACE`` for
    a kernel whose config space other configs can be drawn from
    (:mod:`kda_fuzz.execution.configs`), 0 when none is known."""

    label: str
    kernel: str
    detail: str = ""
    space: int = 0


_sink: contextvars.ContextVar[set[Variant] | None] = contextvars.ContextVar(
    "kda_fuzz_variants", default=None)
_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kda_fuzz_variants_quiet", default=False)


@contextlib.contextmanager
def recording() -> Iterator[set[Variant]]:
    """Collect the variants launched inside (nested recordings collect their own)."""
    install()
    seen: set[Variant] = set()
    token = _sink.set(seen)
    try:
        yield seen
    finally:
        _sink.reset(token)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Launches inside are not variants that ran (an autotuner's benchmarks)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def note(variant: Variant) -> None:
    """A launch of ``variant``."""
    seen = _sink.get()
    if seen is not None and not _quiet.get():
        seen.add(variant)


def _digest(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"[:6]


def _short(value: Any) -> str:
    text = getattr(value, "name", None) if type(value).__name__ == "dtype" else None
    if text is None:
        text = repr(getattr(value, "value", value)) if type(value).__name__ == "constexpr" \
            else repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


# --- Triton ------------------------------------------------------------------------------

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


_params: dict[Any, list[tuple[int, str]]] = {}  # kernel function -> its constexpr params


def _constexpr_params(fn: Any) -> list[tuple[int, str]]:
    """``(position, name)`` of a Triton kernel's constexpr parameters (a JITFunction
    knows them; an InterpretedFunction's come from the annotations)."""
    inner = getattr(fn, "fn", fn)
    known = _params.get(inner)
    if known is not None:
        return known
    if hasattr(fn, "params"):
        known = [(p.num, p.name) for p in fn.params if getattr(p, "is_constexpr", False)]
    else:
        try:
            params = list(inspect.signature(inner).parameters.values())
        except (TypeError, ValueError):
            params = []
        known = [(i, p.name) for i, p in enumerate(params)
                 if "constexpr" in str(getattr(p.annotation, "__name__", p.annotation))]
    _params[inner] = known
    return known


def _constexprs(fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for num, name in _constexpr_params(fn):
        if num < len(args):
            out.append((name, args[num]))
        elif name in kwargs:
            out.append((name, kwargs[name]))
    return out


def _dtypes(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    return ",".join(str(a.dtype).replace("torch.", "") for a in (*args, *kwargs.values())
                    if hasattr(a, "dtype") and hasattr(a, "data_ptr"))


def _triton(fn: Any, consts: list[tuple[str, Any]], options: list[tuple[str, Any]],
            dtypes: str, digest: str) -> Variant:
    jit = getattr(fn, "fn", fn)
    name = getattr(jit, "__name__", None) or getattr(fn, "__name__", "kernel")
    values = ", ".join(f"{k}={_short(v)}" for k, v in [*consts, *options])
    detail = f"{name}({values}) dtypes: {dtypes or 'none'}"
    return Variant(f"{name}[{values}]#{digest}", name, detail)


_interpreted: dict[Any, Variant] = {}


def interpreted(fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """A Triton launch run by the interpreter: its Helion config where the code was
    generated by Helion, else its specialisation from the launch's constexpr values, launch
    options and argument dtypes."""
    if _sink.get() is None or _quiet.get():
        return
    helion = _generated.get(id(fn))
    if helion is not None:
        note(helion[1])
        return
    consts = _constexprs(fn, args, kwargs)
    options = [(k, kwargs[k]) for k in _LAUNCH_OPTIONS if k in kwargs]
    dtypes = _dtypes(args, kwargs)
    key = (id(fn), repr(consts), repr(options), dtypes)
    variant = _interpreted.get(key)
    if variant is None:
        variant = _interpreted[key] = _triton(fn, consts, options, dtypes,
                                              _digest(repr(key[1:])))
    note(variant)


_compiled: dict[int, tuple[Any, Variant]] = {}  # id(compiled kernel) -> (it, its variant)


def _compiled_variant(fn: Any, kernel: Any, args: Sequence[Any],
                      kwargs: dict[str, Any]) -> Variant:
    seen = _compiled.get(id(kernel))
    if seen is not None and seen[0] is kernel:
        return seen[1]
    meta = getattr(kernel, "metadata", None)
    options = [(k, getattr(meta, k)) for k in ("num_warps", "num_stages") if hasattr(meta, k)]
    variant = _triton(fn, _constexprs(fn, args, kwargs), options, _dtypes(args, kwargs),
                      str(getattr(kernel, "hash", "") or "")[:6] or _digest(repr(options)))
    _compiled[id(kernel)] = (kernel, variant)
    return variant


def _hook_jit(module: Any) -> None:
    def on_run(run: Any) -> Any:
        def launched(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            kernel = run(self, *args, grid=grid, warmup=warmup, **kwargs)
            if warmup or _sink.get() is None or _quiet.get() or kernel is None \
                    or not hasattr(kernel, "metadata"):  # (the interpreter's: see above)
                return kernel
            helion = _generated.get(id(self))
            note(helion[1] if helion is not None and helion[0] is self
                 else _compiled_variant(self, kernel, args, kwargs))
            return kernel
        return launched

    wrap_once(module.JITFunction, "run", on_run)


def _hook_autotuner(module: Any) -> None:
    def on_run(run: Any) -> Any:
        def chosen(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = run(self, *args, **kwargs)
            config = getattr(self, "best_config", None)
            if config is not None and _sink.get() is not None:
                declared = getattr(self, "_kda_fuzz_configs", None) or list(self.configs)
                base = getattr(self, "base_fn", None)
                name = getattr(base, "__name__", "kernel")
                at = next((i for i, c in enumerate(declared) if c is config), None)
                which = f"{at + 1}/{len(declared)}" if at is not None else f"?/{len(declared)}"
                note(Variant(f"{name} autotune config {which} [{config}]", name,
                             f"{name}: autotune config {which}: {config}", len(declared)))
            return result
        return chosen

    def on_bench(bench: Any) -> Any:
        def benchmark(self: Any, *args: Any, **kwargs: Any) -> Any:
            with quiet():
                return bench(self, *args, **kwargs)
        return benchmark

    wrap_once(module.Autotuner, "run", on_run)
    if hasattr(module.Autotuner, "_bench"):
        wrap_once(module.Autotuner, "_bench", on_bench)


# --- Helion ------------------------------------------------------------------------------

_generated: dict[int, tuple[Any, Variant]] = {}  # id(generated Triton kernel) -> its config


_SHORT_KEYS = ("block_sizes", "num_warps", "num_stages", "pid_type")


def config_variant(bound: Any, config: Any) -> Variant:
    """The variant of a Helion bound kernel compiled with ``config``."""
    name = str(getattr(getattr(bound, "kernel", None), "name", "") or "kernel")
    values = dict(getattr(config, "config", None) or dict(config or {}))
    index_dtype = getattr(getattr(bound, "settings", None), "index_dtype", None)
    extra = [] if index_dtype is None or "int32" in str(index_dtype) else [
        f"index_dtype={str(index_dtype).replace('torch.', '')}"]
    short = ", ".join([*(f"{k}={values[k]}" for k in _SHORT_KEYS if k in values), *extra])
    full = ", ".join([*(f"{k}={v!r}" for k, v in sorted(values.items())), *extra])
    return Variant(f"{name}[{short}]#{_digest(full)}", name, f"{name}: {full}", CONFIG_SPACE)


def _register(bound: Any, config: Any, compiled: Any) -> None:
    """Label the Triton kernels of the code ``compiled`` (from ``config``) as its config."""
    scope = getattr(compiled, "__globals__", None)
    jit = sys.modules.get("triton.runtime.jit")
    if not scope or jit is None:
        return
    variant = None
    for value in list(scope.values()):
        if isinstance(value, jit.KernelInterface):  # (an InterpretedFunction on CPU)
            known = _generated.get(id(value))
            if known is not None and known[0] is value:
                continue
            variant = variant or config_variant(bound, config)
            _generated[id(value)] = (value, variant)


def _hook_helion(module: Any) -> None:
    def on_compile(compile_config: Any) -> Any:
        def registered(self: Any, config: Any = None, *args: Any, **kwargs: Any) -> Any:
            compiled = compile_config(self, config, *args, **kwargs)
            try:
                if config is None:
                    config = self._require_implicit_config()
                _register(self, config, compiled)
            except Exception:  # coverage is information: never a reason to fail a launch
                pass
            return compiled
        return registered

    def on_autotune(autotune: Any) -> Any:
        def tuning(self: Any, *args: Any, **kwargs: Any) -> Any:
            with quiet():
                return autotune(self, *args, **kwargs)
        return tuning

    wrap_once(module.BoundKernel, "compile_config", on_compile)
    if hasattr(module.BoundKernel, "autotune"):
        wrap_once(module.BoundKernel, "autotune", on_autotune)


_HOOKS = {"triton.runtime.jit": ("JITFunction", _hook_jit),
          "triton.runtime.autotuner": ("Autotuner", _hook_autotuner),
          "helion.runtime.kernel": ("BoundKernel", _hook_helion)}
_done: set[str] = set()  # the modules of _HOOKS hooked already


def install() -> None:
    """Hook the launches of whichever of triton and helion are imported (cheap when done
    already; nothing is imported here)."""
    if len(_done) == len(_HOOKS):
        return
    for name, (cls, hook) in _HOOKS.items():
        module = sys.modules.get(name)
        if name not in _done and module is not None and hasattr(module, cls):
            hook(module)
            _done.add(name)


__all__ = ["CONFIG_SPACE", "Variant", "config_variant", "install", "interpreted", "note",
           "quiet", "recording"]
