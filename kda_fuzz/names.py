"""The names the command line offers, known without importing torch or any kernel.

``kda-fuzz`` parses and checks its arguments before importing anything heavy, so the
built-in contract families are listed here as plain strings (:data:`BUILTINS`, the one
list: :data:`FAMILIES` here and the registry's ``kda_fuzz.families.BUILTIN_SPECS`` and
``OPTIONS`` derive from it); ``tests/test_cli_front.py`` checks that they match
:data:`kda_fuzz.families.CONTRACTS`. This module imports nothing of kda_fuzz.
"""

from __future__ import annotations

from typing import NamedTuple


class Builtin(NamedTuple):
    """A built-in family as known without importing it: its variants, the first being its
    default (its contract's ``variants``), its contract and its command-line options and
    sizes (``MODULE:ATTRIBUTE``, imported on first use; the options' module a light one),
    and the project's own kernels per variant (its contract's ``default_targets``: a
    campaign that names no targets chooses them without importing torch)."""

    variants: tuple[str, ...]
    contract: str
    options: str
    targets: dict[str, tuple[str, ...]]


_KDA = "kda_fuzz_kernels.kda_decode:"
_GDN = "kda_fuzz_kernels.gdn_decode:"
BUILTINS: dict[str, Builtin] = {
    "kda": Builtin(("helion", "triton"), "kda_fuzz.families.kda.contract:CONTRACT",
                   "kda_fuzz.families.packed.knobs:KNOBS", {
                       "helion": (f"{_KDA}helion_fused_recurrent_kda_packed_decode",),
                       "triton": (f"{_KDA}fused_recurrent_kda_packed_decode",
                                  f"{_KDA}kda_packed_decode"),
                   }),
    "gdn": Builtin(("triton", "helion"), "kda_fuzz.families.gdn.contract:CONTRACT",
                   "kda_fuzz.families.packed.knobs:KNOBS", {
                       "helion": (f"{_GDN}helion_fused_recurrent_gated_delta_rule_packed_decode",),
                       "triton": (f"{_GDN}fused_recurrent_gated_delta_rule_packed_decode",
                                  f"{_GDN}gdn_packed_decode"),
                   }),
}
# family -> its variants, the first being the family's default
FAMILIES: dict[str, tuple[str, ...]] = {name: b.variants for name, b in BUILTINS.items()}
DEFAULT_FAMILY = "kda"
# the one variant of a family that declares none (``Contract(variants=())``): files and the
# engine carry it, the command line and the reports leave it out
SOLE_VARIANT = "default"
VARIANTS: tuple[str, ...] = tuple(dict.fromkeys(v for vs in FAMILIES.values() for v in vs))


def label(family: str, variant: str | None) -> str:
    """``family/variant`` as reports print it; the family alone for the sole variant of
    a family that declares none (:data:`SOLE_VARIANT`)."""
    return family if not variant or variant == SOLE_VARIANT else f"{family}/{variant}"
