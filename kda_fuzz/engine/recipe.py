"""Recipes: tensor values regenerated from a few parameters instead of being stored.

A recipe gives the value of every element of a base buffer as a function of its position
``p`` in the base (and the recipe's parameters) alone, computed with integer table look-ups
and exact arithmetic, so that it is bit-identical on every platform, device and torch
version (no ``torch.Generator`` stream is involved):

* ``grid`` (floating dtypes): ``TABLE(seed)[p % PERIOD] / 128 * 2**exponent``, where
  ``TABLE(seed)`` holds ``PERIOD`` integers in ``-127..127`` made by a 32-bit integer
  hash of ``(seed, j)``. Every value is a multiple of ``2**(exponent - 7)`` with a 7-bit
  magnitude, exactly representable in float16 (for exponents in ``FP16_EXPONENTS``),
  bfloat16, float32 and float64. The period is prime, so rows or blocks of any
  power-of-two size never repeat each other.
* ``arange`` (integer dtypes): ``start + step * p``.

A recipe may cover the view only (``outside``: the integer word of one element that every
cell the view does not reach holds, e.g. the NaN guard). The corpus format stores a base
as its recipe plus the elements that differ from it (:mod:`kda_fuzz.corpus.store`,
encoding ``recipe``); this module only makes values. :data:`HINTS` remembers, per base
tensor, the recipe it was made from and which of its cells may differ from it, so that
the writer knows which recipe to compare it with and the minimizer what it may still
regenerate.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kda_fuzz.engine.case import TensorArg
from kda_fuzz.engine.shrink import SENTINEL_OUTSIDE, BaseMarks, overlapping, sentinel

PERIOD = 65521  # the largest prime below 2**16
GRID_STEPS = 127  # |table value| at most this; values are k / 128 * 2**exponent
EXPONENTS = (-60, 60)  # the exponents a file may give ...
FP16_EXPONENTS = (-17, 15)  # ... and for float16, where every grid value is exact
MAX_RANGES = 1 << 12  # a hint lists at most this many ranges (else one that covers them)
CHUNK = 1 << 24  # elements compared or masked per step (a bounded scratch on any base)
_M32 = 0xFFFFFFFF
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
NAMES = ("grid", "arange")
Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Recipe:
    """One recipe: ``grid`` (``seed``, ``exponent``) or ``arange`` (``start``, ``step``)."""

    name: str
    seed: int = 0
    exponent: int = 0
    start: int = 0
    step: int = 0

    def to_json(self) -> dict[str, Any]:
        """The recipe as a corpus file gives it."""
        if self.name == "grid":
            return {"name": "grid", "seed": self.seed, "exponent": self.exponent}
        return {"name": "arange", "start": self.start, "step": self.step}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Recipe:
        """A recipe as a corpus file gives it; ``ValueError`` naming the field when bad."""
        if not isinstance(obj, dict):
            raise ValueError(f"{where} must be an object")
        name = obj.get("name")
        if name not in NAMES:
            raise ValueError(f"{where}.name: unknown recipe {name!r} (known: {', '.join(NAMES)})")
        keys = {"grid": ("seed", "exponent"), "arange": ("start", "step")}[name]
        extra = set(obj) - {"name", *keys}
        if extra:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
        vals = {}
        for k in keys:
            v = obj.get(k)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{where}.{k} must be an integer")
            vals[k] = v
        if name == "grid":
            if not 0 <= vals["seed"] <= _M32:
                raise ValueError(f"{where}.seed must lie in 0..2**32-1")
            if not EXPONENTS[0] <= vals["exponent"] <= EXPONENTS[1]:
                raise ValueError(f"{where}.exponent must lie in {EXPONENTS[0]}..{EXPONENTS[1]}")
        else:
            for k in keys:
                if abs(vals[k]) >= 2**62:
                    raise ValueError(f"{where}.{k} must lie within +-2**62")
        return cls(name, **vals)

    def check(self, dtype: torch.dtype, numel: int, where: str) -> None:
        """``ValueError`` naming ``where`` when this recipe cannot make ``numel`` elements of
        ``dtype`` exactly."""
        if self.name == "grid":
            if not dtype.is_floating_point:
                raise ValueError(f"{where}.name: the grid recipe makes floating values, "
                                 f"not {dtype}")
            lo, hi = FP16_EXPONENTS
            if dtype == torch.float16 and not lo <= self.exponent <= hi:
                raise ValueError(f"{where}.exponent must lie in {lo}..{hi} for float16")
            return
        if dtype.is_floating_point or dtype == torch.bool:
            raise ValueError(f"{where}.name: the arange recipe makes integers, not {dtype}")
        info = torch.iinfo(dtype)
        last = self.start + self.step * max(0, numel - 1)
        if not (info.min <= self.start <= info.max and info.min <= last <= info.max):
            raise ValueError(f"{where}: the arange recipe leaves {dtype}'s range")


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of ``x`` (int64 values in 0..2**32-1): products stay below
    2**63, so no step overflows."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


@functools.lru_cache(maxsize=32)
def table(seed: int) -> torch.Tensor:
    """The ``PERIOD`` integers (int16, ``-127..127``) of a grid recipe's seed."""
    j = torch.arange(PERIOD, dtype=torch.int64)
    h = _mix32((j * 0x9E3779B1 + _mix32(torch.tensor(seed & _M32, dtype=torch.int64)))
               & _M32)
    return (h % (2 * GRID_STEPS + 1) - GRID_STEPS).to(torch.int16)


