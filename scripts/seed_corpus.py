"""Write the seed regressions of ``corpus/seed/`` (deterministic; rerun after format changes).

Each seed is a small, hand-specified layout for one known bug class of spec section 4
(or a contract rule), minimized against the planted-bug implementation of that class
(``tests/mutants.py``, or a local one below when the project has none) under a ``keep``
predicate that preserves what makes the class visible (K != V, non-power-of-two K and V
with NaN guard cells, wide rows...). Before a file is written the script checks that the
case fails on its mutant(s) and passes on the torch reference (triton variant); it also
replays it on the project's kernels and warns when they fail.

    python scripts/seed_corpus.py [--out corpus/seed] [--skip-kernels]

The output folder is owned by this script: its ``*.json`` files are replaced.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kda_fuzz.campaign.minimize import minimize  # noqa: E402
from kda_fuzz.corpus.store import save_case  # noqa: E402
from kda_fuzz.engine.case import Case, TensorArg  # noqa: E402
from kda_fuzz.engine.oracle import run_case  # noqa: E402
from kda_fuzz.engine.targets import default_targets  # noqa: E402
from kda_fuzz.engine.verdict import Verdict  # noqa: E402
from kda_fuzz.families import get_contract  # noqa: E402
from kda_fuzz.families.kda.layouts import KdaLayout, Values, build, strided_arg  # noqa: E402

KDA = get_contract("kda")
REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"
MINIMIZE_SECONDS = 120.0


# ------------------------------------------------------------------ case surgery


def _with_view(arg: TensorArg, values: torch.Tensor) -> TensorArg:
    new = TensorArg(arg.base.clone(), arg.shape, arg.stride, arg.offset)
    new.view().copy_(values.to(arg.dtype).reshape(arg.shape))
    return new


def _replace(case: Case, intent: str, **tensors: TensorArg) -> Case:
    t = dict(case.tensors)
    t.update(tensors)
    return Case(case.contract, case.variant, t, dict(case.scalars), (intent,), dict(case.notes))


def _set_indices(case: Case, values: list[int]) -> Case:
    arg = case.tensors["ssm_state_indices"]
    return _replace(case, case.intent[0],
                    ssm_state_indices=_with_view(arg, torch.tensor(values, dtype=torch.int64)))


def _zero_q(case: Case, row: int, H: int, K: int) -> Case:
    """Row ``row``'s query is zero, so its output is 0 whatever the state (isolates writes)."""
    arg = case.tensors["mixed_qkv"]
    vals = arg.view().clone()
    vals[row, : H * K] = 0
    return _replace(case, case.intent[0], mixed_qkv=_with_view(arg, vals))


def _layout(**kw: Any) -> KdaLayout:
    base: dict[str, Any] = dict(B=2, H=1, HV=2, K=4, V=4, spare_slots=2, values=Values(),
                                seed=2024)
    base.update(kw)
    return KdaLayout(**base)


def _valid(intent: str, **kw: Any) -> Case:
    case = build(_layout(**kw), "triton")
    return Case(case.contract, case.variant, case.tensors, case.scalars, (intent,),
                {**case.notes, "breakages": [], "semantic": False})


def _broken(case: Case, breakages: list[str], semantic: bool = False, **tensors: TensorArg
            ) -> Case:
    t = dict(case.tensors)
    t.update(tensors)
    notes = {**case.notes, "breakages": breakages, "semantic": semantic}
    return Case(case.contract, case.variant, t, dict(case.scalars), tuple(breakages), notes)


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> TensorArg:
    n = 1
    for s in shape:
        n *= s
    vals = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return strided_arg(shape, dtype, vals)


