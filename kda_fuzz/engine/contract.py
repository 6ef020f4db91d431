"""The declarative contract engine: ordered checks, their messages, and expectations."""

from __future__ import annotations

import functools
import importlib
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from kda_fuzz.engine.knobs import NO_KNOBS, Knobs
from kda_fuzz.engine.verdict import RAISED, raised_by
from kda_fuzz.names import SOLE_VARIANT

if TYPE_CHECKING:  # annotations only: hypothesis and the case/verdict types
    from hypothesis.strategies import SearchStrategy

    from kda_fuzz.engine.case import Case
    from kda_fuzz.engine.shrink import Move, ShrinkContext
    from kda_fuzz.engine.verdict import Verdict


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
    """One validation rule: ``fails(ns)`` true means the call must raise ``message``
    (``None``: a check the contract does not word; any instance of its exception)."""

    number: int
    fails: Callable[[Namespace], bool]
    message: str | None
    variants: frozenset[str] | None = None  # None: in every variant

    def render(self, ns: Namespace) -> str | None:
        return None if self.message is None else self.message.format_map(ns)

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
    """The oracle cannot compare numbers on this case (e.g. the result overflows its dtype).

    A judge raises it only once every other rule (read-only inputs, padding, untouched
    state) has been judged and held: the outcome is then a skip that still counts as
    evidence against a failure of one of those rules (``Outcome.rules_held``)."""


@dataclass(frozen=True)
class Deferred:
    """A judgement launched on the device and not read back yet: what a judge called with
    ``defer=True`` may return (a contract with ``judge_defers``). ``finish()`` waits for
    it and returns, or raises, what the judge would have."""

    finish: Callable[[], Any]


@dataclass(frozen=True)
class BatchInvariance:
    """How a family re-runs a valid case's batch members in other batches (a member's
    result must not depend on the rest of its batch): ``sub_batches(case)`` gives (a list,
    or a generator that builds each when drawn: the campaign draws only as far as the one
    it runs) ``(name, sub_case, members)`` (the sub-case's member ``j`` is the case's member
    ``members[j]``, or none of the case's where it is -1), ``differs(case, full, sub_case,
    sub, members)`` where the outputs (the call's arguments after it) of the two differ
    bitwise, in words (None: nowhere); ``unit`` names a member in the verdict's words (e.g.
    ``"rows"``). Under the default ``--invariance tolerance`` one of the sub-cases whose
    tensors keep the case's shapes, strides and dtypes runs, each check the next in turn
    (``same_signature``: a kernel specialized on shapes compiles nothing for them);
    ``bitwise`` runs them all."""

    sub_batches: Callable[[Case], Iterable[tuple[str, Case, list[int]]]]
    differs: Callable[[Case, dict[str, Any], Case, dict[str, Any], list[int]], str | None]
    unit: str


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
        if self.message is None and self.hole is None:
            return f"raises ValueError from check {self.check} (any message: not worded)"
        if self.message is None:
            return f"raises ValueError (any message; contract hole: {self.hole})"
        return f"raises ValueError from check {self.check}: {self.message}"


# ----------------------------------------------------------------- family hooks
#
# Everything the engine needs to know about a kernel family beyond its checks is
# declared on its Contract through the fixed signatures below (as every sample-input
# function of a PyTorch OpInfo has one signature): the engine holds no family names.


class ValidCases(Protocol):
    """Valid cases of a variant. The runner passes only the keywords it sets; the family
    chooses the defaults. ``family``: a compile family from :attr:`Contract.families`;
    ``pins``: fields of the layout fixed to a value, a list of values or a strategy (the
    family names its fields and raises ``ValueError`` for unknown ones); ``sizes``: the
    family's own (its :attr:`Knobs.valid` of the campaign's sizes, e.g. elements per case,
    batch size)."""

    def __call__(self, variant: str, *, device: str = ..., family: Any = ...,
                 pins: Mapping[str, Any] | None = ..., **sizes: Any
                 ) -> SearchStrategy[Case]: ...


