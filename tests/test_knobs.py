"""A family supplies its own knobs: its options as data (read without torch), its sizes
passed through the engine opaquely, and the facts it adds to the summary."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kda_fuzz.engine.knobs import Knob, Knobs

ROOT = Path(__file__).resolve().parents[1]


def test_the_registry_and_the_options_import_no_torch() -> None:
    code = ("import sys; import kda_fuzz.families as f; k = f.family_options(); "
            "print([o.flag for o in k[0].options], 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.strip() == ("['--budget', '--max-b', '--scale-share', '--scale-budget', "
                                "'--no-bucket'] False"), r.stderr


def test_a_knobs_check_is_a_usage_error_before_torch() -> None:
    code = ("import sys; from kda_fuzz.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH' if 'torch' in sys.modules else 'LIGHT', rc)")
    for argv, words in ((["fuzz", "--scale-share", "2"], "--scale-share must be between"),
                        (["fuzz", "--scale-budget", "0"], "--scale-budget must be positive")):
        r = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert r.stdout.strip().splitlines()[-1] == "LIGHT 2" and words in r.stderr, r.stderr


def _knobs(seen: list) -> Knobs:
    def resolve(values, device, named):
        seen.append((dict(values), device, named))
        return {"width": values["width"] or 3}

    return Knobs(options=(Knob("--width", "how wide", metavar="N"),
                          Knob("--fast", "hurry", type=None, default=False, group="own")),
                 sizes=("width",), resolve=resolve, valid=lambda s: {"budget": s["width"]})


def test_a_familys_options_reach_the_parser_and_its_sizes_the_strategies(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kda_fuzz.campaign.plan import plan
    from kda_fuzz.campaign.spec import shaping as _shaping
    from kda_fuzz.cli import build_parser
    from kda_fuzz.families import get_contract

    seen: list = []
    knobs = _knobs(seen)
    parser = build_parser([knobs])
    with pytest.raises(SystemExit):
        parser.parse_args(["fuzz", "--help"])
    text = capsys.readouterr().out
    assert "--width N" in text and "\nown:\n  --fast" in text and "--budget" not in text
    args = parser.parse_args(["fuzz", "--width", "7", "--fast"])
    assert (args.width, args.fast) == (7, True)
    kda = get_contract("kda")
    calls: list = []

    def valid_cases(variant, **kw):
        calls.append(kw)
        return kda.valid_cases(variant, device=kw["device"])

    mine = dataclasses.replace(kda, name="mine", knobs=knobs, valid_cases=valid_cases,
                               families=None, scale=None)
    sizes = _shaping(args, mine)
    assert sizes == {"families": 0, "width": 7}
    assert seen == [({"width": 7, "fast": True}, "cpu", False)]
    sizes.pop("families")
    plan(mine, "triton", 40, **sizes)
    assert calls == [{"device": "cpu", "budget": 7}]  # as the family's Knobs.valid says
    with pytest.raises(TypeError, match="takes no size"):
        plan(mine, "triton", 40, max_b=4)  # a size of another family


def test_a_projects_family_options_come_from_its_configuration(tmp_path: Path) -> None:
    (tmp_path / "myknobs.py").write_text(textwrap.dedent("""
        from kda_fuzz.engine.knobs import Knob, Knobs
        KNOBS = Knobs(options=(Knob("--lanes", "lanes per case", metavar="N"),))
    """))
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kda-fuzz]\nfamily_options = ["myknobs:KNOBS"]\n')
    code = ("import sys; from kda_fuzz.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH' if 'torch' in sys.modules else 'LIGHT', rc)")
    r = subprocess.run([sys.executable, "-c", code, "fuzz", "--help"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "--lanes N" in r.stdout and "--budget N" in r.stdout, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "LIGHT 0"


def test_the_packed_sizes_are_resolved_as_before() -> None:
    from kda_fuzz.families.packed.knobs import KNOBS

    def sizes(device: str, named: bool = False, **given: object) -> dict:
        values = {k.dest: given.get(k.dest, k.default) for k in KNOBS.options}
        return KNOBS.resolve(values, device, named)

    assert sizes("cuda") == {"bucket": True, "max_b": 16384, "budget": 1 << 24,
                             "max_bhv": None, "scale_share": 0.03, "scale_budget": None}
    assert sizes("cpu") == {"bucket": False, "max_b": 64, "budget": 1 << 13, "max_bhv": 32,
                            "scale_share": 0.0, "scale_budget": None}
    assert sizes("cpu", named=True)["budget"] is None  # foreign targets: calibrated first
    assert sizes("cuda", no_bucket=True, max_b=8)["bucket"] is False
    assert KNOBS.valid(sizes("cuda")) == {"budget": 1 << 24, "max_b": 16384, "bucket": True}
    assert KNOBS.scale(sizes("cuda", scale_budget=5)) == (0.03, 5)
    args = argparse.Namespace(device="cpu", target=None, families=None, budget=4096,
                              max_b=None, no_bucket=False, scale_share=None,
                              scale_budget=None)
    from kda_fuzz.campaign.spec import shaping as _shaping

    assert _shaping(args)["max_bhv"] is None and _shaping(args)["budget"] == 4096
