"""What a campaign found: its distinct failures, the variants its targets ran, and the
report of its counts (the JSON summary's model)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kda_fuzz.campaign.channel import ExitReason, Stop
from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.oracle import EnvironmentFailure, Outcome
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.execution import configs
from kda_fuzz.execution.variants import CONFIG_SPACE, Variant

# the stops the JSON summary's ``stopped`` names: a cut by the clock or a signal (a
# campaign that ran its plan, or stopped at --max-failures, has none)
CUT_SHORT = (ExitReason.DEADLINE, ExitReason.INTERRUPTED, ExitReason.TERMINATED)
HARD_KINDS = ("crash", "timeout")  # never re-run in the campaign: each try may kill


@dataclass
class Failure:
    """One distinct failure: the first case that showed it (minimized when possible) and
    how many examples showed it (``count``, repeats included)."""

    case: Case
    verdict: Verdict
    target: str
    saved: str | None = None
    original: Case | None = None
    count: int = 1
    note: str = ""
    reproduce: str = ""  # the command that replays the saved file as the campaign ran it
    # time to this finding: seconds from the campaign's start, and the example (counted from
    # 1, over all jobs) that first showed it; None for a failure not found by this campaign
    found_seconds: float | None = None
    found_example: int | None = None

    def add_note(self, text: str) -> None:
        """Append ``text`` to ``note`` (``; `` between notes)."""
        self.note = f"{self.note}; {text}" if self.note else text

    @property
    def signature(self) -> tuple[Any, ...]:
        """The target and the verdict's :meth:`Verdict.signature` on this case's variant."""
        return (self.target, *self.verdict.signature(self.case.variant))


WORDING_SAMPLES = 5
CAUSES = 5  # distinct causes of examples not executable, kept with their counts
VARIANTS = 200  # distinct variants kept per target; later ones are counted together
MORE_VARIANTS = "(other variants)"


@dataclass
class VariantSeen:
    """One compiled variant a target ran (``Outcome.variants``, see
    :mod:`kda_fuzz.execution.variants`): in how many examples, and the smallest layout
    (in bytes of its buffers) that reached it."""

    kernel: str
    detail: str = ""
    space: int = 0  # Variant.space: the variants its kernel declares (-1: a config space)
    count: int = 0
    layout: str = ""
    size: int = 0

    def merge(self, other: VariantSeen) -> None:
        self.count += other.count
        if other.layout and (not self.layout or other.size < self.size):
            self.layout, self.size = other.layout, other.size


def _room(seen: dict[str, VariantSeen], label: str, new: VariantSeen) -> VariantSeen:
    """The record a new variant is counted in: its own, or past ``VARIANTS`` distinct
    ones (a kernel specialising on every shape) the one of the others together."""
    if len(seen) < VARIANTS or label == MORE_VARIANTS:
        return seen.setdefault(label, new)
    return seen.setdefault(MORE_VARIANTS, VariantSeen(
        "*", f"the variants past the first {VARIANTS} of this target, counted together"))


def case_bytes(case: Case) -> int:
    """The bytes a case's views reach (what makes one layout smaller than another)."""
    return sum(t.footprint() * t.base.element_size() for t in case.tensors.values())


