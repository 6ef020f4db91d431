"""What the oracles conclude about one call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Kind = Literal["contract", "mismatch", "crash", "timeout"]


@dataclass(frozen=True)
class Verdict:
    """A failure of the target on one case.

    ``kind``: ``contract`` (wrong or missing error, error on a valid layout, mutation on
    error), ``mismatch`` (numbers or semantics of an accepted call), ``crash`` (the process
    died), ``timeout`` (it never returned). ``what`` names the failed property, stable
    across runs (used to decide whether a smaller case "fails the same way").
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

    def same_failure(self, other: Verdict | None) -> bool:
        return other is not None and (self.kind, self.what) == (other.kind, other.what)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(**data)

    def summary(self) -> str:
        return f"[{self.kind}] {self.what}: {self.detail}"