class BrokenCases(Protocol):
    """Broken cases of a variant: the breakages named by ``only`` (one arm of
    :attr:`Contract.broken_arms`), else a random mix."""

    def __call__(self, variant: str, *, device: str = ...,
                 only: tuple[str, ...] | str | None = ...,
                 pins: Mapping[str, Any] | None = ...) -> SearchStrategy[Case]: ...


class Judge(Protocol):
    """The oracle of an accepted call: ``before``/``after`` are the bases around the call,
    ``kwargs`` the views passed; ``budget`` (when given) is filled with the error budget
    used. Returns the first broken rule, or None; raises :class:`Unjudgeable`."""

    def __call__(self, case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
                 after: dict[str, torch.Tensor], result: Any,
                 budget: dict[str, float] | None = None) -> Verdict | None: ...


class Execution(Protocol):
    """How a family's kernels run without a GPU."""

    def configure_cpu(self) -> Any:
        """Set up CPU execution (interpreters, hooks) before kernels are imported."""

    def environment_error(self, exc: BaseException) -> str | None:
        """Why ``exc`` is a failure of the execution machinery, not of the target."""


class Shrinker(Protocol):
    """A family's moves for the minimizer (:mod:`kda_fuzz.campaign.minimize`), which adds its own
    (dtypes, strides, guard cells) and tries them all, biggest predicted savings first."""

    def structure(self, case: Case, hint: Verdict | None,
                  ctx: ShrinkContext) -> Iterable[Move]:
        """Smaller layouts (rows, heads, head dims...); ``hint`` is the failure's verdict
        (its ``where`` points at the failing element)."""

    def scalars(self, case: Case, ctx: ShrinkContext) -> Iterable[Move]:
        """Simpler scalar arguments (flags off, plain values)."""

    def values(self, case: Case, ctx: ShrinkContext) -> Iterable[Move]:
        """Simpler tensor values (zeros, ones, rounded)."""

    def notes(self, case: Case, notes: dict[str, Any]) -> dict[str, Any]:
        """The notes of the minimized ``case``: ``notes`` (the original's, with the
        minimizer's own) with the family's facts of the original brought up to date."""


@dataclass(frozen=True)
class ModuleExecution:
    """An :class:`Execution` whose functions live in ``module`` (imported on first use,
    so that a contract can be loaded without importing its kernels)."""

    module: str

    def configure_cpu(self) -> Any:
        return importlib.import_module(self.module).configure_cpu()

    def environment_error(self, exc: BaseException) -> str | None:
        try:
            mod = importlib.import_module(self.module)
        except ImportError:
            return None
        return mod.environment_error(exc)


@dataclass(frozen=True)
class Tally:
    """What one example adds to a campaign's counts of the family's own facts
    (``Report.facts``: ``sums`` added up over examples and jobs, ``peaks`` the largest
    of each kept); the keys are the family's."""

    sums: Mapping[str, int] = field(default_factory=dict)
    peaks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ScaleStratum:
    """A family's GPU-scale stratum: ``cases(variant, device, budget_bytes, pins=...)``
    is a strategy, or None when nothing fits (``pins``: what the targets do not support,
    as ``Contract.restrict`` gives it, never drawn); ``device_budget(device, jobs)`` the
    bytes per case a device has room for. ``focus``: ``cases`` also takes ``focus=`` (a
    pinned layout's pins): cases at that layout's heads, the limits crossed around them."""

    cases: Callable[..., SearchStrategy[Case] | None]
    device_budget: Callable[[str, int], int]
    focus: bool = False


ScalarKind = str  # "float" (finite), "float?" (null or finite), "bool"

# ready-made value patterns for MessageValues.patterns
DTYPE_NAMES = (r"\b(?:torch\.)?(?:bfloat16|float(?:8_\w+|16|32|64)|u?int(?:8|16|32|64)|bool"
               r"|complex(?:32|64|128)|half|double)\b"
               r"|\b(?:BFloat16|Half|Float|Double|Long|Int|Short|Byte|Char|Bool)\b")
