"""A family's own campaign options and sizes, declared as data (imports nothing heavy).

The engine passes a family's sizes through opaquely: ``kda-fuzz fuzz`` adds each
:class:`Knob` of the known families to its parser (``--help`` and usage errors answer
before torch is imported), :attr:`Knobs.resolve` turns their values and the device into
the campaign's sizes (``CampaignOptions.sizes``), and the plan hands those to the
family's strategies through :attr:`Knobs.valid`, :attr:`Knobs.groups` and
:attr:`Knobs.scale` without naming any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Knob:
    """One option of ``kda-fuzz fuzz`` a family declares: ``type`` None is a switch
    (``store_true``); ``check(value)`` says why a given value is wrong (a usage error,
    answered before anything heavy is imported), None when it is fine; ``calibrated``:
    calibration (:mod:`kda_fuzz.campaign.calibrate`) sizes it when it is not given, and
    giving it turns calibration off."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = int
    default: Any = None
    group: str = "sizes"
    metavar: str | None = None
    check: Callable[[Any], str | None] | None = None
    calibrated: bool = False

    @property
    def dest(self) -> str:
        """The name its value goes by (``--max-b``: ``max_b``)."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Measured:
    """What calibration measured of a target on the CPU: seconds per call (``fixed``),
    per parallel unit of work (a program) and per element of the case, and the largest
    ``units`` and ``elements`` that keep a case within ``seconds`` (half of it each;
    None: that cost is not measurable)."""

    fixed: float
    per_unit: float
    per_element: float
    units: int | None
    elements: int | None
    seconds: float


class Caps(Protocol):
    """A family's caps for a slow target, from :class:`Measured` (``Knobs.calibrated``)."""

    def note(self) -> str:
        """The summary's line on what was measured and capped."""

    def cap(self, sizes: Mapping[str, Any]) -> dict[str, Any]:
        """The sizes it changes in ``sizes`` (the campaign's, as resolved)."""


def _none(sizes: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def _no_sizes(values: Mapping[str, Any], device: str, own_kernels: bool) -> dict[str, Any]:
    return {}


def _no_scale(sizes: Mapping[str, Any]) -> tuple[float, int | None]:
    return 0.0, None


@dataclass(frozen=True)
class Knobs:
    """A family's own options and sizes.

    ``options``: its command-line options. ``sizes``: the names of its sizes (the
    keywords ``plan`` and ``CampaignOptions.sizes`` take for it). ``resolve(values,
    device, own_kernels)``: the sizes of a campaign from the options' values (by
    :attr:`Knob.dest`; None where not given), the device, and whether the targets are the
    family's own kernels. ``valid(sizes)`` / ``groups(sizes)``: the keywords of its
    ``valid_cases`` / ``families`` hooks; ``scale(sizes)``: its scale stratum's share of
    the examples and bytes per case (None: from the device's free memory).
    ``calibrated(measured)``: the caps for a slow target (None: its sizes fit)."""

    options: tuple[Knob, ...] = ()
    sizes: tuple[str, ...] = ()
    resolve: Callable[[Mapping[str, Any], str, bool], dict[str, Any]] = _no_sizes
    valid: Callable[[Mapping[str, Any]], dict[str, Any]] = _none
    groups: Callable[[Mapping[str, Any]], dict[str, Any]] = _none
    scale: Callable[[Mapping[str, Any]], tuple[float, int | None]] = _no_scale
    calibrated: Callable[[Measured], Caps | None] | None = None

    def check(self, sizes: Mapping[str, Any], family: str) -> None:
        """Raise ``TypeError`` naming the sizes in ``sizes`` this family does not take."""
        unknown = sorted(set(sizes) - set(self.sizes))
        if unknown:
            raise TypeError(f"family {family!r} takes no size(s) {', '.join(unknown)} "
                            f"(its sizes: {', '.join(self.sizes) or 'none'})")


NO_KNOBS = Knobs()
