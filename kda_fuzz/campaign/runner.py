"""Fuzz campaigns: Hypothesis drives valid and broken cases through the oracles."""

from __future__ import annotations

import contextlib
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from kda_fuzz.campaign import sanitizing
from kda_fuzz.campaign.arms import Arm
from kda_fuzz.campaign.channel import ExitReason, Stop
from kda_fuzz.campaign.interleave import arm_before, cycle_of, in_turn_order, schedule
from kda_fuzz.campaign.shard import NOMINAL_SCALE_BUDGET, Shard, describe, shard_arms
from kda_fuzz.campaign.steering import Steering, describe_feature
from kda_fuzz.engine.case import Case, Judging, fingerprint
from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.oracle import (
    EnvironmentFailure,
    Messages,
    Outcome,
    batch_variance,
    expectation,
    graph_replay,
    run_case,
    run_peers,
    under_configs,
)
from kda_fuzz.engine.targets import (
    Target,
    TargetError,
    check_signature,
    default_targets,
    load_target,
)
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.execution import compiles, configs
from kda_fuzz.execution.variants import CONFIG_SPACE, Variant

# Loading targets lives in kda_fuzz.engine.targets; the names stay importable from here.
__all__ = ["Arm", "Campaign", "CampaignOptions", "Failure", "Recorder", "Report", "Target",
           "TargetError", "campaign", "check_signature", "deal", "default_targets",
           "fingerprint", "load_target", "minimizable", "plan"]


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

# (case, target, verdict, run) -> (smaller case, its verdict); ``run`` judges a candidate.
Minimizer = Callable[[Case, Target, Verdict, Callable[[Case], Outcome]], tuple[Case, Verdict]]


HARD_KINDS = ("crash", "timeout")  # never re-run in the campaign: each try may kill


def deal(arms: list[Arm], job: int, jobs: int) -> list[Arm]:
    """The arms that job ``job`` of ``jobs`` runs: broken and valid arms are each dealt out
    round-robin, so every job gets its share of both (see ``plan``'s ``parts``)."""
    arms = [replace(a, index=i) for i, a in enumerate(arms)]
    broken = [a for a in arms if a.stratum == "broken"]
    valid = [a for a in arms if a.stratum != "broken"]
    return broken[job::jobs] + valid[job::jobs]


def plan(contract: Contract, variant: str, max_examples: int, *, device: str = "cpu",
         valid_share: float = 0.5, families: int = 0, seed: int | None = None,
         parts: int = 1, layouts: Sequence[tuple[str, Mapping[str, Any]]] = (),
         layout_share: float = 0.75, restrict: Mapping[str, Any] | None = None,
         nominal_scale: bool = False, **sizes: Any) -> list[Arm]:
    """Split a campaign's examples: every broken stratum (each breakage, each adjacent pair
    of checks) gets its share, then a random mix of breakages, then valid layouts. The
    arms run interleaved, each from the first round on in proportion to its examples
    (:mod:`kda_fuzz.campaign.interleave`), so the list's order is not the order examples run in.

    ``sizes`` are the family's own (``Contract.knobs``: e.g. elements per case, batch
    size), handed to its strategies as its ``Knobs.valid`` and ``Knobs.groups`` say;
    a size the family does not take is a ``TypeError``.

    With ``families`` (and a contract that defines them) the valid examples are spent
    family by family, so a shape-specialising kernel compiles a few times per family.
    Without families the valid examples are split into ``parts`` arms (one per job).

    The contract's scale stratum (``Contract.scale``) takes the share of the examples
    (from the valid ones) its ``Knobs.scale`` gives, sized to its bytes per case (None:
    0.8 of the device's free memory split between ``parts`` jobs; with
    ``nominal_scale``, on cuda, a large nominal budget instead, the device untouched);
    none when nothing fits.

    ``layouts``: named pins (a deployment's shapes); ``layout_share`` of the valid examples
    go to them (``valid:pin:NAME`` arms: the pinned fields fixed, everything else drawn
    around them), the rest to the whole space. ``restrict``: pins every arm honours
    (what the targets do not support is never drawn)."""
    contract.knobs.check(sizes, contract.name)
    share, budget = contract.knobs.scale(sizes)
    arms_scale = _scale_arms(contract, variant, max_examples, device, share, budget, parts,
                             restrict, nominal_scale, layouts, layout_share)
    max_examples -= sum(a.examples for a in arms_scale)
    arms = _plan(contract, variant, max_examples, device=device, valid_share=valid_share,
                 families=families, seed=seed, parts=parts, layouts=layouts,
                 layout_share=layout_share, restrict=restrict, sizes=sizes)
    return [*arms, *arms_scale]


