"""Hard faults and hangs end one case, not the campaign; the case is saved."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kda_fuzz.engine.oracle import EnvironmentFailure
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, build
from kda_fuzz.workers.isolate import IsolatedTarget

ROOT = Path(__file__).resolve().parents[1]
KDA = get_contract("kda")


def test_worker_survives_abort_and_hang_and_recovers() -> None:
    padded = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, padding="first", seed=1), "triton")
    clean = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, padding="none", seed=1), "triton")
    with IsolatedTarget(KDA, "tests.hostile_targets:aborts_on_padding", timeout=30) as iso:
        crashed = iso.run(padded)
        assert crashed.verdict is not None and crashed.verdict.kind == "crash"
        assert "SIGABRT" in crashed.verdict.detail
        assert iso.run(clean).status == "pass"  # a fresh worker took over
    with IsolatedTarget(KDA, "tests.hostile_targets:hangs", timeout=1) as iso:
        hung = iso.run(clean)
        assert hung.verdict is not None and hung.verdict.kind == "timeout"


def test_an_environment_failure_in_the_worker_is_raised_in_the_parent() -> None:
    clean = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, padding="none", seed=1), "triton")
    with IsolatedTarget(KDA, "tests.hostile_targets:interpreter_gap", timeout=30) as iso:
        with pytest.raises(EnvironmentFailure, match="erfcx has no CPU"):
            iso.run(clean)
        assert iso._proc is not None and iso._proc.is_alive()  # the worker goes on


@pytest.mark.parametrize("target,kind,extra", [
    ("tests.hostile_targets:aborts_on_padding", "crash", []),
    ("tests.hostile_targets:hangs", "timeout", ["--timeout", "2"]),
])
@pytest.mark.slow  # a long campaign: the slow tier
def test_campaign_saves_crash_and_timeout_cases(tmp_path: Path, target: str, kind: str,
                                                extra: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "kda_fuzz", "fuzz", "--target", target, "--contract", "triton",
         "--max-examples", "50", "--seed", "3", "--corpus", str(tmp_path), "--json", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["failure_details"][0]["kind"] == kind
    saved = [Path(p) for p in summary["saved"]]
    assert len(saved) == 1 and saved[0].name.startswith(f"{kind}-") and saved[0].exists()
    assert not (tmp_path / ".inflight").exists()
    # the reproduce command replays it as the campaign ran it (isolated; the same timeout):
    # exit 1, not an abort or a minute's wait
    command = summary["failure_details"][0]["reproduce"]
    assert command.startswith("kda-fuzz replay ") and " ".join(extra) in command
    again = subprocess.run([sys.executable, "-m", "kda_fuzz", *shlex.split(command)[1:]], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 1, again.stderr
    assert "FAIL" in again.stdout and kind in again.stdout
    if kind == "timeout":
        assert "did not return within 2 s" in again.stdout


@pytest.mark.gpu
def test_out_of_bounds_kernel_is_a_crash_not_the_end(kda_device_name: str) -> None:
    case = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, seed=1), "triton")
    with IsolatedTarget(KDA, "tests.gpu_targets:writes_out_of_bounds", timeout=120,
                        device=kda_device_name) as iso:
        out = iso.run(case)
        assert out.verdict is not None and out.verdict.kind == "crash", out
    with IsolatedTarget(KDA, "kda_fuzz_kernels.kda_decode:fused_recurrent_kda_packed_decode",
                        timeout=120, device=kda_device_name) as iso:
        assert iso.run(case).status == "pass"


def test_no_false_timeout_after_the_parent_used_torch_threads() -> None:
    """A worker never inherits a running torch thread pool: after the parent ran parallel
    torch ops, a case large enough for intra-op threads passes through the isolated path
    in seconds (a forked worker deadlocked here)."""
    import time

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))
    try:
        torch.randn(1 << 22).sum()  # the parent's pool is running now
        p = KdaLayout(B=65, H=1, HV=2, K=16, V=64, spare_slots=23, qkv_dtype=torch.bfloat16,
                      ab_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                      state_dtype=torch.bfloat16, seed=3)
        case = build(p, "helion")
        t = time.monotonic()
        reference = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"
        with IsolatedTarget(KDA, reference, timeout=30) as iso:
            outcome = iso.run(case)
    finally:  # the session's own share of the cores again (conftest.py)
        torch.set_num_threads(before)
    assert outcome.status in ("pass", "skip"), outcome.verdict
    assert time.monotonic() - t < 30


def test_a_worker_runs_in_the_environment_of_its_caller(monkeypatch) -> None:
    """Workers are forks of a long-lived fork server, yet each sees the caller's
    environment as it was when the worker started, not the server's."""
    case = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, seed=1), "triton")
    target = "tests.hostile_targets:aborts_when_told"
    monkeypatch.delenv("KDA_FUZZ_TEST_ABORT", raising=False)
    with IsolatedTarget(KDA, target, timeout=30) as iso:  # the server runs from here on
        assert iso.run(case).status == "pass"
    monkeypatch.setenv("KDA_FUZZ_TEST_ABORT", "1")
    with IsolatedTarget(KDA, target, timeout=30) as iso:
        outcome = iso.run(case)
    assert outcome.verdict is not None and outcome.verdict.kind == "crash", outcome


