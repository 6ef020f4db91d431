"""A campaign, resolved once: :class:`CampaignSpec` (what runs, against what, how), its
:class:`Budget` (every limit, and the one ``--max-seconds`` clock) and the options its jobs
draw and judge with (:class:`CampaignOptions`).

``kda-fuzz fuzz`` resolves its arguments and the project's configuration into one spec
(:func:`resolve`) and passes it whole to the supervisor, the jobs, the finding saver and
the summary: nobody looks the contract up by name again or derives a deadline of its own.
A spec crosses into a job process pickled with its family by name; the job rebuilds it
with one lookup (:meth:`CampaignSpec.__reduce__`). Light to import: the command line
imports it before anything heavy.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kda_fuzz.workers.deadline import Deadline

if TYPE_CHECKING:
    import argparse

    from kda_fuzz.campaign.shard import Shard
    from kda_fuzz.engine.contract import Contract
    from kda_fuzz.engine.oracle import Messages

DEFAULT_CORPUS = os.path.join("corpus", "found")  # collected by the pytest plugin
CAMPAIGN_JOBS_PER_GPU = 8  # ``--jobs auto``: campaign jobs sharing one GPU (H200 figures)


class UsageError(Exception):
    """The command line or the project's configuration asks for what cannot run (exit 2)."""


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
    # the extra checks of passing cases (batch invariance, CUDA graphs, other kernel
    # configs): each runs a turn only where it stays within this share of the job's time
    # with that turn at its mean cost (runner.within_share; Report.mode_held counts the
    # turns it waited); 1: always. Its own time understates what a check costs the
    # campaign (the next examples refill the allocator a capture emptied; other jobs share
    # the GPU): on an H100, 0.15 took 20-38 % of the plain rate, 0.07 within 15 %
    extra_share: float = 0.07
    # the judge's results read from the device once per this many valid examples of a turn
    # (a judge with Contract.judge_defers); a device fault or hang found with several
    # unread is traced to its example by running them again one at a time (supervisor)
    read_every: int = 1
    # positions up to this one run with every result read at once (such a re-run)
    read_each_through: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, **options: Any) -> CampaignOptions:
        """Options from keywords: this class's fields, and the family's sizes (any other
        keyword, added to ``sizes``)."""
        own = {f.name for f in fields(cls)}
        sizes = {k: options.pop(k) for k in [k for k in options if k not in own]}
        if sizes:
            options["sizes"] = {**options.get("sizes", {}), **sizes}
        return cls(**options)


# of the --max-seconds clock: the most a finding's minimization is kept from the draw
MINIMIZE_SHARE = 0.2


@dataclass(frozen=True)
class Budget:
    """Every limit of one campaign: examples, distinct failures, the per-call ceiling
    (``timeout``: the calibrated limit's, and a hang's proof), the seconds one finding's
    minimization may take, and the ``--max-seconds`` clock (``None``: no time limit). Each
    phase reads its instant here (``draw``, ``minimize``, ``kill``, ``settle``, ``calibrate``,
    ``replay``, ``end``: see :class:`~kda_fuzz.workers.deadline.Deadline`; ``None``
    without a clock)."""

    max_examples: int = 200
    max_failures: int = 1
    timeout: float = 60.0
    shrink_seconds: float = 30.0
    clock: Deadline | None = None

    @property
    def max_seconds(self) -> float | None:
        return None if self.clock is None else self.clock.seconds

    def _at(self, instant: str) -> float | None:
        return None if self.clock is None else float(getattr(self.clock, instant))

    @property
    def draw(self) -> float | None:
        """When the jobs stop drawing examples."""
        return self._at("draw")

    @property
    def kill(self) -> float | None:
        """When a job still in an example is killed."""
        return self._at("kill")

    @property
    def settle(self) -> float | None:
        """When every minimization has ended."""
        return self._at("settle")

    @property
    def minimize(self) -> float | None:
        """When the jobs stop drawing once a failure waits for its minimization: it is
        given ``shrink_seconds`` (at most ``MINIMIZE_SHARE`` of the clock) before
        ``settle``, never less because it was found late in the campaign."""
        if self.clock is None:
            return None
        reserve = min(self.shrink_seconds, MINIMIZE_SHARE * self.clock.seconds)
        return max(self.clock.started, self.clock.settle - reserve)

    @property
    def calibrate(self) -> float | None:
        """When the measurement of foreign targets gives up."""
        return self._at("calibrate")

    @property
    def replay(self) -> float | None:
        """When the example database's replay gives up."""
        return self._at("replay")

    @property
    def end(self) -> float | None:
        """When the command has ended."""
        return self._at("end")


