"""The family's own ``kda-fuzz fuzz`` options, as data: this module imports nothing heavy,
so that ``kda-fuzz fuzz --help`` and a bad value answer before torch is imported."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kda_fuzz.engine.knobs import Knob, Knobs

MAX_COLS = 48  # the longest row drawn by default


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else "--max-cols must be at least 1"


def _resolve(values: Mapping[str, Any], device: str, own_kernels: bool) -> dict[str, Any]:
    return {"max_cols": values.get("max_cols") or MAX_COLS}


KNOBS = Knobs(
    options=(Knob("--max-cols", f"longest row of a valid case (default {MAX_COLS})",
                  metavar="N", check=_at_least_one),),
    sizes=("max_cols",),
    resolve=_resolve,
    valid=lambda sizes: {"max_cols": sizes["max_cols"]},
)
