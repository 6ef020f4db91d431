"""Device operations per example of the fuzzer's own work on valid KDA layouts: building a
case, the call's copies of its bases, the fused judge (``packed_fused``) and its reads.

On a GPU each operation that is not a view is (at least) one kernel launch, and the
campaign's rate is bound by launches (benchmarks/README, ninth session); the count does not
vary between machine starts, and it runs on the CPU: the fused judge's kernel under the
Triton interpreter counts as one launch, the target (the float64 reference) is not counted,
and the padding mask and the state indices, host work on a GPU, are counted apart ("build
(host)"). The judge's one read of the device (``.tolist()``) is not an ATen operation,
nor is a compiled Triton kernel's launch (``--device cuda`` leaves the fused kernel out).

``--syncs`` (cuda) counts instead where the host waits for the device: every synchronizing
call torch's sync debug mode reports, by phase and by the lines of this repository it came
from (the target's own as "target"). A sync other than the judge's one read makes a job
wait for its launches behind the other jobs' once more per example.

    python benchmarks/launch_count.py [--examples 200] [--seed 1] [--device cpu] [--top 12]
                                       [--budget 2048] [--variant helion] [--campaign]
                                       [--target M:F] [--syncs]
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

# ops that make no launch: views, allocations and metadata
_FREE = ("empty", "empty_like", "empty_strided", "lift_fresh", "set_", "resize_", "is_pinned",
         "_unsafe_view")
READS = ("_local_scalar_dense",)  # a scalar read back (int(), bool(), .item())


class Counting(TorchDispatchMode):
    """Counts the ATen operations that launch work (views and allocations aside), by phase."""

    def __init__(self) -> None:
        super().__init__()
        self.phase: str | None = None
        self.ops: Counter[tuple[str, str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if self.phase is not None and not func.is_view and name not in _FREE:
            self.ops[(self.phase, name)] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def counting(self, phase: str | None) -> Iterator[None]:
        """Count what runs inside under ``phase`` (None: not at all)."""
        old, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = old


def _instrument(mode: Counting) -> None:
    """The fused judge's interpreted kernel counted as one launch; the padding mask and
    the indices (host work on a GPU) counted apart."""
    from kda_fuzz.execution import cpu
    from kda_fuzz.families.kda import layouts as kda_layouts

    real_launch = cpu.launch_triton

    def one_launch(kernel: Any, grid: Any, dev: Any, *a: Any, **kw: Any) -> Any:
        mode.ops[(mode.phase or "?", "(fused kernel)")] += 1
        with mode.counting(None):
            return real_launch(kernel, grid, dev, *a, **kw)

    def on_host(fn: Any) -> Any:
        def counted(*a: Any, **kw: Any) -> Any:
            with mode.counting("build (host)" if mode.phase in ("build", "campaign")
                               else mode.phase):
                return fn(*a, **kw)
        return counted

    cpu.launch_triton = one_launch
    for name in ("_padding", "_indices"):
        setattr(kda_layouts, name, on_host(getattr(kda_layouts, name)))


def _views(case: Any, before: dict[str, Any]) -> dict[str, Any]:
    """The arguments as handed to the target, on the bases ``before`` the call."""
    return {**{n: t.view(before[n]) for n, t in case.tensors.items()}, **case.scalars}


def _phases(args: argparse.Namespace, mode: Counting) -> int:
    """Each phase of ``args.examples`` valid examples run by hand; the number judged."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from kda_fuzz.engine.contract import Unjudgeable
    from kda_fuzz.engine.oracle import expectation
    from kda_fuzz.families import get_contract
    from kda_fuzz.families.kda.layouts import build, layouts
    from kda_fuzz.families.packed import judge as pj
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode as target

    contract = get_contract("kda")
    judged = 0

    @hseed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(layouts(args.variant, budget=args.budget, max_b=16))
    def example(p: Any) -> None:
        nonlocal judged
        with mode.counting("build"):
            case = build(p, args.variant, args.device)
        with mode.counting("expectation"):
            exp = expectation(contract, case)
        if not exp.ok:
            return
        with mode.counting("materialize"):
            kwargs, after = case.materialize()
            before = {n: t.base for n, t in case.tensors.items()}
        with mode.counting(None):
            target(*[kwargs[n] for n in contract.signature])
        with mode.counting("fused judge"):
            try:
                if not pj._fused_pass(case, _views(case, before), kwargs, before, after,
                                      pj.KDA_FUSED, None):
                    raise SystemExit("the fused judge did not pass the reference")
            except Unjudgeable:  # judged all the same (every rule but the numbers held)
                pass
        judged += 1

    with mode:
        example()
    return judged