@dataclass(frozen=True)
class CampaignSpec:
    """One campaign, resolved once: the family's :class:`Contract` and the ``variant``,
    the targets and peers (``MODULE:CALLABLE``, imported by each process that calls them),
    the jobs, the options every job draws and judges with (seed resolved, ``deadline``
    the budget's ``draw``), the :class:`Budget`, whether target calls are isolated, the
    corpus folder (``None``: nothing saved), the shard and what the summary says of how it
    was resolved (``notes``)."""

    contract: Contract
    variant: str
    targets: tuple[str, ...]
    peers: tuple[str, ...] = ()
    jobs: int = 1
    options: CampaignOptions = field(default_factory=lambda: CampaignOptions())
    budget: Budget = field(default_factory=Budget)
    isolate: bool = True
    corpus: str | None = None
    shard: Shard | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {self.jobs}")
        self.contract.checks_for(self.variant)  # an unknown variant fails here, not in a job
        if self.options.families and self.options.families < self.jobs:
            # one compile group per job at least
            object.__setattr__(self, "options", replace(self.options, families=self.jobs))

    @property
    def family(self) -> str:
        """The family's name (what files and reports record)."""
        return str(self.contract.name)

    @property
    def device(self) -> str:
        return self.options.device

    @property
    def seed(self) -> int:
        return int(self.options.seed or 0)

    @classmethod
    def of(cls, contract: Contract | str, variant: str, targets: Sequence[str], *,
           peers: Sequence[str] = (), jobs: int = 1, timeout: float = 60.0,
           isolate: bool = True, corpus: str | None = None, **options: Any) -> CampaignSpec:
        """A spec for a caller other than the command line: ``options`` are
        :class:`CampaignOptions` fields or the family's sizes; ``max_seconds`` starts the
        budget's clock now."""
        if isinstance(contract, str):
            from kda_fuzz.families import get_contract

            contract = get_contract(contract)
        o = CampaignOptions.of(**options)
        clock = None if o.max_seconds is None else Deadline(_now(), o.max_seconds)
        if clock is not None and o.deadline is None:
            o = replace(o, deadline=clock.draw)
        budget = Budget(max_examples=o.max_examples, max_failures=o.max_failures,
                        timeout=timeout, clock=clock)
        return cls(contract, variant, tuple(targets), tuple(peers), jobs, o, budget,
                   isolate=isolate, corpus=corpus)

    def with_options(self, **changes: Any) -> CampaignSpec:
        """This spec with some options changed (a calibration's sizes, a job's share)."""
        return replace(self, options=CampaignOptions.of(**{
            **{f.name: getattr(self.options, f.name) for f in fields(CampaignOptions)},
            **changes}))

    def __reduce__(self) -> tuple[Any, ...]:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "contract"}
        return (_rebuilt, (self.family, own))


def _rebuilt(family: str, own: dict[str, Any]) -> CampaignSpec:
    """A spec unpickled in another process: its family looked up once, there."""
    from kda_fuzz.families import get_contract

    return CampaignSpec(contract=get_contract(family), **own)


def resolve(args: argparse.Namespace, config: Any) -> CampaignSpec:
    """The campaign ``kda-fuzz fuzz``'s checked arguments (``args``, after the family,
    variant and targets were chosen) and the project's configuration (``config``) ask
    for; a :class:`UsageError` where they cannot run."""
    from kda_fuzz.families import get_contract
    from kda_fuzz.names import DEFAULT_FAMILY

    try:
        contract = get_contract(args.family or DEFAULT_FAMILY)
        contract.checks_for(args.contract)
    except ValueError as e:
        raise UsageError(str(e)) from e
    shard = shard_of(args)
    jobs = jobs_of(args)
    seeds, seed_notes = seed_layouts(args.seed_layouts, contract)
    options: dict[str, Any] = dict(
        device=args.device, max_examples=args.max_examples, seed=args.seed,
        valid_share=args.valid_share, max_seconds=args.max_seconds,
        max_failures=args.max_failures, messages=args.messages, strict=args.strict,
        invariance=args.invariance, cuda_graphs=args.cuda_graphs, history=bool(args.report),
        sanitize=args.sanitize, sanitize_every=args.sanitize_every,
        kernel_configs=args.helion_configs, seeds=seeds,
        extra_share=getattr(args, "extra_share", CampaignOptions.extra_share),
        read_every=getattr(args, "read_every", CampaignOptions.read_every),
        **shaping(args, contract), **pinned(args, contract, config))
    if shard is not None:  # the plan of the whole campaign, this shard's share of it
        from kda_fuzz.campaign.shard import DEFAULT_SEED

        options.update(max_examples=args.max_examples * shard.count,
                       shard=(shard.index, shard.count),
                       seed=DEFAULT_SEED if args.seed is None else args.seed)
    if options["seed"] is None:  # chosen here: the saved files name it
        options["seed"] = random.randrange(2**31)
    clock = getattr(args, "clock", None)  # the command's, from its process's start
    if clock is None and args.max_seconds is not None:
        clock = Deadline(getattr(args, "started", None) or _now(), args.max_seconds)
    if clock is not None:
        options["deadline"] = clock.draw
    budget = Budget(max_examples=args.max_examples, max_failures=args.max_failures,
                    timeout=args.timeout, shrink_seconds=args.shrink_seconds, clock=clock)
    corpus = None if args.no_save else args.corpus or default_corpus(config)
    return CampaignSpec(contract, args.contract, tuple(args.chosen.targets.specs),
                        tuple(getattr(args, "peer", None) or ()), jobs,
                        CampaignOptions.of(**options), budget, isolate=not args.no_isolate,
                        corpus=corpus, shard=shard, notes=tuple(seed_notes))


