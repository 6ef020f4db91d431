"""Running kernels under other configs of their config space (``--helion-configs N``).

While :func:`alternative` ``(i, seed)`` is active, each Helion kernel launched runs config
number ``i`` of a deterministic list of other valid configs of its bound kernel (drawn by
Helion's own random config generator, the one its autotuner starts from, under a seed
made of ``seed``, the kernel's name and the shapes, dtypes and strides of the call:
``module-level random`` is seeded for the draw and restored after). The configs each kernel
ran are recorded (``Alternative.used``): a finding under them is saved with them
(:func:`note`), and :func:`pinned` runs a saved note's configs again, by kernel name
(a replay, the minimizer, the campaign's confirmation runs).

A config that Helion cannot generate code for, Triton cannot compile (or launch for lack
of resources), or the CPU interpreter cannot run, raises :class:`ConfigUnavailable`:
not a verdict (the oracle counts it as not judged, the campaign as a skipped config).

Where: on CPU :mod:`kda_fuzz.execution.cpu` asks :func:`choose` and :func:`compiled` for
the config of every Helion launch it makes; on a GPU ``Kernel.__call__`` and
``BoundKernel.__call__`` are wrapped, from the first :func:`alternative` or
:func:`pinned` on (a campaign without ``--helion-configs`` never installs them). Nothing
here is imported before helion is.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import random
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kda_fuzz.execution.patching import after_import, wrap_once

NOTE = "kernel_configs"  # the key of Case.notes under which a finding's configs are saved
OPTION = "--helion-configs"  # the command line's name for it (the summary names it)
DRAWS = 8  # random configs drawn per wanted alternative before giving up on more


class ConfigUnavailable(Exception):
    """A config the kernel cannot be compiled or run with here: not a verdict."""


@dataclass
class Alternative:
    """The configs of one call under :func:`alternative` or :func:`pinned`."""

    index: int | None = None  # the i-th alternative of each kernel (None: pinned)
    seed: int = 0
    pins: dict[str, dict[str, Any]] | None = None  # kernel name -> config values
    used: dict[str, dict[str, Any]] = field(default_factory=dict)  # kernel -> values run
    exhausted: bool = False  # a kernel has no alternative number ``index``
    unavailable: str = ""  # why a config could not run (ConfigUnavailable)
    adjusted: str = ""  # how a drawn config was fitted to the call (see fit_to_call)


_active: contextvars.ContextVar[Alternative | None] = contextvars.ContextVar(
    "kda_fuzz_configs", default=None)


def active() -> Alternative | None:
    """The alternative in force, if any."""
    return _active.get()


@contextlib.contextmanager
def _using(alt: Alternative) -> Iterator[Alternative]:
    install()
    token = _active.set(alt)
    try:
        yield alt
    finally:
        _active.reset(token)


def alternative(index: int, seed: int) -> contextlib.AbstractContextManager[Alternative]:
    """Run each kernel launched inside under its alternative config number ``index``."""
    return _using(Alternative(index=index, seed=seed))


def pinned(saved: Mapping[str, Any]) -> contextlib.AbstractContextManager[Alternative]:
    """Run the kernels named in a saved :func:`note` under the configs it records (others
    under their own)."""
    pins = {str(k): dict(v) for k, v in dict(saved.get("configs") or {}).items()}
    return _using(Alternative(index=saved.get("index"), seed=int(saved.get("seed") or 0),
                              pins=pins))


def note(alt: Alternative) -> dict[str, Any]:
    """What a corpus file records of the configs a call ran (``Case.notes[NOTE]``)."""
    out: dict[str, Any] = {"index": alt.index, "seed": alt.seed, "configs": alt.used}
    if alt.adjusted:
        out["fitted"] = alt.adjusted
    return out


def tag(saved: Mapping[str, Any]) -> str:
    """The config part of a finding's signature: the kernels run under other configs (one
    finding per behaviour and kernels, whichever of their configs showed it)."""
    return "configs:" + ",".join(sorted(dict(saved.get("configs") or {})))


def describe(saved: Mapping[str, Any]) -> str:
    """``_decode: block_sizes=[2], num_warps=4, ...`` for each kernel of a saved note
    (``alternative 2 of each kernel, seed 7`` for one that names no values: a crash's)."""
    if not any(dict(saved.get("configs") or {}).values()):
        return (f"alternative {saved.get('index')} of each kernel, seed {saved.get('seed')}: "
                "drawn again on replay")
    return "; ".join(f"{k}: " + ", ".join(f"{n}={v!r}" for n, v in sorted(dict(c).items()))
                     for k, c in sorted(dict(saved.get("configs") or {}).items()))


def unavailable(error: BaseException) -> str | None:
    """The reason when ``error`` (or what it was raised from) is a config that could not
    run (:class:`ConfigUnavailable`)."""
    e: BaseException | None = error
    seen: list[BaseException] = []
    while e is not None and e not in seen:
        if isinstance(e, ConfigUnavailable):
            return str(e)
        seen.append(e)
        e = e.__cause__ or e.__context__
    return None


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


# --- Helion ------------------------------------------------------------------------------


def _call_key(args: Sequence[Any]) -> str:
    parts = []
    for a in args:
        if hasattr(a, "shape") and hasattr(a, "stride"):
            parts.append(f"{a.dtype}{tuple(a.shape)}{tuple(a.stride())}")
        else:
            parts.append(type(a).__name__ if isinstance(a, float) else repr(a))
    return "|".join(parts)


_lists: dict[tuple[int, int, str], tuple[Any, list[Any]]] = {}


def alternatives(bound: Any, default: Any, args: Sequence[Any], seed: int, n: int
                 ) -> list[Any]:
    """Up to ``n`` valid configs of ``bound``'s config space other than ``default``, the
    same for the same kernel, call layout and seed (module ``random`` restored after). On
    CPU tensors persistent configs are left out: Helion sizes their grid from the device's
    SM count, which only a GPU has (they would all be skipped)."""
    key = (id(bound), seed, _call_key(args))
    known = _lists.get(key)
    if known is not None and known[0] is bound and len(known[1]) >= n:
        return known[1][:n]
    from helion.autotuner.config_generation import ConfigGeneration

    name = str(getattr(bound.kernel, "name", "kernel"))
    generation = ConfigGeneration(bound.config_spec)
    seen = {repr(sorted(dict(getattr(default, "config", default) or {}).items()))}
    cpu = _on_cpu(args)
    found: list[Any] = []
    state = random.getstate()
    random.seed(zlib.crc32(f"{seed}:{name}:{key[2]}".encode()))
    try:
        for _ in range(DRAWS * max(1, n)):
            try:
                config = generation.random_config()
            except Exception:  # helion.exc.InvalidConfig: no valid draw this time
                continue
            text = repr(sorted(config.config.items()))
            if cpu and str(config.config.get("pid_type", "")).startswith("persistent"):
                continue  # (it asks the device's SM count: no CPU has one)
            if text not in seen:
                seen.add(text)
                found.append(config)
                if len(found) >= n:
                    break
    finally:
        random.setstate(state)
    _lists[key] = (bound, found)
    return found


def choose(bound: Any, default: Any, args: Sequence[Any]) -> Any:
    """The config ``bound`` runs with now: ``default``, or the active alternative's (raises
    :class:`ConfigUnavailable` when the kernel has no such alternative)."""
    alt = _active.get()
    if alt is None:
        return default
    name = str(getattr(bound.kernel, "name", "kernel"))
    values = (alt.pins or {}).get(name)
    if values:
        import helion

        config = helion.Config(**values)
    elif alt.index is None or (alt.pins and name not in alt.pins):
        return default  # a saved call's other kernel, run under its own config
    else:  # alternative number ``index`` (a saved crash or hang names only that)
        assert alt.index is not None
        options = alternatives(bound, default, args, alt.seed, alt.index + 1)
        if len(options) <= alt.index:
            alt.exhausted = True
            raise ConfigUnavailable(f"{name} has {len(options)} other config(s) here")
        config = options[alt.index]
        config, alt.adjusted = fit_to_call(config, args, _parameters(bound))
        if alt.adjusted:
            _check_fitted(bound, config, name)
    alt.used[name] = {k: _plain(v) for k, v in dict(config.config).items()}
    return config


def _check_fitted(bound: Any, config: Any, name: str) -> None:
    """Raise :class:`ConfigUnavailable` unless the kernel's config space accepts ``config``
    (a drawn config fitted to the call): only configs Helion itself would take are run, so
    that a wrong result under one is the kernel's (or Helion's code for that config), never
    an artefact of the fitting."""
    spec = getattr(bound, "config_spec", None)
    check = getattr(spec, "normalize", None)
    if check is None:
        return
    try:
        check(dict(getattr(config, "config", config) or {}))
    except Exception as e:
        raise ConfigUnavailable(f"{name}: the drawn config with pointer indexing is not one "
                                f"its config space accepts ({_one_line(e)})") from None


DESCRIPTOR_ALIGNMENT = 16  # bytes: a TMA tensor descriptor's base address must be a multiple
DESCRIPTOR = "tensor_descriptor"


def misaligned(args: Sequence[Any], names: Sequence[str] = (),
               alignment: int = DESCRIPTOR_ALIGNMENT) -> list[str]:
    """The names (``names[i]``, else ``#i``) of the GPU tensors among ``args`` whose data
    pointer is not a multiple of ``alignment`` bytes (CPU tensors are never listed)."""
    out = []
    for i, a in enumerate(args):
        device = getattr(getattr(a, "device", None), "type", None)
        if device not in (None, "cpu", "meta") and hasattr(a, "data_ptr") \
                and a.data_ptr() % alignment:
            out.append(names[i] if i < len(names) else f"#{i}")
    return out


def fit_to_call(config: Any, args: Sequence[Any], names: Sequence[str] = ()
                ) -> tuple[Any, str]:
    """``config`` with its tensor-descriptor indexing replaced by pointer indexing when a GPU
    tensor of the call is not 16-byte aligned, and what was changed ("" if nothing).

    Helion accepts a tensor-descriptor config from the tensors' strides alone; a TMA
    descriptor also needs its base address aligned, and a launch on a view at another
    offset faults ("misaligned address"), whatever the kernel's code. That is Helion's
    limit, not the kernel's: the rest of the drawn config is still run, under pointer
    indexing."""
    values = dict(getattr(config, "config", config) or {})
    indexing = values.get("indexing")
    uses = (indexing == DESCRIPTOR if isinstance(indexing, str)
            else isinstance(indexing, (list, tuple)) and DESCRIPTOR in indexing)
    if not uses:
        return config, ""
    bad = misaligned(args, names)
    if not bad:
        return config, ""
    values["indexing"] = ("pointer" if isinstance(indexing, str)
                          else ["pointer" if v == DESCRIPTOR else v for v in indexing])
    import helion

    return helion.Config(**values), (
        "tensor-descriptor indexing run as pointer indexing: argument(s) "
        f"{', '.join(bad)} not {DESCRIPTOR_ALIGNMENT}-byte aligned (Helion does not check a "
        "descriptor's base address; a kernel autotuned to such a config faults on such calls)")


def _parameters(bound: Any) -> list[str]:
    """The kernel's parameter names, where Helion exposes them."""
    signature = getattr(getattr(bound, "kernel", None), "signature", None)
    return list(getattr(signature, "parameters", None) or ())


def _plain(value: Any) -> Any:
    """A config value as JSON holds it (lists for tuples)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _package_dir(name: str) -> str | None:
    path = getattr(sys.modules.get(name), "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


def _raised_in(error: BaseException, packages: Sequence[str]) -> bool:
    """Whether the innermost frame of ``error``'s traceback is in one of ``packages``."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    file = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return any(d is not None and file.startswith(d) for d in map(_package_dir, packages))


def _config_error(error: BaseException) -> bool:
    """A failure of compiling or launching a config (not of the kernel's own logic): raised
    inside Helion (its code generation, its runtime helpers: on CPU a persistent config asks
    for the device's SM count) or Triton (its compiler, its resource check, its interpreter),
    or by the CPU execution machinery (code the interpreter cannot run). A kernel's wrong
    numbers, and its own exceptions, are not."""
    e: BaseException | None = error
    seen: list[BaseException] = []
    while e is not None and e not in seen:
        if type(e).__name__ in ("CompilationError", "OutOfResources", "PTXASError",
                                "ExecutionEnvironmentError") \
                or (type(e).__module__ or "").startswith(("helion", "triton")) \
                or _raised_in(e, ("helion", "triton")):
            return True
        seen.append(e)
        e = e.__cause__ or e.__context__
    return False


def compiled(bound: Any, config: Any) -> Any:
    """``bound.compile_config(config)``; under an alternative, a config that does not
    generate or compile raises :class:`ConfigUnavailable`."""
    alt = _active.get()
    if alt is None:
        return bound.compile_config(config)
    try:
        return bound.compile_config(config)
    except Exception as e:
        alt.unavailable = f"{bound.kernel.name}: the config does not compile: {_one_line(e)}"
        raise ConfigUnavailable(alt.unavailable) from e


def launched(call: Callable[[], Any], name: str) -> Any:
    """Run a launch of a config chosen here; under an alternative, a failure to compile or
    launch the config (see :func:`_config_error`) raises :class:`ConfigUnavailable`."""
    alt = _active.get()
    if alt is None:
        return call()
    try:
        return call()
    except Exception as e:
        if not _config_error(e):
            raise
        alt.unavailable = f"{name}: the config does not run here: {_one_line(e)}"
        raise ConfigUnavailable(alt.unavailable) from e


def _on_cpu(values: Sequence[Any]) -> bool:
    return any(getattr(getattr(v, "device", None), "type", None) == "cpu" for v in values)


def _run(bound: Any, args: Sequence[Any]) -> Any:
    """A launch of ``bound`` on ``args`` under the active alternative (on a GPU)."""
    default = getattr(bound, "_config", None) or bound._implicit_config()
    if default is None:
        bound.ensure_config_exists(args)  # autotunes where the kernel would
        default = bound._config
    config = choose(bound, default, args)
    fn = compiled(bound, config)
    return launched(lambda: fn(*args), str(bound.kernel.name))


def _hook_helion(module: Any) -> None:
    def on_kernel(kernel_call: Any) -> Any:
        def configured(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _active.get() is None or _on_cpu((*args, *kwargs.values())):
                return kernel_call(self, *args, **kwargs)  # (CPU: see kda_fuzz.execution.cpu)
            if kwargs:
                args = self.normalize_args(*args, **kwargs)
            return _run(self.bind(args), args)
        return configured

    def on_bound(bound_call: Any) -> Any:
        def configured(self: Any, *args: Any) -> Any:
            if _active.get() is None or _on_cpu(args):
                return bound_call(self, *args)
            return _run(self, args)
        return configured

    wrap_once(module.Kernel, "__call__", on_kernel)
    wrap_once(module.BoundKernel, "__call__", on_bound)


# --- Helion kernels without a config of their own: Helion's default config -------------

AUTOTUNE_ENV = "KDA_FUZZ_HELION_AUTOTUNE"  # set by --helion-autotune (children inherit it)
AUTOTUNE_OPTION = "--helion-autotune"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def helion_autotunes() -> bool:
    """Whether a Helion kernel that gives no config of its own autotunes here, as Helion
    would: only when the user asks, with ``--helion-autotune`` (``KDA_FUZZ_HELION_AUTOTUNE=1``)
    or Helion's own variables (``HELION_FORCE_AUTOTUNE=1``, any ``HELION_AUTOTUNE_EFFORT``:
    ``none`` is Helion's default config anyway, ``HELION_USE_DEFAULT_CONFIG=0``: older
    helions' switch, which 1.4 and 1.5 no longer read). Otherwise it runs Helion's default
    config: autotuning on the first call of every shape in every job spent a GPU campaign's
    minute on one example."""
    env = os.environ

    def flag(name: str) -> str:
        return env.get(name, "").strip().lower()

    return flag(AUTOTUNE_ENV) in _TRUE or flag("HELION_FORCE_AUTOTUNE") in _TRUE \
        or bool(flag("HELION_AUTOTUNE_EFFORT")) or flag("HELION_USE_DEFAULT_CONFIG") in _FALSE


def ask_autotuning() -> None:
    """``--helion-autotune``: this process and those it starts let Helion autotune."""
    os.environ[AUTOTUNE_ENV] = "1"


def policy_note(device: str) -> str:
    """The start line's words for how Helion kernels without a config of their own run."""
    if device == "cpu":
        return ("Helion kernels without a config of their own run Helion's default config "
                "(never autotuned on cpu)")
    if helion_autotunes():
        return "Helion kernels without a config of their own autotune (as Helion would)"
    return (f"Helion kernels without a config of their own run Helion's default config "
            f"({AUTOTUNE_OPTION} to autotune)")


def _gives_no_config(bound: Any) -> bool:
    """Whether Helion would autotune ``bound`` only because its kernel names no config:
    none set, none implicit (``autotune_effort="none"`` is Helion's default config), none
    declared, and neither the kernel's settings nor the user force autotuning."""
    kernel = bound.kernel
    settings = getattr(kernel, "settings", None)
    implicit = getattr(bound, "_implicit_config", None)
    if implicit is None:  # a Helion this does not know: leave its choice to it
        return False
    return getattr(bound, "_config", None) is None and not list(kernel.configs or ()) \
        and not getattr(settings, "force_autotune", False) and implicit() is None


def default_config_hook(module: Any) -> None:
    """Wrap ``BoundKernel.ensure_config_exists`` (where Helion 1.4 and 1.5 decide to
    autotune a first call) so that a kernel giving no config of its own runs
    ``config_spec.default_config()`` unless :func:`helion_autotunes`. A kernel's own config
    (``config=``, one of ``configs=``; several: Helion picks among them as it would), one set
    on its bound kernel or autotuned before, is left as it is. A bound kernel given the
    default here keeps it for the rest of the process (Helion's own ``set_config``)."""
    bound_cls = getattr(module, "BoundKernel", None)
    if bound_cls is None or not hasattr(bound_cls, "ensure_config_exists"):
        return

    def on_ensure(ensure: Any) -> Any:
        def default_unless_asked(self: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            if not helion_autotunes() and _gives_no_config(self):
                self.set_config(self.config_spec.default_config())
                return None
            return ensure(self, args, *rest, **kwargs)
        return default_unless_asked

    wrap_once(bound_cls, "ensure_config_exists", on_ensure)


def install_defaults() -> None:
    """Apply :func:`default_config_hook` to Helion now or as soon as it is imported."""
    after_import("helion.runtime.kernel", default_config_hook)


# --- Triton autotuners --------------------------------------------------------------------


def autotune_choice(name: str, declared: Sequence[Any], default: Any) -> Any:
    """The declared config an ``@triton.autotune`` kernel runs now: ``default`` (its
    autotuner's choice), or under an alternative the ``index``-th of the others in their
    declared order (raises :class:`ConfigUnavailable` past the last), or a saved note's."""
    alt = _active.get()
    if alt is None or len(declared) < 2:
        return default
    values = (alt.pins or {}).get(name)
    if values and "autotune" in values:
        at = int(values["autotune"])
        if not 0 <= at < len(declared):
            raise ConfigUnavailable(f"{name} declares {len(declared)} config(s), not "
                                    f"number {at + 1}")
    elif alt.index is None or (alt.pins and name not in alt.pins):
        return default
    else:
        others = [i for i, c in enumerate(declared) if c is not default]
        if len(others) <= alt.index:
            alt.exhausted = True
            raise ConfigUnavailable(f"{name} has {len(others)} other config(s)")
        at = others[alt.index]
    alt.used[name] = {"autotune": at, "config": str(declared[at])}
    return declared[at]


def _hook_autotuner(module: Any) -> None:
    def on_run(run: Any) -> Any:
        def configured(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _active.get() is None:
                result = run(self, *args, **kwargs)
                self._kda_fuzz_chosen = getattr(self, "best_config", None)  # its own choice
                return result
            declared = list(getattr(self, "_kda_fuzz_configs", None) or self.configs)
            if len(declared) < 2:
                return run(self, *args, **kwargs)
            default = getattr(self, "_kda_fuzz_chosen", None) or getattr(
                self, "best_config", None)  # (the call's own run has just chosen it)
            if not any(c is default for c in declared):
                default = declared[0]
            name = str(getattr(getattr(self, "base_fn", None), "__name__", "kernel"))
            config = autotune_choice(name, declared, default)
            # one config left: the autotuner runs it without benchmarking (the CPU hook
            # and variant coverage read what it declares from _kda_fuzz_configs)
            kept, had = self.configs, getattr(self, "_kda_fuzz_configs", None)
            self.configs, self._kda_fuzz_configs = [config], declared
            try:
                return launched(lambda: run(self, *args, **kwargs), name)
            finally:
                self.configs, self._kda_fuzz_configs = kept, had
        return configured

    wrap_once(module.Autotuner, "run", on_run)


def install() -> None:
    """Wrap Helion's launches and Triton's autotuners (those imported; a no-op once done)."""
    helion = sys.modules.get("helion.runtime.kernel")
    if helion is not None and hasattr(helion, "BoundKernel"):
        _hook_helion(helion)
    autotuner = sys.modules.get("triton.runtime.autotuner")
    if autotuner is not None and hasattr(autotuner, "Autotuner"):
        _hook_autotuner(autotuner)


__all__ = ["AUTOTUNE_ENV", "AUTOTUNE_OPTION", "NOTE", "OPTION", "Alternative",
           "ConfigUnavailable", "active", "alternative", "alternatives", "ask_autotuning",
           "autotune_choice", "choose", "compiled", "default_config_hook", "describe",
           "fit_to_call", "helion_autotunes", "install", "install_defaults", "launched",
           "misaligned", "note", "pinned", "policy_note", "tag", "unavailable"]
