"""--sanitize: cases replayed under compute-sanitizer (a stand-in tool on CPU,
``tests/fake_sanitizer.py``; the real one on a GPU, marked ``gpu``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kda_fuzz.campaign.findings import FindingSaver
from kda_fuzz.campaign.runner import Campaign
from kda_fuzz.campaign.spec import CampaignOptions, CampaignSpec
from kda_fuzz.cli import main
from kda_fuzz.corpus.replay import replay, replay_paths
from kda_fuzz.engine.targets import load_target
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, build
from kda_fuzz.workers import sanitize as sanitizer

KDA = get_contract("kda")
ROOT = Path(__file__).resolve().parents[1]
WIDE = "tests.sanitizer_targets:reads_past_indices_of_wide_batches"
REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"
SLOW_ON_TWO = "tests.sanitizer_targets:slow_on_two_rows"

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at _kda_decode_kernel+0x2b0 in /tmp/k.py:42
=========     by thread (0,0,0) in block (1,0,0)
=========     Address 0x7f0000000219 is out of bounds
=========     and is 25 bytes after the nearest allocation at 0x7f0000000200 of size 8 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f3a1] in libcuda.so.1
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure"
=========     Saved host backtrace up to driver entry point
========= ERROR SUMMARY: 2 errors
"""
INITCHECK = """\
========= Uninitialized __global__ memory read of size 4 bytes
=========     at 0x1a0 in decode_kernel
=========     by thread (5,0,0) in block (0,0,0)
=========     Address 0x7f0000001010
"""


@pytest.fixture
def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """compute-sanitizer replaced by ``tests/fake_sanitizer.py``."""
    exe = tmp_path / "compute-sanitizer"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests/fake_sanitizer.py'} \"$@\"\n")
    exe.chmod(0o755)
    monkeypatch.setenv(sanitizer.ENV_TOOL, str(exe))
    monkeypatch.chdir(ROOT)
    return exe


def _case(B: int, seed: int = 1):
    return build(KdaLayout(B=B, H=1, HV=2, K=16, V=16, seed=seed), "triton")


def test_a_memcheck_report_names_the_tensor_and_how_far_past_its_end() -> None:
    errors = sanitizer.parse_report(MEMCHECK, {"a": (0x7f0000000000, 64),
                                               "ssm_state_indices": (0x7f0000000200, 8)})
    assert len(errors) == 1  # the launch failure that follows is a consequence
    e = errors[0]
    assert (e.access, e.size, e.kernel, e.tensor, e.past_end) == (
        "read", 16, "_kda_decode_kernel", "ssm_state_indices", 25)
    assert e.what == "invalid-global-read"
    assert "25 bytes past the end of ssm_state_indices" in e.summary()


def test_an_initcheck_address_inside_an_allocation_names_it() -> None:
    (e,) = sanitizer.parse_report(INITCHECK, {"out": (0x7f0000001000, 256)})
    assert (e.what, e.kernel, e.tensor, e.past_end) == (
        "uninitialized-global-memory-read", "decode_kernel", "out", None)


def test_a_tight_tensor_has_no_guard_cells() -> None:
    case = build(KdaLayout(B=3, H=1, HV=2, K=16, V=16, guard=7, qkv_row_pad=5, seed=3),
                 "triton")
    for arg in case.tensors.values():
        t = sanitizer.tight(arg)
        assert t.base.numel() == arg.footprint() - arg.offset
        bits = [v.contiguous().view(-1).view(torch.uint8) for v in (t.view(), arg.view())]
        assert bits[0].equal(bits[1])  # bit for bit (NaN fills included)


def test_errors_are_told_apart_by_case(fake_tool: Path) -> None:
    cases = [_case(1), _case(4), _case(2), _case(5)]
    reports = sanitizer.sanitize("memcheck", WIDE, cases, device="cpu")
    assert [r.status for r in reports] == ["clean", "errors", "clean", "errors"]
    v = reports[1].verdict()
    assert v is not None and v.kind == "sanitizer" and v.output == "ssm_state_indices"
    assert v.what == "memcheck-invalid-global-read"
    assert v.extra["sanitizer"]["errors"][0]["past_end"] == 4


