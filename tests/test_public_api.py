"""The public API for users' own tests: strategies with pins, check, assert_conforms,
saving failing cases from pytest; the user guide's example run from a project outside
this package."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kda_fuzz
from kda_fuzz.engine.oracle import expectation
from kda_fuzz.families import get_contract
from kda_fuzz.strategies import breakages, broken_layouts, valid_layouts
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode
from tests import mutants
from tests.inprocess import kda_fuzz as kda_fuzz_command

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=30, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


def _sizes(case):
    s = get_contract(case.contract).sizes(case)
    s["H"] = (case.tensors["mixed_qkv"].shape[1] - s["HV"] * s["V"]) // (2 * s["K"])
    return s


@FAST
@given(valid_layouts("kda", "triton", H=2, HV=[2, 4], K=[16, 96], V=8, state="bf16",
                     indices="int64", B=st.integers(1, 5), l2norm=True, lower_bound=None,
                     strides=False))
def test_pins_fix_what_they_name_and_draw_the_rest(case):
    s = _sizes(case)
    assert s["H"] == 2 and s["HV"] in (2, 4) and s["K"] in (16, 96) and s["V"] == 8
    assert 1 <= s["B"] <= 5
    assert case.tensors["initial_state"].dtype == torch.bfloat16
    assert case.tensors["ssm_state_indices"].dtype == torch.int64
    assert case.scalars["use_qk_l2norm_in_kernel"] is True
    assert case.scalars["lower_bound"] is None
    kwargs, _ = case.materialize()
    assert all(kwargs[n].is_contiguous() for n in ("mixed_qkv", "a", "b", "initial_state"))
    assert expectation(get_contract("kda"), case).ok


@FAST
@given(valid_layouts("gdn", H=1, HV=3, K=4, V=4, slots=9))
def test_gdn_pins_and_pool_size(case):
    s = _sizes(case)
    assert (s["H"], s["HV"], s["K"], s["V"]) == (1, 3, 4, 4)
    assert case.tensors["initial_state"].shape[0] == 9 and s["B"] <= 9
    assert expectation(get_contract("gdn"), case).ok


@pytest.mark.parametrize("family, variant, pins, words", [
    ("kda", "helion", {"K": 96}, "powers of two"),
    ("kda", "triton", {"H": 3, "HV": [4, 8]}, "multiple"),
    ("kda", "triton", {"heads": 2}, "unknown layout field 'heads'"),
    ("kda", "triton", {"state": "float64"}, "unknown dtype|valid layouts use"),
    ("kda", "triton", {"B": 0}, "B >= 1"),
    ("gdn", "triton", {"lower_bound": -5.0}, "unknown layout field 'lower_bound'"),
    ("kda", "cuda", {}, "no variant 'cuda'"),
])
def test_impossible_pins_raise_when_the_strategy_is_made(family, variant, pins, words):
    with pytest.raises(ValueError, match=words):
        valid_layouts(family, variant, **pins)


@FAST
@given(broken_layouts("kda", "triton", checks=[20, 21]))
def test_broken_layouts_aimed_at_checks(case):
    exp = expectation(get_contract("kda"), case)
    assert not exp.ok  # rejected (by the aimed check or one before it)


def test_breakages_name_their_checks():
    aims = breakages("kda", "helion")
    assert 14 in aims.values() and 20 in aims.values()
    assert 14 not in breakages("kda", "triton").values()
    with pytest.raises(ValueError, match="no check"):
        broken_layouts("kda", "triton", checks=[14])


@FAST
@given(st.one_of(valid_layouts("kda", "triton", B=[1, 2]),
                 broken_layouts("kda", "triton")))
def test_check_passes_the_reference(case):
    assert kda_fuzz.check(reference_kda_packed_decode, case) is None
    assert kda_fuzz.check("kda_fuzz_kernels.kda_decode:reference_kda_packed_decode",
                          case) is None


def test_assert_conforms_reports_like_the_cli():
    buggy = mutants.make({"skip_check_20"})
    found = []

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(broken_layouts("kda", "triton", checks=[20]))
    def prop(case):
        v = kda_fuzz.check(buggy, case)
        if v is not None:
            found.append(case)
        kda_fuzz.assert_conforms(buggy, case)

    with pytest.raises(AssertionError) as info:
        prop()
    text = str(info.value)
    assert "FAILURE in" in text and "layout:" in text and "expected: raises ValueError" in text
    assert found and kda_fuzz.check(buggy, found[-1]).kind == "contract"


def _guide_blocks() -> list[str]:
    text = (ROOT / "docs" / "user-guide.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


BUGGY = '''
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
           use_qk_l2norm_in_kernel=False, lower_bound=None):
    reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state,
                                out, ssm_state_indices, use_qk_l2norm_in_kernel,
                                lower_bound)
    if out.shape[2] == 4:       # the planted bug: GQA ratio 2 writes one head twice
        out[:, :, 1] = out[:, :, 0]
    return out, initial_state
'''
CORRECT = BUGGY.split("    if out.shape")[0] + "    return out, initial_state\n"


def _user_project(tmp_path: Path, kernel: str) -> Path:
    proj = tmp_path / "user"
    (proj / "my_project").mkdir(parents=True)
    (proj / "tests").mkdir()
    (proj / "my_project" / "__init__.py").write_text("")
    (proj / "my_project" / "decode.py").write_text(kernel)
    (proj / "tests" / "test_decode.py").write_text(_guide_blocks()[0])
    (proj / "pyproject.toml").write_text('[project]\nname = "user"\nversion = "0"\n')
    return proj


def _pytest(proj: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(proj)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "tests/test_decode.py", *args],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=600)


def test_user_guide_example_from_outside_the_package(tmp_path):
    ok = _user_project(tmp_path / "a", CORRECT)
    r = _pytest(ok)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 passed" in r.stdout

    bad = _user_project(tmp_path / "b", BUGGY)
    found = bad / "corpus" / "found"
    r = _pytest(bad, "--kda-save-failures", str(found))
    assert r.returncode == 1, r.stdout[-3000:]
    assert "FAILURE in my_project.decode:decode" in r.stdout
    assert "saved the failing case" in r.stdout
    files = sorted(found.glob("*.json"))
    assert len(files) == 1, r.stdout[-3000:]
    replay = ("replay", "--contract", "triton")  # in this process (tests/inprocess.py)
    r = kda_fuzz_command(*replay, "--target", "my_project.decode:decode", str(files[0]),
                         cwd=bad)
    assert r.returncode == 1, r.stdout + r.stderr
    r = kda_fuzz_command(*replay, "--target",
                         "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode",
                         str(files[0]), cwd=bad)
    assert r.returncode == 0, r.stdout + r.stderr


CHECKED_KERNEL = '''
import torch

from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode, validate_packed_decode_inputs


def decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
           use_qk_l2norm_in_kernel=False, lower_bound=None, check_indices=False):
    validate_packed_decode_inputs(mixed_qkv, a, b, A_log, dt_bias, initial_state, out,
                                  ssm_state_indices, "triton")
    top = int(ssm_state_indices.max()) if ssm_state_indices.numel() else -1
    if check_indices and top >= initial_state.shape[0]:
        raise ValueError(f"`ssm_state_indices` must be below "
                         f"num_slots={initial_state.shape[0]} (got {top}).")
    return reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale,
                                       initial_state, out, ssm_state_indices,
                                       use_qk_l2norm_in_kernel, lower_bound)


def unchecked(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
              ssm_state_indices, use_qk_l2norm_in_kernel=False, lower_bound=None,
              check_indices=False):
    top = int(ssm_state_indices.max()) if ssm_state_indices.numel() else -1
    if top >= initial_state.shape[0]:
        raise ValueError("index out of range")  # its own words: the contract's are pinned
    return decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                  ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound, False)
'''


def test_derived_contract_from_the_user_guide(tmp_path):
    """The guide's derived family, registered from a project's pyproject.toml: fuzzed,
    saved, replayed by the CLI and collected by pytest under its own family."""
    proj = tmp_path / "user"
    (proj / "my_project").mkdir(parents=True)
    (proj / "my_project" / "__init__.py").write_text("")
    (proj / "my_project" / "decode.py").write_text(CHECKED_KERNEL)
    blocks = _guide_blocks()
    (proj / "my_project" / "contract.py").write_text(blocks[1])
    toml = re.findall(r"```toml\n(.*?)```", (ROOT / "docs/user-guide.md").read_text(),
                      re.S)[0]
    (proj / "pyproject.toml").write_text('[project]\nname = "user"\nversion = "0"\n\n'
                                         + toml)
    env = {**os.environ, "PYTHONPATH": str(proj)}
    cli = [sys.executable, "-m", "kda_fuzz"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], cwd=proj, env=env, capture_output=True,
                              text=True, timeout=900)

    # small layouts (--budget): what is shown is the family's way through the tools, not
    # sizes (a plain torch target on cpu draws layouts of up to 2^18 elements otherwise)
    common = ("--family", "kda-checked", "--contract", "triton", "--max-examples", "300",
              "--seed", "1", "--jobs", "1", "--no-isolate", "--budget", "4096")
    # one campaign, both targets: the checked one passes, the unchecked one fails
    r = run("fuzz", *common, "--target", "my_project.decode:decode", "--target",
            "my_project.decode:unchecked", "--corpus", "corpus/found", "--shrink-seconds", "3")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "23:" in r.stdout  # the new check was hit
    files = sorted((proj / "corpus" / "found").glob("*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    assert docs and all(d["contract"]["family"] == "kda-checked" for d in docs), docs[:1]
    assert {d["origin"]["target"] for d in docs} == {"my_project.decode:unchecked"}
    r = run("replay", "--family", "kda-checked", "--contract", "triton", "--target",
            "my_project.decode:decode", *map(str, files))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                        "-p", "no:cacheprovider", "corpus"], cwd=proj, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and f"{len(files)} passed" in r.stdout, r.stdout[-3000:]


def test_pinned_campaign_from_the_user_guide(tmp_path):
    """The guide's presets and capability table, from a project outside the package."""
    proj = tmp_path / "user"
    (proj / "my_project").mkdir(parents=True)
    (proj / "my_project" / "__init__.py").write_text("")
    kernel = CORRECT.replace("def decode(", "def _decode(") + '''

def decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
           use_qk_l2norm_in_kernel=False, lower_bound=None):
    if lower_bound is not None:
        raise NotImplementedError("no lower_bound here")
    return _decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                   ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound)
'''
    (proj / "my_project" / "decode.py").write_text(kernel)
    guide = (ROOT / "docs/user-guide.md").read_text()
    toml = re.findall(r"```toml\n(.*?)```", guide, re.S)[1]
    (proj / "pyproject.toml").write_text('[project]\nname = "user"\nversion = "0"\n\n'
                                         '[tool.kda-fuzz]\n\n' + toml)
    command = re.findall(r"```bash\n(.*?)```", guide, re.S)[0].replace("\\\n", " ").split()
    assert command[:2] == ["kda-fuzz", "fuzz"]
    env = {**os.environ, "PYTHONPATH": str(proj)}
    # the unpinned quarter small too (--budget): the presets and the table are what is shown
    r = subprocess.run([sys.executable, "-m", "kda_fuzz", *command[1:], "--json",
                        "--no-save", "--seed", "2", "--max-examples", "120", "--budget",
                        "4096"], cwd=proj, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    notes = json.loads(r.stdout.strip().splitlines()[-1])["notes"]
    assert any("pinned layouts" in n and "small" in n and "gqa" in n for n in notes), notes
    assert any("left out" in n and "lower_bound" in n for n in notes), notes
