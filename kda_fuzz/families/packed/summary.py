"""What the packed decode families add to a campaign's counts and summary: the batch rows
their valid cases verified (live ones held to the reference, the rest padding; of it the
rows filling batch buckets), per stratum, and how the GPU-scale cases were judged and the
largest sizes they reached.

The facts live in ``Report.facts`` under this module's keys (``rows``, ``live_rows``,
``tail_rows``, ``rows:STRATUM``, ``judged:MODE``) and ``Report.peaks`` (the scale cases'
``notes["scale_sizes"]``); the JSON summary keys are today's (``valid_rows``,
``live_rows``, ``bucket_padding_rows``, ``stratum_rows``, ``scale_largest``,
``scale_judged``).
"""

from __future__ import annotations

from typing import Any

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import Tally

STRATUM_ROWS, JUDGED = "rows:", "judged:"


def tally(case: Case, outcome: Any, stratum: str) -> Tally:
    """The rows of a valid case that was judged (its notes' counts: a case without them
    is one row), how a scale case was judged (``Outcome.facts["judged_mode"]``) and the
    sizes a scale case reached."""
    sums: dict[str, int] = {}
    if outcome.status not in ("gap", "skip") and outcome.expectation.ok:
        rows = int(case.notes.get("rows", 1))
        sums = {"rows": rows, "live_rows": int(case.notes.get("live_rows", rows)),
                STRATUM_ROWS + stratum: rows, "tail_rows": int(case.notes.get("tail_rows", 0))}
    mode = (outcome.facts or {}).get("judged_mode")
    if mode:
        sums[JUDGED + mode] = 1
    return Tally(sums, case.notes.get("scale_sizes") or {})


def _by(facts: Any, prefix: str) -> dict[str, int]:
    return {k[len(prefix):]: n for k, n in facts.items() if k.startswith(prefix)}


def judged(report: Any) -> dict[str, int]:
    """Scale cases by how they were judged (``full``, ``sampled``)."""
    return _by(report.facts, JUDGED)


def rows_judged(report: Any) -> str:
    """The batch rows of the valid cases judged, live and padding ("" with none)."""
    f = report.facts
    if not f.get("rows"):
        return ""
    tail = f.get("tail_rows", 0)
    return (f"{f['rows']:,} of valid cases: {f.get('live_rows', 0):,} live (held to the "
            f"reference), the rest padding"
            + (f", {tail:,} of it filling batch buckets" if tail else ""))


def report_rows(report: Any) -> list[tuple[str, str]]:
    """The summary's row on the rows judged."""
    return [("rows judged", rows_judged(report))]


def report_json(report: Any) -> dict[str, Any]:
    """The JSON summary's keys of these facts."""
    f = report.facts
    return {"valid_rows": f.get("rows", 0), "live_rows": f.get("live_rows", 0),
            "bucket_padding_rows": f.get("tail_rows", 0),
            "stratum_rows": _by(f, STRATUM_ROWS), "scale_largest": dict(report.peaks),
            "scale_judged": judged(report)}
