"""Device operations per example of the fuzzer's own work on valid KDA layouts: building a
case, the call's copies of its bases, the fused judge (``packed_fused``) and its reads.

On a GPU each operation that is not a view is (at least) one kernel launch, and the
campaign's rate is bound by launches (benchmarks/README, ninth session); the count does not
vary between machine starts, and it runs on the CPU: the fused judge's kernel under the
Triton interpreter counts as one launch, the target (the float64 reference) is not counted,
and the padding mask and the state indices, host work on a GPU, are counted apart ("build
(host)"). The judge's one read of the device (``.tolist()``) is not an ATen operation.

    python benchmarks/launch_count.py [--examples 200] [--seed 1] [--device cpu] [--top 12]
                                       [--budget 2048] [--variant helion]
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
READS = ("_local_scalar_dense", "_to_cpu", "tolist")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variant", default="helion")
    ap.add_argument("--budget", type=int, default=2048,
                    help="state elements per layout (small: the interpreter runs the judge)")
    ap.add_argument("--top", type=int, default=12, help="operations listed per phase")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from kda_fuzz.engine.contract import Unjudgeable
    from kda_fuzz.engine.oracle import expectation
    from kda_fuzz.execution import cpu
    from kda_fuzz.families import get_contract
    from kda_fuzz.families.kda.layouts import build, layouts
    from kda_fuzz.families.packed import fused as pf
    from kda_fuzz.families.packed import judge as pj
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode as target

    contract = get_contract("kda")
    mode = Counting()
    real_launch = cpu.launch_triton

    def one_launch(kernel: Any, grid: Any, dev: Any, *a: Any, **kw: Any) -> Any:
        mode.ops[(mode.phase or "?", "(fused kernel)")] += 1
        with mode.counting(None):
            return real_launch(kernel, grid, dev, *a, **kw)

    cpu.launch_triton = one_launch
    from kda_fuzz.families.kda import layouts as kda_layouts

    def on_host(fn: Any) -> Any:  # the padding mask and the indices: host work on a GPU
        def counted(*a: Any, **kw: Any) -> Any:
            with mode.counting("build (host)" if mode.phase == "build" else mode.phase):
                return fn(*a, **kw)
        return counted

    for name in ("_padding", "_indices"):
        setattr(kda_layouts, name, on_host(getattr(kda_layouts, name)))
    stats: Counter[str] = Counter()

    @hseed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(layouts(args.variant, budget=args.budget, max_b=16))
    def example(p: Any) -> None:
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
            result = target(*[kwargs[n] for n in contract.signature])
        views = {n: case.tensors[n].view(before[n]) for n in case.tensors}
        views.update(case.scalars)
        with mode.counting("fused judge"):
            try:
                ok = pj._fused_pass(case, views, kwargs, before, after, pj.KDA_FUSED, None)
            except Unjudgeable:  # judged all the same (every rule but the numbers held)
                ok = True
        stats["examples"] += 1
        stats["passed"] += bool(ok) and result is not None

    with mode:
        example()
    if pf.broken is not None:
        raise SystemExit(f"the fused judge failed: {pf.broken}")
    n = max(1, stats["examples"])
    phases = ("build", "build (host)", "expectation", "materialize", "fused judge")
    total = sum(mode.ops.values())
    host = sum(v for k, v in mode.ops.items() if k[0] == "build (host)")
    print(f"{stats['examples']} valid examples ({stats['passed']} passed the fused judge), "
          f"{args.variant} layouts on {args.device}: {total / n:.1f} operations per example, "
          f"{(total - host) / n:.1f} of them on the case's device on a GPU")
    for phase in phases:
        ops = Counter({k[1]: v for k, v in mode.ops.items() if k[0] == phase})
        reads = sum(v for k, v in ops.items() if k in READS)
        print(f"  {phase:12s} {sum(ops.values()) / n:6.1f} per example"
              f"{f' ({reads / n:.1f} reads of the device)' if reads else ''}")
        for name, v in ops.most_common(args.top):
            print(f"      {v / n:6.2f}  {name}")


if __name__ == "__main__":
    main()