def test_a_still_crashing_corpus_entry_fails_alone(tmp_path: Path) -> None:
    """crash- entries replay isolated (kda-fuzz replay and pytest alike): a target that
    still aborts fails the entry; the replaying process goes on."""
    from kda_fuzz.corpus.replay import replay_entry
    from kda_fuzz.engine.targets import load_target

    padded = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, padding="first", seed=1), "triton")
    [(_, outcome)] = replay_entry(KDA, padded, "crash",
                                     [load_target("tests.hostile_targets:aborts_on_padding")])
    assert outcome.verdict is not None and outcome.verdict.kind == "crash"
    [(_, fine)] = replay_entry(KDA, padded, "crash",
                               [load_target("kda_fuzz_kernels.kda_decode:reference_kda_packed_decode")])
    assert fine.status == "pass"


def test_workers_fork_from_the_fork_server_on_linux_only(monkeypatch) -> None:
    import sys

    from kda_fuzz.workers import process

    expected = "forkserver" if sys.platform.startswith("linux") else "spawn"
    assert process.worker_context().get_start_method() == expected
    monkeypatch.setattr(process.sys, "platform", "darwin")
    assert process.worker_context().get_start_method() == "spawn"


def test_the_fork_server_preloads_the_kernel_libraries_a_target_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Import statements and the callable's name count; a word in a docstring or a string
    (a variant named "helion") does not: a wrong guess costs seconds of import on CPU."""
    import importlib.util

    from kda_fuzz.execution import kernel_libraries

    installed = [lib for lib in ("triton", "helion") if importlib.util.find_spec(lib)]
    sources = {"imports_both": "import torch\nimport helion\nfrom triton import language\n",
               "lazily": 'import importlib\nK = importlib.import_module("helion.language")\n',
               "in_words": '"""A torch twin of the helion and triton kernels."""\n'
                           'VARIANT = "helion"\nimport torch  # not triton\n'}
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kernel_libraries(["imports_both:decode"]) == installed
    assert kernel_libraries(["lazily:decode"]) == [x for x in installed if x == "helion"]
    assert kernel_libraries(["in_words:decode"]) == []
    assert kernel_libraries(["in_words:helion_decode"]) == [
        x for x in installed if x == "helion"]
    assert kernel_libraries(["no_such_module:decode"]) == []


def test_kernel_libraries_follow_a_package_that_loads_its_kernels_on_first_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package whose ``__getattr__`` imports the submodule named beside the callable
    (as the project's own kernel packages do): the libraries of that submodule and of
    what it imports from its package, not those of the package's other kernels. Before,
    the project's Triton targets named none, and every job imported helion itself."""
    import importlib.util

    from kda_fuzz.execution import kernel_libraries

    has = {lib: [lib] if importlib.util.find_spec(lib) else [] for lib in ("triton", "helion")}
    pkg = tmp_path / "lazykernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '"""Kernels in triton and helion, loaded on first use."""\n'
        "from importlib import import_module\n"
        "from lazykernels.reference import ref\n"
        '_LAZY = {"tk": ".tmod", "hk": ".hmod", "both": ".pick"}\n'
        "def __getattr__(name):\n"
        "    return getattr(import_module(_LAZY[name], __name__), name)\n")
    (pkg / "reference.py").write_text("import torch\ndef ref(*a):\n    pass\n")
    (pkg / "tmod.py").write_text("import triton\nfrom .reference import ref\ndef tk(*a):\n"
                                 "    pass\n")
    (pkg / "hmod.py").write_text("import helion\ndef hk(*a):\n    pass\n")
    (pkg / "pick.py").write_text("from lazykernels.hmod import hk\nfrom . import tmod\n"
                                 "def both(*a):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kernel_libraries(["lazykernels:tk"]) == has["triton"]
    assert kernel_libraries(["lazykernels:hk"]) == has["helion"]
    assert kernel_libraries(["lazykernels:both"]) == has["triton"] + has["helion"]
    assert kernel_libraries(["lazykernels:ref"]) == []
    assert kernel_libraries(["lazykernels.tmod:tk"]) == has["triton"]
    own = "kda_fuzz_kernels.kda_decode"
    assert kernel_libraries([f"{own}:fused_recurrent_kda_packed_decode"]) == has["triton"]
    assert kernel_libraries([f"{own}:kda_packed_decode"]) == has["triton"] + has["helion"]
