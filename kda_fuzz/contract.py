"""The declarative contract engine: ordered checks, their messages, and expectations."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


class Namespace(dict):
    """Call arguments plus lazily derived values (``B``, ``HV``...) for checks and messages."""

    def __init__(self, args: Mapping[str, Any], derived: Mapping[str, Callable[[Namespace], Any]]):
        super().__init__(args)
        self._derived = derived

    def __missing__(self, key: str) -> Any:
        fn = self._derived.get(key)
        if fn is None:
            raise KeyError(key)
        value = self[key] = fn(self)
        return value

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e


@dataclass(frozen=True)
class Check:
    """One validation rule: ``fails(ns)`` true means the call must raise ``message``."""

    number: int
    fails: Callable[[Namespace], bool]
    message: str
    variants: frozenset[str] | None = None  # None: in every variant

    def render(self, ns: Namespace) -> str:
        return self.message.format_map(ns)

    def applies(self, variant: str) -> bool:
        return self.variants is None or variant in self.variants


@dataclass(frozen=True)
class Hole:
    """A layout the published checks let through or crash on, that must still be rejected.

    When ``applies(ns)`` holds and no check up to ``after`` fails, any instance of the
    contract's exception is the expected outcome (the message is not pinned).
    """

    name: str
    applies: Callable[[Namespace], bool]
    after: int


class Unjudgeable(Exception):
    """The oracle cannot compare numbers on this case (e.g. the result overflows its dtype)."""


@dataclass(frozen=True)
class Expectation:
    """What a correct implementation does with a layout."""

    ok: bool
    check: int | None = None
    message: str | None = None  # None with ok=False: any message
    hole: str | None = None

    def describe(self) -> str:
        if self.ok:
            return "accepts the layout"
        if self.message is None:
            return f"raises ValueError (any message; contract hole: {self.hole})"
        return f"raises ValueError from check {self.check}: {self.message}"


@dataclass(frozen=True)
class Contract:
    """A kernel family's contract as data.

    ``signature`` lists the entry point's parameters in order. ``judge`` is the
    differential oracle for accepted layouts; ``valid_cases(variant, **kw)`` and
    ``broken_cases(variant, only=names, **kw)`` are Hypothesis strategies, the latter
    with the breakages of one of ``broken_arms(variant)`` or, without ``only``, a mix.
    """

    name: str
    signature: tuple[str, ...]
    variants: tuple[str, ...]
    checks: tuple[Check, ...]
    derived: Mapping[str, Callable[[Namespace], Any]]
    judge: Callable[..., Any]
    valid_cases: Callable[..., Any]
    broken_cases: Callable[..., Any]
    broken_arms: Callable[[str], list[tuple[str, tuple[str, ...]]]]
    holes: tuple[Hole, ...] = ()
    families: Callable[..., list[Any]] | None = None  # compile families for valid_cases
    cross_judge: Callable[..., Any] | None = None  # peer mode: two targets' outputs agree
    exception: type[Exception] = ValueError
    doc: str = ""
    extras: Mapping[str, Any] = field(default_factory=dict)

    def checks_for(self, variant: str) -> tuple[Check, ...]:
        self._require_variant(variant)
        return tuple(c for c in self.checks if c.applies(variant))

    def namespace(self, args: Mapping[str, Any]) -> Namespace:
        return Namespace(args, self.derived)

    def expect(self, args: Mapping[str, Any], variant: str) -> Expectation:
        """The outcome the contract prescribes for a call with ``args``."""
        ns = self.namespace(args)
        holes = list(self.holes)
        for c in (*self.checks_for(variant), None):
            for hole in [h for h in holes if c is None or c.number > h.after]:
                holes.remove(hole)  # every check up to hole.after passed
                if hole.applies(ns):
                    return Expectation(False, None, None, hole.name)
            if c is not None and c.fails(ns):
                return Expectation(False, c.number, c.render(ns))
        return Expectation(True)

    def _require_variant(self, variant: str) -> None:
        if variant not in self.variants:
            raise ValueError(
                f"contract {self.name!r} has no variant {variant!r} "
                f"(choose from {', '.join(self.variants)})"
            )


def shape(t: torch.Tensor) -> tuple[int, ...]:
    """``tuple(t.shape)``, the way contract messages print shapes."""
    return tuple(t.shape)
