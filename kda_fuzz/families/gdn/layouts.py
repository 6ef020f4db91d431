"""Hypothesis strategies for packed GDN decode layouts: valid ones and broken ones.

A GDN layout is drawn as a :class:`~kda_fuzz.families.kda.layouts.KdaLayout` (same
packing, padding rows, strides, guard cells, dtypes, GQA head counts, l2norm flag, value
profiles; ``lower_bound`` unused) and built as the KDA case of those sizes with the two
tensors that differ reshaped: the gates ``a`` are ``[B, HV]`` (row stride ``HV +
a_row_pad``) and ``dt_bias`` has HV elements, each holding the KDA case's values of key
channel 0 (so the gate regimes are the same). Breakages are KDA's, with those aimed at
KDA checks 15-18 re-aimed at GDN's two checks 15 (``a``/``b`` width) and 16
(``A_log``/``dt_bias`` sizes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from hypothesis import strategies as st

from kda_fuzz.engine.case import Case
from kda_fuzz.families.kda import layouts as kl
from kda_fuzz.families.kda.layouts import Breakage, KdaLayout, strided_arg
from kda_fuzz.families.packed.pins import normalize as pin_strategies

FAMILY = "gdn"
NOT_GDN = ("lower_bound",)  # layout fields GDN has no use for
DEFAULT_BUDGET = kl.DEFAULT_BUDGET


def build(p: KdaLayout, variant: str, device: str = "cpu") -> Case:
    """The concrete GDN ``Case`` of a layout (valid when ``p``'s sizes are), on ``device``."""
    p = replace(p, lower_bound=None)
    kda = kl.build(p, variant, device)
    B, HV, K, g = p.B, p.HV, p.K, p.guard
    dev = kda.tensors["a"].device
    if dev.type == "meta" or K == 0:
        a_vals = torch.zeros(B * HV, dtype=torch.float64, device=dev)
        dt_vals = torch.zeros(HV, dtype=torch.float64, device=dev)
    else:
        a_vals = kda.tensors["a"].view().reshape(B, HV, K)[..., 0].to(torch.float64)
        dt_vals = kda.tensors["dt_bias"].view().reshape(HV, K)[:, 0].to(torch.float64)
    tensors = dict(kda.tensors)
    tensors["a"] = strided_arg((B, HV), p.ab_dtype, a_vals, (HV + p.a_row_pad, 1), g, dev)
    tensors["dt_bias"] = strided_arg((HV,), p.param_dtype, dt_vals, guard=g, device=dev)
    scalars = {k: v for k, v in kda.scalars.items() if k != "lower_bound"}
    return Case(FAMILY, variant, tensors, scalars, kda.intent, dict(kda.notes))


def valid_cases(variant: str, *, budget: int = DEFAULT_BUDGET, device: str = "cpu",
                max_b: int = 256, bucket: bool = False, family: KdaLayout | None = None,
                max_bhv: int | None = None, pins: Mapping[str, Any] | None = None
                ) -> st.SearchStrategy[Case]:
    """Cases that the GDN contract variant accepts, built on ``device``: GQA head groups,
    padding rows, row and slot strides, guard cells, fp32/bf16/fp16, l2norm on and off,
    any K and V on triton (powers of two on helion). ``pins`` fix layout fields
    (:mod:`kda_fuzz.families.packed.pins`; GDN has no ``lower_bound``)."""
    pz = pin_strategies(pins, variant, exclude=NOT_GDN)
    return kl.layouts(variant, budget, max_b, bucket=bucket, family=family,
                      max_bhv=max_bhv, pins=pz).map(lambda p: build(p, variant, device))


def families(variant: str, n: int, seed: int = 0, budget: int = DEFAULT_BUDGET
             ) -> list[KdaLayout]:
    """Compile families, as for KDA (``lower_bound`` is dropped when built)."""
    return [replace(f, lower_bound=None) for f in kl.families(variant, n, seed, budget)]


def _retarget(b: Breakage) -> Breakage | None:
    """KDA's breakage re-aimed at GDN's checks (None: it has no GDN counterpart)."""
    gdn_check = {15: 15, 16: 15, 17: 16, 18: 16}
    if b.check in gdn_check:
        return replace(b, check=gdn_check[b.check])
    return b


BREAKAGES: tuple[Breakage, ...] = tuple(
    r for r in (_retarget(b) for b in kl.BREAKAGES) if r is not None)


def breakages(variant: str) -> tuple[Breakage, ...]:
    """The breakages of a variant (check 14, power-of-two K and V, is helion's only)."""
    return tuple(b for b in BREAKAGES if not (b.check == 14 and variant != "helion"))


def broken_arms(variant: str) -> list[tuple[str, tuple[str, ...]]]:
    """Each breakage alone, then one pair per two consecutive checks."""
    return kl.arms_of(breakages(variant))


def broken_cases(variant: str, *, budget: int = 4096, device: str = "cpu",
                 only: tuple[str, ...] | str | None = None, max_breaks: int = 3,
                 pins: Mapping[str, Any] | None = None) -> st.SearchStrategy[Case]:
    """A valid small GDN layout with breakages applied: those named by ``only``, else one
    to ``max_breaks`` drawn at random. Size changes (rebuilds) are applied first."""
    return kl.broken_from(variant, breakages(variant), build, budget=budget, device=device,
                          only=only, max_breaks=max_breaks,
                          pins=pin_strategies(pins, variant, exclude=NOT_GDN))
