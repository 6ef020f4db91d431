"""The packed decode families' own options and sizes (no torch: the command line reads
them before anything heavy is imported).

Sizes (``CampaignOptions.sizes``, ``plan``'s keywords): ``budget`` (state elements
B*HV*V*K per valid case), ``max_b`` (batch rows), ``bucket`` (round B up to a power of
four with padding rows), ``max_bhv`` (programs: rows x heads), ``scale_share`` (share of
the examples in the GPU-scale stratum) and ``scale_budget`` (its device bytes per case).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kda_fuzz.engine.knobs import Knob, Knobs, Measured

# Default sizes: on CUDA, and for the family's own kernels on CPU, which run interpreted
CUDA_BUDGET, CUDA_MAX_B = 1 << 24, 16384
INTERPRETED_BUDGET, INTERPRETED_MAX_B, INTERPRETED_MAX_BHV = 1 << 13, 64, 32
CUDA_SCALE_SHARE = 0.03
# the layouts' own defaults (other targets on CPU): what calibration caps
LAYOUT_BUDGET, LAYOUT_MAX_B, LAYOUT_MAX_BHV = 1 << 18, 256, 256 * 64


def _share(value: float) -> str | None:
    return None if 0 <= value <= 1 else "--scale-share must be between 0 and 1"


def _positive(value: int) -> str | None:
    return None if value > 0 else "--scale-budget must be positive"


OPTIONS = (
    Knob("--budget", "max B*HV*V*K elements per valid case (default: 2^18 on cpu, 2^13 for "
         "the project's interpreted kernels, 2^24 on cuda)", metavar="N", calibrated=True),
    Knob("--max-b", "largest batch size (default: 256 on cpu, 64 for the project's "
         "interpreted kernels, 16384 on cuda)", metavar="N", calibrated=True),
    Knob("--scale-share", "share of examples in the GPU-scale stratum (B*HV past 65,535, "
         "state pools past 2^31 elements; default 0.03 on cuda, 0 on cpu); with "
         "--max-seconds it takes at most a tenth of the time, or its share if larger",
         type=float, metavar="X", check=_share),
    Knob("--scale-budget", "device bytes per scale case (default: 0.8 of the device's free "
         "memory, split between the jobs)", metavar="BYTES", check=_positive),
    Knob("--no-bucket", "do not round B up to powers of four with padding rows on cuda",
         type=None, default=False, group="GPU"),
)
SIZES = ("budget", "max_b", "bucket", "max_bhv", "scale_share", "scale_budget")


def resolve(values: Mapping[str, Any], device: str, named_targets: bool) -> dict[str, Any]:
    """The sizes of a campaign: compile-aware defaults on cuda (bucketed batches), small
    layouts for the interpreted own kernels on cpu (other targets on cpu are measured
    first, see :func:`calibrated`), else the layouts' own defaults (None)."""
    cuda = device.startswith("cuda")
    interpreted = not cuda and not named_targets
    budget, max_b = values.get("budget"), values.get("max_b")
    share = values.get("scale_share")
    return {
        "bucket": cuda and not values.get("no_bucket"),
        "max_b": max_b or (CUDA_MAX_B if cuda else INTERPRETED_MAX_B if interpreted else None),
        "budget": budget or (CUDA_BUDGET if cuda else INTERPRETED_BUDGET if interpreted
                             else None),
        "max_bhv": INTERPRETED_MAX_BHV if interpreted and not budget else None,
        "scale_share": share if share is not None else CUDA_SCALE_SHARE if cuda else 0.0,
        "scale_budget": values.get("scale_budget"),
    }


def valid(sizes: Mapping[str, Any]) -> dict[str, Any]:
    """``valid_cases``' keywords (a size not set: the layouts' default)."""
    kw = {k: sizes[k] for k in ("budget", "max_b", "max_bhv") if sizes.get(k)}
    return {**kw, **({"bucket": True} if sizes.get("bucket") else {})}


def groups(sizes: Mapping[str, Any]) -> dict[str, Any]:
    """The compile families' keywords."""
    return {"budget": sizes["budget"]} if sizes.get("budget") else {}


def scale(sizes: Mapping[str, Any]) -> tuple[float, int | None]:
    """The scale stratum's share of the examples and its bytes per case."""
    return float(sizes.get("scale_share") or 0.0), sizes.get("scale_budget")


@dataclass(frozen=True)
class PackedCaps:
    """What calibration measured and the caps it chose: ``max_bhv`` programs (rows x
    heads) and ``budget`` state elements a case."""

    fixed: float
    per_row_head: float
    per_element: float
    max_bhv: int
    budget: int
    seconds: float = 0.5

    def note(self) -> str:
        return (f"sizes capped for a slow target: {1e3 * self.fixed:.0f} ms per call, "
                f"{1e3 * self.per_row_head:.2f} ms per row and head, "
                f"{1e6 * self.per_element:.2f} us per state element measured; at most "
                f"{self.max_bhv} programs (rows x heads) and {self.budget} state elements a "
                f"case (about {self.seconds:g} s per example; --budget/--max-b override)")

    def cap(self, sizes: Mapping[str, Any]) -> dict[str, Any]:
        max_bhv = min(sizes.get("max_bhv") or self.max_bhv, self.max_bhv)
        return {"max_bhv": max_bhv,
                "max_b": min(sizes.get("max_b") or LAYOUT_MAX_B, self.max_bhv),
                "budget": min(sizes.get("budget") or self.budget, self.budget)}


def calibrated(m: Measured) -> PackedCaps | None:
    """Caps within the layouts' defaults for a target measured as ``m`` (a program per
    row and head); None when the defaults already fit."""
    max_bhv = min(LAYOUT_MAX_BHV, m.units or LAYOUT_MAX_BHV)
    budget = min(LAYOUT_BUDGET, m.elements or LAYOUT_BUDGET)
    if max_bhv >= LAYOUT_MAX_BHV and budget >= LAYOUT_BUDGET:
        return None
    return PackedCaps(m.fixed, m.per_unit, m.per_element, max_bhv, budget, m.seconds)


KNOBS = Knobs(options=OPTIONS, sizes=SIZES, resolve=resolve, valid=valid, groups=groups,
              scale=scale, calibrated=calibrated)