SIGNED_NUMBERS = (r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])"
                  r"|(?<!\w)[-+]?(?:inf|nan)\b")


@dataclass(frozen=True)
class MessageValues:
    """What in a family's messages is a value: a failure that raised (the wrong message,
    a check out of order, the wrong type, on a valid layout) is known by its message with
    these masked, then its digits (:meth:`Verdict.signature`), so that one bug shown on
    other dtypes or signs reads as one.

    ``fields``: a message that reads as one of the contract's check messages is known by
    that check's format string, each field as ``{name}`` whatever filled it; ``patterns``:
    regular expressions of values in any message (e.g. :data:`DTYPE_NAMES`,
    :data:`SIGNED_NUMBERS`), each match read as ``<value>``; ``mask``: a function of the
    message after those, for anything else the family knows of its messages."""

    fields: bool = True
    patterns: tuple[str, ...] = ()
    mask: Callable[[str], str] | None = None


@functools.lru_cache(maxsize=64)
def _templates(checks: tuple[Check, ...]) -> tuple[tuple[re.Pattern[str], str], ...]:
    """Each worded check message as a regular expression (its fields: any text) and as
    the pattern a message it matches is known by (its fields as ``{name}``)."""
    out = []
    for check in checks:
        if check.message is None:
            continue
        rx, text, literal = [], [], ""
        for lit, name, _spec, _conv in string.Formatter().parse(check.message):
            literal += lit
            rx.append(re.escape(lit))
            text.append(lit)
            if name is not None:
                rx.append("(.*?)")
                text.append("{" + name + "}")
        if literal.strip() and len(rx) > 1:  # a message that is all fields matches anything
            out.append((re.compile("".join(rx), re.S), "".join(text)))
    return tuple(out)