@dataclass
class Report:
    """Counts and findings of one campaign."""

    contract: str
    variant: str
    targets: list[str]
    examples: int = 0
    valid_cases: int = 0
    broken_cases: int = 0
    skipped: int = 0
    seeds: int = 0  # of ``examples``: seed cases run (CampaignOptions.seeds)
    batch_checks: int = 0  # valid examples whose rows were re-run in other batches
    graph_checks: int = 0  # valid examples also replayed from a CUDA graph
    # --sanitize: samples (passing case x target) sent to compute-sanitizer, those it ran
    # to their end (clean or not), of them those with errors (findings), those whose
    # sanitized run failed (never verdicts; by cause), and the tool's seconds per case
    # summed; the rest were not run (time ran out, or the campaign stopped, first)
    sanitize_sampled: int = 0
    sanitized: int = 0
    sanitize_found: int = 0
    sanitize_failed: int = 0
    sanitize_seconds: float = 0.0
    sanitize_causes: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    seed: int | None = None
    checks_hit: Counter = field(default_factory=Counter)
    validation_gaps: Counter = field(default_factory=Counter)
    wording: Counter = field(default_factory=Counter)  # check -> differently worded errors
    wording_samples: list[tuple[int | None, str, str]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # With CampaignOptions.history: one record per example, {"t": seconds since the start,
    # "examples": count, "budget": Outcome.budget, "compile": whether it compiled,
    # "compile_seconds": seconds in those compiles (kda_fuzz.execution.compiles)}
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # more JSON summary keys (shard, ...)
    # why the campaign stopped early (None: it ran its plan); the JSON's ``stopped`` says
    # so when the cut was the clock's or a signal's (CUT_SHORT)
    stopped: Stop | None = None
    # seconds spent per stratum ("broken", "valid", "scale"), summed over jobs
    stratum_seconds: Counter = field(default_factory=Counter)
    # Triton and Helion compiles during the examples, counted by their hooks
    # (kda_fuzz.execution.compiles), and the seconds spent in them
    compiles: int = 0
    compiling_seconds: float = 0.0
    # examples the execution machinery could not run (an interpreter gap on CPU: never a
    # verdict), of them valid layouts, and their causes (a few distinct ones, counted)
    unexecutable: int = 0
    unexecutable_valid: int = 0
    unexecutable_causes: Counter = field(default_factory=Counter)
    # supervised jobs: seconds from a job's launch to its first example (the fork, CUDA
    # context, imports of the targets), summed over jobs and restarts
    startup_seconds: float = 0.0
    # the family's own facts (Contract.tally; its keys): counts summed over examples and
    # jobs, and the largest of each size its cases reached
    facts: Counter = field(default_factory=Counter)
    peaks: dict[str, int] = field(default_factory=dict)
    # draws not run because layouts of their signature crashed or hung (kda_fuzz.campaign.steering)
    shifted: Counter = field(default_factory=Counter)
    # seconds of the extra checks of passing cases, by mode ("batch invariance", "CUDA
    # graphs"; "sanitizer": the tool's own, in the background), summed over jobs
    mode_seconds: Counter = field(default_factory=Counter)
    # turns of those checks that waited: the check had taken its share of the job's time
    # (CampaignOptions.extra_share), by mode
    mode_held: Counter = field(default_factory=Counter)
    # examples of the pinned layouts' arms, by "stratum:NAME" ("valid:qwen", "scale:qwen")
    pinned: Counter = field(default_factory=Counter)
    # variant coverage: target -> variant label -> what ran it (kda_fuzz.execution.variants)
    variants: dict[str, dict[str, VariantSeen]] = field(default_factory=dict)
    # CampaignOptions.kernel_configs: valid examples also run under other kernel configs,
    # the runs judged, and the configs skipped (they do not compile or run here) by cause
    config_checks: int = 0
    config_runs: int = 0
    config_adjusted: int = 0  # runs whose drawn config was fitted to the call (configs.fit_to_call)
    config_skips: Counter = field(default_factory=Counter)
    # the contract (its tally and summary hooks); None: the registered one of that name
    family: Contract | None = field(default=None, repr=False, compare=False)

    COUNTERS = ("examples", "valid_cases", "broken_cases", "skipped", "seeds", "batch_checks",
                "graph_checks", "sanitize_sampled", "sanitized", "sanitize_found",
                "sanitize_failed", "sanitize_seconds", "compiles", "compiling_seconds",
                "startup_seconds",
                "unexecutable", "unexecutable_valid", "config_checks", "config_runs",
                "config_adjusted")

    def contract_hooks(self) -> Contract | None:
        """The contract whose hooks count and summarize the family's facts (``family``,
        else the registered contract named ``contract``; None: none known)."""
        if self.family is None:
            from kda_fuzz.families import get_contract

            try:
                self.family = get_contract(self.contract)
            except ValueError:
                return None
        return self.family

    def record(self, outcome: Outcome, case: Case, stratum: str = "valid") -> None:
        """Count one judged example (its first target's outcome) of ``stratum``, and what
        the family tallies of it (``Contract.tally``: e.g. the rows it verified)."""
        self.examples += 1
        exp = outcome.expectation
        if outcome.status == "gap":
            label = exp.hole if exp.hole else "+".join(case.notes.get("breakages", ["?"]))
            self.validation_gaps[label] += 1
        elif exp.ok:
            self.valid_cases += 1
        else:
            self.broken_cases += 1
            self.checks_hit[exp.check if exp.check is not None else f"hole:{exp.hole}"] += 1
        if outcome.status == "skip":
            self.skipped += 1
        family = self.contract_hooks()
        if family is not None and family.tally is not None:
            tally = family.tally(case, outcome, stratum)
            self.facts.update(tally.sums)
            self._largest(tally.peaks)
        if outcome.wording is not None:
            self.wording[outcome.wording[0]] += 1
            if len(self.wording_samples) < WORDING_SAMPLES:
                self.wording_samples.append(outcome.wording)

    def ran(self, target: str, launched: Sequence[Variant], case: Case,
            layout: Callable[[Case], str]) -> None:
        """Count the variants one example's call of ``target`` launched (``layout``: the
        one-line summary of a case, made only for a variant's smallest case so far)."""
        if not launched:
            return
        seen = self.variants.setdefault(target, {})
        size = case_bytes(case)
        for v in launched:
            rec = seen.get(v.label)
            if rec is None:
                rec = _room(seen, v.label, VariantSeen(v.kernel, v.detail, v.space))
            rec.count += 1
            if not rec.layout or size < rec.size:
                rec.layout, rec.size = layout(case), size

    def unrun_variants(self) -> list[str]:
        """Where the variants that ran show others that did not: an autotuner's configs
        not chosen, a config space of which only the kernel's own config ran."""
        out = []
        for target, seen in sorted(self.variants.items()):
            kernels: dict[tuple[str, int], int] = {}
            for rec in seen.values():
                if rec.space > 1 or rec.space == CONFIG_SPACE:
                    kernels[(rec.kernel, rec.space)] = kernels.get((rec.kernel, rec.space), 0) + 1
            for (kernel, space), n in sorted(kernels.items()):
                if space > n:
                    out.append(f"{target}: {kernel} declares {space} autotune configs, "
                               f"{n} ran (chosen by its autotuner; on cpu the first)"
                               + ("" if self.config_runs else
                                  f": {configs.OPTION} N runs N others"))
                elif space == CONFIG_SPACE and not self.config_runs:
                    out.append(f"{target}: {kernel} has a config space; only its own config "
                               f"ran ({n} variant(s)): {configs.OPTION} N runs N others")
        return out

    def variants_json(self) -> dict[str, Any]:
        """Per target: each variant that ran (most examples first) with the smallest layout
        that reached it."""
        return {target: [{"id": label, "kernel": r.kernel, "examples": r.count,
                          "layout": r.layout, "layout_bytes": r.size, "detail": r.detail,
                          **({"declared": r.space} if r.space > 1 else {}),
                          **({"config_space": True} if r.space == CONFIG_SPACE else {})}
                         for label, r in sorted(seen.items(), key=lambda kv: (-kv[1].count,
                                                                              kv[0]))]
                for target, seen in sorted(self.variants.items())}

    def not_executable(self, exp_ok: bool, cause: str) -> None:
        """Count an example the execution machinery could not run (not a verdict)."""
        self.unexecutable += 1
        self.unexecutable_valid += int(exp_ok)
        self._causes({cause: 1})

    def _causes(self, causes: dict[str, int]) -> None:
        for cause, n in causes.items():
            if cause in self.unexecutable_causes or len(self.unexecutable_causes) < CAUSES:
                self.unexecutable_causes[cause] += n

    def _largest(self, sizes: Mapping[str, int]) -> None:
        for k, v in sizes.items():
            self.peaks[k] = max(v, self.peaks.get(k, 0))

    def counters(self) -> dict[str, Any]:
        """The counts alone (what a job sends as progress, and resumes from)."""
        out: dict[str, Any] = {n: getattr(self, n) for n in self.COUNTERS}
        out.update(checks_hit=dict(self.checks_hit), validation_gaps=dict(self.validation_gaps),
                   wording=dict(self.wording), wording_samples=list(self.wording_samples),
                   stratum_seconds=dict(self.stratum_seconds), facts=dict(self.facts),
                   peaks=dict(self.peaks), unexecutable_causes=dict(self.unexecutable_causes),
                   shifted=dict(self.shifted), mode_seconds=dict(self.mode_seconds),
                   mode_held=dict(self.mode_held),
                   pinned=dict(self.pinned), config_skips=dict(self.config_skips),
                   sanitize_causes=dict(self.sanitize_causes),
                   variants={t: {k: vars(r).copy() for k, r in seen.items()}
                             for t, seen in self.variants.items()})
        return out

    def add_counters(self, c: dict[str, Any]) -> None:
        """Add another campaign's (a job's) :meth:`counters` to this report's."""
        for n in self.COUNTERS:
            setattr(self, n, getattr(self, n) + c.get(n, 0))
        self._causes(c.get("unexecutable_causes", {}))
        self.checks_hit.update(c["checks_hit"])
        self.validation_gaps.update(c["validation_gaps"])
        self.wording.update(c["wording"])
        self.stratum_seconds.update(c.get("stratum_seconds", {}))
        self.facts.update(c.get("facts", {}))
        self._largest(c.get("peaks", {}))
        self.shifted.update(c.get("shifted", {}))
        self.mode_seconds.update(c.get("mode_seconds", {}))
        self.mode_held.update(c.get("mode_held", {}))
        self.pinned.update(c.get("pinned", {}))
        self.sanitize_causes.update(c.get("sanitize_causes", {}))
        for cause, n in c.get("config_skips", {}).items():
            if cause in self.config_skips or len(self.config_skips) < CAUSES:
                self.config_skips[cause] += n
        for target, seen in c.get("variants", {}).items():
            mine = self.variants.setdefault(target, {})
            for label, rec in seen.items():
                other = VariantSeen(**rec)
                if label in mine:
                    mine[label].merge(other)
                else:
                    kept = _room(mine, label, VariantSeen(other.kernel, other.detail,
                                                          other.space))
                    kept.merge(other)
        room = WORDING_SAMPLES - len(self.wording_samples)
        self.wording_samples.extend(c["wording_samples"][:max(0, room)])

    def add_failure(self, failure: Failure) -> Failure:
        """Keep ``failure`` if it is a new distinct one, else count it as a repeat of the
        one kept; returns the kept one."""
        for f in self.failures:
            if f.signature == failure.signature:
                f.count += failure.count
                if failure.found_seconds is not None and (
                        f.found_seconds is None or failure.found_seconds < f.found_seconds):
                    f.found_seconds, f.found_example = failure.found_seconds, \
                        failure.found_example  # another job saw it first
                return f
        self.failures.append(failure)
        return failure

    def first_finding(self) -> dict[str, Any] | None:
        """``{"seconds", "example"}`` of the earliest distinct failure this campaign found
        (None without one)."""
        found = [f for f in self.failures if f.found_seconds is not None]
        if not found:
            return None
        f = min(found, key=lambda f: f.found_seconds or 0.0)
        return {"seconds": round(f.found_seconds or 0.0, 3), "example": f.found_example}

    def to_json(self) -> dict[str, Any]:
        return {
            "contract": self.contract,
            "variant": self.variant,
            "targets": self.targets,
            "seed": self.seed,
            "examples": self.examples,
            "valid_cases": self.valid_cases,
            "broken_cases": self.broken_cases,
            "skipped_unjudgeable": self.skipped,
            "seed_layouts": self.seeds,
            "batch_invariance_checks": self.batch_checks,
            "cuda_graph_checks": self.graph_checks,
            "mode_seconds": {k: round(v, 3) for k, v in sorted(self.mode_seconds.items())},
            "mode_held": dict(sorted(self.mode_held.items())),
            "pinned_examples": dict(sorted(self.pinned.items())),
            "sanitizer": {"sampled": self.sanitize_sampled, "sanitized": self.sanitized,
                          "found": self.sanitize_found,
                          "not_run": max(0, self.sanitize_sampled - self.sanitized
                                         - self.sanitize_failed),
                          "failed": self.sanitize_failed,
                          "failed_causes": dict(self.sanitize_causes),
                          "seconds": round(self.sanitize_seconds, 3)},
            "variants": self.variants_json(),
            "unrun_variants": self.unrun_variants(),
            "kernel_configs": {"examples": self.config_checks, "runs": self.config_runs,
                               "adjusted": self.config_adjusted,
                               "skipped": sum(self.config_skips.values()),
                               "skip_causes": dict(self.config_skips)},
            "failures": len(self.failures),
            "failure_details": [
                {"target": f.target, **f.verdict.to_json(), "count": f.count,
                 "layout": f.case.describe(), "saved": f.saved,
                 **({"reproduce": f.reproduce} if f.reproduce else {}),
                 **({"note": f.note} if f.note else {}),
                 "found_seconds": (None if f.found_seconds is None
                                   else round(f.found_seconds, 3)),
                 "found_example": f.found_example}
                for f in self.failures
            ],
            "first_finding": self.first_finding(),
            "seconds": round(self.seconds, 3),
            # summed over jobs (a campaign of 8 jobs has 8 seconds of them per second)
            "stratum_seconds": {k: round(v, 3) for k, v in self.stratum_seconds.items()},
            "compiles": self.compiles,
            "compiling_seconds": round(self.compiling_seconds, 3),
            "not_executable": {"examples": self.unexecutable, "valid": self.unexecutable_valid,
                               "causes": dict(self.unexecutable_causes)},
            "startup_seconds": round(self.startup_seconds, 3),
            "checks_hit": {str(k): v for k, v in sorted(self.checks_hit.items(), key=_check_key)},
            "validation_gaps": dict(self.validation_gaps),
            "shifted": dict(sorted(self.shifted.items())),
            "wording_differences": {str(k): v for k, v in self.wording.items()},
            "wording_samples": [{"check": c, "expected": e, "got": g}
                                for c, e, g in self.wording_samples],
            "notes": self.notes,
            "saved": self.saved,
            **self.family_json(),
            **({"stopped": self.stopped.reason.value}
               if self.stopped is not None and self.stopped.reason in CUT_SHORT else {}),
            **self.extra,
        }

    def family_json(self) -> dict[str, Any]:
        """The JSON summary keys of the family's facts (``Contract.report_json``)."""
        family = self.contract_hooks()
        if family is None or family.report_json is None:
            return {}
        return family.report_json(self)


def _check_key(item: tuple[Any, Any]) -> tuple[int, str]:
    k = item[0]
    return (k, "") if isinstance(k, int) else (1 << 30, str(k))


def require_executed(report: Report) -> None:
    """Note the examples the execution machinery could not run; raise
    :class:`EnvironmentFailure` when none of the campaign's valid layouts could run (or
    nothing at all): then the campaign verified nothing and says so with exit 2."""
    if not report.unexecutable:
        return
    causes = "; ".join(f"{n} x {c}" for c, n in report.unexecutable_causes.most_common())
    if report.examples == 0 or (report.unexecutable_valid and not report.valid_cases):
        raise EnvironmentFailure(
            f"none of the {report.unexecutable_valid} valid layout(s) drawn could run here "
            f"({report.unexecutable} example(s) not executable: {causes})")
    report.notes.append(
        f"not executable here: {report.unexecutable} example(s) "
        f"({report.unexecutable_valid} valid layouts), skipped: a failure of the execution "
        f"machinery, not a verdict on the target: {causes}")


def minimizable(verdict: Verdict) -> bool:
    """Whether a failure can be shrunk by re-running candidates in this process: not a
    crash, hang, flaky failure or peer disagreement."""
    return verdict.kind not in (*HARD_KINDS, "flaky", "sanitizer") \
        and not verdict.what.startswith("peers-")


def wants_minimizing(failure: Failure) -> bool:
    """Whether the campaign minimizes ``failure`` (in an isolated worker: what it can
    re-run, and crashes and hangs, each candidate of which may kill the worker; or under
    the sanitizer, a sanitizer finding); not flaky failures, not peer disagreements."""
    v = failure.verdict
    return (minimizable(v) or v.kind in (*HARD_KINDS, "sanitizer")) \
        and " vs " not in failure.target

