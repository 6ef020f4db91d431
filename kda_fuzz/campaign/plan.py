"""A campaign's plan: its examples split into arms (breakage strata, valid layouts,
pinned layouts, the scale stratum), dealt to jobs and shards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kda_fuzz.campaign.arms import Arm
from kda_fuzz.campaign.shard import NOMINAL_SCALE_BUDGET, Shard, describe
from kda_fuzz.campaign.spec import CampaignOptions
from kda_fuzz.engine.contract import Contract


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


def campaign_plan(contract: Contract, variant: str, o: CampaignOptions,
                  nominal_scale: bool = False) -> list[Arm]:
    """The whole plan of a campaign with options ``o`` (before it is dealt to jobs)."""
    restrict = (contract.restrict(o.unsupported, variant)
                if o.unsupported and contract.restrict is not None else None)
    return plan(contract, variant, o.max_examples, device=o.device,
                valid_share=o.valid_share, families=o.families, seed=o.seed, parts=o.job[1],
                layouts=o.layouts, layout_share=o.layout_share, restrict=restrict,
                nominal_scale=nominal_scale, **o.sizes)


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