# ------------------------------------------------------------------ local mutants


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def unmasked_gate_read(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float,
                       initial_state: torch.Tensor, out: torch.Tensor,
                       ssm_state_indices: torch.Tensor, use_qk_l2norm_in_kernel: bool = False,
                       lower_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-linear-attention #1134 in torch: the gate is loaded for next_pow2(K) lanes with
    no mask. Lanes past K are masked to 0 in the state, but 0 * exp(NaN) is NaN, so a NaN
    read past the end of ``dt_bias`` poisons that head's output and state."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound)
    HV, _, K = initial_state.shape[-3:]
    BK = _next_pow2(K)
    if BK == K:
        return out, initial_state
    wide = torch.as_strided(dt_bias, (HV, BK), (K, 1), dt_bias.storage_offset())
    poisoned = ~torch.isfinite(wide[:, K:].float()).all(-1)  # [HV]
    idx = ssm_state_indices.long()
    rows = (idx >= 0).nonzero().squeeze(1)
    for hv in poisoned.nonzero().flatten().tolist():
        out[rows, 0, hv] = float("nan")
        initial_state[idx[rows], hv] = float("nan")
    return out, initial_state


def _target_name(name: str) -> str:
    local = name == "unmasked_gate_read"
    return f"scripts/seed_corpus.py:{name}" if local else f"tests.mutants:{name}"


def _mutant(name: str) -> Callable[..., Any]:
    if name == "unmasked_gate_read":
        return unmasked_gate_read
    from tests import mutants

    return mutants.MUTANTS[name]


# ------------------------------------------------------------------ the seeds


def _sizes(c: Case) -> tuple[int, ...]:
    st = c.tensors["initial_state"].shape
    return tuple(st) if len(st) == 4 else ()


def _non_pow2_guarded(c: Case) -> bool:
    s = _sizes(c)
    if not s:
        return False
    _, _, V, K = s
    pow2 = {1, 2, 4, 8, 16, 32, 64, 128, 256}
    guarded = all(t.offset >= 4 and t.base.numel() - t.footprint() >= 4
                  for t in c.tensors.values())
    return K not in pow2 and V not in pow2 and guarded


def _k_ne_v_pow2(c: Case) -> bool:
    """K != V, both powers of two (so the Helion route of the dispatcher is exercised too)."""
    s = _sizes(c)
    return bool(s) and s[2] != s[3] and all(n > 0 and n & (n - 1) == 0 for n in s[2:])


def _wide_rows(c: Case) -> bool:
    t = c.tensors["mixed_qkv"]
    return len(t.shape) == 2 and t.shape[0] >= 2 and t.stride[0] > t.shape[1]


@dataclass
class Seed:
    """One seed regression: how to build it and which mutants it must catch."""

    slug: str
    description: str
    build: Callable[[], Case]
    mutants: tuple[str, ...] = ()
    keep: Callable[[Case], bool] | None = None
    expect_what: dict[str, str] = field(default_factory=dict)
    strict: bool = False  # judged under the hardened contract (notes["strict"])


def _pad_wrap_write() -> Case:
    # Padding row last; the slot it would wrap to (-1 -> last slot) is named by no row.
    c = _valid("padding -1 wraps to the last slot", B=2, spare_slots=2)
    c = _set_indices(c, [1, -1])
    return _zero_q(c, 1, 1, 4)


def _pad_remap_live() -> Case:
    # Row 0 is live on the last slot; row 1 is padding (-1), remapped onto that live slot.
    c = _valid("padding -1 remapped onto a live slot", B=2, spare_slots=1)
    c = _set_indices(c, [2, -1])
    return _zero_q(c, 1, 1, 4)


def _pad_other_negative() -> Case:
    c = _valid("padding index -2**31 (any negative index is padding)", B=2, spare_slots=1,
               idx_dtype=torch.int32)
    return _set_indices(c, [1, -(2**31)])


def _kv_major() -> Case:
    return _valid("V-major state pool with K != V", B=2, H=1, HV=2, K=8, V=4)


def _non_pow2() -> Case:
    c = _valid("non-power-of-two K and V with NaN guard cells", B=3, H=1, HV=2, K=5, V=3,
               spare_slots=1, guard=4, qkv_row_pad=3, a_row_pad=2, b_row_pad=1, slot_pad=3)
    return _set_indices(c, [3, -1, 0])


def _wide_qkv() -> Case:
    c = _valid("mixed_qkv rows wider than the packed width", B=3, H=2, HV=4, K=4, V=4,
               qkv_row_pad=24)
    return _set_indices(c, [0, 4, 2])


def _first_check_wins() -> Case:
    c = _valid("first failing check wins: out shape (19) before the packed width (20)")
    qkv, out = c.tensors["mixed_qkv"], c.tensors["out"]
    B, W = qkv.shape
    _, _, HV, V = out.shape
    return _broken(c, ["out-shape:V", "odd-qk-width"],
                   mixed_qkv=_rand((B, W + 1), qkv.dtype, 1),
                   out=strided_arg((B, 1, HV, V + 1), out.dtype, None))


def _zero_k() -> Case:
    # K = 0 (a has no columns) but mixed_qkv still has q/k columns: upstream's check 21
    # computes q_dim % 0. Any ValueError is right; ZeroDivisionError is not.
    c = _valid("K = 0 must raise ValueError, not ZeroDivisionError")
    t = c.tensors
    B, HV, V, n = 2, 2, 4, t["initial_state"].shape[0]
    return _broken(c, ["zero-size:K"], semantic=True,
                   mixed_qkv=_rand((B, 2 * 4 + HV * V), t["mixed_qkv"].dtype, 2),
                   a=_rand((B, 0), t["a"].dtype, 3),
                   dt_bias=_rand((0,), t["dt_bias"].dtype, 4),
                   initial_state=_rand((n, HV, V, 0), t["initial_state"].dtype, 5))


def _zero_v() -> Case:
    c = _valid("V = 0 must raise ValueError (upstream lets it through)")
    t = c.tensors
    B, HV, K, n = 2, 2, 4, t["initial_state"].shape[0]
    return _broken(c, ["zero-size:V"], semantic=True,
                   mixed_qkv=_rand((B, 2 * K), t["mixed_qkv"].dtype, 6),
                   initial_state=_rand((n, HV, 0, K), t["initial_state"].dtype, 7),
                   out=strided_arg((B, 1, HV, 0), t["out"].dtype, None))


def _batch_message() -> Case:
    c = _valid("check 10's message, character for character")
    a = c.tensors["a"]
    return _broken(c, ["batch:a"], a=_rand((a.shape[0] + 1, a.shape[1]), a.dtype, 8))


SEEDS = (
    Seed("pad-wrap-write",
         "padding row (index -1) must not write the wrapped-around last state slot "
         "(flashinfer #5042)", _pad_wrap_write, ("pad_wrap",),
         expect_what={"pad_wrap": "untouched-state-written"}),
    Seed("pad-remap-live",
         "padding row (index -1) remapped onto a live slot must not clobber that row's state "
         "(sglang #36880)", _pad_remap_live, ("pad_wrap",),
         keep=lambda c: c.tensors["ssm_state_indices"].shape[0] >= 2,
         expect_what={"pad_wrap": "initial_state-value"}),
    Seed("pad-other-negative",
         "any negative index (here -2**31) is a padding row, not only -1",
         _pad_other_negative, ("only_minus_one_pads",)),
    Seed("kv-major-k-ne-v",
         "V-major state pool read as K-major; K != V so the confusion cannot hide "
         "(sgl-kernel-npu #640)", _kv_major, ("k_major_state",), keep=_k_ne_v_pow2),
    Seed("non-pow2-oob",
         "non-power-of-two K and V (triton variant) with NaN guard cells: an unmasked read "
         "past a head poisons the result (flash-linear-attention #1134)", _non_pow2,
         ("unmasked_gate_read",), keep=_non_pow2_guarded),
    Seed("wide-qkv-rows",
         "mixed_qkv row stride larger than its width (column slice of a wider projection) "
         "must be accepted and read through the row stride", _wide_qkv,
         ("ignore_row_stride", "qkv_requires_contiguous"), keep=_wide_rows),
    Seed("first-check-wins",
         "layout failing checks 19 and 20 must raise check 19's message (first check wins)",
         _first_check_wins, ("swap_19_20",)),
    Seed("zero-k-valueerror",
         "K = 0 with q/k columns present must raise ValueError, not ZeroDivisionError",
         _zero_k, ("no_harden",)),
    Seed("zero-v-rejected",
         "V = 0 must raise ValueError although upstream's checks let it through (hardened "
         "contract)", _zero_v, ("no_harden",), strict=True),
    Seed("batch-message-exact",
         "mismatched batch sizes raise check 10's message character for character",
         _batch_message, ("typo_check_10",)),
)


# ------------------------------------------------------------------ driver


def _fails(case: Case, fn: Callable[..., Any]) -> Verdict | None:
    outcome = run_case(KDA, case, fn)
    return outcome.verdict if outcome.status == "fail" else None


def make_seed(seed: Seed, out: Path, check_kernels: bool) -> tuple[Path, list[str]]:
    """Build, minimize, verify and save one seed; the path and any warnings."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    warnings: list[str] = []
    case = seed.build()
    verdict = None
    if seed.mutants:
        first = _mutant(seed.mutants[0])
        verdict = _fails(case, first)
        if verdict is None:
            raise SystemExit(f"{seed.slug}: the seed does not fail on {seed.mutants[0]}")
        case = minimize(KDA, case, first, verdict, seconds=MINIMIZE_SECONDS, keep=seed.keep)
        verdict = _fails(case, first)
        assert verdict is not None, seed.slug
    for name in seed.mutants:
        got = _fails(case, _mutant(name))
        if got is None:
            raise SystemExit(f"{seed.slug}: the minimized case does not fail on {name}")
        want = seed.expect_what.get(name)
        if want is not None and got.what != want:
            raise SystemExit(f"{seed.slug}: {name} fails with {got.what}, expected {want}")
    ref = run_case(KDA, case, reference_kda_packed_decode)
    if ref.status == "fail":
        raise SystemExit(f"{seed.slug}: fails on the reference: {ref.verdict}")
    if check_kernels:
        for target in default_targets(KDA, case.variant):
            got = run_case(KDA, case, target.fn)
            if got.status == "fail":
                assert got.verdict is not None
                warnings.append(f"{seed.slug}: project kernel {target.name} fails: "
                                f"{got.verdict.summary()}")
    case.notes["seed"] = seed.slug
    case.notes["mutants"] = list(seed.mutants)
    if seed.strict:
        case.notes["strict"] = True
    origin = {"tool": "scripts/seed_corpus.py", "seed": seed.slug,
              "target": _target_name(seed.mutants[0]) if seed.mutants else None,
              "date": None}
    path = save_case(case, verdict, out, origin=origin, description=seed.description)
    return path, warnings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "corpus" / "seed"))
    parser.add_argument("--skip-kernels", action="store_true",
                        help="do not replay the seeds on the project's kernels")
    args = parser.parse_args(argv)
    from kda_fuzz.execution.cpu import configure_cpu

    configure_cpu()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    warnings: list[str] = []
    for seed in SEEDS:
        path, warn = make_seed(seed, out, not args.skip_kernels)
        warnings += warn
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}  {seed.slug}")
    for w in warnings:
        print(f"WARNING {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
