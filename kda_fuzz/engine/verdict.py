"""What the oracles conclude about one call."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, InitVar, dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

Kind = Literal["contract", "mismatch", "crash", "timeout", "flaky", "sanitizer"]

# contract failures where the target raised: judged by what it raised, not by the check
RAISED = ("wrong-exception-type", "rejected-valid-layout", "wrong-message", "wrong-check-order")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|\d+")
MESSAGE_CHARS = 200  # of a masked message that count

# The typed facts of a verdict: field name -> its key in the one ``extra`` object a saved
# verdict keeps every fact in (the file format), typed and free-form alike.
FACTS: dict[str, str] = {
    "exception": "exception", "got": "got", "got_check": "got_check",
    "got_pattern": "got_pattern", "hole": "hole", "wrong_outputs": "outputs",
    "graph": "graph", "config": "config", "config_alternative": "config_alternative",
    "first_kind": "first_kind", "reproduced": "reproduced", "reruns": "reruns",
    "limit_seconds": "limit_seconds", "tool": "tool",
}
_FACT_KEYS = frozenset(FACTS.values())
_SAVED = ("kind", "what", "detail", "check", "message", "output", "max_error", "where")


def masked(message: str) -> str:
    """``message`` with every number (decimal digits, hex literals) as ``#`` and its
    whitespace collapsed: the same error on other sizes reads the same."""
    return " ".join(_NUMBER.sub("#", message).split())[:MESSAGE_CHARS]


_RAISED_DETAIL = re.compile(r"raised (?:on a layout the contract accepts: )?"
                           r"([A-Za-z_][\w.]*)(?:: (.*))?", re.S)


def raised_by(v: Verdict) -> tuple[str, str]:
    """The exception type and message a contract verdict says the target raised (its
    ``exception`` and ``got``, or from the detail of files written before they were
    recorded)."""
    exc, got = v.exception, v.got
    if got is None:
        m = _RAISED_DETAIL.match(v.detail.split("; expected", 1)[0])
        if m is not None:
            exc, got = exc or m.group(1), m.group(2) or ""
        else:
            got = v.detail
    return str(exc or "ValueError"), str(got)


@dataclass(frozen=True)
class Verdict:
    """A failure of the target on one case.

    ``kind``: ``contract`` (wrong or missing error, error on a valid layout, mutation on
    error), ``mismatch`` (numbers or semantics of an accepted call), ``crash`` (the process
    died), ``timeout`` (it never returned), ``flaky`` (a failure that did not come back on
    every re-run of the same case: ``first_kind``, ``reproduced``, ``reruns``),
    ``sanitizer`` (outputs right, but compute-sanitizer reported an error: ``tool``, and
    its report in ``notes["sanitizer"]``). ``what`` names the failed property, stable
    across runs.

    The keyword-only fields are the facts the engine reads (its signature, a hang's
    limit, a flaky failure's first kind, ...), ``None`` where they do not apply; ``notes``
    holds free-form facts that are only shown and saved (a judge's worst index, ratio,
    elements out of tolerance; a sanitizer's report).

    ``extra``: every fact by its saved key (:data:`FACTS`, then ``notes``), the one object
    a corpus file keeps them in. Given as an argument (as files and older code build a
    verdict), it sets every fact: typed keys go to their fields, the rest to ``notes``.
    Read, it is a read-only view; the view of a verdict passed back (as ``replace``
    does) changes nothing.
    """

    kind: Kind
    what: str
    detail: str
    check: int | None = None
    message: str | None = None
    output: str | None = None
    max_error: float | None = None
    where: list[int] | None = None
    extra: InitVar[Mapping[str, Any] | None] = None
    _: KW_ONLY
    notes: dict[str, Any] = field(default_factory=dict)
    # contract failures where the target raised: the exception's type name and message;
    # for ``wrong-check-order``, the check whose message it was; the message with the
    # values its family declares masked (``Contract.valued``)
    exception: str | None = None
    got: str | None = None
    got_check: int | None = None
    got_pattern: str | None = None
    # a write on a degenerate layout: the contract's hole it fell through
    hole: str | None = None
    # wrong numbers: every output found wrong together (saved as ``outputs``)
    wrong_outputs: list[str] | None = None
    # found under CUDA-graph replay (``what`` is ``graph-`` and the eager property)
    graph: bool = False
    # found under other kernel configs than the kernels' own: their tag
    # (``execution.configs.tag``); for a hard fault recorded by the supervisor, the
    # alternative the call ran under
    config: str | None = None
    config_alternative: int | None = None
    # a flaky failure: the kind of its first failure, in how many of how many re-runs
    first_kind: Kind | None = None
    reproduced: int | None = None
    reruns: int | None = None
    # a hang: the calibrated per-call limit it was found past (its minimization's)
    limit_seconds: float | None = None
    # a sanitizer finding: the compute-sanitizer tool
    tool: str | None = None

    def __post_init__(self, extra: Mapping[str, Any] | None) -> None:
        typed = _FACT_KEYS.intersection(self.notes)
        if typed:
            raise ValueError(f"facts with fields of their own in notes: {sorted(typed)}")
        if extra is None or isinstance(extra, MappingProxyType):
            return  # none given, or a verdict's own view passed back
        if not isinstance(extra, Mapping):
            raise TypeError(f"extra must be a mapping, not {type(extra).__name__}")
        facts = dict(extra)
        for name, key in FACTS.items():
            value = facts.pop(key, None)
            object.__setattr__(self, name, bool(value) if name == "graph" else value)
        object.__setattr__(self, "notes", facts)

    def saved_extra(self) -> dict[str, Any]:
        """Every fact by its saved key: ``notes``, then each typed fact that is set."""
        facts = dict(self.notes)
        for name, key in FACTS.items():
            value = getattr(self, name)
            if value is not None and value is not False:
                facts[key] = value
        return facts

    def signature(self, variant: str = "") -> tuple[Any, ...]:
        """What makes two failures "the same": what the target did, and the contract
        variant. The one definition used by the campaign (distinct failures and repeats),
        the minimizer, the corpus and the reports.

        A target that raised (the wrong type, the wrong message, or on a valid layout) is
        known by the exception type and its message with numbers masked (and the values
        its family declares, ``got_pattern``: ``Contract.valued``), whichever check
        the layout was meant to trip; wrong numbers by the set of outputs out of
        tolerance together (``out`` and the state); anything else by its property
        (``what``), and a broken layout accepted by the check that should have fired."""
        return (*self.behaviour(), variant)

    def behaviour(self) -> tuple[Any, ...]:
        """What the target did (see :meth:`signature`)."""
        if self.config:  # under other kernel configs (execution.configs.tag)
            return ("config", str(self.config), *replace(self, config=None).behaviour())
        if self.graph and self.what.startswith("graph-"):  # under graph replay
            eager = replace(self, what=self.what[len("graph-"):], graph=False)
            return ("graph", *eager.behaviour())
        if self.kind == "flaky":
            first = self.first_kind if self.first_kind is not None else "mismatch"
            return ("flaky", *replace(self, kind=first).behaviour())
        if self.kind == "contract" and self.what in RAISED:
            exc, got = raised_by(self)  # the family's values masked first, if it says which
            pattern = self.got_pattern if self.got_pattern is not None else got
            return ("contract", "raised", exc, masked(pattern))
        if self.kind == "mismatch" and self.what.endswith("-value") \
                and not self.what.startswith("peers-"):
            return ("mismatch", "wrong-values", tuple(self.outputs()))
        if self.kind == "contract" and self.what == "accepted-broken-layout":
            return (self.kind, self.what, self.check)
        return (self.kind, self.what, self.exception, self.output)

    def outputs(self) -> list[str]:
        """The outputs this failure found wrong (``wrong_outputs``, else ``output``)."""
        named = self.wrong_outputs
        if named:
            return sorted(str(n) for n in named)
        return [self.output] if self.output else []

    def same_failure(self, other: Verdict | None) -> bool:
        """Same :meth:`signature` (the variant is the case's, shared by both)."""
        return other is not None and self.signature() == other.signature()

    def to_json(self) -> dict[str, Any]:
        """The verdict as saved: its first fields, and every fact in ``extra``."""
        saved = {name: copy.deepcopy(getattr(self, name)) for name in _SAVED}
        return {**saved, "extra": copy.deepcopy(self.saved_extra())}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        """A verdict saved by :meth:`to_json` (or by older versions: the same keys).
        Raises ``TypeError`` on missing or unknown keys."""
        unknown = set(data) - {*_SAVED, "extra"}
        if unknown:
            raise TypeError(f"unknown verdict field(s) {', '.join(sorted(unknown))}")
        return cls(**data)

    def summary(self) -> str:
        what = self.what
        outputs = self.outputs()
        if what.endswith("-value") and len(outputs) > 1:  # one failure, several outputs
            what = " and ".join(f"{n}-value" for n in outputs)
        return f"[{self.kind}] {what}: {self.detail}"


Verdict.extra = property(  # type: ignore[assignment]
    lambda self: MappingProxyType(self.saved_extra()),
    doc="Every fact by its saved key, read-only (see :class:`Verdict`).")
