"""CUDA-graph mode (on a GPU): a valid case captured once, replayed on other values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kda_fuzz.engine.oracle import graph_replay, rolled_values, run_case
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, build

KDA = get_contract("kda")
ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = [KdaLayout(B=4, H=1, HV=2, K=16, V=16, padding="some", seed=1),
           KdaLayout(B=3, H=2, HV=4, K=32, V=16, qkv_row_pad=5, guard=3, seed=2,
                     use_qk_l2norm_in_kernel=True, lower_bound=-5.0)]


def test_rolled_values_keep_the_layout_and_change_the_values():
    case = build(LAYOUTS[1], "triton")
    fresh = rolled_values(case)
    for name, t in case.tensors.items():
        f = fresh.tensors[name]
        assert (f.shape, f.stride, f.offset) == (t.shape, t.stride, t.offset)
    assert not fresh.tensors["mixed_qkv"].view().equal(case.tensors["mixed_qkv"].view())
    assert fresh.tensors["ssm_state_indices"] is case.tensors["ssm_state_indices"]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["fused_recurrent_kda_packed_decode",
                                    "helion_fused_recurrent_kda_packed_decode"])
def test_the_projects_kernels_replay_from_a_graph(kernel: str, kda_device_name: str) -> None:
    from kda_fuzz_kernels import kda_decode

    fn = getattr(kda_decode, kernel)
    for layout in LAYOUTS:
        case = build(layout, "triton").on(kda_device_name)
        assert run_case(KDA, case, fn).status == "pass"
        got = graph_replay(KDA, case, fn)
        assert got.status == "pass", got.verdict


@pytest.mark.gpu
def test_graph_breaking_kernels_are_found(kda_device_name: str) -> None:
    from tests.gpu_targets import reads_a_gate_on_the_host, remembers_its_gates

    case = build(LAYOUTS[0], "triton").on(kda_device_name)
    for fn, what in ((reads_a_gate_on_the_host, "graph-capture-failed"),
                     (remembers_its_gates, "graph-")):
        assert run_case(KDA, case, fn).status == "pass"  # right eagerly
        got = graph_replay(KDA, case, fn)
        assert got.status == "fail" and got.verdict.what.startswith(what), got.verdict
        marked = type(case)(**{**case.__dict__, "notes": {**case.notes, "graph": True}})
        assert run_case(KDA, marked, fn).status == "fail"  # a saved finding replays it


@pytest.mark.gpu
def test_a_campaign_with_cuda_graphs_saves_the_finding(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--device", "cuda",
                        "--target", "tests.gpu_targets:remembers_its_gates", "--contract",
                        "triton", "--cuda-graphs", "--max-examples", "400", "--seed", "1",
                        "--jobs", "2", "--corpus", str(tmp_path), "--json"], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(ROOT), os.environ.get("PYTHONPATH", "")])},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    whats = {d["what"] for d in summary["failure_details"]}
    assert any(w.startswith("graph-") for w in whats), summary["failure_details"]
    assert summary["cuda_graph_checks"] > 0
    assert all(Path(p).stat().st_size < 1 << 20 for p in summary["saved"])
