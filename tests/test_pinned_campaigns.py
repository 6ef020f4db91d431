"""Pinned campaigns (--layout, presets) and what targets do not support (--unsupported,
kda_fuzz_unsupported, [tool.kda-fuzz.unsupported])."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kda_fuzz.campaign.plan import plan
from kda_fuzz.engine.pins import PinError, parse_layout
from kda_fuzz.families import get_contract
from kda_fuzz.families.packed.pins import restrictions
from tests.inprocess import kda_fuzz

ROOT = Path(__file__).resolve().parents[1]
KDA = get_contract("kda")


def test_parse_layout_and_restrictions():
    assert parse_layout("H=16,HV=32,K=128,state=bfloat16,B=1|8,lower_bound=none") == {
        "H": 16, "HV": 32, "K": 128, "state": "bfloat16", "B": [1, 8], "lower_bound": None}
    r = restrictions(["lower_bound", "state=float16", "indices=int64", "l2norm=False"],
                     "triton")
    assert r["lower_bound"] == [None] and r["use_qk_l2norm_in_kernel"] == [True]
    assert [str(d) for d in r["state_dtype"]] == ["torch.float32", "torch.bfloat16"]
    assert [str(d) for d in r["idx_dtype"]] == ["torch.int32"]
    with pytest.raises(PinError):
        restrictions(["K=3"], "triton")
    with pytest.raises(PinError):
        restrictions(["state=float32", "state=bfloat16", "state=float16"], "triton")


def test_plan_gives_pinned_layouts_their_share():
    arms = plan(KDA, "triton", 1000, layouts=[("a", {"H": 2, "HV": 4}), ("b", {"K": 8})],
                layout_share=0.75)
    valid = {a.name: a.examples for a in arms if a.stratum == "valid"}
    assert valid["valid:pin:a"] + valid["valid:pin:b"] == round(500 * 0.75)
    assert valid["valid"] == 500 - round(500 * 0.75)
    assert sum(a.examples for a in arms) == 1000


def _fuzz(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return kda_fuzz("fuzz", "--contract", "triton", "--json", "--no-save", "--seed", "1",
                    *args, cwd=cwd)  # in this process (tests/inprocess.py)


def test_a_bug_at_a_pinned_shape_is_found():
    r = _fuzz("--target", "tests.hostile_capabilities:wrong_at_served_shape",
              "--max-examples", "120", "--layout", "H=4,HV=12,K=8,V=8")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert any("pinned layouts" in n for n in out["notes"]), out["notes"]
    assert any(f["kind"] == "mismatch" for f in out["failure_details"])


@pytest.mark.slow  # a long campaign: the slow tier
def test_unsupported_features_are_not_drawn():
    common = ("--max-examples", "150", "--valid-share", "1.0")
    r = _fuzz("--target", "tests.hostile_capabilities:no_lower_bound", *common)
    assert r.returncode == 1  # flooded without the declaration
    r = _fuzz("--target", "tests.hostile_capabilities:declared_no_lower_bound", *common)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert any("left out" in n and "lower_bound" in n for n in out["notes"]), out["notes"]
    r = _fuzz("--target", "tests.hostile_capabilities:no_lower_bound", *common,
              "--unsupported", "lower_bound")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_bad_pins_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from kda_fuzz.cli import main as cli_main

    def fuzz(*args: str) -> tuple[int, str]:  # in this process: the pins are checked early
        code = cli_main(["fuzz", "--contract", "triton", "--no-save", "--seed", "1",
                         "--target", "tests.hostile_capabilities:no_lower_bound", *args])
        return code, capsys.readouterr().err

    code, err = fuzz("--layout", "H=3,HV=4")
    assert code == 2 and "multiple" in err
    code, err = fuzz("--layout", "served")
    assert code == 2 and "preset" in err
    code, err = fuzz("--unsupported", "K=3")
    assert code == 2 and err.strip()


def test_seed_layouts_run_first_as_they_are(tmp_path: Path) -> None:
    """Corpus files given as seeds are the campaign's first examples: a bug that only the
    seed's layout shows (a padding row wrapping to the last slot) is found at example 1;
    the CLI takes a folder, leaves out other families' files and says so."""
    from kda_fuzz.campaign.runner import campaign
    from kda_fuzz.corpus.store import save_case
    from kda_fuzz.engine.targets import Target
    from kda_fuzz.families.kda.layouts import KdaLayout, build
    from tests.mutants import pad_wrap

    case = build(KdaLayout(B=6, H=1, HV=2, K=4, V=4, padding="some", seed=3), "triton")
    seeds = tmp_path / "seeds"
    path = save_case(case, None, seeds, description="a seed")
    gdn = next(p for p in sorted((ROOT / "corpus").rglob("*.json"))
               if json.loads(p.read_text())["contract"]["family"] == "gdn")
    (seeds / gdn.name).write_text(gdn.read_text())
    rep = campaign(KDA, "triton", [Target("pad_wrap", pad_wrap)], max_examples=5, seed=1,
                   seeds=(str(path),))
    assert rep.seeds == 1 and rep.examples == 1 and rep.failures
    assert rep.failures[0].found_example == 1 and rep.failures[0].case.describe() == \
        case.describe()
    r = kda_fuzz("fuzz", "--target", "tests.mutants:correct_triton", "--contract", "triton",
                 "--seed-layouts", str(seeds), "--max-examples", "3", "--seed", "1",
                 "--no-save", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["seed_layouts"] == 1 and summary["examples"] == 4
    assert any("1 corpus case(s) run first" in n and "1 file(s) of other families" in n
               for n in summary["notes"]), summary["notes"]
    bad = kda_fuzz("fuzz", "--seed-layouts", str(tmp_path / "nowhere"), "--contract", "triton")
    assert bad.returncode == 2 and "no such file or folder" in bad.stderr, bad.stderr
