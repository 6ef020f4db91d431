"""A concrete fuzz case: every tensor argument as a strided view of its own base buffer."""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kda_fuzz.execution.configs import NOTE


def footprint(shape: Sequence[int], stride: Sequence[int], offset: int = 0) -> int:
    """Base elements a view of ``shape``/``stride`` at ``offset`` can reach (0 if empty)."""
    if any(n == 0 for n in shape):
        return 0
    return offset + 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride))


class BaseMarks:
    """A value remembered per tensor object while it lives (by identity: tensors compare
    elementwise, so weak sets and dicts of them do not work). Each is registered under its
    ``name``, and a pickled :class:`TensorArg` carries its base's marks with it (a finding
    sent from a job to the parent keeps the recipes its bases were made from)."""

    registry: ClassVar[dict[str, BaseMarks]] = {}

    def __init__(self, name: str) -> None:
        if name in BaseMarks.registry:
            raise ValueError(f"base marks {name!r} already exist")
        self.name = name
        self._marks: dict[int, tuple[weakref.ref[torch.Tensor], Any]] = {}
        BaseMarks.registry[name] = self

    def get(self, t: torch.Tensor, default: Any = None) -> Any:
        hit = self._marks.get(id(t))
        return hit[1] if hit is not None and hit[0]() is t else default

    def add(self, t: torch.Tensor, value: Any = True) -> None:
        key = id(t)
        self._marks[key] = (weakref.ref(t, lambda _, key=key: self._marks.pop(key, None)), value)

    def __contains__(self, t: torch.Tensor) -> bool:
        return self.get(t) is not None