def _scale_arms(contract: Contract, variant: str, max_examples: int, device: str,
                share: float, budget: int | None, parts: int,
                restrict: Mapping[str, Any] | None = None, nominal: bool = False,
                layouts: Sequence[tuple[str, Mapping[str, Any]]] = (),
                layout_share: float = 0.75) -> list[Arm]:
    """The scale stratum's arms; with pinned ``layouts``, ``layout_share`` of its examples
    go to the limits at each layout's heads (``scale:pin:NAME``), when any fits."""
    stratum = contract.scale
    n = round(max_examples * share)
    if not n or stratum is None:
        return []
    if budget is None:
        budget = (NOMINAL_SCALE_BUDGET if nominal and str(device).startswith("cuda")
                  else stratum.device_budget(device, parts))
    if not budget:
        return []
    kw: dict[str, Any] = {"pins": restrict} if restrict else {}
    arms: list[Arm] = []
    time_share = max(SCALE_TIME_SHARE, share)
    pinned = [(name, stratum.cases(variant, device, budget, focus=pins, **kw))
              for name, pins in layouts] if stratum.focus else []
    pinned = [(name, s) for name, s in pinned if s is not None]
    if pinned:
        n_pinned = round(n * layout_share)
        n -= n_pinned
        for (name, strategy), m in zip(pinned, _split(n_pinned, len(pinned))):
            arms += [Arm(f"scale:pin:{name}" + (f":part{j}" if parts > 1 else ""), strategy,
                         k, time_share=time_share)
                     for j, k in enumerate(_split(m, max(1, parts))) if k]
    strategy = stratum.cases(variant, device, budget, **kw)
    if strategy is not None:
        arms += [Arm(f"scale:part{j}" if parts > 1 else "scale", strategy, k,
                     time_share=time_share)
                 for j, k in enumerate(_split(n, max(1, parts))) if k]
    return arms


def _plan(contract: Contract, variant: str, max_examples: int, *, device: str,
          valid_share: float, families: int, seed: int | None, parts: int,
          layouts: Sequence[tuple[str, Mapping[str, Any]]] = (),
          layout_share: float = 0.75, restrict: Mapping[str, Any] | None = None,
          sizes: Mapping[str, Any] | None = None) -> list[Arm]:
    strata = contract.broken_arms(variant)
    n_broken = round(max_examples * (1 - valid_share))
    per = (n_broken * 4 // 5) // max(1, len(strata))  # 0: too few examples, mix only
    pk: dict[str, Any] = {"pins": dict(restrict)} if restrict else {}
    arms = [Arm(f"broken:{name}", contract.broken_cases(variant, device=device, only=only,
                                                        **pk), per)
            for name, only in strata] if per else []
    used = per * len(arms)
    mix = max(0, n_broken - used)
    if mix:
        arms.append(Arm("broken:mix", contract.broken_cases(variant, device=device, **pk),
                        mix))
    used += mix
    n_valid = max_examples - used
    if n_valid <= 0:
        return arms
    sizes = sizes or {}
    kw: dict[str, Any] = {"device": device, **contract.knobs.valid(sizes)}
    if layouts:
        n_pinned = round(n_valid * layout_share)
        n_valid -= n_pinned
        for (name, pins), n in zip(layouts, _split(n_pinned, len(layouts))):
            strategy = contract.valid_cases(variant, **kw, pins={**(restrict or {}), **pins})
            arms += [Arm(f"valid:pin:{name}" + (f":part{j}" if parts > 1 else ""),
                         strategy, k) for j, k in enumerate(_split(n, max(1, parts))) if k]
    kw.update(pk)
    fams = (contract.families(variant, families, seed or 0, **contract.knobs.groups(sizes))
            if families and contract.families else [])
    if not fams:
        strategy = contract.valid_cases(variant, **kw)
        if parts <= 1:
            return [*arms, Arm("valid", strategy, n_valid)]
        return [*arms, *(Arm(f"valid:part{j}", strategy, n) for j, n in
                         enumerate(_split(n_valid, parts)) if n)]
    return [*arms, *(Arm(f"valid:family{i}", contract.valid_cases(variant, family=f, **kw), n)
                     for i, (f, n) in enumerate(zip(fams, _split(n_valid, len(fams)))) if n)]


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (i < n % parts) for i in range(parts)]



# a time-bounded campaign gives the scale stratum at most this share of a job's time (or
# its share of examples, if larger): its cases cost tens of the others' (a compile per
# shape for a shape-specialising kernel)
SCALE_TIME_SHARE = 0.1


_LEAD = st.integers(0, 255)  # each example's first draw (see Campaign._body)

# A position in a campaign: (round, arm within the job, example within the arm's run).
# Positions grow in the order examples run, and a campaign run again from the same plan
# and seed draws the same case at the same position (the layouts are built from seeded
# generators), which is what lets a supervised job resume after a crash.
Position = tuple[int, int, int]
END: Position = (1 << 62, 0, 0)


class _Stopped(BaseException):
    """Ends the Hypothesis run at once (not an ``Exception``: Hypothesis lets it through
    without replaying or shrinking)."""


