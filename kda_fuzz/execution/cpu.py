"""How Helion and Triton kernels execute on CPU tensors (there is no GPU on CI).

One switch, the environment variable ``KDA_FUZZ_CPU_MODE``, read at every launch:

``triton`` (default)
    Helion compiles the kernel to Triton as it would for a GPU (one config: the kernel's
    own, else Helion's default; never autotuning), and the generated Triton runs under
    the Triton interpreter, patched for the launch (:func:`_interpreter_context`):
    ``libdevice`` calls (``libdevice.exp``, ``libdevice.log1p``, ...) are stubs returning
    None in the interpreter (the source of ``AttributeError("'NoneType' object has no
    attribute 'type'")``), so they get numpy bodies, and stubs without one raise
    :class:`ExecutionEnvironmentError` naming the function; bfloat16 is made safe
    (below). A slot index loaded as a scalar and then indexed ``idx[:, None]`` by
    Helion's codegen becomes a ``[1]`` (triton 3.6 did so itself; 3.9 refuses it:
    :func:`_rank0_index_patch`), and masks stay boolean (triton 3.9's loads refuse the
    0/1 integers the interpreter makes of ``mask & scalar_condition``: :func:`_mask_patches`),
    and a one-element value is an index under numpy 2.4 (``range(pid, n, step)``; triton
    3.6 calls ``int()`` on a one-element array, which numpy 2.4 refuses:
    :func:`_scalar_index_patch`).
    Helion's generated Triton that Triton's frontend still refuses under the interpreter
    (size-1 dimensions emitted with a rank too few) raises :class:`ExecutionEnvironmentError`.
``eager``
    Helion's reference eager mode (what ``HELION_INTERPRET=1`` selects): the kernel body
    runs as plain torch code. It exercises the kernel's math but not Helion's codegen,
    and it is trusted for the project's own kernels only (those of the packages in
    :data:`EAGER_TRUSTED`, and :func:`run_helion`'s): with a scalar-tensor ``idx``,
    ``state[idx, hv, tile_v.index, k_offsets]`` reads a diagonal there (silently wrong
    numbers; stores fail), a pattern real kernels use, so any other Helion kernel raises
    :class:`ExecutionEnvironmentError` in this mode.

Every kernel, the project's own included (``kda_fuzz_kernels`` is a plain package that
calls its kernels as anyone would). :func:`configure_cpu` hooks Helion's ``Kernel.__call__`` /
``BoundKernel.__call__``, Triton's ``JITFunction.run``, ``InterpretedFunction.run`` and
``Autotuner.run`` (as soon as each module is imported; helion is never imported here).
From then on, any ``@helion.kernel`` called on CPU tensors runs as above, and any
``@triton.jit`` kernel launched on CPU tensors runs under the same patched interpreter,
whatever the order of ``TRITON_INTERPRET`` and imports (``@triton.autotune``: its first
config). kda-fuzz's own launches (:func:`launch_triton`, :func:`run_helion`) go
straight to the interpreter. :func:`environment_error` tells a
failure of this machinery (an interpreter gap, a GPU driver asked for on CPU, ...) from
an error of the kernel's own, so that the former stops a campaign instead of becoming a
verdict.

Dtype coverage on CPU. The Triton interpreter holds bfloat16 as raw 16-bit words and
would compute on them silently wrong (``x + x``, ``tl.sum``, comparisons) or raise. Under
the patches: casts to and from bf16 are exact or round to nearest even like a GPU (the
stock interpreter truncates float32 -> bf16 and garbles the other bf16 casts), and any
arithmetic, comparison or reduction on bf16 values raises
:class:`ExecutionEnvironmentError`. So every path covers fp32 and fp16 natively (numpy
float16 rounds to nearest even), and bf16 for kernels that upcast loads before computing
(the contract's "all arithmetic in float32", as all kernels here do): bf16 loads, casts
and stores are then bit-exact with a GPU (NaN payloads aside). Kernels that compute in
bf16 cannot be judged on CPU (environment error, never a verdict). The project's own
kernels additionally stage bf16 outputs through float32 scratch on CPU tensors
(``kda_fuzz_kernels.kda_decode.staging``, from before these patches; same result). The
``eager`` path is torch code and covers fp32, fp16 and bf16.

``HELION_INTERPRET=1`` cannot be combined with ``TRITON_INTERPRET=1`` (Helion raises
``IncompatibleInterpretModes`` whenever a ``Settings()`` reads both). The kernels here
pass ``ref_mode`` explicitly, so they never read that pair; :func:`configure_cpu`
maps a ``HELION_INTERPRET=1`` found in the environment onto ``KDA_FUZZ_CPU_MODE=eager``
and drops it when it has to set ``TRITON_INTERPRET=1``. A third-party kernel decorated
with ref mode on is compiled from a ``ref_mode=OFF`` twin in ``triton`` mode.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, cast

import numpy as np
import torch

from kda_fuzz.execution import compiles, configs, variants
from kda_fuzz.execution.patching import after_import, wrap_once

CpuMode = Literal["triton", "eager"]
ENV_VAR = "KDA_FUZZ_CPU_MODE"
CPU_MODES: tuple[CpuMode, ...] = ("triton", "eager")
DEFAULT_CPU_MODE: CpuMode = "triton"

_TRUE = ("1", "true", "yes", "on")


def cpu_mode() -> CpuMode:
    """The CPU execution mode currently selected by ``KDA_FUZZ_CPU_MODE``."""
    value = os.environ.get(ENV_VAR, "").strip().lower() or DEFAULT_CPU_MODE
    if value not in CPU_MODES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(CPU_MODES)}.")
    return cast("CpuMode", value)


def configure_cpu(mode: CpuMode | None = None) -> CpuMode:
    """Select the CPU mode (``None`` keeps the environment's), make the env consistent and
    install the hooks that run any Helion or Triton kernel called on CPU tensors here.

    Safe to call any number of times, before or after the kernels are imported.
    """
    if mode is not None:
        if mode not in CPU_MODES:
            raise ValueError(f"unknown CPU mode {mode!r}; expected one of {CPU_MODES}.")
        os.environ[ENV_VAR] = mode
    helion_interpret = os.environ.get("HELION_INTERPRET", "").lower() in _TRUE
    if helion_interpret:
        os.environ.setdefault(ENV_VAR, "eager")
    elif not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if helion_interpret and os.environ.get("TRITON_INTERPRET") == "1":
        del os.environ["HELION_INTERPRET"]  # both set: Helion would refuse every Settings()
    _install_hooks()
    return cpu_mode()


class ExecutionEnvironmentError(RuntimeError):
    """The CPU execution machinery cannot run a kernel: a fact about the environment,
    never a verdict on the kernel."""


class NotAScalar(TypeError):
    """The kernel used a block where Triton needs a scalar (a loop bound, an index): the
    kernel's error, raised by this module's repair of the interpreter
    (:func:`_scalar_index_patch`), never an environment error."""


EAGER_REFUSAL = (
    f"{ENV_VAR}=eager runs only the project's own Helion kernels: Helion's eager mode "
    "indexes `state[idx, hv, tile_v.index, k_offsets]` with a scalar `idx` as a diagonal "
    "(silently wrong loads, failing stores; spec section 6), so a third-party Helion kernel "
    f"would be judged on numbers it does not compute; use {ENV_VAR}=triton"
)

# True while the project's machinery launches a kernel: hooks let such calls through.
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("kda_fuzz_inside", default=False)


def _on_cpu(values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in values)


# --- hand-written Triton kernels -------------------------------------------------------

_interpreted: dict[Callable[..., Any], Any] = {}
_GPU_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "ptx_options",
                       "launch_cooperative_grid")


def _interpreted_fn(kernel: Any) -> Any:
    from triton.runtime.interpreter import InterpretedFunction

    fn = getattr(kernel, "fn", kernel)
    if fn not in _interpreted:
        _interpreted[fn] = InterpretedFunction(fn)
    return _interpreted[fn]


def _run_interpreted(kernel: Any, grid: Any, args: Sequence[Any], meta: dict[str, Any]) -> Any:
    compiles.note_interpreted()
    variants.interpreted(kernel, args, meta)
    meta = {k: v for k, v in meta.items() if k not in _GPU_LAUNCH_OPTIONS}
    with _interpreter_context(kernel):
        return _interpreted_fn(kernel).run(*args, grid=grid, warmup=False, **meta)


def launch_triton(
    kernel: Any, grid: tuple[int, ...], device: torch.device, *args: Any, **meta: Any
) -> None:
    """Launch a ``@triton.jit`` kernel; on CPU through the interpreter, on GPU compiled."""
    if device.type != "cpu":
        kernel[grid](*args, **meta)
        return
    _run_interpreted(kernel, grid, args, meta)


# --- Helion kernels ----------------------------------------------------------------------

_twins: dict[tuple[int, Any], Any] = {}


def _twin(kernel: Any, ref_mode: Any) -> Any:
    """The same Helion kernel with another ``ref_mode`` (built once per kernel and mode)."""
    import helion

    key = (id(kernel), ref_mode)
    if key not in _twins:
        settings = dataclasses.replace(kernel.settings, ref_mode=ref_mode)
        _twins[key] = (kernel, helion.kernel(kernel.fn, configs=kernel.configs, settings=settings))
    return _twins[key][1]


def _interpreter_launcher(
    triton_kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any
) -> None:
    """Helion ``_launcher`` running the generated Triton under the interpreter."""
    _run_interpreted(triton_kernel, grid, args, kwargs)


def _generated_triton_on_cpu(kernel: Any, args: Sequence[Any]) -> Any:
    """Compile ``kernel`` for ``args`` with one config (no autotuning: the interpreter's
    timings mean nothing) and run the generated Triton under the interpreter."""
    from helion.runtime.ref_mode import RefMode, is_ref_mode_enabled

    if is_ref_mode_enabled(kernel.settings):
        kernel = _twin(kernel, RefMode.OFF)
    bound = kernel.bind(tuple(args))
    config = bound._implicit_config() or (kernel.configs[0] if kernel.configs else None)
    config = configs.choose(bound, config or bound.config_spec.default_config(), args)
    compiled = configs.compiled(bound, config)  # (--helion-configs: kda_fuzz.execution.configs)

    def launch() -> Any:
        try:
            with _interpreter_context():
                return compiled(*args, _launcher=_interpreter_launcher)
        except Exception as e:
            cause = _generated_code_gap(e)
            if cause is None:
                raise
            raise ExecutionEnvironmentError(cause) from e

    return configs.launched(launch, str(getattr(kernel, "name", "kernel")))


def _generated_code_gap(exc: BaseException) -> str | None:
    """Why a failure of Helion's generated Triton under the interpreter is this path's: a
    shape or type error of Triton's frontend on code Helion generated for the config
    chosen here (not the kernel's own source, nor a GPU's config). Seen: size-1
    dimensions emitted as 0-d or 1-d values that the frontend then refuses to broadcast
    or index (``Expected pointer argument to have shape ...``, ``Cannot broadcast, rank
    mismatch``) where the same kernel runs on a GPU."""
    for e in _causes(exc):
        file = _raising_file(e)
        if isinstance(e, (ValueError, TypeError, IndexError)) and file is not None \
                and _under(file, "triton.language"):
            return ("the Triton interpreter cannot run the code Helion generated for this "
                    f"layout on CPU: {_one_line(e)}")
    return None


def run_helion(kernel: Any, args: Sequence[Any]) -> Any:
    """Run a trusted ``@helion.kernel``: compiled on GPU, per ``cpu_mode()`` on CPU (eager
    mode is trusted for the project's own kernels only: :func:`trusted_in_eager`)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or tensors[0].device.type != "cpu":
        return kernel(*args)
    token = _inside.set(True)
    try:
        if cpu_mode() == "eager":
            from helion.runtime.ref_mode import RefMode

            return _twin(kernel, RefMode.EAGER)(*args)
        return _generated_triton_on_cpu(kernel, args)
    finally:
        _inside.reset(token)


# The packages whose Helion kernels eager mode runs (the project's own: they index the
# pool with a one-element tile, never the scalar that eager mode reads as a diagonal).
EAGER_TRUSTED: tuple[str, ...] = ("kda_fuzz_kernels",)


def trusted_in_eager(kernel: Any) -> bool:
    """Whether ``kernel``'s function belongs to a package of :data:`EAGER_TRUSTED`."""
    module = str(getattr(getattr(kernel, "fn", None), "__module__", None) or "")
    return module.split(".")[0] in EAGER_TRUSTED


def _called_helion(kernel: Any, args: Sequence[Any]) -> Any:
    """A Helion kernel called on CPU tensors after :func:`configure_cpu`: the project's own
    as :func:`run_helion` runs it, any other refused in eager mode."""
    if trusted_in_eager(kernel):
        return run_helion(kernel, args)
    if cpu_mode() == "eager":
        raise ExecutionEnvironmentError(EAGER_REFUSAL)
    return _generated_triton_on_cpu(kernel, args)


# --- hooks: third-party kernels called on CPU tensors ------------------------------------


def _hook_helion(module: Any) -> None:
    def on_kernel(kernel_call: Any) -> Any:
        def call_kernel(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _inside.get() or not _on_cpu((*args, *kwargs.values())):
                return kernel_call(self, *args, **kwargs)
            return _called_helion(self, self.normalize_args(*args, **kwargs) if kwargs
                                  else args)
        return call_kernel

    def on_bound(bound_call: Any) -> Any:
        def call_bound(self: Any, *args: Any) -> Any:
            if _inside.get() or not _on_cpu(args):
                return bound_call(self, *args)
            return _called_helion(self.kernel, args)
        return call_bound

    wrap_once(module.Kernel, "__call__", on_kernel)
    wrap_once(module.BoundKernel, "__call__", on_bound)


def _hook_jit(module: Any) -> None:
    def on_run(run: Any) -> Any:
        def hooked(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if warmup or _inside.get() or not _on_cpu((*args, *kwargs.values())):
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)
            return _run_interpreted(self, grid, args, kwargs)
        return hooked

    wrap_once(module.JITFunction, "run", on_run)


def _hook_interpreter(module: Any) -> None:
    """An ``InterpretedFunction`` (a ``@triton.jit`` kernel defined under
    ``TRITON_INTERPRET=1``) launched on CPU tensors runs as a ``JITFunction`` does here
    (:func:`_run_interpreted`); its launches from inside this module get the patches."""
    def on_run(run: Any) -> Any:
        def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
            if "grid" in kwargs and not kwargs.get("warmup") and not _inside.get() \
                    and _on_cpu((*args, *kwargs.values())):
                meta = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
                return _run_interpreted(self, kwargs["grid"], args, meta)
            with _interpreter_context(self):
                return run(self, *args, **kwargs)
        return hooked

    wrap_once(module.InterpretedFunction, "run", on_run)


def _hook_autotuner(module: Any) -> None:
    """On CPU tensors a ``@triton.autotune`` kernel runs its first config: benchmarking
    needs a GPU driver, and the interpreter's timings would mean nothing."""
    def on_run(run: Any) -> Any:
        def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
            if len(self.configs) <= 1 or not _on_cpu((*args, *kwargs.values())):
                return run(self, *args, **kwargs)
            declared, self.configs = self.configs, self.configs[:1]
            self._kda_fuzz_configs = declared  # what it declares (variant coverage)
            try:
                return run(self, *args, **kwargs)
            finally:
                self.configs = declared
        return hooked

    wrap_once(module.Autotuner, "run", on_run)


_HOOKS: dict[str, Callable[[Any], None]] = {
    "helion.runtime.kernel": _hook_helion,
    "triton.runtime.jit": _hook_jit,
    "triton.runtime.interpreter": _hook_interpreter,
    "triton.runtime.autotuner": _hook_autotuner,
}


def _variants_too(_: Any) -> None:
    variants.install()  # (variant coverage: the same modules' launches)


def _install_hooks() -> None:
    """Route Helion and Triton kernels called on CPU tensors through this module: Helion's
    generated Triton and plain ``@triton.jit`` kernels under the patched interpreter (as soon
    as each module is imported: configure_cpu must not import helion)."""
    for name, hook in _HOOKS.items():
        after_import(name, hook)
        after_import(name, _variants_too)
    after_import("helion.runtime.kernel", configs.default_config_hook)


# --- interpreter patches -------------------------------------------------------------------

_NP_LIBDEVICE: dict[str, Callable[..., Any]] = {
    "exp": np.exp,
    "exp2": np.exp2,
    "expm1": np.expm1,
    "log": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "sqrt_rn": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "cbrt": np.cbrt,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "abs": np.abs,
    "fabs": np.abs,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "rint": np.rint,
    "nearbyint": np.rint,
    "pow": np.power,
    "atan2": np.arctan2,
    "fmod": np.fmod,
    "hypot": np.hypot,
    "copysign": np.copysign,
    "fmin": np.fmin,
    "fmax": np.fmax,
    "div_rn": np.divide,
    "fma": lambda x, y, z: x * y + z,
    "isnan": np.isnan,
    "isinf": np.isinf,
    "signbit": np.signbit,
}


def _numpy_libdevice(name: str, np_fn: Callable[..., Any]) -> Callable[..., Any]:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def fn(*args: Any, **_: Any) -> Any:
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        if not tensors:
            return np_fn(*args)
        if any(t.dtype == tl.bfloat16 for t in tensors):
            raise ExecutionEnvironmentError(
                f"libdevice.{name} on bfloat16 values: the Triton interpreter holds bf16 as "
                "raw 16-bit words and has no bfloat16 arithmetic")
        like = max(tensors, key=lambda t: t.handle.data.size)
        data = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        result = np.asarray(np_fn(*data))
        if result.dtype == np.bool_:
            scalar = tl.int1
        else:
            scalar = like.type.scalar
            result = result.astype(like.handle.data.dtype)
        ty = tl.block_type(scalar, like.type.shape) if like.type.is_block() else scalar
        return tl.tensor(TensorHandle(result, scalar), ty)

    return fn


def _missing_libdevice(name: str) -> Callable[..., Any]:
    def fn(*_: Any, **__: Any) -> Any:
        raise ExecutionEnvironmentError(
            f"libdevice.{name} has no implementation under the Triton interpreter "
            "(its stub returns None) and none is patched in")

    return fn


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even as a GPU does."""
    x = np.ascontiguousarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), ((u >> 16) | 0x40).astype(np.uint16), rounded)


def _bf16_patches(interp: Any) -> list[tuple[Any, str, Any]]:
    """Make bfloat16 safe in the interpreter, which holds it as raw 16-bit words: casts
    to/from bf16 round to nearest even (the interpreter truncates, and garbles casts that
    do not involve float32) and any arithmetic on bf16 values raises
    :class:`ExecutionEnvironmentError` (the interpreter would compute on the raw words)."""
    import triton.language as tl

    bf16, builder = tl.bfloat16, interp.InterpreterBuilder
    handle_cls = interp.TensorHandle

    def refuse(*handles: Any) -> None:
        if any(isinstance(h, handle_cls) and h.dtype.scalar == bf16 for h in handles):
            raise ExecutionEnvironmentError(
                "the Triton interpreter has no bfloat16 arithmetic (it computes on the raw "
                "16-bit words); this kernel computes on bfloat16 values")

    def guarded(name: str, check: Callable[..., tuple[Any, ...]]) -> tuple[Any, str, Any]:
        original = getattr(builder, name)

        def fn(self: Any, *args: Any) -> Any:
            refuse(*check(*args))
            return original(self, *args)

        return builder, name, fn

    cast_impl = builder.cast_impl

    def cast(self: Any, src: Any, dst_type: Any) -> Any:
        s, d = src.dtype.scalar, dst_type.scalar
        if bf16 not in (s, d) or s == d:
            return cast_impl(self, src, dst_type)
        f32 = _bf16_to_f32(src.data) if s == bf16 else np.asarray(src.data).astype(np.float32)
        data = _f32_to_bf16(f32) if d == bf16 else f32.astype(interp._get_np_dtype(d))
        return handle_cls(data, d)

    def get_bf16(self: Any, value: float) -> Any:
        return handle_cls(_f32_to_bf16(np.array([value], np.float32)), bf16)

    reduce_apply = interp.ReduceScanOpInterface.apply

    def apply(self: Any, input: Any) -> Any:
        tensors = input if isinstance(input, tuple) else (input,)
        refuse(*(t.handle for t in tensors if isinstance(t, tl.tensor)))
        return reduce_apply(self, input)

    return [
        (builder, "cast_impl", cast),
        (builder, "get_bf16", get_bf16),
        (interp.ReduceScanOpInterface, "apply", apply),
        guarded("binary_op", lambda lhs, rhs, op: (lhs, rhs)),
        guarded("ternary_op", lambda a, b, c, op: () if op is np.where else (a, b, c)),
        guarded("unary_op", lambda arg, op: (arg,)),
        guarded("create_fma", lambda x, y, z: (x, y, z)),
        guarded("create_rsqrt", lambda arg: (arg,)),
        guarded("create_erf", lambda arg: (arg,)),
        guarded("create_dot", lambda a, b, d, *_: (a, b, d)),
    ]


_COMPARISONS = (np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal)


def _mask_patches(interp: Any, binary_op: Callable[..., Any]) -> list[tuple[Any, str, Any]]:
    """Keep comparison results and masks boolean, as on a GPU.

    The interpreter labels a comparison's result with its operands' dtype (``int64`` for
    ``slot >= 0``), so splatting it (``mask_v & valid``) makes 0/1 integers of a mask;
    triton 3.6's loads accepted such masks, triton 3.9's native loads and stores raise
    ``ValueError('mask has unsupported dtype')``. Comparisons are labelled ``int1`` and
    masks reach loads and stores as booleans (nonzero is true, as for an ``i1`` on a GPU).
    """
    import triton.language as tl

    builder, handle_cls = interp.InterpreterBuilder, interp.TensorHandle

    def compare(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        out = binary_op(self, lhs, rhs, op)
        if op in _COMPARISONS:
            return handle_cls(np.asarray(out.data).astype(np.bool_), tl.int1)
        return out

    def boolean(mask: Any) -> Any:
        data = np.asarray(mask.data)
        return mask if data.dtype == np.bool_ else handle_cls(data != 0, tl.int1)

    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store

    def load(self: Any, ptrs: Any, mask: Any, *args: Any) -> Any:
        return masked_load(self, ptrs, boolean(mask), *args)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *args: Any) -> Any:
        return masked_store(self, ptrs, value, boolean(mask), *args)

    return [(builder, "binary_op", compare), (builder, "create_masked_load", load),
            (builder, "create_masked_store", store)]


def _rank0_index_patch() -> list[tuple[Any, str, Any]]:
    """Let a 0-d value be indexed ``x[:, None]`` under the interpreter, as triton 3.6's
    frontend did: it becomes a ``[1]`` block, which broadcasts where a scalar would.

    Helion's generated Triton indexes a slot index loaded as a scalar that way; triton
    3.9's frontend refuses it (``too many indices for tensor of rank 0``), which made every
    kernel of that style fail on CPU under helion 1.5.1. Other indexing is untouched.
    """
    import triton.language as tl

    original = tl.tensor.__getitem__

    @tl.core.builtin
    def getitem(self: Any, slices: Any, _semantic: Any = None) -> Any:
        try:
            return original(self, slices, _semantic=_semantic)
        except ValueError as e:
            if not str(e).startswith("too many indices") or len(self.shape):
                raise
        return _semantic.expand_dims(self, 0)  # a [1], as triton 3.6 made of it

    return [(tl.tensor, "__getitem__", getitem)]


def _scalar_index_patch(interp: Any) -> list[tuple[Any, str, Any]]:
    """Let a one-element value be a Python index under numpy 2.4, as it was before.

    The interpreter holds a scalar (``tl.program_id(0)``, a runtime ``int`` argument) as a
    one-element array and makes an index of it with ``int(data)`` (``range(pid, n, step)``);
    numpy 2.4 refuses ``int()`` of an array of rank > 0 (``TypeError: only 0-dimensional
    arrays can be converted to Python scalars``; deprecated since numpy 1.25; triton fixed
    it after 3.6). A one-element value becomes an index through its element, as numpy < 2.4
    did; a block of several values raises :class:`NotAScalar` (a ``TypeError``, as before:
    the kernel's error, which a GPU's compiler reports too)."""
    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None:
        return []

    def patch_lang_tensor(tensor: Any, scope: Any, *args: Any, **kwargs: Any) -> None:
        original(tensor, scope, *args, **kwargs)
        own = getattr(tensor, "__index__", None)

        def index(self: Any) -> int:
            data = getattr(self.handle, "data", None)
            if not isinstance(data, np.ndarray) and own is not None:
                return own(self)
            data = np.asarray(data)
            if data.size != 1:
                raise NotAScalar(f"a block of {data.size} values used where an index (a "
                                 "scalar) is needed")
            return int(data.reshape(()))

        scope.set_attr(tensor, "__index__", index)

    return [(interp, "_patch_lang_tensor", patch_lang_tensor)]


_MISSING = object()
# id(libdevice stub) -> its replacement, while an interpreter context is active
_stub_replacements: dict[int, Callable[..., Any]] = {}


@contextlib.contextmanager
def _patched(patches: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    saved = [(obj, name, obj.__dict__.get(name, _MISSING) if isinstance(obj, type)
              else getattr(obj, name, _MISSING)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            if value is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


def _stub_globals(kernel: Any) -> list[tuple[Any, str, Any]]:
    """Patches for libdevice stubs the kernel's module imported by name."""
    fn = getattr(kernel, "fn", kernel)
    scope = getattr(fn, "__globals__", None)
    if not scope or not _stub_replacements:
        return []
    return [(_Namespace(scope), name, _stub_replacements[id(v)])
            for name, v in list(scope.items()) if id(v) in _stub_replacements]


class _Namespace:
    """setattr/getattr over a dict (a module's globals)."""

    def __init__(self, scope: dict[str, Any]) -> None:
        object.__setattr__(self, "scope", scope)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.scope[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self.scope[name] = value

    def __delattr__(self, name: str) -> None:
        del self.scope[name]


@contextlib.contextmanager
def _interpreter_context(kernel: Any = None) -> Iterator[None]:
    """Make the Triton interpreter behave as if ``TRITON_INTERPRET=1`` had been set at import,
    and fill its gaps.

    With the variable unset when triton was imported, triton's own ``@jit`` helpers
    (``tl.sum``, ``tl.sigmoid``, ...) are compiled-mode ``JITFunction`` objects that refuse
    to be called; they are routed to the interpreter here. ``libdevice`` gets numpy bodies
    (stubs without one raise :class:`ExecutionEnvironmentError`; ``kernel``'s module gets
    the same for stubs it imported by name), bfloat16 is made safe (:func:`_bf16_patches`)
    and numpy's IEEE warnings are silenced (a GPU does not warn on overflow either).
    Nested contexts only add ``kernel``'s globals.
    """
    if _inside.get() and _stub_replacements:
        with _patched(_stub_globals(kernel)):
            yield
        return
    import triton
    from triton.language.extra import libdevice
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    stubs = {name: fn for name, fn in vars(libdevice).items()
             if inspect.isfunction(fn) and fn.__module__ == libdevice.__name__}
    replacements = {name: _numpy_libdevice(name, _NP_LIBDEVICE[name]) if name in _NP_LIBDEVICE
                    else _missing_libdevice(name) for name in stubs}
    patches = [(libdevice, name, fn) for name, fn in replacements.items()]
    bf16 = _bf16_patches(interpreter)
    binary_op = next(fn for obj, name, fn in bf16 if name == "binary_op")
    patches += [(JITFunction, "__call__", _call_interpreted), *bf16,
                *_mask_patches(interpreter, binary_op), *_rank0_index_patch(),
                *_scalar_index_patch(interpreter)]
    token = _inside.set(True)
    _stub_replacements.update({id(stubs[name]): fn for name, fn in replacements.items()})
    try:
        with _patched(patches), _patched(_stub_globals(kernel)), triton.knobs.runtime.scope(), \
                np.errstate(all="ignore"):
            triton.knobs.runtime.interpret = True
            yield
    finally:
        _stub_replacements.clear()
        _inside.reset(token)


def _call_interpreted(self: Any, *args: Any, **kwargs: Any) -> Any:
    return _interpreted_fn(self)(*args, **kwargs)


# --- classifying failures -----------------------------------------------------------------


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return chain


def _raising_file(exc: BaseException) -> str | None:
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename)


def _module_file(name: str) -> str | None:
    path = getattr(sys.modules.get(name), "__file__", None)
    return os.path.abspath(path) if path else None


def _under(file: str, package: str) -> bool:
    init = _module_file(package)
    return init is not None and file.startswith(os.path.dirname(init) + os.sep)


def _machinery(file: str) -> bool:
    """Files of the execution stack: triton, helion, torch, numpy and this module."""
    return file == _module_file(__name__) or any(
        _under(file, p) for p in ("triton", "helion", "torch", "numpy"))


def _gap(e: BaseException, file: str) -> str | None:
    """The cause when ``e``, raised in machinery file ``file``, is a known gap of it."""
    msg = _one_line(e)
    if file == _module_file(__name__):
        return f"the CPU execution machinery failed: {msg}"
    if file == _module_file("triton.runtime.interpreter") and (
        isinstance(e, NotImplementedError)
        or (isinstance(e, (ValueError, TypeError)) and "unsupported" in str(e))
    ):
        return f"the Triton interpreter cannot run this kernel: {msg}"
    if isinstance(e, AttributeError) and type(getattr(e, "obj", None)).__name__ == (
        "InterpreterBuilder"
    ):
        return f"the Triton interpreter lacks an operation this kernel uses: {msg}"
    if file == _module_file("triton.runtime.driver") or _under(file, "triton.backends"):
        return f"Triton tried to launch on a GPU driver: {msg}"
    if _under(file, "torch.cuda"):
        return f"the kernel needs CUDA: {msg}"
    return _library_failure(e, file)


def _library_failure(e: BaseException, file: str) -> str | None:
    """The cause when ``e``, raised in ``file``, is a kernel library failing in its own code
    with the versions installed here: numpy refusing the library's conversion of an array to
    a scalar, a deprecation of it made an error, a name it imports or uses missing."""
    library = _library(file)
    msg = _one_line(e)
    if library is None:
        return None
    if isinstance(e, TypeError) and any(m in str(e) for m in _NUMPY_SCALAR_CONVERSION):
        return (f"{library} fails in its own code under numpy {_version('numpy')} (its "
                "conversion of an array to a Python scalar, which numpy < 2.4 allowed; not "
                f"the kernel's): {msg}")
    if isinstance(e, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
        return f"a deprecation warning of {library}, made an error by the warning filters: {msg}"
    if isinstance(e, ImportError) or (isinstance(e, AttributeError) and _library_module(
            getattr(e, "obj", None))):
        return f"{library} does not work with the libraries installed here: {msg}"
    return None


# numpy's words when an array cannot become a Python scalar (numpy 2.4 made int() and
# float() of any array of rank > 0 one of them)
_NUMPY_SCALAR_CONVERSION = (
    "only 0-dimensional arrays can be converted to Python scalars",
    "only length-1 arrays can be converted to Python scalars",
    "only integer scalar arrays can be converted to a scalar index",
    "can only convert an array of size 1 to a Python scalar",
)
_LIBRARIES = ("triton", "helion", "numpy", "torch")


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def _library(file: str) -> str | None:
    """``"triton 3.6.0"`` when ``file`` is part of one of the kernel libraries."""
    for name in _LIBRARIES:
        if _under(file, name):
            return f"{name} {_version(name)}"
    return None


def _library_module(obj: Any) -> bool:
    """Whether ``obj`` is a module of one of the kernel libraries (``numpy.foo``)."""
    name = getattr(obj, "__name__", "") if inspect.ismodule(obj) else ""
    return name.split(".")[0] in _LIBRARIES


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:400]


def environment_error(exc: BaseException) -> str | None:
    """The one-line cause when ``exc``, raised while calling a target on CPU, comes from
    the execution machinery rather than from the kernel; ``None`` when it is the kernel's.

    Conservative: besides an :class:`ExecutionEnvironmentError` anywhere in the chain
    (raised only by this module) and a kernel library failing in its own code with the
    versions installed here anywhere in it (:func:`_library_failure`: numpy 2.4 refusing
    triton 3.6's ``int()`` of a one-element array, a deprecation made an error, a name the
    library imports missing; raised inside triton, helion, numpy or torch, never in the
    kernel's files), an exception counts only when it was raised inside
    triton, helion, torch, numpy or this module *and* is a known gap there (interpreter
    features it lacks, a GPU driver or CUDA asked for on CPU, this module failing), and
    only if every exception wrapping it was raised by that machinery too. Anything raised
    by the kernel's own code (its validator, its wrapper, its device code), device
    asserts, and shape or type errors the compiler would report on a GPU too, return None.
    """
    chain = _causes(exc)
    if any(isinstance(e, NotAScalar) for e in chain):
        return None
    for e in chain:
        if isinstance(e, ExecutionEnvironmentError):
            return _one_line(e)
    for e in chain:  # a library failing in its own code: wrapped by the kernel's or not
        file = _raising_file(e)
        cause = None if file is None else _library_failure(e, file)
        if cause is not None:
            return cause
    for e in chain:
        file = _raising_file(e)
        if file is None or not _machinery(file):
            return None
        cause = _gap(e, file)
        if cause is not None:
            return cause
    return None