def test_errors_that_name_no_tensor_are_found_by_splitting_the_batch(
        fake_tool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SANITIZER_LOOSE", "1")
    cases = [_case(1), _case(4)]  # one process for both, then one each
    reports = sanitizer.sanitize("memcheck", WIDE, cases, device="cpu")
    assert [r.status for r in reports] == ["clean", "errors"]
    assert reports[1].errors[0].tensor is None


def test_a_correct_target_is_clean(fake_tool: Path) -> None:
    reports = sanitizer.sanitize("memcheck", REFERENCE, [_case(4), _case(6)], device="cpu")
    assert [r.status for r in reports] == ["clean", "clean"]
    assert all(r.verdict() is None for r in reports)


def test_a_missing_tool_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(sanitizer.ENV_TOOL, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    if Path("/usr/local/cuda/bin/compute-sanitizer").exists():
        pytest.skip("this machine has compute-sanitizer in /usr/local/cuda")
    with pytest.raises(sanitizer.SanitizerMissing, match="compute-sanitizer"):
        sanitizer.find_sanitizer()


@pytest.mark.parametrize("argv, message", [
    (["fuzz", "--sanitize", "memcheck"], "--sanitize memcheck needs --device cuda"),
    (["fuzz", "--sanitize-every", "0"], "--sanitize-every must be at least 1"),
    (["replay", "--sanitize", "initcheck", "corpus"], "needs --device cuda"),
])
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
                      ) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_campaign_finds_saves_and_skips_replaying_it_without_a_gpu(
        fake_tool: Path, tmp_path: Path) -> None:
    target = load_target(WIDE)
    options = CampaignOptions.of(device="cpu", max_examples=20, seed=3, sanitize="memcheck",
                                 sanitize_every=2, max_failures=5, budget=1 << 12)
    report = Campaign(KDA, "triton", [target], options=options).run()
    assert report.sanitize_sampled and report.sanitized == report.sanitize_sampled
    found = [f for f in report.failures if f.verdict.kind == "sanitizer"]
    assert len(found) == 1, [f.verdict.summary() for f in report.failures]
    assert found[0].case.tensors["ssm_state_indices"].shape[0] > 2
    assert report.to_json()["sanitizer"]["sanitized"] == report.sanitized
    corpus = tmp_path / "corpus"
    saver = FindingSaver(CampaignSpec.of(KDA, "triton", [], corpus=str(corpus), seed=3))
    saver.found_inline(found[0], None)
    path = Path(found[0].saved)
    assert path.name.startswith("sanitizer-")
    data = json.loads(path.read_text())
    assert data["verdict"]["extra"]["sanitizer"]["errors"][0]["tensor"] == "ssm_state_indices"
    rec = replay(path, [target])
    assert rec.status == "SKIP" and "needs --device cuda" in rec.reason
    assert replay_paths([str(path)], [target]) == 2  # nothing could run here


def test_each_finding_carries_a_report(fake_tool: Path, tmp_path: Path) -> None:
    from kda_fuzz.campaign.results import Failure
    from kda_fuzz.engine.verdict import Verdict

    f = Failure(_case(4), Verdict("mismatch", "out-value", "wrong"), WIDE)
    saver = FindingSaver(CampaignSpec.of(KDA, "triton", [], corpus=str(tmp_path), seed=1,
                                         sanitize="memcheck"))
    saver.found_inline(f, None)
    report = json.loads(Path(f.saved).read_text())["verdict"]["extra"]["sanitizer"]
    assert report["status"] == "errors"
    assert report["errors"][0]["tensor"] == "ssm_state_indices"


# ------------------------------------------------------------------ on a GPU


@pytest.mark.gpu
def test_the_projects_kernels_are_clean_under_memcheck(kda_device_name: str) -> None:
    pytest.importorskip("triton")
    sanitizer.find_sanitizer()
    cases = [build(KdaLayout(B=3, H=1, HV=2, K=32, V=16, seed=1), "triton"),
             build(KdaLayout(B=5, H=2, HV=4, K=16, V=32, padding="some", seed=2,
                             use_qk_l2norm_in_kernel=True, lower_bound=-5.0), "triton")]
    for spec in ("kda_fuzz_kernels.kda_decode:fused_recurrent_kda_packed_decode",
                 "kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode"):
        reports = sanitizer.sanitize("memcheck", spec, cases, device=kda_device_name)
        assert [r.status for r in reports] == ["clean", "clean"], [r.text for r in reports]


@pytest.mark.gpu
def test_a_masked_read_past_the_indices_is_found(kda_device_name: str) -> None:
    sanitizer.find_sanitizer()
    reports = sanitizer.sanitize("memcheck", "tests.gpu_targets:reads_past_the_indices",
                                 [_case(3)], device=kda_device_name)
    (r,) = reports
    assert r.status == "errors", (r.note, r.text)
    assert r.errors[0].tensor == "ssm_state_indices", r.text
    assert r.errors[0].access == "read"


pytest_plugins = ["pytester"]


@pytest.mark.slow
def test_a_sanitizer_file_is_skipped_by_pytest_without_a_gpu(
        fake_tool: Path, tmp_path: Path, pytester: pytest.Pytester) -> None:
    from kda_fuzz.campaign.results import Failure

    pytester._monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the target, from pytester's dir
    reports = sanitizer.sanitize("memcheck", WIDE, [_case(4)], device="cpu")
    assert reports[0].status == "errors", reports[0].note
    f = Failure(_case(4), reports[0].verdict(), WIDE)
    FindingSaver(CampaignSpec.of(KDA, "triton", [], corpus=str(pytester.path / "corpus"),
                                 seed=1)).found_inline(f, None)
    pytester.makefile(".toml", pyproject="[tool.kda-fuzz]\n[tool.kda-fuzz.targets.kda]\n"
                      f"triton = ['{WIDE}']\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*sanitizer-*needs --device cuda and compute-sanitizer*"])