class _Halt(BaseException):
    """Carries an error out of the Hypothesis run (internal error, environment failure)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


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


def campaign_plan(contract: Contract, variant: str, o: CampaignOptions,
                  nominal_scale: bool = False) -> list[Arm]:
    """The whole plan of a campaign with options ``o`` (before it is dealt to jobs)."""
    restrict = (contract.restrict(o.unsupported, variant)
                if o.unsupported and contract.restrict is not None else None)
    return plan(contract, variant, o.max_examples, device=o.device,
                valid_share=o.valid_share, families=o.families, seed=o.seed, parts=o.job[1],
                layouts=o.layouts, layout_share=o.layout_share, restrict=restrict,
                nominal_scale=nominal_scale, **o.sizes)


class Recorder:
    """Where a campaign says what it is doing, so that a supervisor can tell a target's
    crash or hang from the fuzzer's own (the in-process default records nothing).

    ``alternative``: 1 + the number of the other kernel configs the calls are made under
    (``CampaignOptions.kernel_configs``), 0 under the kernels' own: a crash or hang there
    is saved with it."""

    alternative: int = 0

    def call(self, position: Position, target: int) -> contextlib.AbstractContextManager[Any]:
        """Wraps one target call."""
        return contextlib.nullcontext()

    def expect(self, case: Case) -> None:
        """The case the next target calls are made on (a supervised job times them)."""

    def settle(self) -> contextlib.AbstractContextManager[Any]:
        """Wraps one case's call and judging: where a device fault the target caused
        (launches are asynchronous) surfaces, at the latest when it ends."""
        return contextlib.nullcontext()

    def progress(self, position: Position) -> None:
        """The examples before ``position`` are done."""


class Campaign:
    """One fuzz campaign over a contract variant: a plan of arms run through Hypothesis,
    every case judged on every target, distinct failures kept (with repeat counts) until
    ``max_failures`` of them, the examples or the time run out.

    A campaign can start part-way (``resume``: the position of its first example to run,
    with the counts it had there) and be told which positions already crashed or hung
    (``hard``: position -> (target index, verdict)); those cases are regenerated, recorded
    as failures and not run again. ``seen``: signatures of failures already kept by
    whoever runs this campaign (a restarted job's supervisor); they count as repeats.
    Draws like layouts that crashed or hung get less of the budget
    (:mod:`kda_fuzz.campaign.steering`; its state resumes with ``resume``'s counts)."""

    def __init__(self, contract: Contract, variant: str, targets: list[Target], *,
                 peers: list[Target] | None = None, options: CampaignOptions | None = None,
                 on_example: Callable[[Report], None] | None = None,
                 on_failure: Callable[[Failure, bool], None] | None = None,
                 stop: Callable[[], bool] | None = None, recorder: Recorder | None = None,
                 resume: tuple[Position, dict[str, Any]] | None = None,
                 hard: dict[Position, tuple[int, Verdict]] | None = None,
                 seen: frozenset[tuple[Any, ...]] = frozenset()) -> None:
        contract.checks_for(variant)  # rejects unknown variants early
        self.contract, self.variant = contract, variant
        self.peers = list(peers or [])
        self.targets = [*targets, *self.peers]
        self.options = options or CampaignOptions()
        declared = [u for t in self.targets for u in getattr(t.fn, "kda_fuzz_unsupported", ())]
        if declared:  # what a target says it does not support is never drawn for it
            self.options = replace(self.options, unsupported=tuple(dict.fromkeys(
                [*self.options.unsupported, *declared])))
        if self.options.seed is None:
            self.options = replace(self.options, seed=random.randrange(2**31))
        self.report = Report(contract.name, variant, [t.name for t in self.targets],
                             seed=self.options.seed, family=contract)
        self.on_example, self.on_failure, self.stop = on_example, on_failure, stop
        self.recorder = recorder or Recorder()
        self.resume_at: Position = (-1, 0, 0)  # seeds run at (-1, 0, i) (see _run_seeds)
        if resume is not None:
            self.resume_at = resume[0]
            self.report.add_counters(resume[1])
        self.hard = dict(hard or {})
        self._stratum = "valid"  # the stratum of the arm being run (see _run_arm)
        self._arm = "valid"  # and its name
        self.known: dict[tuple[Any, ...], Failure] = {}
        self.seen = seen  # failures kept elsewhere (by the supervisor): repeats here
        self.stopped: Stop | None = None  # why it stopped early (None: not yet, or never)
        self._pos: list[int] = [0, 0, 0]
        self._share: tuple[int, int] = (0, 1)
        self._strategy: st.SearchStrategy[Case] = st.nothing()
        self._cycle = 1  # rounds of a cycle of the plan (see _run_rounds)
        self._first = 0  # the number (over its turns) of the arm's first example of this turn
        self._largest: int | None = None  # the whole plan's largest arm (see arms)
        self._t0 = time.monotonic()
        self._nth = 0  # the number of the example being run (from 1)
        self._sanitizer: sanitizing.SanitizerClient | None = None  # with options.sanitize
        self.steering = Steering(self.options.seed or 0,
                                 resume[1].get("steering") if resume is not None else None)

    # ------------------------------------------------------------------ running

    def arms(self) -> list[Arm]:
        """This job's share of the campaign's plan."""
        o = self.options
        arms = campaign_plan(self.contract, self.variant, o)
        # the whole plan's largest arm sets the rounds (kda_fuzz.campaign.interleave): every job and
        # shard runs its arms the way the single campaign would
        self._largest = max((a.examples for a in arms), default=1)
        mine = (shard_arms(arms, o.shard, job=o.job, seed=o.seed or 0) if o.shard[1] > 1
                else deal(arms, *o.job))
        return in_turn_order(mine)

    def run(self) -> Report:
        """Run the campaign (from ``resume`` on); raises what halted it (an internal
        error or an ``EnvironmentFailure``)."""
        t0 = time.monotonic()
        o = self.options
        self._t0 = o.origin if o.origin is not None else t0
        deadline = o.deadline if o.deadline is not None else (
            None if o.max_seconds is None else t0 + o.max_seconds)
        self._deadline = deadline
        arms = self.arms()
        largest = self._largest or max((a.examples for a in arms), default=1)
        self._sanitizer_start(deadline)
        try:
            self._run_seeds(deadline)
        except _Stopped:
            arms = []
        except _Halt as h:
            raise h.error from None
        with _global_constants_only():
            self._run_rounds(arms, largest, deadline)
        self._sanitizer_finish(deadline)
        if self.contract.status is not None:
            self.report.notes += self.contract.status()
        self.recorder.progress(END)
        self.report.seconds = time.monotonic() - t0
        return self.report

    def _run_seeds(self, deadline: float | None) -> None:
        """Run this job's share of the seed cases (``options.seeds``: corpus files of the
        contract's family) before any draw, at positions ``(-1, 0, i)``."""
        o = self.options
        parts = o.shard[1] * o.job[1]
        mine = o.job[0] * o.shard[1] + o.shard[0]
        self._stratum = "seed"
        for i, path in enumerate(o.seeds):
            pos: Position = (-1, 0, i)
            if i % parts != mine or pos < self.resume_at:
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise _Stopped
            case = load_seed(self.contract, path)
            if o.device != "cpu":
                case = case.on(o.device)
            self._pos = [-1, 0, i]
            self.report.seeds += 1
            self._run_one(pos, case)

    def _run_rounds(self, arms: list[Arm], largest: int, deadline: float | None) -> None:
        """Run the arms interleaved (:func:`kda_fuzz.campaign.interleave.schedule`): in every round
        each arm its share, the plan's ``largest`` arm CHUNK examples; one cycle of rounds,
        or cycles until the ``deadline``."""
        cycle = self._cycle = cycle_of(largest)
        try:
            for rounds, ai, n in schedule(arms, cycle, repeat=deadline is not None):
                arm = arms[ai]
                if (rounds, ai, 1 << 62) < self.resume_at:
                    continue  # done before the resume point
                if deadline is not None and time.monotonic() > deadline:
                    raise _Stopped
                if deadline is not None and self._over_time_share(arm, arms):
                    continue  # its stratum has had its share of the time for now
                self._pos = [rounds, ai, 0]
                self._run_arm(arm, n, rounds)
        except _Stopped:
            pass
        except _Halt as h:
            raise h.error from None

    def _over_time_share(self, arm: Arm, arms: list[Arm]) -> bool:
        """Whether the arm's stratum has taken more than ``arm.time_share`` of this job's
        time so far (never when the job has no arm without a time share: it would idle)."""
        if arm.time_share is None or all(a.time_share is not None for a in arms):
            return False
        spent = self.report.stratum_seconds
        return spent[arm.stratum] > arm.time_share * sum(spent.values())

    def _run_arm(self, arm: Arm, n: int, rounds: int) -> None:
        self._share = arm.share
        self._stratum = arm.stratum
        self._arm = arm.name
        self._strategy = arm.strategy
        self._first = arm_before(arm, self._cycle, rounds)
        # every Hypothesis run starts with the arm's simplest case: after the first round
        # it is skipped before its case is drawn (see _body), so an arm of one example per
        # round does not run that case again and again
        test = settings(
            max_examples=n + (rounds > 0), database=None, deadline=None,
            phases=(Phase.generate,),
            suppress_health_check=list(HealthCheck), print_blob=False,
        )(given(st.data())(self._body))
        seed = self.options.seed or 0
        t = time.monotonic()
        try:
            hypothesis_seed((seed * 1009 + arm.index) * 7919 + rounds)(test)()
        finally:
            self.report.stratum_seconds[arm.stratum] += time.monotonic() - t

    def _body(self, data: st.DataObject) -> None:
        pos: Position = (self._pos[0], self._pos[1], self._pos[2])
        # one cheap draw first: an example that draws nothing would end the run (Hypothesis
        # takes its choices as exhausted)
        data.draw(_LEAD)
        if pos[0] and not pos[2]:
            self._pos[2] += 1
            return  # a later round's first example: the simplest case, run in the first round
        case = data.draw(self._strategy)  # (a case the strategy rejects gets no position)
        self._pos[2] += 1
        if (self._first + pos[2] - (pos[0] > 0)) % self._share[1] != self._share[0]:
            return  # another shard's example (drawn all the same: the draws stay aligned)
        if pos not in self.hard:
            run, why = self.steering.admits(pos, self._stratum, case,
                                            replay=pos < self.resume_at)
            if not run:
                if why is not None:
                    self.report.shifted[describe_feature(why)] += 1
                reject()  # like layouts that crashed or hung: another draw instead
        if pos < self.resume_at:
            return  # fast-forward: this example ran before the resume point
        self._run_one(pos, case)

    def _run_one(self, pos: Position, case: Case) -> None:
        """Run the example at ``pos``, then record the progress past it."""
        try:
            self._example(pos, case)
        except (_Stopped, _Halt):
            raise
        except Exception as e:  # an error of the fuzzer or of the environment
            raise _Halt(e) from e
        self.recorder.progress((pos[0], pos[1], pos[2] + 1))

    def _example(self, pos: Position, case: Case) -> None:
        self._nth = self.report.examples + 1  # this example's number in the job
        hard = self.hard.pop(pos, None)
        if hard is not None:  # crashed or hung here before: record it, never run it again
            index, verdict = hard
            outcome = Outcome("fail", expectation(self.contract, case), verdict)
            self._count(outcome, case)
            alt = verdict.extra.get("config_alternative")
            if alt is not None:  # it died under other configs: the file re-runs them
                saved = {"index": int(alt), "seed": self.options.seed or 0,
                         "configs": {k: {} for k in self._configurable(self.targets[index])}}
                case = Judging(configs=saved).mark(case)
                verdict = under_configs(verdict, saved)
            self._failed(case.on("cpu"), verdict, self.targets[index], confirmed=True)
            self.steering.observe(self._stratum, case, fault=True)
            return
        if self.stop is not None and self.stop():
            self.stopped = self.stopped or Stop(ExitReason.STOP_REQUESTED)
            raise _Stopped
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise _Stopped
        first: Outcome | None = None
        outcomes: list[Outcome] = []
        built = compiles.totals()
        try:
            for index, target in enumerate(self.targets):
                outcome = self._judge(pos, index, case, target, budget=first is None)
                first = first or outcome
                outcomes.append(outcome)
                self.report.ran(target.name, outcome.variants, case, self._layout)
                if outcome.status == "fail":
                    assert outcome.verdict is not None
                    self._failed(case, outcome.verdict, target, pos=pos, index=index)
                elif outcome.status in ("gap", "skip"):
                    break
        except EnvironmentFailure as e:  # not executable here: counted, never a verdict
            self._compiled(built)
            self.report.not_executable(expectation(self.contract, case).ok, str(e))
            if self.on_example is not None:
                self.on_example(self.report)
            return
        assert first is not None
        if first.status == "pass" and self._batch_turn(pos, first):
            with self._timed("batch invariance"):
                self._batch_invariance(pos, case)
        if first.status == "pass" and self._graph_turn(pos, first):
            with self._timed("CUDA graphs"):
                self._graph(pos, case)
        if self.options.kernel_configs and first.expectation.ok and self._stratum != "scale":
            with self._timed("other kernel configs"):
                self._other_configs(pos, case, outcomes)
        if first.status == "pass" and self._sanitize_turn(pos, first, case):
            self._sanitizer_submit(pos, case)
        self._sanitizer_collect()
        for peer in self.peers if first.status == "pass" else ():
            main = self.targets[0]
            pair = run_peers(self.contract, case, [(main.name, main.fn), (peer.name, peer.fn)])
            if pair.status == "fail" and pair.verdict is not None:
                self._failed(case, pair.verdict, Target(f"{main.name} vs {peer.name}", main.fn),
                             confirmed=True)
        compiled = self._compiled(built)
        self._count(first, case)
        self.steering.observe(self._stratum, case, fault=False)
        if self.options.history:
            self._remember(first, compiled)
        if len(self.report.failures) >= self.options.max_failures:
            self.stopped = Stop(ExitReason.MAX_FAILURES,
                                f"{len(self.report.failures)} distinct failures (--max-failures)")
            raise _Stopped

    def _batch_turn(self, pos: Position, first: Outcome) -> bool:
        """Whether this passing example's rows are re-run in other batches."""
        o = self.options
        return (o.invariance != "off" and self.contract.batch is not None
                and first.expectation.ok and self._stratum != "scale"
                and zlib.crc32(f"batch:{o.seed}:{pos}".encode()) % max(1, o.invariance_every)
                == 0)

    def _batch_invariance(self, pos: Position, case: Case) -> None:
        """Re-run the case's rows in the family's sub-batches on each target: each judged
        as a case of its own, and under ``bitwise`` compared with the whole batch's rows."""
        assert self.contract.batch is not None
        self.report.batch_checks += 1
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            for _, sub, _ in self.contract.batch.sub_batches(case):
                outcome = self._judge(pos, index, sub, target)
                if outcome.status == "fail" and outcome.verdict is not None:
                    self._failed(sub, outcome.verdict, target, pos=pos, index=index)
                    return
            if self.options.invariance != "bitwise":
                continue
            self.recorder.expect(case)
            with self.recorder.settle():
                v = batch_variance(self.contract, case, target.fn,
                                   guard=lambda i=index: self.recorder.call(pos, i))
            if v.status == "fail" and v.verdict is not None:
                marked = Judging(invariance="bitwise").mark(case)
                self._failed(marked, v.verdict, target, pos=pos, index=index)
                return

    def _graph_turn(self, pos: Position, first: Outcome) -> bool:
        """Whether this passing example is also replayed from a CUDA graph."""
        o = self.options
        return (o.cuda_graphs and first.expectation.ok and self._stratum != "scale"
                and zlib.crc32(f"graph:{o.seed}:{pos}".encode()) % max(1, o.graph_every) == 0)

    def _graph(self, pos: Position, case: Case) -> None:
        """Capture the case in a CUDA graph on each target and judge its replay on other
        values of the same buffers."""
        self.report.graph_checks += 1
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            self.recorder.expect(case)
            with self.recorder.settle(), self.recorder.call(pos, index):
                outcome = graph_replay(self.contract, case, target.fn)
            if outcome.status == "fail" and outcome.verdict is not None:
                marked = Judging(graph=True).mark(case)
                self._failed(marked, outcome.verdict, target, pos=pos, index=index)
                return

    @contextlib.contextmanager
    def _timed(self, mode: str) -> Iterator[None]:
        """Count the block's seconds as ``mode``'s (``Report.mode_seconds``)."""
        t = time.monotonic()
        try:
            yield
        finally:
            self.report.mode_seconds[mode] += time.monotonic() - t

    def _sanitize_turn(self, pos: Position, first: Outcome, case: Case) -> bool:
        """Whether this passing example is also replayed under compute-sanitizer."""
        o = self.options
        return (o.sanitize is not None and first.expectation.ok and self._stratum != "scale"
                and zlib.crc32(f"sanitize:{o.seed}:{pos}".encode()) % max(1, o.sanitize_every)
                == 0 and sum(t.footprint() * t.base.element_size()
                             for t in case.tensors.values()) <= sanitizing.MAX_CASE_BYTES)

    def _sanitizer_start(self, deadline: float | None) -> None:
        """With ``sanitize``: connect to the campaign's sanitized worker now (its start-up
        overlaps the examples; SanitizerMissing before any)."""
        o = self.options
        if o.sanitize is None:
            return
        self._sanitizer = sanitizing.SanitizerClient(
            o.sanitize, o.device, [t.name for t in self.targets[:len(self.targets)
                                                                - len(self.peers)]],
            name=f"{o.job[0]}:{o.shard[0]}", seed=o.seed, origin=o.origin, deadline=deadline)
        self._sanitizer.start()

    def _sanitizer_submit(self, pos: Position, case: Case) -> None:
        if self._sanitizer is None:
            return
        cpu = case.on("cpu")
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            self.report.sanitize_sampled += 1
            self._sanitizer.submit(sanitizing.Sample(cpu, target.name, index, (pos, index)))

    def _sanitizer_collect(self, samples: list[sanitizing.Sample] | None = None) -> None:
        """Count the sanitized samples back (``samples``, else those ready now); a report
        with errors is a failure of its own kind. A sanitizer that cannot run at all is
        the environment's failure."""
        client = self._sanitizer
        if client is None:
            return
        if client.unavailable is not None and not client.unavailable.ran \
                and not self.report.sanitized:
            raise EnvironmentFailure(f"--sanitize {client.tool}: {client.unavailable.detail}")
        for s in client.ready() if samples is None else samples:
            r = s.report
            if r is None:
                continue
            if not s.counted:
                s.counted = True
                if r.status == "failed":
                    self.report.sanitize_failed += 1
                    self.report.sanitize_causes[_sanitizer_cause(r.note)] += 1
                    continue
                self.report.sanitized += 1
                self.report.sanitize_seconds += r.seconds
                self.report.mode_seconds["sanitizer"] += r.seconds
            verdict = r.verdict()  # (a later report: errors printed after the case ended)
            if verdict is not None and not s.found:
                s.found = True
                self.report.sanitize_found += 1
                self._failed(s.case, verdict, self.targets[s.index], confirmed=True)

    def _sanitizer_finish(self, deadline: float | None) -> None:
        """Collect the samples still with the sanitizer (until ``deadline``); those not
        run by then stay counted as not run."""
        if self._sanitizer is None:
            return
        done, _ = self._sanitizer.finish(deadline,
                                         stopped=lambda: self.stop is not None and self.stop())
        self._sanitizer_collect(done)

    def _layout(self, case: Case) -> str:
        summarize = self.contract.summarize
        return summarize(case) if summarize is not None else case.describe()

    def _other_configs(self, pos: Position, case: Case, outcomes: list[Outcome]) -> None:
        """Run a valid case that passed on a target again under ``kernel_configs`` other
        configs of the configurable kernels it launched, each judged like any case; a
        config that does not compile or run here is skipped (counted), not a verdict."""
        counted = False
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            own = outcomes[index] if index < len(outcomes) else None
            if own is None or own.status != "pass" or not any(
                    configurable(v) for v in own.variants):
                continue
            if not counted:
                self.report.config_checks += 1
                counted = True
            for i in range(self.options.kernel_configs):
                self.recorder.alternative = i + 1
                try:
                    with configs.alternative(i, self.options.seed or 0) as alt:
                        outcome = self._judge(pos, index, case, target)
                finally:
                    self.recorder.alternative = 0
                if alt.exhausted:
                    break  # no more configs for this layout
                if alt.unavailable and outcome.status == "skip":
                    self.report.config_skips[_cause(alt.unavailable)] += 1
                    continue
                if not alt.used:
                    break  # it launched no configurable kernel this time
                self.report.config_runs += 1
                self.report.config_adjusted += bool(alt.adjusted)
                self.report.ran(target.name, outcome.variants, case, self._layout)
                if outcome.status == "fail" and outcome.verdict is not None:
                    saved = configs.note(alt)
                    marked = Judging(configs=saved).mark(case)
                    self._failed(marked, under_configs(outcome.verdict, saved), target,
                                 pos=pos, index=index)
                    return

    def _configurable(self, target: Target) -> list[str]:
        """The kernels with other configs to run the target was seen launching."""
        return sorted({r.kernel for r in self.report.variants.get(target.name, {}).values()
                       if configurable(r)})

    def _judge(self, pos: Position, index: int, case: Case, target: Target,
               budget: bool = False) -> Outcome:
        self.recorder.expect(case)
        with self.recorder.settle():
            return run_case(self.contract, case, target.fn, messages=self.options.messages,
                            strict=self.options.strict,
                            guard=lambda: self.recorder.call(pos, index),
                            budget=budget and self.options.history)

    def _compiled(self, before: compiles.Compiles) -> compiles.Compiles:
        """Count the compiles since ``before`` (this example's) in the report."""
        new = compiles.totals() - before
        self.report.compiles += new.count
        self.report.compiling_seconds += new.seconds
        return new

    def _remember(self, outcome: Outcome, compiled: compiles.Compiles) -> None:
        """One history record."""
        self.report.history.append({
            "t": round(time.monotonic() - self._t0, 4), "examples": self.report.examples,
            "budget": outcome.budget or {}, "compile": compiled.count > 0,
            "compile_seconds": round(compiled.seconds, 4)})

    def _count(self, outcome: Outcome, case: Case) -> None:
        self.report.record(outcome, case, self._stratum)
        if ":pin:" in self._arm:  # a pinned layout's arm: "valid:pin:NAME[:partJ]"
            self.report.pinned[f"{self._stratum}:{self._arm.split(':')[2]}"] += 1
        if self.on_example is not None:
            self.on_example(self.report)

    def _failed(self, case: Case, verdict: Verdict, target: Target, *, confirmed: bool = False,
                pos: Position | None = None, index: int = 0) -> None:
        """Keep a new distinct failure (re-run first: one that does not come back every
        time is ``flaky``) or count a repeat of a known one."""
        seconds = time.monotonic() - self._t0  # first seen (before any re-run)
        failure = Failure(case, verdict, target.name)
        known = self._known(failure)
        if known is None and not confirmed and self.options.confirm_runs:
            failure = self._confirm(failure, target, pos, index)
            known = self._known(failure)
        if known is not None:
            known.count += 1
            if self.on_failure is not None:
                self.on_failure(known, False)
            return
        if any(t.device.type == "cuda" for t in failure.case.tensors.values()):
            failure.case = failure.case.on("cpu")
        policy = Judging(strict=self.options.strict,
                         messages="class" if self.options.messages == "class" else None)
        if policy.notes():  # replay judges the saved case the way the campaign did
            failure.case = policy.mark(failure.case)
        failure.found_seconds = seconds
        failure.found_example = self._nth
        self.known[failure.signature] = failure
        self.report.failures.append(failure)
        if self.on_failure is not None:
            self.on_failure(failure, True)

    def _known(self, failure: Failure) -> Failure | None:
        sig = failure.signature
        if sig in self.seen and sig not in self.known:
            self.known[sig] = replace(failure, count=0)  # kept elsewhere: count repeats
        return self.known.get(sig)

    def _confirm(self, failure: Failure, target: Target, pos: Position | None,
                 index: int) -> Failure:
        """Re-run the failing case: a failure that a re-run does not show is ``flaky``.
        A re-run that fails again (in any way: a target racing on duplicate writes fails
        differently each time) reproduces it; a skip is no evidence, unless the rules the
        failure broke were judged and held (``Outcome.rules_held``)."""
        runs = same = 0
        other: list[str] = []
        numeric = failure.verdict.behaviour()[1] == "wrong-values"
        for _ in range(self.options.confirm_runs):
            again = (self._judge(pos, index, failure.case, target) if pos is not None
                     else Outcome("fail", expectation(self.contract, failure.case),
                                  failure.verdict))
            if again.status == "skip" and (numeric or not again.rules_held):
                continue  # e.g. out of device memory: no evidence either way
            runs += 1
            if again.status == "fail":
                same += 1
                if again.verdict is not None and again.verdict.signature() != \
                        failure.verdict.signature():
                    other.append(f"{again.verdict.kind}/{again.verdict.what}")
        if same == runs:
            notes = []
            if runs < self.options.confirm_runs:
                notes.append(f"re-run {runs} of {self.options.confirm_runs} times")
            if other:
                notes.append("re-runs failed differently: " + ", ".join(sorted(set(other))))
            failure.note = "; ".join(notes)
            return failure
        v = failure.verdict
        flaky = Verdict("flaky", v.what, f"seen once, then in {same} of {runs} re-runs of the "
                        f"same case: {v.detail}", v.check, v.message, v.output, v.max_error,
                        v.where, {**v.extra, "reproduced": same, "reruns": runs,
                                  "first_kind": v.kind})
        return Failure(failure.case, flaky, failure.target)


def configurable(variant: Any) -> bool:
    """Whether a variant's kernel has other configs to run (``--helion-configs``): a Helion
    config space, or an autotuner declaring more than one config."""
    return variant.space == CONFIG_SPACE or variant.space > 1


def _cause(text: str) -> str:
    """A skipped config's cause with its numbers masked (few distinct ones are kept)."""
    from kda_fuzz.engine.verdict import masked

    return masked(text)[:160]


def load_seed(contract: Contract, path: str) -> Case:
    """The case of the corpus file ``path`` as a seed of a ``contract`` campaign; raises
    ``ValueError`` for a file of another family or one that does not decode."""
    from kda_fuzz.corpus.store import load_case

    try:
        case, _, _ = load_case(path)
    except Exception as e:  # a bad file is the user's to fix: say which one
        raise ValueError(f"seed layout {path}: {e}") from e
    if case.contract != contract.name:
        raise ValueError(f"seed layout {path} is a {case.contract!r} case, the campaign "
                         f"fuzzes {contract.name!r}")
    return case


def share_of(contract: Contract, variant: str, options: CampaignOptions, jobs: int
             ) -> dict[str, Any]:
    """:func:`kda_fuzz.campaign.shard.describe` of the shard ``options.shard`` of the plan that
    ``jobs`` supervised jobs draw with ``options``. Computed without initialising a GPU: a
    scale budget left to the jobs (their free memory) is taken as large, which gives the
    same arms whenever any scale case fits."""
    o = replace(options, job=(0, jobs),
                families=max(options.families, jobs) if options.families else 0)
    return describe(campaign_plan(contract, variant, o, nominal_scale=True), Shard(*o.shard),
                    o.seed or 0)


@contextlib.contextmanager
def _global_constants_only() -> Iterator[None]:
    """Now and then Hypothesis draws a constant found in the (non-library) modules loaded
    in the process, and which modules are loaded differs between processes (a kernel
    imported on its first call, a test run before): the same seed would then draw
    different cases, and a restarted job would not resume where it stood. Campaigns draw
    from Hypothesis' global constants only (its internals; a no-op where they differ)."""
    try:
        from hypothesis.internal.conjecture import providers

        original = providers._get_local_constants
        empty = providers.Constants()
        cache = providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: empty
    cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.clear()


def campaign(contract: Contract, variant: str, targets: list[Target], *,
             minimize: Minimizer | None = None,
             peers: list[Target] | None = None,
             on_example: Callable[[Report], None] | None = None,
             stop: Callable[[], bool] | None = None,
             on_failure: Callable[[Failure, bool], None] | None = None,
             **options: Any) -> Report:
    """Run a campaign in this process (targets called directly) and minimize each distinct
    failure with ``minimize``; ``options`` are :class:`CampaignOptions` fields or the
    family's sizes (:meth:`CampaignOptions.of`). Stops at
    the first distinct failure unless ``max_failures`` says otherwise. ``on_failure(f,
    new)`` is told of each confirmed failure as it is found (``new``: a distinct one)."""
    c = Campaign(contract, variant, targets, peers=peers, options=CampaignOptions.of(**options),
                 on_example=on_example, stop=stop, on_failure=on_failure)
    report = c.run()
    if c.stopped is not None and c.stopped.noteworthy:
        report.notes.append(f"stopped: {c.stopped}")
    if minimize is not None:
        by_name = {t.name: t for t in c.targets}
        for f in report.failures:
            target = by_name.get(f.target)
            if target is None or not minimizable(f.verdict):
                continue
            f.original = f.case
            f.case, f.verdict = minimize(f.case, target, f.verdict,
                                         lambda cand, t=target: run_case(
                                             contract, cand, t.fn, messages=c.options.messages,
                                             strict=c.options.strict))
    return report


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


def _sanitizer_cause(note: str) -> str:
    """A failed sanitized run's cause, its numbers masked (so that causes count together)."""
    import re

    return re.sub(r"0x[0-9a-fA-F]+|\d+", "N", note)[:160] or "no cause given"


def minimizable(verdict: Verdict) -> bool:
    """Whether a failure can be shrunk by re-running candidates in this process: not a
    crash, hang, flaky failure or peer disagreement."""
    return verdict.kind not in (*HARD_KINDS, "flaky", "sanitizer") \
        and not verdict.what.startswith("peers-")
