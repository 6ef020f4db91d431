"""How the KDA decode kernels execute on CPU tensors (there is no GPU on CI).

One switch, the environment variable ``KDA_FUZZ_CPU_MODE``, read at every launch:

``triton`` (default)
    Helion compiles the kernel to Triton as it would for a GPU, and the generated Triton
    runs under the Triton interpreter. Two interpreter gaps are bridged here:
    ``libdevice`` calls (``libdevice.exp``, ``libdevice.sqrt``, ...) are stubs returning
    None in the interpreter, so they are patched with numpy implementations for the
    duration of the launch; and the kernel reads the slot index as a one-element tile
    (``indices[tile_b]``), never as a loaded scalar, which Helion 1.4.0 would index as
    ``slot[:, None]`` (a miscompile, not only an interpreter problem).
``eager``
    Helion's reference eager mode (what ``HELION_INTERPRET=1`` selects): the kernel body
    runs as plain torch code. It exercises the kernel's math but not Helion's codegen.

The hand-written Triton kernel always runs under the Triton interpreter on CPU tensors,
whatever the mode. Both interpreted paths are built lazily from the kernel's Python
function at launch time (``InterpretedFunction(kernel.fn)`` and a custom Helion
``_launcher``), so, unlike plain ``TRITON_INTERPRET=1``, nothing depends on the order of
environment variables and imports. :func:`configure_cpu` still exports
``TRITON_INTERPRET=1`` on machines without CUDA so that third-party Triton kernels
(reference peers) imported afterwards run too.

Dtype coverage on CPU. The Triton interpreter holds bfloat16 as raw 16-bit words: bf16
loads followed by ``.to(float32)`` are exact, but a float32 -> bf16 cast truncates
(rounds toward zero; the GPU rounds to nearest even) and bf16 arithmetic is wrong or
raises (``InterpreterBuilder`` has no ``get_bf16``). The kernels do all math in float32,
so bf16 *inputs* are native in both interpreted paths; bf16 *outputs* (``out`` and the
state pool) are staged through float32 scratch tensors of the same strides and copied
back with torch's round-to-nearest-even (:func:`stage_bf16_outputs`). fp32 and fp16 are
native everywhere (numpy float16 rounds to nearest even). The ``eager`` path is torch
code and covers fp32, fp16 and bf16 natively.

``HELION_INTERPRET=1`` cannot be combined with ``TRITON_INTERPRET=1`` (Helion raises
``IncompatibleInterpretModes`` whenever a ``Settings()`` reads both). The kernels here
pass ``ref_mode`` explicitly, so they never read that pair; :func:`configure_cpu`
maps a ``HELION_INTERPRET=1`` found in the environment onto ``KDA_FUZZ_CPU_MODE=eager``
and drops it when it has to set ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, cast

import numpy as np
import torch

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
    """Select the CPU mode (``None`` keeps the environment's) and make the env consistent.

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
    return cpu_mode()




def uses_interpreter(t: torch.Tensor) -> bool:
    """True when a kernel launched on ``t`` runs under the Triton interpreter."""
    return t.device.type == "cpu"


# --- hand-written Triton kernels -------------------------------------------------------

_interpreted: dict[Callable[..., Any], Any] = {}


def _interpreted_fn(kernel: Any) -> Any:
    from triton.runtime.interpreter import InterpretedFunction

    fn = getattr(kernel, "fn", kernel)
    if fn not in _interpreted:
        _interpreted[fn] = InterpretedFunction(fn)
    return _interpreted[fn]


def launch_triton(
    kernel: Any, grid: tuple[int, ...], device: torch.device, *args: Any, **meta: Any
) -> None:
    """Launch a ``@triton.jit`` kernel; on CPU through the interpreter, on GPU compiled."""
    if device.type != "cpu":
        kernel[grid](*args, **meta)
        return
    meta = {k: v for k, v in meta.items() if k not in ("num_warps", "num_stages")}
    with _interpreter_context():
        _interpreted_fn(kernel).run(*args, grid=grid, warmup=False, **meta)


# --- Helion kernels ----------------------------------------------------------------------

_eager_twins: dict[int, Any] = {}


def _eager_twin(kernel: Any) -> Any:
    """The same Helion kernel with ``ref_mode=EAGER`` (built once per kernel)."""
    import helion
    from helion.runtime.ref_mode import RefMode

    key = id(kernel)
    if key not in _eager_twins:
        settings = dataclasses.replace(kernel.settings, ref_mode=RefMode.EAGER)
        _eager_twins[key] = (
            kernel,
            helion.kernel(kernel.fn, configs=kernel.configs, settings=settings),
        )
    return _eager_twins[key][1]


def _interpreter_launcher(
    triton_kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any
) -> None:
    """Helion ``_launcher`` running the generated Triton under the interpreter."""
    for name in ("num_warps", "num_stages", "ptx_options", "launch_cooperative_grid"):
        kwargs.pop(name, None)
    _interpreted_fn(triton_kernel).run(*args, grid=grid, warmup=False, **kwargs)


def run_helion(kernel: Any, args: Sequence[Any]) -> Any:
    """Run a ``@helion.kernel`` on ``args``: compiled on GPU, per ``cpu_mode()`` on CPU."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or tensors[0].device.type != "cpu":
        return kernel(*args)
    if cpu_mode() == "eager":
        return _eager_twin(kernel)(*args)
    compiled = kernel.bind(tuple(args)).compile_config()
    with _interpreter_context():
        return compiled(*args, _launcher=_interpreter_launcher)


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


def _numpy_libdevice(np_fn: Callable[..., Any]) -> Callable[..., Any]:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def fn(*args: Any, **_: Any) -> Any:
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        if not tensors:
            return np_fn(*args)
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


@contextlib.contextmanager
def _interpreter_context() -> Iterator[None]:
    """Make the Triton interpreter behave as if ``TRITON_INTERPRET=1`` had been set at import.

    With the variable unset when triton was imported, triton's own ``@jit`` helpers
    (``tl.sum``, ``tl.sigmoid``, ...) are compiled-mode ``JITFunction`` objects that refuse
    to be called; they are routed to the interpreter here. ``libdevice`` gets real bodies
    and numpy's IEEE warnings are silenced (a GPU does not warn on overflow either).
    """
    import triton
    from triton.language.extra import libdevice
    from triton.runtime.jit import JITFunction

    saved = {name: getattr(libdevice, name) for name in _NP_LIBDEVICE if hasattr(libdevice, name)}
    jit_call = JITFunction.__call__
    try:
        for name in saved:
            setattr(libdevice, name, _numpy_libdevice(_NP_LIBDEVICE[name]))
        JITFunction.__call__ = _call_interpreted  # type: ignore[method-assign]
        with triton.knobs.runtime.scope(), np.errstate(all="ignore"):
            triton.knobs.runtime.interpret = True
            yield
    finally:
        JITFunction.__call__ = jit_call  # type: ignore[method-assign]
        for name, fn in saved.items():
            setattr(libdevice, name, fn)


def _call_interpreted(self: Any, *args: Any, **kwargs: Any) -> Any:
    return _interpreted_fn(self)(*args, **kwargs)


@contextlib.contextmanager
def stage_bf16_outputs(
    out: torch.Tensor, state: torch.Tensor, indices: torch.Tensor, enabled: bool = True
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(out, state)`` to launch on, staging bf16 ones through float32 scratch.

    The interpreter casts float32 -> bf16 by truncation; staging lets torch do the final
    cast with round-to-nearest-even, as the GPU does. The state scratch keeps the pool's
    strides (so stride handling stays exercised) and only the slots named by an in-range
    index travel in and out; other slots stay bit-identical. With
    ``enabled=False`` (compiled GPU launches) the caller's tensors are yielded as they are.
    """
    stage_out = enabled and out.dtype == torch.bfloat16
    stage_state = enabled and state.dtype == torch.bfloat16
    if not (stage_out or stage_state):
        yield out, state
        return
    out_k = torch.empty(out.shape, dtype=torch.float32) if stage_out else out
    state_k, slots = state, None
    if stage_state:
        state_k = torch.empty_strided(state.shape, state.stride(), dtype=torch.float32)
        slots = indices[(indices >= 0) & (indices < state.shape[0])].to(torch.long)
        state_k[slots] = state[slots].to(torch.float32)
    yield out_k, state_k
    if stage_out:
        out.copy_(out_k)
    if slots is not None:
        state[slots] = state_k[slots].to(torch.bfloat16)