# ------------------------------------------------------------------ one worker per campaign


def _starts(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _gone(pids: list[int], within: float) -> bool:
    import os
    import time

    end = time.monotonic() + within
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_a_planted_report_is_the_case_that_was_running(
        fake_tool: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_SANITIZER_REPORT", "2")
    monkeypatch.setenv("FAKE_SANITIZER_STARTS", str(tmp_path / "starts"))
    reports = sanitizer.sanitize("memcheck", REFERENCE, [_case(1), _case(2), _case(3)],
                                 device="cpu")
    assert [r.status for r in reports] == ["clean", "errors", "clean"]
    assert reports[1].errors[0].tensor is None and "Invalid __global__ read" in reports[1].text
    assert len(_starts(tmp_path / "starts")) == 1  # one sanitized process for all three


@pytest.mark.parametrize("with_report", [True, False])
def test_a_crash_of_the_sanitized_process_is_reported_and_the_worker_restarts(
        fake_tool: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        with_report: bool) -> None:
    monkeypatch.setenv("FAKE_SANITIZER_CRASH", "2")
    monkeypatch.setenv("FAKE_SANITIZER_ONCE", str(tmp_path / "once"))
    monkeypatch.setenv("FAKE_SANITIZER_STARTS", str(tmp_path / "starts"))
    if with_report:
        monkeypatch.setenv("FAKE_SANITIZER_CRASH_REPORT", "1")
    # (the second case, of two rows, is slow: the kill lands in the middle of it)
    reports = sanitizer.sanitize("memcheck", SLOW_ON_TWO, [_case(1), _case(2), _case(1, 5)],
                                 device="cpu")
    statuses = [r.status for r in reports]
    assert statuses == ["clean", "errors" if with_report else "failed", "clean"], reports
    assert "died (exit status 137) while running the case" in reports[1].note
    if with_report:  # evidence: a finding of the case that was running
        v = reports[1].verdict()
        assert v is not None and v.kind == "sanitizer"
    assert len(_starts(tmp_path / "starts")) == 2


def test_a_process_the_tool_ends_between_cases_costs_the_next_case_nothing(
        fake_tool: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The tool ends the process right after a case has ended: the next case runs in a
    fresh process and is judged there (not reported as a death of its own)."""
    monkeypatch.setenv("FAKE_SANITIZER_DIE_AFTER", "1")
    monkeypatch.setenv("FAKE_SANITIZER_ONCE", str(tmp_path / "once"))
    monkeypatch.setenv("FAKE_SANITIZER_STARTS", str(tmp_path / "starts"))
    reports = sanitizer.sanitize("memcheck", REFERENCE, [_case(1), _case(2), _case(1, 5)],
                                 device="cpu")
    assert [r.status for r in reports] == ["clean", "clean", "clean"], reports
    assert len(_starts(tmp_path / "starts")) == 2


def test_one_sanitized_worker_serves_every_job_of_a_campaign(
        fake_tool: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kda_fuzz.campaign.supervisor import Supervisor

    monkeypatch.setenv("FAKE_SANITIZER_STARTS", str(tmp_path / "starts"))
    sup = Supervisor(CampaignSpec.of("kda", "triton", [WIDE], jobs=2, device="cpu",
                                     max_examples=24, seed=5, sanitize="memcheck",
                                     sanitize_every=2, max_failures=5, budget=1 << 12))
    report = sup.run()
    assert report.sanitize_sampled > 2
    assert report.sanitized == report.sanitize_sampled, report.to_json()["sanitizer"]
    assert report.sanitize_failed == 0
    found = [f for f in report.failures if f.verdict.kind == "sanitizer"]
    assert len(found) == 1 and found[0].verdict.output == "ssm_state_indices"
    assert report.sanitize_found >= 1
    assert len(_starts(tmp_path / "starts")) == 1  # one worker for both jobs


def test_a_slow_start_up_leaves_samples_not_run_and_the_campaign_ends_in_time(
        fake_tool: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import time

    from kda_fuzz.campaign.sanitizing import SANITIZE_BACKLOG, sanitizer_note

    monkeypatch.setenv("FAKE_SANITIZER_STARTUP", "120")
    monkeypatch.setenv("FAKE_SANITIZER_STARTS", str(tmp_path / "starts"))
    options = CampaignOptions.of(device="cpu", max_examples=100_000, seed=3,
                                 sanitize="memcheck", sanitize_every=1, max_seconds=4.0,
                                 budget=1 << 12)
    t = time.monotonic()
    report = Campaign(KDA, "triton", [load_target(REFERENCE)], options=options).run()
    assert time.monotonic() - t < 4.0 + 2.0
    assert report.sanitize_sampled > 0
    # samples that could only wait are not taken: at most the backlog waits, unrun
    assert report.sanitize_sampled <= SANITIZE_BACKLOG < report.valid_cases
    assert report.sanitized == 0 and report.sanitize_failed == 0
    assert report.to_json()["sanitizer"]["not_run"] == report.sanitize_sampled
    note = sanitizer_note(report, "memcheck", 1)
    assert f"{report.sanitize_sampled} not run (time ran out" in note and "0 failed" in note
    assert _gone(_starts(tmp_path / "starts"), 3.0)  # the sanitized worker was stopped


def test_a_sanitizer_that_cannot_start_is_the_environments_failure(
        fake_tool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kda_fuzz.engine.oracle import EnvironmentFailure

    monkeypatch.setenv("FAKE_SANITIZER_NO_START", "1")
    options = CampaignOptions.of(device="cpu", max_examples=20, seed=3, sanitize="memcheck",
                                 sanitize_every=1, budget=1 << 12)
    with pytest.raises(EnvironmentFailure, match=r"cannot start.*could not start"):
        Campaign(KDA, "triton", [load_target(REFERENCE)], options=options).run()


def test_a_sanitizer_finding_is_minimized_under_the_tool(fake_tool: Path) -> None:
    from kda_fuzz.campaign.results import Failure
    from kda_fuzz.campaign.sanitizing import minimize_finding

    (report,) = sanitizer.sanitize("memcheck", WIDE, [_case(7)], device="cpu")
    verdict = report.verdict()
    assert verdict is not None
    f = Failure(_case(7), verdict, WIDE)
    assert minimize_finding(KDA, f, device="cpu", seconds=20.0)
    assert f.case.tensors["ssm_state_indices"].shape[0] == 3  # the smallest that reads past
    assert f.verdict.kind == "sanitizer"
    assert f.verdict.extra["sanitizer"]["errors"][0]["tensor"] == "ssm_state_indices"


def test_the_dispatcher_runs_a_signature_it_has_compiled_first() -> None:
    """Under the tool a compile is many times slower than a run: of the samples waiting,
    the oldest of a signature already run goes first, else the oldest."""
    import collections

    from kda_fuzz.workers.sanitize import _Dispatcher

    d = object.__new__(_Dispatcher)
    d.queue = collections.deque([("j0", 1, "t", b"", "new"), ("j1", 2, "t", b"", "seen"),
                                 ("j0", 3, "u", b"", "seen"), ("j1", 4, "t", b"", "seen")])
    d.compiled, d.passed_over = {("t", "seen")}, 0
    assert [d._next()[1] for _ in range(4)] == [2, 4, 1, 3]
    assert d._next() is None
    # a new signature waits behind at most PASSED_OVER samples of compiled ones
    d.queue = collections.deque([("j0", 0, "t", b"", "new"),
                                 *(("j1", k, "t", b"", "seen") for k in range(1, 6))])
    assert [d._next()[1] for _ in range(6)] == [1, 2, 3, 0, 4, 5]

