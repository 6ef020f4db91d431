"""What the oracles conclude about one call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Kind = Literal["contract", "mismatch", "crash", "timeout", "flaky"]


@dataclass(frozen=True)
class Verdict:
    """A failure of the target on one case.

    ``kind``: ``contract`` (wrong or missing error, error on a valid layout, mutation on
    error), ``mismatch`` (numbers or semantics of an accepted call), ``crash`` (the process
    died), ``timeout`` (it never returned), ``flaky`` (a failure that did not come back on
    every re-run of the same case; ``extra`` says how often it did). ``what`` names the
    failed property, stable across runs.
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
        """What makes two failures "the same": kind, property, check, exception type, the
        output that differs and the contract variant. The one definition used by the
        campaign (distinct failures and repeats), the minimizer and the reports."""
        return (self.kind, self.what, self.check, self.extra.get("exception"), self.output,
                variant)

    def same_failure(self, other: Verdict | None) -> bool:
        """Same :meth:`signature` (the variant is the case's, shared by both)."""
        return other is not None and self.signature() == other.signature()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(**data)

    def summary(self) -> str:
        return f"[{self.kind}] {self.what}: {self.detail}"
