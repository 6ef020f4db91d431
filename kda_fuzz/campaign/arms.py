"""An arm: one stratum of a campaign's plan (a strategy and the examples it gets)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from kda_fuzz.engine.case import Case


@dataclass(frozen=True)
class Arm:
    """One stratum of a campaign: a strategy and the examples it gets."""

    name: str
    strategy: st.SearchStrategy[Case]
    examples: int
    index: int = 0  # position in the whole campaign's plan (seeds the arm's Hypothesis run)
    # (r, k): of the arm's Hypothesis run, only examples e with e % k == r are run here (the
    # others belong to other shards, see kda_fuzz.campaign.shard); the run draws all of them
    share: tuple[int, int] = (0, 1)
    # in a time-bounded campaign, the most of a job's time its stratum may take: a round
    # passes the arm by while its stratum is over (None: no limit)
    time_share: float | None = None

    @property
    def stratum(self) -> str:
        """``broken``, ``valid`` or ``scale``: the part of the plan the arm belongs to."""
        return self.name.split(":")[0]
