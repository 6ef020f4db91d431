"""Building blocks of the minimizer's moves (:mod:`kda_fuzz.campaign.minimize`), for families'
shrinkers (:class:`kda_fuzz.engine.contract.Shrinker`): the ``Move`` type, what a move sees
(``ShrinkContext``), and helpers that rebuild a strided argument with other values or
another shape while keeping its padding and guard cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

# the guard values, as the layouts build them (INT_SENTINEL re-exported)
from kda_fuzz.engine.case import INT_SENTINEL as INT_SENTINEL
from kda_fuzz.engine.case import BaseMarks as BaseMarks
from kda_fuzz.engine.case import Case, TensorArg, footprint, sentinel

SMALL_AXIS = 64  # axes up to this long try every chunk position ...
MAX_POSITIONS = 8  # ... longer ones this many per chunk size

# bases whose cells outside the view are known to hold the sentinel (made by ``make``)
SENTINEL_OUTSIDE = BaseMarks("sentinel-outside")


class CostModel(Protocol):
    """The minimizer's objective, as moves see it (``minimize._Costs``)."""

    def encoded(self, arg: TensorArg) -> int:
        """Encoded bytes of ``arg``'s base in a corpus file."""

    def predict(self, case: Case, after: Mapping[str, tuple[int, Sequence[int]]]) -> float:
        """The cost of ``case`` once the named tensors hold (bytes, shape) ``after``."""


@dataclass(frozen=True)
class ShrinkContext:
    """What a family's shrinker is told about the current step: the objective, the
    case's cost, its variant, and whether the contract accepts it (and it is no semantic
    breakage), so that moves may rely on its structure."""

    costs: CostModel
    size: float
    variant: str
    accepted: bool


@dataclass(frozen=True)
class Move:
    """One candidate: how to build it, and the encoded size its result is predicted to have.

    ``simplify``: kept at equal size (and at any size up to ``SIMPLE_BYTES``).
    ``same_shape``: every tensor keeps its shape, strides and dtype (new values or
    scalars only), so a shape-specialising kernel runs the candidate without compiling.
    """

    label: str
    build: Callable[[], Case]
    size: float
    simplify: bool = False
    same_shape: bool = False


class Skip(Exception):
    """A candidate that cannot be built on this layout."""


# ------------------------------------------------------------------ tensor helpers


def tail(arg: TensorArg) -> int:
    """Guard cells after the last element the view reaches."""
    return max(0, arg.base.numel() - max(arg.footprint(), arg.offset))


def overlapping(shape: Sequence[int], stride: Sequence[int]) -> bool:
    need = 1
    for st, n in sorted((s, n) for s, n in zip(stride, shape) if n > 1):
        if st < need:
            return True
        need = st * n
    return False


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def make(values: torch.Tensor | None, like: TensorArg, shape: Sequence[int],
          stride: Sequence[int], offset: int, tail: int,
          dtype: torch.dtype | None = None) -> TensorArg:
    """A fresh argument: sentinel-filled base, the view written with ``values``."""
    dtype = dtype or like.dtype
    shape, stride = tuple(int(n) for n in shape), tuple(int(s) for s in stride)
    size = max(footprint(shape, stride, offset), offset) + tail
    if like.device.type == "meta":
        return TensorArg(torch.empty(size, dtype=dtype, device="meta"), shape, stride, offset)
    base = torch.full((size,), sentinel(dtype), dtype=dtype, device=like.device)
    SENTINEL_OUTSIDE.add(base)
    arg = TensorArg(base, shape, stride, offset)
    if values is not None and base.numel() and all(shape):
        if overlapping(shape, stride):
            raise Skip("overlapping view")
        arg.view().copy_(values.to(device=like.device, dtype=dtype).reshape(shape))
    return arg