def _campaign(args: argparse.Namespace, mode: Counting) -> int:
    """A whole in-process campaign of valid layouts, its judge taking the fused path as
    on a GPU (the torch oracle only where that does not pass); the number of examples."""
    from kda_fuzz.campaign.runner import campaign
    from kda_fuzz.engine.targets import Target, load_target
    from kda_fuzz.families import get_contract
    from kda_fuzz.families.packed import judge as pj

    target = load_target(args.target)
    call = target.fn

    def uncounted(*a: Any, **kw: Any) -> Any:
        with mode.counting(None):
            return call(*a, **kw)

    torch_judge = pj.judge

    def gpu_judge(case: Any, kwargs: Any, before: Any, after: Any, result: Any,
                  budget: Any = None, **kw: Any) -> Any:
        if isinstance(result, tuple) and len(result) == 2 and result[0] is kwargs["out"] \
                and result[1] is kwargs["initial_state"]:
            with mode.counting("fused judge"):
                if pj._fused_pass(case, _views(case, before), kwargs, before, after,
                                  pj.KDA_FUSED, budget):
                    return None
        with mode.counting("torch judge"):
            return torch_judge(case, kwargs, before, after, result, budget, **kw)

    pj.judge = gpu_judge
    target = Target(target.name, uncounted)
    with mode, mode.counting("campaign"):
        report = campaign(get_contract("kda"), args.variant, [target], device=args.device,
                          max_examples=args.examples, seed=args.seed, valid_share=1.0,
                          budget=args.budget, max_b=16)
    return report.examples


def _watch_syncs(mode: Counting) -> Counter[tuple[str, str]]:
    """Every synchronizing CUDA call from now on, counted by phase and by where it came
    from (the innermost lines of this repository, then the outermost other one)."""
    import traceback
    import warnings

    import torch

    seen: Counter[tuple[str, str]] = Counter()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def show(message: Any, *_: Any, **__: Any) -> None:
        if "synchroniz" not in str(message):
            return
        stack = traceback.extract_stack()[:-1]
        ours = [f for f in stack if f.filename.startswith(root)
                and not f.filename.endswith("launch_count.py")]
        where = " <- ".join(f"{os.path.relpath(f.filename, root)}:{f.lineno}"
                            for f in reversed(ours[-3:]))
        seen[(mode.phase or "target", where or stack[-1].filename)] += 1

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variant", default="helion")
    ap.add_argument("--budget", type=int, default=2048,
                    help="state elements per layout (small: the interpreter runs the judge)")
    ap.add_argument("--campaign", action="store_true",
                    help="count a whole in-process campaign of valid layouts instead (what "
                         "else it launches per example shows as 'campaign')")
    ap.add_argument("--top", type=int, default=12, help="operations listed per phase")
    ap.add_argument("--target", default="kda_fuzz_kernels.kda_decode:reference_kda_packed_decode",
                    help="the target of --campaign (not counted)")
    ap.add_argument("--syncs", action="store_true",
                    help="count the host's waits for the device instead (cuda)")
    args = ap.parse_args()
    if args.syncs and not args.device.startswith("cuda"):
        raise SystemExit("--syncs needs --device cuda: only a GPU makes the host wait")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    mode = Counting()
    _instrument(mode)
    syncs = _watch_syncs(mode) if args.syncs else None
    n = max(1, (_campaign if args.campaign else _phases)(args, mode))
    if syncs is not None:
        import torch

        torch.cuda.set_sync_debug_mode(0)
        print(f"{n} valid examples, {args.variant} layouts on {args.device}: "
              f"{sum(syncs.values()) / n:.2f} synchronizing calls per example")
        for (phase, where), v in syncs.most_common(args.top * 2):
            print(f"  {v / n:6.2f}  {phase:12s} {where}")
        return
    from kda_fuzz.families.packed import fused as pf

    if pf.broken is not None:
        raise SystemExit(f"the fused judge failed: {pf.broken}")
    phases = ("campaign", "build", "build (host)", "expectation", "materialize",
              "fused judge", "torch judge")
    total = sum(mode.ops.values())
    host = sum(v for k, v in mode.ops.items() if k[0] == "build (host)")
    print(f"{n} valid examples, {args.variant} layouts on {args.device}: {total / n:.1f} "
          f"operations per example, {(total - host) / n:.1f} of them on the case's device "
          "on a GPU")
    for phase in phases:
        ops = Counter({k[1]: v for k, v in mode.ops.items() if k[0] == phase})
        if not ops:
            continue
        reads = sum(v for k, v in ops.items() if k in READS)
        print(f"  {phase:12s} {sum(ops.values()) / n:6.1f} per example"
              f"{f' ({reads / n:.1f} reads of the device)' if reads else ''}")
        for name, v in ops.most_common(args.top):
            print(f"      {v / n:6.2f}  {name}")


if __name__ == "__main__":
    main()
