"""How a campaign is run, resolved once: its options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kda_fuzz.engine.oracle import Messages


@dataclass(frozen=True)
class CampaignOptions:
    """How a campaign draws and judges (see ``plan`` for the shaping knobs): resolved once
    from the command line or a caller, passed whole to jobs, changed only by
    ``dataclasses.replace``."""

    device: str = "cpu"
    max_examples: int = 200
    seed: int | None = None
    valid_share: float = 0.5
    families: int = 0
    # the family's own sizes (Contract.knobs: resolved once by its Knobs.resolve), passed
    # through to its strategies by ``plan``
    sizes: Mapping[str, Any] = field(default_factory=dict)
    max_seconds: float | None = None
    deadline: float | None = None  # time.monotonic() at which to stop (overrides max_seconds)
    max_failures: int = 1  # distinct failures before the campaign stops
    messages: Messages = "exact"
    strict: bool = False
    confirm_runs: int = 2  # re-runs of a new failure; fewer reproductions make it flaky
    history: bool = False  # keep per-example records (error budget, timing) in the report
    origin: float | None = None  # time.monotonic() the history's times count from
    job: tuple[int, int] = (0, 1)
    # (i, n): run shard i (0-based) of n of the campaign's plan (kda_fuzz.campaign.shard);
    # with n > 1, max_examples counts the examples of all n shards together
    shard: tuple[int, int] = (0, 1)
    # pinned layouts (name, pins) and the share of valid examples they get (see ``plan``)
    layouts: tuple[tuple[str, dict[str, Any]], ...] = ()
    layout_share: float = 0.75
    # what the targets do not support (Contract.restrict): never drawn
    unsupported: tuple[str, ...] = ()
    # corpus files whose cases run first, as they are (libFuzzer's seed corpus)
    seeds: tuple[str, ...] = ()
    # batch invariance (Contract.batch): one valid example in ``invariance_every`` has its
    # rows re-run in other batches, judged like any case ("tolerance") and also compared
    # bitwise with the whole batch's ("bitwise"); "off": never
    invariance: str = "tolerance"
    invariance_every: int = 16
    # CUDA-graph mode (cuda): one valid example in ``graph_every`` is also captured in a
    # CUDA graph and replayed on other values (oracle.graph_replay)
    cuda_graphs: bool = False
    graph_every: int = 4
    # --sanitize (cuda): one passing valid example in ``sanitize_every`` (of at most
    # kda_fuzz.workers.sanitize.MAX_CASE_BYTES) is replayed under compute-sanitizer's
    # ``sanitize`` tool (memcheck, racecheck, initcheck) in the background
    sanitize: str | None = None
    sanitize_every: int = 8
    # passing valid examples also run under this many other configs of each configurable
    # kernel their target launched (kda_fuzz.execution.configs), each judged as a case
    kernel_configs: int = 0

    @classmethod
    def of(cls, **options: Any) -> CampaignOptions:
        """Options from keywords: this class's fields, and the family's sizes (any other
        keyword, added to ``sizes``)."""
        own = {f.name for f in fields(cls)}
        sizes = {k: options.pop(k) for k in [k for k in options if k not in own]}
        if sizes:
            options["sizes"] = {**options.get("sizes", {}), **sizes}
        return cls(**options)
