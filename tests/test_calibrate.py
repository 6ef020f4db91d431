"""Time-aware sizes: an interpreted kernel on CPU gets capped layouts, native code not."""

from __future__ import annotations

from kda_fuzz.campaign.calibrate import EXAMPLE_SECONDS, INTERPRETED_ROW_HEAD, apply, calibrate
from kda_fuzz.campaign.spec import CampaignSpec
from kda_fuzz.families import get_contract

KDA = get_contract("kda")


def test_an_interpreted_kernel_gets_sizes_that_fit_the_time() -> None:
    sizing = calibrate(KDA, "triton", "tests.foreign.triton_row_program:decode")
    assert sizing is not None and sizing.per_row_head > INTERPRETED_ROW_HEAD
    assert 1 <= sizing.max_bhv < 4096 and sizing.budget <= 1 << 18
    spec = CampaignSpec.of(KDA, "triton", ["tests.foreign.triton_row_program:decode"],
                           budget=None, max_b=None, max_bhv=None)
    options = apply(sizing, spec).options.sizes
    assert options["max_bhv"] == sizing.max_bhv and options["budget"] == sizing.budget
    assert options["max_b"] <= sizing.max_bhv
    # the caps keep the predicted example time near the target
    predicted = (sizing.fixed + sizing.per_row_head * sizing.max_bhv
                 + sizing.per_element * sizing.budget)
    assert predicted <= 2 * EXAMPLE_SECONDS
    assert "sizes capped" in sizing.note()


def test_vectorised_code_keeps_the_default_sizes() -> None:
    reference = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"
    assert calibrate(KDA, "triton", reference) is None
