"""Compiles counted by Triton's and Helion's hooks; examples the CPU machinery cannot run
are counted as not executable (never verdicts) and the campaign goes on; triton 3.9's
interpreter loads get boolean masks."""

from __future__ import annotations

import json

import helion
import helion.language as hl
import pytest
import torch
import triton
import triton.language as tl

from kda_fuzz.campaign.results import Report, require_executed
from kda_fuzz.campaign.runner import campaign
from kda_fuzz.engine.oracle import EnvironmentFailure
from kda_fuzz.engine.targets import Target
from kda_fuzz.execution import compiles
from kda_fuzz.execution import cpu as _execution
from kda_fuzz.execution.cpu import ExecutionEnvironmentError
from kda_fuzz.families import get_contract
from tests import mutants

KDA = get_contract("kda")
SMALL = {"budget": 2048, "max_b": 4}


def test_pure_torch_target_reports_no_compiles() -> None:
    report = campaign(KDA, "triton", [Target("torch", mutants.make())], max_examples=30,
                      seed=3, history=True, **SMALL)
    assert report.examples == 30 and not report.failures
    assert report.compiles == 0 and report.compiling_seconds == 0.0
    assert not any(rec["compile"] for rec in report.history)
    assert report.to_json()["compiles"] == 0


@helion.kernel(static_shapes=True, config=helion.Config(block_sizes=[4]))
def double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(x.size(0)):
        out[tile] = x[tile] * 2
    return out


def test_helion_compiles_are_counted_once_per_shape() -> None:
    before = compiles.totals()
    x = torch.arange(8, dtype=torch.float32)
    assert torch.equal(double(x), x * 2)
    first = compiles.totals() - before
    assert first.helion == 1 and first.seconds > 0
    double(x + 1)  # same shape: the compiled config is reused
    assert (compiles.totals() - before).helion == 1
    double(torch.arange(16, dtype=torch.float32))  # static shapes: a new shape compiles
    assert (compiles.totals() - before).helion == 2


def test_a_new_shapes_compile_is_bracketed_for_the_flight_record() -> None:
    """Helion binding a new shape and generating its code are one compile in progress,
    told to the listener (a job's flight record) at its start and its end; a call of a
    shape already bound tells nothing."""
    told: list[float] = []
    compiles.install()
    compiles.on_compiling(told.append)
    try:
        double(torch.arange(24, dtype=torch.float32))
        n = len(told)  # (binding, then the config's code: each a start and an end)
        assert n >= 2 and all(t > 0 for t in told[::2]) and told[1::2] == [0.0] * (n // 2)
        assert not compiles.in_compile()
        double(torch.arange(24, dtype=torch.float32))
        assert len(told) == n
        with compiles.compiling(), compiles.compiling():  # nested: the outermost only
            assert compiles.in_compile() and len(told) == n + 1
        assert told[n + 1:] == [0.0]
    finally:
        compiles.on_compiling(None)


def test_triton_cache_miss_hooks_count_and_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter never compiles, so the hooks are driven as Triton's JIT drives them
    on a cache miss (jit_cache_hook, build, jit_post_compile_hook); a hook installed
    before keeps running, and one that skips the compile (truthy) leaves no event."""
    runtime = triton.knobs.runtime
    seen: list[str] = []
    monkeypatch.setattr(runtime, "jit_cache_hook",
                        lambda *a, **k: seen.append("cache") or k.get("skip", False))
    monkeypatch.setattr(runtime, "jit_post_compile_hook",
                        lambda *a, **k: seen.append("post"))
    compiles.install()
    before = compiles.totals()
    assert not runtime.jit_cache_hook(key="k", fn=None)
    runtime.jit_post_compile_hook(key="k", fn=None)
    assert runtime.jit_cache_hook(key="k", fn=None, skip=True)
    got = compiles.totals() - before
    assert (got.triton, got.helion) == (1, 0)
    assert seen == ["cache", "post", "cache"]


def _interpreter_gap_on_one_head(target: Target) -> Target:
    """``target``, failing in the CPU machinery (not in its own code) whenever HV == 1."""

    def decode(*args: torch.Tensor) -> object:
        if args[6].dim() == 4 and args[6].shape[1] == 1:
            raise ExecutionEnvironmentError("the Triton interpreter cannot run this layout")
        return target.fn(*args)

    return Target("gap-at-HV1", decode)


def test_unexecutable_examples_are_counted_and_the_campaign_goes_on() -> None:
    target = _interpreter_gap_on_one_head(Target("torch", mutants.make()))
    report = campaign(KDA, "triton", [target], max_examples=60, seed=2, valid_share=1.0,
                      **SMALL)
    assert not report.failures
    assert report.unexecutable > 0 and report.unexecutable_valid > 0
    assert report.valid_cases > 0  # the rest ran and was judged
    assert report.examples + report.unexecutable == 60
    assert "cannot run this layout" in next(iter(report.unexecutable_causes))
    require_executed(report)  # something ran: a note, no error
    assert any("not executable here" in n for n in report.notes)


def test_nothing_executable_is_an_environment_failure() -> None:
    def never(*_: object, **__: object) -> None:
        raise ExecutionEnvironmentError("no interpreter here")

    report = campaign(KDA, "triton", [Target("never", never)], max_examples=20, seed=1,
                      valid_share=1.0, **SMALL)
    assert not report.failures and report.valid_cases == 0 and report.unexecutable > 0
    with pytest.raises(EnvironmentFailure, match="none of the"):
        require_executed(report)
    require_executed(Report(contract="kda", variant="triton", targets=[]))  # nothing drawn


@triton.jit
def _masked_copy(src, dst, idx, n, N: tl.constexpr):
    offs = tl.arange(0, N)
    slot = tl.load(idx)
    live = (slot >= 0) & (slot < n)
    mask = (offs < n) & live  # a block mask and a scalar: 0/1 integers in the interpreter
    tl.store(dst + offs, tl.load(src + offs, mask=mask, other=-1.0), mask=mask)


@pytest.mark.parametrize("slot", [0, -1])
def test_block_mask_and_scalar_condition_load_and_store(slot: int) -> None:
    """triton 3.9's interpreter refuses non-boolean masks ('mask has unsupported dtype');
    on a GPU an i1 is a boolean, and so it is here."""
    _execution.configure_cpu()
    src, dst = torch.arange(8, dtype=torch.float32), torch.full((8,), 7.0)
    idx = torch.tensor([slot], dtype=torch.int32)
    _masked_copy[(1,)](src, dst, idx, 6, N=8)
    want = torch.where(torch.arange(8) < 6, src, 7.0) if slot >= 0 else torch.full((8,), 7.0)
    assert torch.equal(dst, want)


def test_cli_goes_on_past_unexecutable_cases(capsys: pytest.CaptureFixture[str]) -> None:
    """Through the default path (supervised jobs): counted, noted, exit 0; exit 2 when no
    valid layout could run."""
    from kda_fuzz import cli

    common = ["--contract", "triton", "--max-examples", "30", "--seed", "2", "--no-save",
              "--json", "--valid-share", "1.0", "--budget", "2048", "--max-b", "4"]
    rc = cli.main(["fuzz", "--target", "tests.unexecutable_targets:gap_at_one_head", *common])
    out = capsys.readouterr().out
    assert rc == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["failures"] == 0 and summary["not_executable"]["examples"] > 0
    assert summary["compiles"] == 0
    assert any("not executable here" in n for n in summary["notes"])
    rc = cli.main(["fuzz", "--target", "tests.unexecutable_targets:never_runs", *common])
    err = capsys.readouterr().err
    assert rc == 2 and "none of the" in err, err