def relayout(arg: TensorArg, shape: Sequence[int]) -> tuple[int, ...]:
    """Strides for ``shape`` that keep ``arg``'s per-dim padding (row-major layouts only)."""
    old_shape, old = arg.shape, arg.stride
    if len(shape) != len(old_shape):
        raise Skip("rank changed")
    if not old_shape:
        return ()
    n = len(shape)
    new = [0] * n
    new[-1] = old[-1]
    for d in range(n - 2, -1, -1):
        pad = old[d] - old_shape[d + 1] * old[d + 1]
        if old_shape[d] <= 1:
            pad = max(pad, 0)
        if pad < 0:
            raise Skip("not a row-major layout")
        new[d] = shape[d + 1] * new[d + 1] + pad
    return tuple(new)


def reshaped(arg: TensorArg, values: torch.Tensor) -> TensorArg:
    """``arg`` holding ``values`` (a new shape), padding and guard cells kept."""
    shape = tuple(values.shape)
    return make(values, arg, shape, relayout(arg, shape), arg.offset, tail(arg))


def select(arg: TensorArg, dim: int, index: Sequence[int] | torch.Tensor) -> TensorArg:
    if isinstance(index, range):
        idx = torch.arange(index.start, index.stop, index.step)
    else:
        idx = torch.as_tensor(index, dtype=torch.long)
    if arg.device.type == "meta":
        shape = list(arg.shape)
        shape[dim] = idx.numel()
        return make(None, arg, shape, relayout(arg, shape), arg.offset, tail(arg))
    return reshaped(arg, arg.view().index_select(dim, idx.to(arg.device)))


def with_values(arg: TensorArg, values: torch.Tensor) -> TensorArg:
    """The same layout and guard cells, with the view's elements replaced."""
    if arg.device.type == "meta":
        raise Skip("meta tensor")
    if overlapping(arg.shape, arg.stride):
        raise Skip("overlapping view")
    new = TensorArg(arg.base.clone(), arg.shape, arg.stride, arg.offset)
    new.view().copy_(values.to(device=arg.device, dtype=arg.dtype).reshape(arg.shape))
    if arg.base in SENTINEL_OUTSIDE:
        SENTINEL_OUTSIDE.add(new.base)
    return new


def same_values(arg: TensorArg, values: torch.Tensor) -> bool:
    if arg.device.type == "meta":
        return True
    return torch.equal(arg.view(), values.to(device=arg.device, dtype=arg.dtype))


def replace_in(case: Case, tensors: dict[str, TensorArg] | None = None,
             scalars: dict[str, Any] | None = None) -> Case:
    t = dict(case.tensors)
    t.update(tensors or {})
    s = dict(case.scalars)
    s.update(scalars or {})
    return Case(case.contract, case.variant, t, s, case.intent, dict(case.notes))


def raw_bytes(arg: TensorArg) -> int:
    return 0 if arg.device.type == "meta" else arg.base.numel() * arg.base.element_size()


def raw_after(arg: TensorArg, shape: Sequence[int], dtype: torch.dtype | None = None) -> int:
    """Bytes of ``arg``'s base once reshaped to ``shape`` (padding and guards kept)."""
    try:
        stride = relayout(arg, shape)
    except Skip:
        stride = contiguous_strides(shape)
    n = max(footprint(shape, stride, arg.offset), arg.offset) + tail(arg)
    return n * (dtype or arg.dtype).itemsize


def chunks(n: int, avoid: int | None = None, whole: bool = False) -> Iterator[tuple[int, int]]:
    """(start, stop) of chunks of ``range(n)``: the whole range when ``whole``, then halves,
    quarters... (ddmin order); chunks holding ``avoid`` last within a size, and at most
    ``MAX_POSITIONS`` chunks per size when ``n > SMALL_AXIS``."""
    if whole and n:
        yield 0, n
    size = n // 2
    while size >= 1:
        spans = [(s, min(n, s + size)) for s in range(0, n, size)]
        spans.sort(key=lambda sp: avoid is not None and sp[0] <= avoid < sp[1])
        yield from spans if n <= SMALL_AXIS else spans[:MAX_POSITIONS]
        size //= 2