@functools.lru_cache(maxsize=32)
def _period(seed: int, exponent: int, dtype: torch.dtype) -> torch.Tensor:
    """One period of a grid recipe's values in ``dtype`` (exact: see the module doc)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return (table(seed).to(work) * (2.0 ** (exponent - 7))).to(dtype)


def realize(recipe: Recipe, numel: int, dtype: torch.dtype, shape: Sequence[int] = (),
            stride: Sequence[int] = (), offset: int = 0, outside: int | None = None,
            device: torch.device | str = "cpu") -> torch.Tensor:
    """A base of ``numel`` elements of ``dtype`` made by ``recipe``: everywhere, or, with
    ``outside`` (the integer word of one element), only in the cells the view
    (``shape``, ``stride``, ``offset``) reaches, every other cell holding ``outside``."""
    if recipe.name == "arange":
        base = (torch.arange(numel, dtype=torch.int64, device=device) * recipe.step
                + recipe.start).to(dtype)
    else:
        per = _period(recipe.seed, recipe.exponent, dtype).to(device)
        base = torch.empty(numel, dtype=dtype, device=device)
        whole = numel // PERIOD
        if whole:
            base[: whole * PERIOD].view(whole, PERIOD).copy_(per.expand(whole, PERIOD))
        base[whole * PERIOD:] = per[: numel - whole * PERIOD]
    if outside is None:
        return base
    words = base.view(_INT_OF_SIZE[base.element_size()])
    mask = torch.ones(numel, dtype=torch.bool, device=device)  # True: outside the view
    if math.prod(shape) and numel:
        mask.as_strided(tuple(shape), tuple(stride), offset).fill_(False)
    for lo in range(0, numel, CHUNK):
        words[lo:lo + CHUNK].masked_fill_(mask[lo:lo + CHUNK], outside)
    return base


@dataclass(frozen=True)
class Hint:
    """How a base was made: ``recipe``, ``outside`` (the word every cell outside its view
    holds, or None: the recipe everywhere), and ``kept``: the ranges ``[lo, hi)`` of base
    positions that may hold other values (``()``: none, the base is as the recipe made
    it; ``None``: not known)."""

    recipe: Recipe
    outside: int | None
    kept: Ranges | None = ()

    @property
    def pure(self) -> bool:
        """Whether the base is exactly what its recipe made."""
        return self.kept == ()


HINTS = BaseMarks("recipe")  # base tensor -> Hint


def hint_of(base: torch.Tensor) -> Hint | None:
    """The recipe ``base`` was made from, if it was."""
    return HINTS.get(base)


def ranges_of(positions: torch.Tensor) -> Ranges:
    """Sorted distinct base positions as ranges ``[lo, hi)`` of consecutive ones (one
    range covering them all past ``MAX_RANGES``)."""
    if positions.numel() == 0:
        return ()
    pos = positions.detach().cpu().to(torch.int64)
    breaks = (pos[1:] - pos[:-1] != 1).nonzero().squeeze(1)
    if breaks.numel() + 1 > MAX_RANGES:
        return ((int(pos[0]), int(pos[-1]) + 1),)
    starts = [int(pos[0]), *(pos[breaks + 1]).tolist()]
    ends = [*(pos[breaks] + 1).tolist(), int(pos[-1]) + 1]
    return tuple(zip(starts, ends))


def kept_count(kept: Ranges) -> int:
    """Base positions the ranges cover."""
    return sum(hi - lo for lo, hi in kept)


def without(kept: Ranges, lo: int, hi: int) -> Ranges:
    """``kept`` less the positions ``[lo, hi)``."""
    out: list[tuple[int, int]] = []
    for a, b in kept:
        if b <= lo or a >= hi:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo))
        if hi < b:
            out.append((hi, b))
    return tuple(out)


def differing(arg: TensorArg, hint: Hint) -> torch.Tensor:
    """The base positions (sorted, int64, on cpu) where ``arg``'s base differs from what
    ``hint``'s recipe makes, bit for bit."""
    flat = arg.base.detach().reshape(-1)
    n = flat.numel()
    itype = _INT_OF_SIZE[flat.element_size()]
    want = realize(hint.recipe, n, flat.dtype, arg.shape, arg.stride, arg.offset,
                   hint.outside, device=flat.device).view(itype)
    have = flat.view(itype)
    found = [(have[lo:lo + CHUNK] != want[lo:lo + CHUNK]).nonzero().squeeze(1).cpu() + lo
             for lo in range(0, n, CHUNK)]
    return torch.cat(found) if found else torch.empty(0, dtype=torch.int64)


