"""The names the command line offers, known without importing torch or any kernel.

``kda-fuzz`` parses and checks its arguments before importing anything heavy, so the
contract families and their variants are listed here as plain strings;
``tests/test_cli_front.py`` checks that they match :data:`kda_fuzz.families.CONTRACTS`.
"""

from __future__ import annotations

# family -> its variants, the first being the family's default
FAMILIES: dict[str, tuple[str, ...]] = {
    "kda": ("helion", "triton"),
    "gdn": ("triton", "helion"),
}
DEFAULT_FAMILY = "kda"
# the one variant of a family that declares none (``Contract(variants=())``): files and the
# engine carry it, the command line and the reports leave it out
SOLE_VARIANT = "default"
VARIANTS: tuple[str, ...] = tuple(dict.fromkeys(v for vs in FAMILIES.values() for v in vs))


def label(family: str, variant: str | None) -> str:
    """``family/variant`` as reports print it; the family alone for the sole variant of
    a family that declares none (:data:`SOLE_VARIANT`)."""
    return family if not variant or variant == SOLE_VARIANT else f"{family}/{variant}"
