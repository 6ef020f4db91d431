"""GPU check and benchmark of the packed KDA decode kernels (Helion, Triton, dispatcher).

Runs every kernel on the upstream grids of the contract's section 4 (B in {1, 4, 32, 128}
with H = HV = 16, K = V = 128; B = 8 with H = 8, HV = 16; B = 3, H = 2, HV = 4 with 7 slots
and indices [5, -1, 2]) for fp32/bf16/fp16 states, l2norm on/off and lower_bound None/-5.0,
against the float64 torch reference. Each case also checks that padding rows are exact
zeros over a NaN-filled ``out``, that slots no row names are bit-identical and that the
caller's objects are returned. Prints one table row per case with the max errors, the
first-call time (compile included) and the median per-launch time of 50 launches after
warmup (CUDA events). Exits non-zero if any case fails or raises.

    python benchmarks/gpu_kernels.py                 # full grid on cuda
    python benchmarks/gpu_kernels.py --quick         # one state dtype, fewer variants
    python benchmarks/gpu_kernels.py --device cpu --quick --iters 2   # harness dry run
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_fuzz_kernels.kda_decode import (
    fused_recurrent_kda_packed_decode,
    helion_fused_recurrent_kda_packed_decode,
    kda_packed_decode,
    reference_kda_packed_decode,
)

Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]

KERNELS: dict[str, Kernel] = {
    "helion": helion_fused_recurrent_kda_packed_decode,
    "triton": fused_recurrent_kda_packed_decode,
    "dispatch": kda_packed_decode,
}
# (atol, rtol) against the float64 reference, by the dtype of the compared tensor
TOL = {torch.float32: (5e-5, 5e-5), torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclasses.dataclass(frozen=True)
class Grid:
    B: int
    H: int
    HV: int
    K: int = 128
    V: int = 128
    slots: int | None = None
    indices: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return f"B{self.B} H{self.H} HV{self.HV} K{self.K} V{self.V}"


GRIDS = [
    *(Grid(B, 16, 16) for B in (1, 4, 32, 128)),
    Grid(8, 8, 16),
    Grid(3, 2, 4, slots=7, indices=(5, -1, 2)),
]


@dataclasses.dataclass
class Result:
    kernel: str
    grid: str
    state: str
    l2norm: bool
    lower_bound: float | None
    out_err: float = float("nan")
    state_err: float = float("nan")
    first_ms: float = float("nan")
    launch_us: float = float("nan")
    ok: bool = False
    note: str = ""


def make_inputs(grid: Grid, state_dtype: torch.dtype, act_dtype: torch.dtype,
                device: str, seed: int) -> dict[str, object]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, H, HV, K, V = grid.B, grid.H, grid.HV, grid.K, grid.V
    slots = grid.slots if grid.slots is not None else 2 * B + 3
    if grid.indices is not None:
        idx = torch.tensor(grid.indices, dtype=torch.int32)
    else:
        idx = torch.randperm(slots, generator=g)[:B].to(torch.int32)
        if B > 1:
            idx[1::4] = -1  # padding rows
    width = 2 * H * K + HV * V

    def randn(*size: int, std: float = 1.0) -> torch.Tensor:
        return torch.randn(*size, generator=g) * std

    qkv = randn(B, width + 64).to(act_dtype)[:, :width]  # row stride > width
    return {
        "mixed_qkv": qkv.to(device),
        "a": randn(B, HV * K, std=2.0).to(act_dtype).to(device),
        "b": randn(B, HV).to(act_dtype).to(device),
        "A_log": randn(HV, std=0.5).to(device),
        "dt_bias": randn(HV * K, std=0.5).to(device),
        "scale": K**-0.5,
        "initial_state": (randn(slots, HV, V, K) * 0.5).to(state_dtype).to(device),
        "out": torch.full((B, 1, HV, V), float("nan"), dtype=act_dtype, device=device),
        "ssm_state_indices": idx.to(device),
    }


def call(kernel: Kernel, inp: dict[str, object], l2norm: bool,
         lower_bound: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    return kernel(inp["mixed_qkv"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"],
                  inp["scale"], inp["initial_state"], inp["out"], inp["ssm_state_indices"],
                  l2norm, lower_bound)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).abs().max()) if x.numel() else 0.0


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_launches(fn: Callable[[], object], device: str, iters: int, warmup: int) -> float:
    """Median per-launch time in microseconds."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def run_case(name: str, grid: Grid, state_dtype: torch.dtype, l2norm: bool,
             lower_bound: float | None, args: argparse.Namespace, seed: int) -> Result:
    res = Result(name, grid.name, DTYPE_NAMES[state_dtype], l2norm, lower_bound)
    try:
        kernel = KERNELS[name]
        inp = make_inputs(grid, state_dtype, torch.bfloat16, args.device, seed)
        state, out = inp["initial_state"], inp["out"]
        assert isinstance(state, torch.Tensor) and isinstance(out, torch.Tensor)
        idx = inp["ssm_state_indices"]
        assert isinstance(idx, torch.Tensor)
        ref = dict(inp, initial_state=state.clone(), out=torch.empty_like(out))
        reference_kda_packed_decode(
            ref["mixed_qkv"], ref["a"], ref["b"], ref["A_log"], ref["dt_bias"], ref["scale"],
            ref["initial_state"], ref["out"], ref["ssm_state_indices"], l2norm, lower_bound,
            compute_dtype=torch.float64,
        )
        state_before = bits(state).clone()

        sync(args.device)
        t0 = time.perf_counter()
        returned = call(kernel, inp, l2norm, lower_bound)
        sync(args.device)
        res.first_ms = (time.perf_counter() - t0) * 1e3

        problems = []
        if returned[0] is not out or returned[1] is not state:
            problems.append("returned objects are not the caller's")
        live = idx[idx >= 0].long()
        pad = idx < 0
        if not bool((out[pad] == 0).all()):
            problems.append("padding rows not zero")
        untouched = torch.ones(state.shape[0], dtype=torch.bool, device=state.device)
        untouched[live] = False
        if not torch.equal(bits(state)[untouched], state_before[untouched]):
            problems.append("untouched slots changed")
        ref_state, ref_out = ref["initial_state"], ref["out"]
        assert isinstance(ref_state, torch.Tensor) and isinstance(ref_out, torch.Tensor)
        res.out_err = max_err(out, ref_out)
        res.state_err = max_err(state[live], ref_state[live])
        for label, x, r in (("out", out, ref_out), ("state", state[live], ref_state[live])):
            atol, rtol = TOL[x.dtype]
            if not torch.allclose(x.double(), r.double(), atol=atol, rtol=rtol):
                problems.append(f"{label} mismatch")

        res.launch_us = time_launches(lambda: call(kernel, inp, l2norm, lower_bound),
                                      args.device, args.iters, args.warmup)
        res.ok = not problems
        res.note = "; ".join(problems)
    except Exception as e:
        res.note = f"{type(e).__name__}: {e}".splitlines()[0][:120]
        if args.verbose:
            traceback.print_exc()
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="fp32 state and l2norm on only, small grids")
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--verbose", action="store_true", help="print tracebacks")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available; use --device cpu for a harness dry run.", file=sys.stderr)
        return 2

    grids = [g for g in GRIDS if g.B <= 8] if args.quick else GRIDS
    dtypes = [torch.float32] if args.quick else [torch.float32, torch.bfloat16, torch.float16]
    l2s = [True] if args.quick else [False, True]
    bounds: list[float | None] = [None, -5.0]
    names = [n.strip() for n in args.kernels.split(",") if n.strip()]

    header = (f"{'kernel':8} {'grid':26} {'state':5} {'l2':2} {'lb':5} {'out_err':>9} "
              f"{'state_err':>9} {'first_ms':>9} {'launch_us':>9}  result")
    print(header)
    print("-" * len(header))
    results = []
    for seed, (name, grid, dtype, l2, lb) in enumerate(
        itertools.product(names, grids, dtypes, l2s, bounds)
    ):
        r = run_case(name, grid, dtype, l2, lb, args, seed)
        results.append(r)
        print(f"{r.kernel:8} {r.grid:26} {r.state:5} {int(r.l2norm):2} {r.lower_bound!s:5} "
              f"{r.out_err:9.2e} {r.state_err:9.2e} {r.first_ms:9.1f} {r.launch_us:9.1f}  "
              f"{'PASS' if r.ok else 'FAIL'} {r.note}", flush=True)
    failed = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)}/{len(results)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