def known_kept(arg: TensorArg) -> Ranges | None:
    """The ranges of ``arg``'s base that may differ from its recipe (computed once when
    its hint does not say); None for a base made from no recipe."""
    h = hint_of(arg.base)
    if h is None:
        return None
    if h.kept is None:
        h = Hint(h.recipe, h.outside, ranges_of(differing(arg, h)))
        HINTS.add(arg.base, h)
    return h.kept


def seed_of(name: str, salt: int = 0) -> int:
    """A grid seed for the tensor called ``name`` (tensors of one case differ)."""
    return (zlib.crc32(name.encode()) + salt * 0x9E3779B1) & _M32


def exponent_for(view: torch.Tensor) -> int:
    """The grid exponent whose values span about the magnitudes of ``view``'s finite
    elements (0 when none is finite and non-zero); within float16's exact range for
    float16 views."""
    top = 0.0
    if view.numel():
        flat = view.detach().reshape(-1)
        for lo in range(0, flat.numel(), CHUNK):
            part = flat[lo:lo + CHUNK].double().abs()
            part = part[torch.isfinite(part)]
            if part.numel():
                top = max(top, float(part.max()))
    e = 0 if top == 0.0 else math.ceil(math.log2(top))
    lo, hi = FP16_EXPONENTS if view.dtype == torch.float16 else (-40, 40)
    return max(lo, min(hi, e))


def grid_recipe(arg: TensorArg, name: str) -> Recipe:
    """A grid recipe for ``arg`` (a floating tensor called ``name``) of about the
    magnitudes of its view's values."""
    return Recipe("grid", seed_of(name), exponent_for(arg.view()))


def outside_word(arg: TensorArg) -> int | None:
    """The guard word a recipe version of ``arg`` keeps outside its view: the dtype's
    sentinel, or None when the view covers every cell of the base."""
    n = math.prod(arg.shape)
    if arg.base.numel() == n and not overlapping(arg.shape, arg.stride):
        return None
    itemsize = arg.base.element_size()
    word = torch.tensor([sentinel(arg.dtype)], dtype=arg.dtype).view(_INT_OF_SIZE[itemsize])
    return int(word.item())


def regenerate(arg: TensorArg, recipe: Recipe, outside: int | None,
               keep: Ranges = ()) -> TensorArg:
    """``arg``'s layout (shape, strides, offset, base size) holding ``recipe``'s values in
    its view and ``outside`` elsewhere, except the base ranges ``keep``, copied from
    ``arg``'s base; hinted in :data:`HINTS` (and, with nothing kept, as
    sentinel-guarded), so that a corpus file stores it as the recipe and a patch."""
    keep = tuple((lo, hi) for lo, hi in keep if hi > lo)
    old = arg.base.detach()
    base = realize(recipe, old.numel(), arg.dtype, arg.shape, arg.stride, arg.offset,
                   outside, device=old.device)
    for lo, hi in keep:
        base[lo:hi] = old[lo:hi]
    HINTS.add(base, Hint(recipe, outside, keep))
    if outside is not None and not keep:
        SENTINEL_OUTSIDE.add(base)
    return TensorArg(base, arg.shape, arg.stride, arg.offset)


def off_grid(arg: TensorArg, recipe: Recipe) -> torch.Tensor:
    """A mask of ``arg``'s view: the elements that are no value a grid of ``recipe``'s
    exponent makes (any non-finite one included)."""
    x = arg.view().detach().double() * (2.0 ** (7 - recipe.exponent))
    return ~(torch.isfinite(x) & (x == x.round()) & (x.abs() <= GRID_STEPS))


def view_positions(arg: TensorArg, mask: torch.Tensor) -> torch.Tensor:
    """The base positions (sorted, distinct, int64, on cpu) of the view elements
    ``mask`` selects."""
    if not arg.shape:
        return torch.tensor([arg.offset] if bool(mask) else [], dtype=torch.int64)
    nz = mask.nonzero().cpu()
    pos = (nz * torch.tensor(arg.stride, dtype=torch.int64)).sum(1) + arg.offset
    return torch.unique(pos)


def carry_hints(old: Mapping[str, TensorArg], new: Mapping[str, TensorArg]) -> None:
    """Copy the hints of ``old``'s bases onto ``new``'s (the same tensors, moved)."""
    for n, a in old.items():
        b = new.get(n)
        h = hint_of(a.base)
        if h is not None and b is not None and b.base is not a.base:
            HINTS.add(b.base, h)


__all__ = ["CHUNK", "HINTS", "PERIOD", "Hint", "Recipe", "carry_hints", "differing",
           "exponent_for", "grid_recipe", "hint_of", "kept_count", "known_kept", "off_grid",
           "outside_word", "ranges_of", "realize", "regenerate", "seed_of", "table",
           "view_positions", "without"]