def marks_of(t: torch.Tensor) -> dict[str, Any]:
    """Every registered mark of ``t``, by name."""
    return {name: v for name, m in BaseMarks.registry.items()
            if (v := m.get(t)) is not None}


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument: a ``base`` buffer (1-D, contiguous) and the view taken of it.

    Elements of ``base`` outside the view are guard cells: a target must never write them.
    A ``meta`` base carries no data.
    """

    base: torch.Tensor
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    @property
    def device(self) -> torch.device:
        return self.base.device

    def view(self, base: torch.Tensor | None = None) -> torch.Tensor:
        """The argument as the target sees it, on ``base`` (default: this arg's own base)."""
        src = self.base if base is None else base
        return src.as_strided(self.shape, self.stride, self.offset)

    def footprint(self) -> int:
        """Number of base elements the view can reach (0 for an empty view)."""
        return footprint(self.shape, self.stride, self.offset)

    def on(self, device: torch.device | str) -> TensorArg:
        """The same argument with its base moved to ``device``."""
        return TensorArg(self.base.to(device), self.shape, self.stride, self.offset)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        marks = marks_of(self.base)
        if marks:
            state["marks"] = marks
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        marks = state.pop("marks", {})
        for k, v in state.items():
            object.__setattr__(self, k, v)
        for name, v in marks.items():  # (marks of a module not imported here are dropped)
            m = BaseMarks.registry.get(name)
            if m is not None:
                m.add(self.base, v)


INT_SENTINEL = 2**30 + 7  # the guard value of integer buffers: an out-of-range index if read


@functools.cache
def sentinel(dtype: torch.dtype) -> float | int | bool:
    """The value guard cells of a ``dtype`` buffer hold (NaN for floating dtypes)."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return False
    return min(INT_SENTINEL, torch.iinfo(dtype).max)


def _dense(shape: Sequence[int], pad: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for n, extra in zip(reversed(shape), reversed(pad)):
        step += extra
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _overlaps(shape: Sequence[int], stride: Sequence[int]) -> bool:
    reach = 1
    for s, n in sorted((s, n) for s, n in zip(stride, shape) if n > 1):
        if s < reach:
            return True
        reach += (n - 1) * s
    return False


def guarded_arg(shape: Sequence[int], dtype: torch.dtype, values: torch.Tensor | None = None,
                *, stride: Sequence[int] | None = None, pad: Sequence[int] | None = None,
                guard: int = 0, device: str | torch.device = "cpu") -> TensorArg:
    """A tensor argument of ``shape`` and ``dtype``: a view of a base buffer whose other
    cells hold :func:`sentinel` (guard cells, which a target must not write), holding
    ``values`` (converted to ``dtype``; None: sentinels).

    ``stride``: the view's strides (default: row-major); ``pad``: instead, the guard cells
    after each step along each dimension (on ``[4, 8]``, ``pad=(3, 0)``: rows 11 apart,
    8 elements then 3 guard cells; ``pad=(0, 1)``: elements 2 apart, rows 16); ``guard``:
    guard cells before and after the view. A row-major view
    with neither padding nor guard cells has no cell left for a sentinel. On the ``meta``
    device the base carries no data."""
    shape = tuple(int(n) for n in shape)
    if stride is not None and pad is not None:
        raise ValueError("give stride or pad, not both")
    if pad is not None and len(pad) != len(shape):
        raise ValueError(f"pad {tuple(pad)} does not match shape {shape}")
    if stride is not None and len(stride) != len(shape):
        raise ValueError(f"stride {tuple(stride)} does not match shape {shape}")
    if guard < 0 or any(p < 0 for p in pad or ()) or any(s < 0 for s in stride or ()):
        raise ValueError("strides, pads and guard cells cannot be negative")
    dense = _dense(shape, (0,) * len(shape))
    stride = tuple(int(s) for s in stride) if stride is not None else _dense(shape, pad or
                                                                             (0,) * len(shape))
    foot = footprint(shape, stride)
    size = 2 * guard + foot
    if torch.device(device).type == "meta":
        return TensorArg(torch.empty(size, dtype=dtype, device="meta"), shape, stride, guard)
    # values on the host for a device buffer (pinned, as the builders make them): no sync
    host_copy = values is not None and values.device.type == "cpu" \
        and torch.device(device).type != "cpu"
    if values is not None and foot and not guard and values.numel() == foot and all(
            s == d for s, d, n in zip(stride, dense, shape) if n > 1):
        # a row-major view covering its whole base: no cell is left for a sentinel
        base = torch.empty(size, dtype=dtype, device=device).copy_(values.reshape(-1),
                                                                   non_blocking=host_copy)
        return TensorArg(base, shape, stride)
    base = torch.full((size,), sentinel(dtype), dtype=dtype, device=device)
    arg = TensorArg(base, shape, stride, guard)
    if values is not None and foot:
        if not _overlaps(shape, stride):
            # converts to dtype as it copies
            arg.view().copy_(values.reshape(shape), non_blocking=host_copy)
        else:  # overlapping view (a zero stride): fill the cells it reaches, in base order
            flat = values.flatten().to(dtype)
            n = min(foot, flat.numel())
            base[guard : guard + n] = flat[:n]
    return arg


def _specialized(case: Case) -> tuple[Any, ...]:
    """Everything of ``case`` a kernel specializes on: each tensor's shape, strides,
    offset and dtype, and the scalars (values and buffers aside)."""
    return (sorted(case.scalars.items()),
            sorted((n, t.shape, t.stride, t.offset, str(t.dtype))
                   for n, t in case.tensors.items()))


def signature(case: Case) -> str:
    """:func:`_specialized` as a short key (cases of one key compile once)."""
    return hashlib.sha1(repr(_specialized(case)).encode()).hexdigest()[:16]


def same_signature(a: Case, b: Case) -> bool:
    """Whether two cases' arguments agree in everything a kernel specializes on."""
    return _specialized(a) == _specialized(b)


@dataclass
class Case:
    """Arguments of one call of a contract's entry point, plus how they were made.

    ``tensors`` and ``scalars`` together name every argument of the signature.
    ``intent`` says what the generator meant (``"valid"`` or the breakages applied); it is
    information only: the expected outcome always comes from the contract.
    """

    contract: str
    variant: str
    tensors: dict[str, TensorArg]
    scalars: dict[str, Any]
    intent: tuple[str, ...] = ("valid",)
    notes: dict[str, Any] = field(default_factory=dict)

    def materialize(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Fresh copies of the bases and the call's keyword arguments viewing them."""
        # a clone per base: torch._foreach_copy_ (one per dtype) copied a float16 base
        # wrongly on an H100 with torch 2.11, a false finding against a correct kernel
        bases = {n: t.base.clone() for n, t in self.tensors.items()}
        kwargs: dict[str, Any] = {n: t.view(bases[n]) for n, t in self.tensors.items()}
        kwargs.update(self.scalars)
        return kwargs, bases

    def on(self, device: torch.device | str) -> Case:
        """The same case with every non-meta base moved to ``device``."""
        moved = {
            n: (t if t.device.type == "meta" else t.on(device)) for n, t in self.tensors.items()
        }
        return Case(self.contract, self.variant, moved, dict(self.scalars), self.intent,
                    dict(self.notes))

    def describe(self) -> str:
        """A one-paragraph, human-readable summary of the layout."""
        parts = []
        for n, t in self.tensors.items():
            dev = "" if t.device.type == "cpu" else f" on {t.device.type}"
            dt = str(t.dtype).replace("torch.", "")
            parts.append(f"{n}: {dt}{list(t.shape)} stride={t.stride} offset={t.offset}{dev}")
        parts += [f"{n}={v!r}" for n, v in self.scalars.items()]
        return "; ".join(parts)


CONFIGS_NOTE = NOTE  # the notes key of a finding's kernel configs (execution.configs)


@dataclass(frozen=True)
class Judging:
    """How a case is judged beyond its contract: the policy of the campaign that found it
    (``strict``: the hardened contract; ``messages="class"``: any message of the right
    exception), and the mode that found it (``invariance="bitwise"``: its rows re-run in
    other batches must equal the whole batch's bit for bit; ``graph``: replayed from a
    CUDA graph; ``configs``: the kernel configs a finding under other configs ran,
    ``--helion-configs``, replayed under them). It lives in the case's notes (its corpus
    file's ``notes``; ``configs`` as ``kernel_configs``), so that a replay judges the case
    the way it was found; this is their one typed view."""

    strict: bool = False
    messages: str | None = None
    invariance: str | None = None
    graph: bool = False
    configs: dict[str, Any] | None = None

    @classmethod
    def of(cls, case: Case) -> Judging:
        """The policy the case's notes record (the defaults where they record none)."""
        n = case.notes
        return cls(bool(n.get("strict")), n.get("messages"), n.get("invariance"),
                   bool(n.get("graph")), n.get(CONFIGS_NOTE) or None)

    def notes(self) -> dict[str, Any]:
        """The notes that record this policy (what differs from the defaults)."""
        return {k: v for k, v in (("strict", self.strict), ("messages", self.messages),
                                  ("invariance", self.invariance), ("graph", self.graph),
                                  (CONFIGS_NOTE, self.configs))
                if v}

    def mark(self, case: Case) -> Case:
        """``case`` (a copy) with this policy added to its notes."""
        return Case(case.contract, case.variant, case.tensors, case.scalars, case.intent,
                    {**case.notes, **self.notes()})


def fingerprint(case: Case) -> str:
    """A content hash of a case: layouts, bytes and scalars."""
    h = hashlib.sha256()
    for name in sorted(case.tensors):
        t = case.tensors[name]
        h.update(f"{name}|{t.dtype}|{t.device.type}|{t.shape}|{t.stride}|{t.offset}|".encode())
        if t.device.type != "meta":
            h.update(t.base.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    h.update(repr(sorted(case.scalars.items())).encode())
    h.update(case.variant.encode())
    return h.hexdigest()