@dataclass(frozen=True)
class Contract:
    """A kernel family's contract as data.

    ``signature`` lists the entry point's parameters in order. ``judge`` is the
    differential oracle for accepted layouts; ``valid_cases(variant, **kw)`` and
    ``broken_cases(variant, only=names, **kw)`` are Hypothesis strategies, the latter
    with the breakages of one of ``broken_arms(variant)`` or, without ``only``, a mix.

    Family hooks: ``scalars`` (the scalar arguments and their kinds, for corpus files),
    ``default_targets`` (the project's kernels per variant), ``reference_target``,
    ``execution``, ``knobs`` (its command-line options and sizes), ``shrinker``,
    ``summarize`` (a case in one line), ``sizes`` (a case's named sizes for
    descriptions), ``probe(units, width, variant)`` (calibration cases: ``units``
    programs of work, each ``width`` wide), ``scale``, ``judge_budget`` (the judge
    fills an error budget), ``judge_defers`` (the judge may return a :class:`Deferred`),
    ``status`` (notes for a campaign's summary on the family's own machinery, e.g. a
    fast path that turned itself off), ``tally``,
    ``report_notes``, ``report_rows`` and ``report_json`` (the facts it adds to a
    campaign's counts and summary), ``aims`` (the check each breakage of a variant aims
    at, for :func:`kda_fuzz.strategies.broken_layouts`), ``restrict`` (the pins that
    leave out features a target declares it does not support), ``upgrade_verdict``
    (a verdict read from an older file, in today's terms) and ``message_values`` (what in
    its messages is a value, for telling failures apart: :class:`MessageValues`).
    ``variants`` (keyword only): its variants, the first its default; a family with one
    implementation declares none.
    """

    name: str
    signature: tuple[str, ...]
    checks: tuple[Check, ...]
    derived: Mapping[str, Callable[[Namespace], Any]]
    judge: Judge
    valid_cases: ValidCases
    broken_cases: BrokenCases
    broken_arms: Callable[[str], list[tuple[str, tuple[str, ...]]]]
    holes: tuple[Hole, ...] = ()
    families: Callable[..., list[Any]] | None = None  # compile families for valid_cases
    cross_judge: Callable[..., Any] | None = None  # peer mode: two targets' outputs agree
    exception: type[Exception] = ValueError
    doc: str = ""
    scalars: Mapping[str, ScalarKind] = field(default_factory=dict)
    default_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reference_target: str | None = None
    execution: Execution | None = None
    knobs: Knobs = NO_KNOBS
    shrinker: Shrinker | None = None
    summarize: Callable[[Case], str] | None = None
    sizes: Callable[[Case], dict[str, int]] | None = None
    probe: Callable[[int, int, str], Case] | None = None
    scale: ScaleStratum | None = None
    judge_budget: bool = False
    # judge(..., facts={}) tells the dict what it learned (Outcome.facts: e.g. how much of
    # a case it compared)
    judge_facts: bool = False
    # judge(..., defer=True) may return a Deferred: a campaign reads it with the others of
    # its batch (--read-every: one wait on the device for several examples)
    judge_defers: bool = False
    status: Callable[[], list[str]] | None = None
    # batch invariance: sub-batches of a valid case and where their rows differ bitwise
    batch: BatchInvariance | None = None
    # the facts the family adds to a campaign's summary, from its report (e.g. how its
    # scale stratum's cases were judged): notes, the summary's rows (label, text; "":
    # nothing to say) and JSON keys
    report_notes: Callable[[Any], list[str]] | None = None
    report_rows: Callable[[Any], list[tuple[str, str]]] | None = None
    report_json: Callable[[Any], dict[str, Any]] | None = None
    # tally(case, outcome, stratum): what a judged example (its oracle.Outcome) adds to
    # the report's facts (Report.facts, Report.peaks), e.g. the batch rows it verified
    tally: Callable[[Case, Any, str], Tally] | None = None
    # breakage name -> the check it aims at (None: a semantic rule), per variant
    aims: Callable[[str], Mapping[str, int | None]] | None = None
    # pins (for valid_cases/broken_cases) that leave out what a target does not support
    restrict: Callable[[Sequence[str], str], Mapping[str, Any]] | None = None
    # a verdict decoded from a corpus file, in today's terms (files written by older
    # versions recorded some facts otherwise)
    upgrade_verdict: Callable[[Verdict], Verdict] | None = None
    # what in its messages is a value, masked in a raised failure's signature (None: its
    # digits only)
    message_values: MessageValues | None = None
    # its variants, the first the default; none declared: one, SOLE_VARIANT, that the
    # command line and the reports leave out
    variants: tuple[str, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        if not self.variants:
            object.__setattr__(self, "variants", (SOLE_VARIANT,))

    @property
    def declares_variants(self) -> bool:
        """Whether the family declares variants of its own (else it has the one
        :data:`~kda_fuzz.names.SOLE_VARIANT`)."""
        return self.variants != (SOLE_VARIANT,)

    def decoded_verdict(self, verdict: Verdict) -> Verdict:
        """``verdict`` as read from a file, upgraded by :attr:`upgrade_verdict`, its
        message's values masked as :attr:`message_values` says today."""
        if self.upgrade_verdict is not None:
            verdict = self.upgrade_verdict(verdict)
        return self.valued(verdict)

    def message_pattern(self, message: str) -> str | None:
        """``message`` with the values :attr:`message_values` declares masked (None: the
        family declares none)."""
        mv = self.message_values
        if mv is None:
            return None
        text = message
        if mv.fields:
            for rx, template in _templates(self.checks):
                if rx.fullmatch(message):
                    text = template
                    break
        for pattern in mv.patterns:
            text = re.sub(pattern, "<value>", text)
        return mv.mask(text) if mv.mask is not None else text

    def valued(self, verdict: Verdict) -> Verdict:
        """``verdict`` with the pattern of the message it raised (``got_pattern``, what
        its signature compares) where the family declares :attr:`message_values`."""
        if verdict.what not in RAISED:
            return verdict
        pattern = self.message_pattern(raised_by(verdict)[1])
        if pattern == verdict.got_pattern:
            return verdict
        return replace(verdict, got_pattern=pattern)

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
