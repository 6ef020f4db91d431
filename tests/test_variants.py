"""Kernel variants: which compiled variants a campaign ran (coverage), and
``--helion-configs N``: valid cases also judged under other configs of a Helion kernel."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kda_fuzz.campaign.results import Report, VariantSeen
from kda_fuzz.campaign.runner import campaign
from kda_fuzz.engine.targets import load_target
from kda_fuzz.families import get_contract
from kda_fuzz.report.html import render_report
from kda_fuzz.report.progress import print_summary
from tests.inprocess import kda_fuzz

ROOT = Path(__file__).resolve().parents[1]
TRITON = "kda_fuzz_kernels.kda_decode:fused_recurrent_kda_packed_decode"
HELION = "kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode"
BUG = "tests.helion_config_bug:decode"
AUTOTUNED = "tests.autotune_config_bug:decode"
SMALL = {"budget": 512, "max_b": 4, "valid_share": 1.0}


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in ("TRITON_INTERPRET", "KDA_FUZZ_CPU_MODE"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "kda_fuzz", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_triton_specialisations_are_listed_per_target_with_their_smallest_layout() -> None:
    report = campaign(get_contract("kda"), "triton", [load_target(TRITON)], max_examples=6,
                      seed=1, **SMALL)
    seen = report.variants[TRITON]
    assert seen and sum(r.count for r in seen.values()) == report.valid_cases == 6
    # under the interpreter the specialisation comes from the launch: constexprs and dtypes
    assert all(label.startswith("_kda_packed_decode_kernel[H=") and "BK=" in label
               for label in seen)
    smallest = min(seen.values(), key=lambda r: r.size)
    assert smallest.layout.startswith("B=1 H=1 HV=1 K=1 V=1")  # the simplest case's summary
    listed = report.to_json()["variants"][TRITON]
    assert {v["id"] for v in listed} == set(seen) and all(v["layout"] for v in listed)
    out = io.StringIO()
    print_summary(report, file=out)
    text = out.getvalue()
    assert f"Variants of {TRITON}: {len(seen)} ran, of 1 kernel(s) (_kda_packed_decode_kernel)" \
        in text
    assert "Kernel variants" in render_report(report) and next(iter(seen)) in \
        render_report(report).replace("&#x27;", "'")


def test_a_helion_config_is_a_variant_and_its_config_space_is_said_unrun() -> None:
    report = campaign(get_contract("kda"), "helion", [load_target(HELION)], max_examples=2,
                      seed=1, **SMALL)
    (label, rec), = report.variants[HELION].items()
    assert label.startswith("_kda_packed_decode[num_warps=2, num_stages=1]#")
    assert rec.count == 2 and rec.space == -1
    assert report.unrun_variants() == [
        f"{HELION}: _kda_packed_decode has a config space; only its own config ran "
        "(1 variant(s)): --helion-configs N runs N others"]


def test_variants_of_jobs_merge_counts_and_keep_the_smallest_layout() -> None:
    a, b = Report("kda", "helion", ["t"]), Report("kda", "helion", ["t"])
    a.variants = {"t": {"k[x]": VariantSeen("k", "d", 0, 3, "big", 900)}}
    b.variants = {"t": {"k[x]": VariantSeen("k", "d", 0, 2, "small", 40),
                        "k[y]": VariantSeen("k", "d", 4, 1, "other", 70)}}
    merged = Report("kda", "helion", ["t"])
    merged.add_counters(a.counters())
    merged.add_counters(b.counters())
    assert merged.variants["t"]["k[x]"] == VariantSeen("k", "d", 0, 5, "small", 40)
    assert merged.variants["t"]["k[y]"].count == 1
    assert merged.unrun_variants() == ["t: k declares 4 autotune configs, 1 ran (chosen by its "
                                       "autotuner; on cpu the first): --helion-configs N runs "
                                       "N others"]


def test_helion_configs_must_not_be_negative() -> None:
    r = _cli("fuzz", "--helion-configs", "-1")
    assert r.returncode == 2
    assert r.stderr.strip() == "kda-fuzz: error: --helion-configs must be 0 or more"


def test_the_fixture_is_right_under_its_default_config() -> None:
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode
    from tests.helion_config_bug import decode

    g = torch.Generator().manual_seed(0)
    B, H, HV, K, V = 2, 1, 2, 8, 16
    args = [torch.randn(B, 2 * H * K + HV * V, generator=g), torch.randn(B, HV * K, generator=g),
            torch.randn(B, HV, generator=g), torch.randn(HV, generator=g),
            torch.randn(HV * K, generator=g), 0.3, torch.randn(3, HV, V, K, generator=g),
            torch.zeros(B, 1, HV, V), torch.tensor([2, 0], dtype=torch.int32)]
    ref = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    decode(*args)
    reference_kda_packed_decode(*ref)
    assert torch.allclose(args[7], ref[7], atol=1e-5) and torch.allclose(args[6], ref[6],
                                                                          atol=1e-5)


def test_a_bug_of_one_helion_config_is_found_saved_with_it_and_replayed(tmp_path: Path) -> None:
    r = kda_fuzz("fuzz", "--target", BUG, "--contract", "helion", "--helion-configs", "4",
             "--layout", "H=1,HV=2,K=4,V=16", "--layout-share", "1", "--max-examples", "12",
             "--seed", "1", "--valid-share", "1", "--max-b", "2", "--jobs", "1", "--no-isolate",
             "--shrink-seconds", "2", "--max-failures", "1", "--corpus", str(tmp_path), "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    (f,) = out["failure_details"]
    assert f["kind"] == "mismatch" and f["extra"]["config"] == "configs:_decode"
    assert "under other kernel configs (_decode: " in f["detail"]
    saved = json.loads(Path(f["saved"]).read_text())
    config = saved["case"]["notes"]["kernel_configs"]["configs"]["_decode"]
    assert config["block_sizes"] in ([1], [2])  # the narrow V tiles the bug is planted in
    assert out["kernel_configs"]["runs"] >= 1
    again = kda_fuzz("replay", "--target", BUG, "--contract", "helion", f["saved"])
    assert again.returncode == 1 and "FAIL" in again.stdout, again.stdout + again.stderr
    assert "under other kernel configs" in again.stdout


def test_a_bug_of_one_autotune_config_is_found_saved_with_it_and_replayed(tmp_path: Path
                                                                          ) -> None:
    plain = campaign(get_contract("kda"), "triton", [load_target(AUTOTUNED)], max_examples=4,
                     seed=1, **SMALL)
    assert not plain.failures  # the autotuner's own (first) config is right
    assert any("declares 2 autotune configs, 1 ran" in u for u in plain.unrun_variants())
    r = kda_fuzz("fuzz", "--target", AUTOTUNED, "--contract", "triton", "--helion-configs", "2",
             "--max-examples", "8", "--seed", "1", "--valid-share", "1", "--max-b", "2",
             "--jobs", "1", "--no-isolate", "--shrink-seconds", "2", "--max-failures", "1",
             "--corpus", str(tmp_path), "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    (f,) = out["failure_details"]
    assert f["kind"] == "mismatch" and f["extra"]["config"] == "configs:_finish", f
    saved = json.loads(Path(f["saved"]).read_text())
    assert saved["case"]["notes"]["kernel_configs"]["configs"]["_finish"]["autotune"] == 1
    seen = {v["id"] for v in out["variants"][AUTOTUNED]}
    assert any("autotune config 2/2" in v for v in seen), seen  # the other config ran
    again = kda_fuzz("replay", "--target", AUTOTUNED, "--contract", "triton", f["saved"])
    assert again.returncode == 1 and "FAIL" in again.stdout, again.stdout + again.stderr
    # the debugger's script calls the kernel under the recorded configs too
    script = tmp_path / "repro.py"
    shown = kda_fuzz("show", "--python", f["saved"], "--target", AUTOTUNED)
    assert shown.returncode == 0, shown.stderr
    script.write_text(shown.stdout)
    ran = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "under the recorded kernel configs: _finish: autotune=1" in ran.stdout, \
        ran.stdout + ran.stderr
    assert ran.returncode == 1 and "REPRODUCED" in ran.stdout, ran.stdout + ran.stderr


@pytest.mark.slow
def test_the_project_helion_kernel_passes_under_other_configs() -> None:
    report = campaign(get_contract("kda"), "helion", [load_target(HELION)], max_examples=4,
                      seed=3, kernel_configs=3, extra_share=1.0, **SMALL)
    assert not report.failures
    assert report.config_runs + sum(report.config_skips.values()) >= 4


def test_hooks_of_two_concerns_on_one_method_stack() -> None:
    import triton.runtime.autotuner
    import triton.runtime.jit

    from kda_fuzz.execution import cpu, variants
    from kda_fuzz.execution.patching import MARK

    cpu.configure_cpu()
    variants.install()
    variants.install()  # a second install adds nothing
    for method in (triton.runtime.jit.JITFunction.run, triton.runtime.autotuner.Autotuner.run):
        tags = getattr(method, MARK)
        assert {t.split(".<locals>")[0] for t in tags} >= {
            "kda_fuzz.execution.cpu._hook_jit" if "jit" in method.__module__ else
            "kda_fuzz.execution.cpu._hook_autotuner",
            "kda_fuzz.execution.variants._hook_jit" if "jit" in method.__module__ else
            "kda_fuzz.execution.variants._hook_autotuner"}, tags


def test_a_crash_under_other_configs_is_saved_to_run_under_them_again() -> None:
    from kda_fuzz.campaign.runner import Campaign
    from kda_fuzz.campaign.spec import CampaignOptions
    from kda_fuzz.engine.verdict import Verdict

    died = Verdict("crash", "device-fault", "the device faulted: CUDA error: misaligned address",
                   extra={"config_alternative": 1})  # the supervisor's record of the call
    c = Campaign(get_contract("kda"), "triton", [load_target(TRITON)],
                 options=CampaignOptions.of(max_examples=1, seed=5, **SMALL),
                 hard={(0, 0, 0): (0, died)})
    (f,) = c.run().failures
    assert f.case.notes["kernel_configs"] == {"index": 1, "seed": 5, "configs": {}}
    assert f.verdict.kind == "crash" and f.verdict.extra["config"] == "configs:"
    assert f.signature[1:3] == ("config", "configs:")  # not the crash of the kernels' own


def test_variants_past_the_cap_are_counted_together() -> None:
    from kda_fuzz.campaign import results as runner
    from kda_fuzz.execution.variants import Variant
    from kda_fuzz.families.kda.layouts import KdaLayout, build

    report, case = Report("kda", "triton", ["t"]), build(KdaLayout(B=1, H=1, HV=1, K=4, V=4,
                                                                   seed=0), "triton")
    for i in range(runner.VARIANTS + 5):
        report.ran("t", [Variant(f"k[{i}]", "k")], case, lambda c: "layout")
    seen = report.variants["t"]
    assert len(seen) == runner.VARIANTS + 1 and seen[runner.MORE_VARIANTS].count == 5


def test_a_findings_kernel_configs_are_part_of_its_typed_judging() -> None:
    """The configs a finding under other configs ran travel in the judging policy's typed
    view (the oracle reads them there), stored in the notes as ``kernel_configs``."""
    from kda_fuzz.engine.case import Judging
    from kda_fuzz.families.kda.layouts import KdaLayout, build

    case = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, seed=1), "triton")
    saved = {"index": 1, "seed": 5, "configs": {"_decode": {"num_warps": 2}}}
    marked = Judging(strict=True, configs=saved).mark(case)
    assert marked.notes["kernel_configs"] == saved and marked.notes["strict"] is True
    assert Judging.of(marked) == Judging(strict=True, configs=saved)
    assert Judging.of(case).configs is None and "kernel_configs" not in case.notes


class _Gpu:
    """A stand-in for a CUDA tensor: what configs.fit_to_call reads of one."""

    def __init__(self, address: int) -> None:
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else \
            type("D", (), {"type": "cuda"})()
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def test_tensor_descriptor_configs_run_as_pointer_indexing_on_misaligned_gpu_tensors() -> None:
    pytest.importorskip("helion")
    import helion

    from kda_fuzz.execution.configs import fit_to_call

    drawn = helion.Config(num_warps=4, indexing=["pointer", "tensor_descriptor", "block_ptr"])
    aligned, misaligned = _Gpu(4096), _Gpu(4096 + 8)
    same, why = fit_to_call(drawn, [aligned, torch.zeros(3)], ["x", "y"])
    assert same is drawn and why == ""  # aligned GPU tensors (and CPU ones) keep it
    fitted, why = fit_to_call(drawn, [aligned, misaligned], ["mixed_qkv", "initial_state"])
    assert fitted.config["indexing"] == ["pointer", "pointer", "block_ptr"]
    assert fitted.config["num_warps"] == 4  # the rest of the drawn config still runs
    assert "initial_state" in why and "mixed_qkv" not in why and "16-byte" in why
    plain = helion.Config(num_warps=2, indexing="tensor_descriptor")
    assert fit_to_call(plain, [misaligned])[0].config["indexing"] == "pointer"
    # on CPU nothing is fitted: the interpreter has no alignment rule
    assert fit_to_call(drawn, [torch.zeros(4)[1:]])[0] is drawn