def _now() -> float:
    import time

    return time.monotonic()


def default_corpus(config: Any) -> str:
    """Where new findings are saved: the project's first corpus folder's ``found/``, else
    ``corpus/found``."""
    if config.present and config.corpus_dirs:
        return str(config.corpus_dirs[0] / "found")
    return DEFAULT_CORPUS


def shard_of(args: argparse.Namespace) -> Shard | None:
    """``--shard I/N`` (``None`` without it)."""
    if args.shard is None:
        return None
    from kda_fuzz.campaign.shard import parse_shard

    try:
        return parse_shard(args.shard)
    except ValueError as e:
        raise UsageError(str(e)) from None

def auto_jobs(device: str) -> int:
    """Jobs for ``--jobs auto``: ``CAMPAIGN_JOBS_PER_GPU`` per GPU in use on cuda, one per
    CPU core on cpu; never more than the CPU cores."""
    cpus = os.cpu_count() or 1
    if not device.startswith("cuda"):
        return cpus
    import torch

    gpus = 1 if ":" in device else max(1, torch.cuda.device_count())
    return max(1, min(cpus, CAMPAIGN_JOBS_PER_GPU * gpus))


def jobs_of(args: argparse.Namespace) -> int:
    """``--jobs``: a positive integer, or ``auto`` (8 per GPU on cuda, one per core on cpu)."""
    if args.jobs == "auto":
        return auto_jobs(args.device)
    try:
        jobs = int(args.jobs)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise UsageError(f"--jobs must be a positive integer or auto, not {args.jobs!r}")
    return jobs


def shaping(args: argparse.Namespace, contract: Contract | None = None) -> dict[str, Any]:
    """The campaign's compile groups (8 on cuda) and the family's sizes, resolved once by
    its ``Knobs.resolve`` from its options' values and the device (``contract`` None:
    the family of ``args``, else the default one)."""
    from kda_fuzz.families import knobs_of
    from kda_fuzz.names import DEFAULT_FAMILY

    knobs = (contract.knobs if contract is not None
             else knobs_of(getattr(args, "family", None) or DEFAULT_FAMILY))
    cuda = args.device.startswith("cuda")
    values = {k.dest: getattr(args, k.dest, k.default) for k in knobs.options}
    return {"families": args.families if args.families is not None else (8 if cuda else 0),
            **knobs.resolve(values, args.device, bool(args.target))}


def pinned(args: argparse.Namespace, contract: Contract, config: Any) -> dict[str, Any]:
    """``--layout`` pins and ``--unsupported`` features as campaign options, checked now
    (a pin no valid layout can have is a usage error)."""
    from kda_fuzz.engine.pins import PinError, parse_layout, scalar_of

    if not 0 <= args.layout_share <= 1:
        raise UsageError("--layout-share must be between 0 and 1")
    layouts = []
    for spec in args.layout:
        if "=" not in spec:
            if spec not in config.layouts:
                raise UsageError(f"--layout {spec!r}: no such preset in [tool.kda-fuzz.layouts]"
                                 f" (presets: {', '.join(config.layouts) or 'none'})")
            layouts.append((spec, {k: scalar_of(v) if isinstance(v, str) else v
                                   for k, v in config.layouts[spec].items()}))
            continue
        try:
            layouts.append((spec.replace(",", " "), parse_layout(spec)))
        except PinError as e:
            raise UsageError(f"--layout: {e}") from None
    unsupported = [*args.unsupported]
    for spec in [*(args.target or []), *(args.peer or [])]:
        unsupported += config.unsupported.get(spec, [])
    try:
        for _name, pins in layouts:
            contract.valid_cases(args.contract, pins=pins)
        if unsupported:
            if contract.restrict is None:
                raise UsageError(f"family {contract.name!r} declares no features to leave out")
            contract.restrict(unsupported, args.contract)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return {"layouts": tuple(layouts), "layout_share": args.layout_share,
            "unsupported": tuple(dict.fromkeys(unsupported))}


def seed_layouts(paths: Sequence[str], contract: Contract) -> tuple[tuple[str, ...], list[str]]:
    """The corpus files of ``--seed-layouts`` for ``contract``'s family, each checked now
    (a file that does not decode is a usage error), and the summary's note."""
    if not paths:
        return (), []
    from kda_fuzz.corpus.store import load_case

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.json"))
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"--seed-layouts {p}: no such file or folder")
    mine, other = [], 0
    for f in files:
        try:
            case, _, _ = load_case(f)
        except Exception as e:  # a bad file is the user's to fix: say which one
            raise UsageError(f"--seed-layouts: {f}: {e}") from None
        if case.contract == contract.name:
            mine.append(str(f))
        else:
            other += 1
    note = (f"seed layouts: {len(mine)} corpus case(s) run first, as they are"
            + (f" ({other} file(s) of other families left out)" if other else ""))
    return tuple(mine), [note]
