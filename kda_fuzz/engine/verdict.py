"""What the oracles conclude about one call."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Kind = Literal["contract", "mismatch", "crash", "timeout", "flaky", "sanitizer"]

# contract failures where the target raised: judged by what it raised, not by the check
RAISED = ("wrong-exception-type", "rejected-valid-layout", "wrong-message", "wrong-check-order")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|\d+")
MESSAGE_CHARS = 200  # of a masked message that count


def masked(message: str) -> str:
    """``message`` with every number (decimal digits, hex literals) as ``#`` and its
    whitespace collapsed: the same error on other sizes reads the same."""
    return " ".join(_NUMBER.sub("#", message).split())[:MESSAGE_CHARS]


_RAISED_DETAIL = re.compile(r"raised (?:on a layout the contract accepts: )?"
                           r"([A-Za-z_][\w.]*)(?:: (.*))?", re.S)


def raised_by(v: Verdict) -> tuple[str, str]:
    """The exception type and message a contract verdict says the target raised (from
    ``extra``, or from the detail of files written before it was recorded there)."""
    exc, got = v.extra.get("exception"), v.extra.get("got")
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
    every re-run of the same case; ``extra`` says how often it did), ``sanitizer`` (outputs
    right, but compute-sanitizer reported an error: ``extra["sanitizer"]`` holds its
    report). ``what`` names the failed property, stable across runs.
    """

    kind: Kind
    what: str
    detail: str
    check: int | None = None
    message: str | None = None
    output: str | None = None
    max_error: float | None = None
    where: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def signature(self, variant: str = "") -> tuple[Any, ...]:
        """What makes two failures "the same": what the target did, and the contract
        variant. The one definition used by the campaign (distinct failures and repeats),
        the minimizer, the corpus and the reports.

        A target that raised (the wrong type, the wrong message, or on a valid layout) is
        known by the exception type and its message with numbers masked (and the values
        its family declares, ``extra["got_pattern"]``: ``Contract.valued``), whichever check
        the layout was meant to trip; wrong numbers by the set of outputs out of
        tolerance together (``out`` and the state); anything else by its property
        (``what``), and a broken layout accepted by the check that should have fired."""
        return (*self.behaviour(), variant)

    def behaviour(self) -> tuple[Any, ...]:
        """What the target did (see :meth:`signature`)."""
        if self.extra.get("config"):  # under other kernel configs (execution.configs.tag)
            inner = replace(self, extra={k: v for k, v in self.extra.items() if k != "config"})
            return ("config", str(self.extra["config"]), *inner.behaviour())
        if self.extra.get("graph") and self.what.startswith("graph-"):  # under graph replay
            eager = replace(self, what=self.what[len("graph-"):],
                            extra={k: v for k, v in self.extra.items() if k != "graph"})
            return ("graph", *eager.behaviour())
        if self.kind == "flaky":
            inner = Verdict(self.extra.get("first_kind", "mismatch"), self.what, self.detail,
                            self.check, self.message, self.output, extra=self.extra)
            return ("flaky", *inner.behaviour())
        if self.kind == "contract" and self.what in RAISED:
            exc, got = raised_by(self)  # the family's values masked first, if it says which
            return ("contract", "raised", exc, masked(self.extra.get("got_pattern", got)))
        if self.kind == "mismatch" and self.what.endswith("-value") \
                and not self.what.startswith("peers-"):
            return ("mismatch", "wrong-values", tuple(self.outputs()))
        if self.kind == "contract" and self.what == "accepted-broken-layout":
            return (self.kind, self.what, self.check)
        return (self.kind, self.what, self.extra.get("exception"), self.output)

    def outputs(self) -> list[str]:
        """The outputs this failure found wrong (``extra["outputs"]``, else ``output``)."""
        named = self.extra.get("outputs")
        if named:
            return sorted(str(n) for n in named)
        return [self.output] if self.output else []

    def same_failure(self, other: Verdict | None) -> bool:
        """Same :meth:`signature` (the variant is the case's, shared by both)."""
        return other is not None and self.signature() == other.signature()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(**data)

    def summary(self) -> str:
        what = self.what
        outputs = self.outputs()
        if what.endswith("-value") and len(outputs) > 1:  # one failure, several outputs
            what = " and ".join(f"{n}-value" for n in outputs)
        return f"[{self.kind}] {what}: {self.detail}"
