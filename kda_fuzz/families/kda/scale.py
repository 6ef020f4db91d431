"""The GPU-scale stratum of the packed KDA decode contract (spec section 5).

Layouts that cross the limits where real GPU kernels break, each drawn on both sides:

* ``bhv``: B * HV just below and above 65,535 * k (a grid axis y/z of 65,535 blocks);
* ``wide-batch``: B around and past 65,536 with one or two small heads (B on a y/z axis);
* ``big-pool``: a state pool of more than 2^31 elements (a few wide slots or many narrow
  ones) whose live indices sit at its top (int32 offsets wrap);
* ``qkv-stride``: ``mixed_qkv`` whose row stride times B passes 2^31 elements;
* ``tails``: B, V and K that are not multiples of the kernels' blocks.

Every case names slot ``num_slots - 1``. Big buffers are filled cheaply (NaN guards, one
value per slot), only the cells live rows read get random values. Sizes are kept within
a memory budget in bytes (``case_cost``: the inputs, the caller's copy, the ``before``
copy and the judge's scratch, which is chunked and sampled so it stays near 1.5 GiB).
``judge_sampled`` judges these cases without a float64 reference of the whole pool.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import reject
from hypothesis import strategies as st

from kda_fuzz.engine.case import Case, TensorArg
from kda_fuzz.engine.contract import Unjudgeable
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families.kda.layouts import KdaLayout, build, strided_arg
from kda_fuzz.families.packed import judge as packed_judge
from kda_fuzz.families.packed.summary import judged

GRID_YZ = 65535  # blocks on CUDA grid axes y and z
INT32 = 2**31  # elements past which int32 offsets wrap
KINDS = ("bhv", "wide-batch", "big-pool", "qkv-stride", "tails")
CHUNK = 1 << 26  # elements compared per step by the judge's bit-exact checks
COPIES = 3  # the inputs (the judge's `before` too), the caller's copy, and one spare
SAMPLE_ROWS = 2048  # live rows whose math is checked when the full reference is too big
FULL_LIMIT = 1 << 22  # live state elements (rows * HV * V * K) judged in full (or sampled)
# The judge's own memory: chunked bit comparisons (a few bytes per CHUNK element) and
# float64 terms of the reference (about a dozen arrays of FULL_LIMIT elements).
JUDGE_SCRATCH = CHUNK * 16 + FULL_LIMIT * 8 * 16


@dataclass(frozen=True)
class ScaleLayout:
    """A scale case before tensors exist: its sub-stratum, the layout, which side of the
    limit it lies on, and the fraction of rows that are padding."""

    kind: str
    layout: KdaLayout
    above: bool = True
    pad_rate: float = 0.0


def _base_bytes(arg: TensorArg) -> int:
    return arg.base.numel() * arg.base.element_size()


def case_bytes(s: ScaleLayout) -> int:
    """Bytes of one copy of every base buffer of the case."""
    return sum(_base_bytes(a) for a in build_scale(s, "triton", "meta").tensors.values())


def case_cost(s: ScaleLayout) -> int:
    """Device bytes a scale case needs while it is run and judged: ``COPIES`` copies of
    its bases and the judge's scratch (no more than the case's own bytes when small)."""
    one = case_bytes(s)
    return COPIES * one + min(one, JUDGE_SCRATCH)


def _layout(**kw: Any) -> KdaLayout:
    f32 = torch.float32
    base = dict(H=1, qkv_dtype=torch.bfloat16, ab_dtype=f32, param_dtype=f32,
                out_dtype=torch.bfloat16, state_dtype=f32, use_qk_l2norm_in_kernel=True)
    return KdaLayout(**{**base, **kw})


def _dims(variant: str, small: bool = True) -> list[int]:
    if variant == "helion":
        return [2, 4, 8, 16] if small else [16, 32, 64, 128]
    return [2, 3, 4, 5, 8, 16] if small else [17, 33, 64, 100, 128, 129]


def cheapest(kind: str) -> ScaleLayout:
    """The least memory-hungry case of a sub-stratum that still crosses its limit."""
    if kind == "bhv":
        return ScaleLayout(kind, _layout(B=GRID_YZ // 64 + 1, HV=64, K=2, V=2))
    if kind == "wide-batch":
        return ScaleLayout(kind, _layout(B=GRID_YZ + 1, HV=1, K=2, V=2))
    if kind == "big-pool":
        slot = 16 * 16
        return ScaleLayout(kind, _layout(B=2, HV=1, K=16, V=16, state_dtype=torch.bfloat16,
                                         spare_slots=INT32 // slot + 2 - 2))
    if kind == "qkv-stride":
        width = 2 * 2 + 2
        return ScaleLayout(kind, _layout(B=2, HV=1, K=2, V=2, qkv_row_pad=INT32 - width))
    return ScaleLayout(kind, _layout(B=4097, HV=1, K=2, V=2))


FOCUS_FIELDS = ("H", "HV", "K", "V", "qkv_dtype", "out_dtype", "state_dtype", "idx_dtype",
                "use_qk_l2norm_in_kernel", "lower_bound")


def _choices(focus: Mapping[str, Any] | None, variant: str = "triton"
             ) -> dict[str, list[Any]]:
    """The pinned layout fields a scale case keeps (field -> values), from a layout's pins
    (aliases and dtype names resolved; a strategy whose values cannot be listed is left
    free)."""
    if not focus:
        return {}
    from kda_fuzz.families.packed.pins import normalize, pin_values

    out: dict[str, list[Any]] = {}
    for name, strategy in normalize(focus, variant).items():
        values = pin_values(strategy) if name in FOCUS_FIELDS else None
        if values:
            out[name] = values
    return out


def _kind_layout(kind: str, pick: Callable[[str, Any], Any], variant: str, above: bool,
                 common: dict[str, Any]) -> KdaLayout:
    """The layout of a sub-stratum's case; ``pick(field, choices)`` chooses each value
    (drawn, or a pinned one)."""
    small = _dims(variant)
    if kind == "bhv":
        HV = pick("HV", (2, 4, 8, 16, 32, 64))
        k = pick("k", (1, 1, 2, 3))
        below = GRID_YZ * k // HV
        B = below + 1 + pick("extra", (0, 1, 2)) if above else below
        return _layout(B=B, HV=HV, H=pick("H", (1, max(1, HV // 2))), K=pick("K", small),
                       V=pick("V", small), spare_slots=pick("spare", (0, 1, 2, 3)), **common)
    if kind == "wide-batch":
        B = pick("B", (65537, 65536, 70000, 98305, 131073) if above else (65535, 65534))
        HV = pick("HV", (1, 1, 2))
        return _layout(B=B, HV=HV, H=pick("H", (1,)), K=pick("K", small), V=pick("V", small),
                       spare_slots=pick("spare", (0, 1, 2, 3)), **common)
    if kind == "big-pool":
        if pick("wide", (True, False)):  # a few wide slots
            HV, K, V = pick("HV", (16, 32, 64)), pick("K", (128,)), pick("V", (128,))
        else:  # many narrow ones
            HV, K, V = pick("HV", (1, 2)), pick("K", (16,)), pick("V", (16, 8))
        state = pick("state_dtype", (torch.bfloat16, torch.bfloat16, torch.float16,
                                     torch.float32))
        slot = HV * V * K + common["slot_pad"]
        n = INT32 // slot + 2 if above else INT32 // slot - 1
        B = min(pick("B", tuple(range(1, 17))), n)
        return _layout(B=B, HV=HV, H=pick("H", (1,)), K=K, V=V, spare_slots=n - B,
                       state_dtype=state, **common)
    if kind == "qkv-stride":
        B = pick("B", (2, 3, 5, 9))
        K, V = pick("K", small), pick("V", small)
        HV, H = pick("HV", (1, 2)), pick("H", (1,))
        width = 2 * H * K + HV * V
        stride = -(-INT32 // (B - 1)) + pick("extra", (0, 1, 2, 3)) if above \
            else (INT32 - width) // (B - 1) - 1
        return _layout(B=B, HV=HV, H=H, K=K, V=V, qkv_row_pad=stride - width, **common)
    K = pick("K", _dims(variant, small=False))  # tails
    V = pick("V", _dims(variant, small=False))
    HV = pick("HV", (1, 2, 4))
    cap = max(1, (1 << 24) // (HV * V * K))
    B = min(cap, pick("B", (4097, 4099, 8191, 16385, 32769, 65537)))
    return _layout(B=B, HV=HV, H=pick("H", (1, HV)), K=K, V=V,
                   spare_slots=pick("spare", (0, 1, 2, 3, 4, 5)), **common)


def _pinned(pick: Callable[[str, Any], Any], at: dict[str, list[Any]]
            ) -> Callable[[str, Any], Any]:
    """``pick`` that takes a pinned field's value from ``at`` (a head count the pins do not
    fix stays a divisor of HV: H from the pinned H, HV a multiple of it)."""
    def chosen(name: str, options: Any) -> Any:
        if name in at:
            return pick(name, tuple(at[name]))
        if name == "HV" and "H" in at:
            h = at["H"][0]
            options = tuple(o for o in options if o % h == 0) or (h,)
        return pick(name, options)
    return chosen


def _fixed(name: str, options: Any) -> Any:
    return options[0]


def _heads_fit(p: KdaLayout) -> bool:
    return p.H >= 1 and p.HV % p.H == 0


def fitting_kinds(budget_bytes: int, variant: str = "triton",
                  focus: Mapping[str, Any] | None = None) -> list[str]:
    """Sub-strata whose cheapest case fits ``budget_bytes`` (at the ``focus`` pins' heads,
    when given: the first pinned value of each field)."""
    at = _choices(focus, variant)
    if not at:
        return [k for k in KINDS if case_cost(cheapest(k)) <= budget_bytes]
    out = []
    for kind in KINDS:
        lay = _at_heads(_kind_layout(kind, _pinned(_fixed, at), variant, True,
                                     _common_fixed()), at)
        if _heads_fit(lay) and case_cost(ScaleLayout(kind, lay)) <= budget_bytes:
            out.append(kind)
    return out


def _common_fixed() -> dict[str, Any]:
    return dict(seed=0, qkv_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                idx_dtype=torch.int32, slot_pad=0, guard=0)


def _at_heads(p: KdaLayout, at: dict[str, list[Any]]) -> KdaLayout:
    """``p`` with the pinned dtypes and flags the sub-stratum's choice left out."""
    changes = {n: v[0] for n, v in at.items()
               if n in FOCUS_FIELDS and n not in ("H", "HV", "K", "V")
               and getattr(p, n) not in v}
    return replace(p, **changes) if changes else p


@st.composite
def scale_layouts(draw: Callable, variant: str, budget_bytes: int,
                  focus: Mapping[str, Any] | None = None) -> ScaleLayout:
    """A ``ScaleLayout`` of a sub-stratum that fits ``budget_bytes`` (falling back to the
    sub-stratum's cheapest case when the drawn one does not). ``focus``: pins of a
    deployment's layout (``--layout``): the case keeps its heads, head dims and dtypes,
    and B, slots and strides go to the limits at those heads (only the sub-strata whose
    cheapest case there fits)."""
    at = _choices(focus, variant)
    kinds = fitting_kinds(budget_bytes, variant, focus)
    if not kinds:
        raise ValueError(f"no scale case fits a budget of {budget_bytes} bytes")
    kind = draw(st.sampled_from(kinds))
    above = draw(st.sampled_from((True, True, True, False)))
    seed = draw(st.integers(0, 2**32 - 1))
    pad_rate = draw(st.sampled_from((0.0, 0.0, 0.1)))
    dt = draw(st.sampled_from((torch.bfloat16, torch.float32)))
    common = dict(seed=seed, qkv_dtype=dt, out_dtype=dt,
                  idx_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
                  slot_pad=draw(st.sampled_from((0, 0, 8))),
                  guard=draw(st.sampled_from((0, 4))))

    def drawn(name: str, options: Any) -> Any:
        return draw(st.sampled_from(tuple(options)))

    pick = _pinned(drawn, at) if at else drawn
    p = _at_heads(_kind_layout(kind, pick, variant, above, common), at)
    s = ScaleLayout(kind, p, above, pad_rate if kind in ("bhv", "wide-batch", "tails") else 0.0)
    if case_cost(s) > budget_bytes and p.state_dtype == torch.float32 and kind == "big-pool" \
            and "state_dtype" not in at:
        s = replace(s, layout=replace(p, state_dtype=torch.bfloat16))
    if case_cost(s) > budget_bytes or not _heads_fit(s.layout):
        s = (ScaleLayout(kind, _at_heads(_kind_layout(kind, _pinned(_fixed, at), variant, True,
                                                      {**common, "slot_pad": 0}), at))
             if at else cheapest(kind))
    return s


def _top_indices(s: ScaleLayout, gen: torch.Generator) -> torch.Tensor:
    """Distinct slots from the top of the pool (``num_slots - 1`` included), shuffled; a
    ``pad_rate`` share of rows padded with -1 (never the first, the last, or the row that
    names the top slot)."""
    p, dev = s.layout, gen.device
    order = torch.randperm(p.B, generator=gen, device=dev)
    idx = (p.num_slots - 1 - order).to(torch.int64)
    if s.pad_rate:
        pad = torch.rand(p.B, generator=gen, device=dev) < s.pad_rate
        pad[0] = pad[-1] = False
        pad &= order != 0
        idx = torch.where(pad, torch.full_like(idx, -1), idx)
    return idx


def build_scale(s: ScaleLayout, variant: str, device: str | torch.device = "cpu") -> Case:
    """The ``Case`` of a scale layout: ``build`` for the rows, then a pool of
    ``num_slots`` slots (one value per slot, NaN padding and guards) whose live slots at
    the top hold the rows' random states. ``meta``: shapes only, nothing allocated."""
    p, dev = s.layout, torch.device(device)
    notes = {"layout": repr(p), "rows": p.B, "tail_rows": 0, "scale": s.kind,
             "above": s.above}
    slot = p.HV * p.V * p.K + p.slot_pad
    pool_shape, pool_stride = (p.num_slots, p.HV, p.V, p.K), (slot, p.V * p.K, p.K, 1)
    if dev.type == "meta":
        width, g = p.width, p.guard
        meta = {
            "mixed_qkv": ((p.B, width), p.qkv_dtype, (width + p.qkv_row_pad, 1)),
            "a": ((p.B, p.HV * p.K), p.ab_dtype, (p.HV * p.K + p.a_row_pad, 1)),
            "b": ((p.B, p.HV), p.ab_dtype, (p.HV + p.b_row_pad, 1)),
            "A_log": ((p.HV,), p.param_dtype, None),
            "dt_bias": ((p.HV * p.K,), p.param_dtype, None),
            "initial_state": (pool_shape, p.state_dtype, pool_stride),
            "out": ((p.B, 1, p.HV, p.V), p.out_dtype, None),
            "ssm_state_indices": ((p.B,), p.idx_dtype, None),
        }
        tensors = {n: strided_arg(shp, dt, None, stride, g, "meta")
                   for n, (shp, dt, stride) in meta.items()}
        scalars = {"scale": float(p.K**-0.5), "use_qk_l2norm_in_kernel":
                   p.use_qk_l2norm_in_kernel, "lower_bound": p.lower_bound}
        return _with_sizes(Case("kda", variant, tensors, scalars, ("valid",), notes))
    rows = build(replace(p, spare_slots=0), variant, dev)  # a pool of B slots, random
    gen = torch.Generator(device=dev).manual_seed(p.seed ^ 0x5CA1E)
    idx = _top_indices(s, gen)
    pool = strided_arg(pool_shape, p.state_dtype, None, pool_stride, p.guard, dev)
    view = pool.view()
    per_slot = (torch.arange(p.num_slots, device=dev) % 61).to(torch.float32) / 61 - 0.5
    view.copy_(per_slot.view(-1, 1, 1, 1).expand(pool_shape))
    top = p.num_slots - p.B
    view[top:] = rows.tensors["initial_state"].view()
    rows.tensors["initial_state"] = pool
    rows.tensors["ssm_state_indices"] = strided_arg((p.B,), p.idx_dtype, idx, guard=p.guard,
                                                    device=dev)
    rows.notes = {**notes, "live_rows": int((idx >= 0).sum())}  # (a sync: cases of a second)
    return _with_sizes(rows)


def _with_sizes(case: Case) -> Case:
    """``notes["scale_sizes"]``: what the campaign's summary reports the largest of."""
    qkv, state = case.tensors["mixed_qkv"], case.tensors["initial_state"]
    B = qkv.shape[0]
    case.notes["scale_sizes"] = {"B": B, "B*HV": B * state.shape[1],
                                 "state pool elements": state.footprint(),
                                 "mixed_qkv reach (elements)": qkv.footprint()}
    return case


def scale_cases(variant: str, device: str = "cpu", budget_bytes: int = 1 << 30, *,
                pins: Mapping[str, Any] | None = None,
                focus: Mapping[str, Any] | None = None) -> st.SearchStrategy[Case] | None:
    """Scale cases of a variant within ``budget_bytes`` (None when none fits), within
    ``pins`` (what the targets do not support is left out: :func:`honour`), at the heads
    of ``focus`` (a pinned layout's pins: :func:`scale_layouts`). On cuda,
    a case is checked against the device's free memory when it is built and replaced by
    its sub-stratum's cheapest case (or the cheapest of all) when it would not fit, or
    when building it runs out of this job's share of memory (then no case at all)."""
    if not fitting_kinds(budget_bytes, variant, focus):
        return None
    return scale_layouts(variant, budget_bytes, focus).map(
        lambda s: build_within_memory(honour(s, pins), variant, device))


def honour(s: ScaleLayout, pins: Mapping[str, Any] | None) -> ScaleLayout:
    """``s`` within ``pins`` (field -> allowed values, as ``packed.pins.restrictions``
    gives them): a field whose value is left out takes the first allowed one; no padded
    strides without ``strides``, no padding rows without ``some``."""
    if not pins:
        return s
    p, pad_rate, changes = s.layout, s.pad_rate, {}
    for name, allowed in pins.items():
        allowed = list(allowed) if isinstance(allowed, list | tuple) else [allowed]
        if name == "strides":
            if True not in allowed:
                changes.update(dict.fromkeys(("qkv_row_pad", "a_row_pad", "b_row_pad",
                                              "slot_pad", "guard"), 0))
        elif name == "padding":
            if "some" not in allowed:
                pad_rate = 0.0
        elif hasattr(p, name) and getattr(p, name) not in allowed:
            changes[name] = allowed[0]
    return replace(s, layout=replace(p, **changes), pad_rate=pad_rate)


def build_within_memory(s: ScaleLayout, variant: str, device: str) -> Case:
    """Build ``s``, or a cheaper case when it does not fit (see ``scale_cases``); reject
    the draw when nothing does."""
    if torch.device(device).type == "cuda":
        free = torch.cuda.mem_get_info(torch.device(device))[0]
        if case_cost(s) > 0.9 * free:
            s = cheapest(s.kind)
            if case_cost(s) > 0.9 * free:
                s = cheapest("wide-batch")
    for attempt in (s, cheapest(s.kind), cheapest("wide-batch")):
        try:
            case = build_scale(attempt, variant, device)
        except torch.OutOfMemoryError:  # this job's share is taken (by the last case?)
            gc.collect()
            torch.cuda.empty_cache()
            continue
        case.notes["bytes"] = case_bytes(attempt)
        return case
    reject()  # nothing fits now: Hypothesis draws another example
    raise AssertionError("unreachable")


def device_budget(device: str, jobs: int = 1, share: float = 0.8) -> int:
    """Default scale budget: ``share`` of the device's free memory, split between the
    ``jobs`` sharing it (0 off cuda)."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return 0
    free = torch.cuda.mem_get_info(torch.device(device))[0]
    return int(free * share / max(1, jobs))


# ------------------------------------------------------------------------- judging


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_INT_OF_SIZE[t.element_size()])


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bit-identical 1-D bases, compared ``CHUNK`` elements at a time (a device bool)."""
    a, b = _bits(a), _bits(b)
    flags = [(a[i:i + CHUNK] == b[i:i + CHUNK]).all() for i in range(0, a.numel(), CHUNK)]
    return torch.stack(flags).all() if flags else torch.ones((), dtype=torch.bool,
                                                              device=a.device)


def _pool_changes(arg: TensorArg, before: torch.Tensor, after: torch.Tensor,
                  live: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Device booleans, each true where the pool is intact: guard cells, the padding
    cells of every slot (``slot_pad``) and every cell of slots that no live row names.
    Slot by slot in chunks, so no pool-sized mask exists."""
    n_slots, HV, V, K = arg.shape
    S, o, n = arg.stride[0], arg.offset, HV * V * K
    assert arg.stride[1:] == (V * K, K, 1), "scale judge expects slot-major pools"
    a, b = _bits(before), _bits(after)
    end = o + (n_slots - 1) * S + n if n_slots else o
    out = [("guard", (a[:o] == b[:o]).all() & (a[end:] == b[end:]).all())]
    step = max(1, CHUNK // max(S, 1))
    for s0 in range(0, n_slots, step):
        cnt = min(step, n_slots - s0)
        cells = (a.as_strided((cnt, n), (S, 1), o + s0 * S)
                 != b.as_strided((cnt, n), (S, 1), o + s0 * S)).any(1)
        out.append(("slots", ~(cells & ~live[s0:s0 + cnt]).any()))
        padded = cnt - (s0 + cnt == n_slots)  # the last slot has no padding cells
        if S > n and padded > 0:
            out.append(("slot-pad", (a.as_strided((padded, S - n), (S, 1), o + s0 * S + n)
                                     == b.as_strided((padded, S - n), (S, 1),
                                                     o + s0 * S + n)).all()))
    return out


def sample_rows(live_rows: torch.Tensor, slots: torch.Tensor, num_slots: int, HV: int,
                limit: int = SAMPLE_ROWS, seed: int = 0) -> torch.Tensor:
    """At most ``limit`` of ``live_rows`` (sorted, on CPU): the first and last, the row
    naming slot ``num_slots - 1``, rows around each multiple of 65,535 and 65,536 in B and
    in B * HV order, and the rest drawn at random with ``seed``."""
    rows = live_rows.cpu()
    if rows.numel() <= limit:
        return rows
    last = int(rows[-1])
    must = {int(rows[0]), last}
    top = (slots.cpu() == num_slots - 1).nonzero()
    if top.numel():
        must.add(int(rows[int(top[0, 0])]))
    for unit in (GRID_YZ, GRID_YZ + 1):
        for m in range(unit, last * max(HV, 1) + HV + 1, unit):
            for flat in (m - 1, m, m + 1):
                must.update((flat // HV, flat))  # as a row-head (B * HV) and as a row
    keep = torch.isin(rows, torch.tensor(sorted(must), dtype=rows.dtype))
    chosen = rows[keep][: limit // 2]
    rest = rows[~keep]
    gen = torch.Generator().manual_seed(seed)
    extra = rest[torch.randperm(rest.numel(), generator=gen)[: limit - chosen.numel()]]
    return torch.cat([chosen, extra]).sort().values


def judge_sampled(case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
                  after: dict[str, torch.Tensor], result: Any,
                  budget: dict[str, float] | None = None, *, full_limit: int = FULL_LIMIT,
                  limit: int = SAMPLE_ROWS, facts: dict[str, Any] | None = None
                  ) -> Verdict | None:
    """The contract's judge for cases too big for a float64 reference of everything.

    Bit-exact on everything, on the device and chunked: read-only inputs, ``out``'s guard
    cells, padding rows exactly 0, the pool's guards, slot padding and every slot that
    no live row names. The math (float64 reference and bounds of
    ``packed_judge.reference64``) on all live rows when rows * HV * V * K <=
    ``full_limit``, else on ``sample_rows`` (at most ``limit`` rows and about
    ``full_limit`` state elements, at least 4 rows; every head of each row). Live slots
    outside the sample are not compared with the reference. ``facts`` (a dict) is told
    which: ``judged`` in words, ``judged_mode`` ``full`` or ``sampled``."""
    out, state = kwargs["out"], kwargs["initial_state"]
    if not (isinstance(result, tuple | list) and len(result) == 2
            and result[0] is out and result[1] is state):
        return Verdict("mismatch", "returned-objects", "must return the caller's own "
                       f"(out, initial_state); got {type(result).__name__}")
    HV, V, K = state.shape[-3:]
    n_slots = state.shape[0]
    idx_before = case.tensors["ssm_state_indices"].view(before["ssm_state_indices"])
    idx = idx_before.to(torch.long)
    live_rows = (idx >= 0).nonzero().squeeze(1)
    live_slots = idx[live_rows]
    R = live_rows.numel()
    full = R * HV * V * K <= full_limit
    per_row = max(1, HV * V * K)  # the sample is bounded in state elements too
    pick = live_rows.cpu() if full else sample_rows(
        live_rows, live_slots, n_slots, HV, min(limit, max(4, full_limit // per_row)))
    judged = (f"full: {R} live rows x {HV} heads" if full else
              f"sampled: {pick.numel()} of {R} live rows x {HV} heads")
    if facts is not None:
        facts.update(judged=judged, judged_mode="full" if full else "sampled")

    flags: list[tuple[str, torch.Tensor]] = [
        (f"mutated-{n}", _same(before[n], after[n])) for n in packed_judge.READ_ONLY]
    guard = torch.ones_like(after["out"], dtype=torch.bool)
    case.tensors["out"].view(guard).fill_(False)
    flags.append(("out-guard-written", ((_bits(after["out"]) == _bits(before["out"]))
                                        | ~guard).all()))
    pad = idx < 0
    flags.append(("padding-row-not-zero", ((out == 0).flatten(1).all(1) | ~pad).all()))
    live = torch.zeros(n_slots, dtype=torch.bool, device=state.device)
    live[live_slots] = True
    flags += [(f"untouched-state-{what}", ok) for what, ok in
              _pool_changes(case.tensors["initial_state"], before["initial_state"],
                            after["initial_state"], live)]

    rows = pick.to(idx.device)
    sub = {n: case.tensors[n].view(before[n]) for n in case.tensors}
    for n in ("mixed_qkv", "a", "b", "ssm_state_indices"):
        sub[n] = sub[n][rows]
    sub.update(case.scalars)
    ref = packed_judge.reference64(sub)
    slots = ref["slots"]
    fits = (packed_judge.fits(ref["out"], out.dtype)
            & packed_judge.fits(ref["state"], state.dtype))
    ratios: list[torch.Tensor] = []
    flags.append(("out-value", packed_judge.within(out[rows, 0], ref["out"], ref["out_bound"],
                                                   ratios)))
    flags.append(("initial_state-value", packed_judge.within(state[slots], ref["state"],
                                                             ref["state_bound"], ratios)))
    names = [n for n, _ in flags]
    values = torch.cat([torch.stack([f for _, f in flags] + [fits]).to(torch.float64),
                        torch.stack(ratios)]).tolist()  # the one device sync
    if budget is not None and rows.numel():
        budget[f"out/{packed_judge.short_dtype(out.dtype)}"] = values[-2]
        budget[f"state/{packed_judge.short_dtype(state.dtype)}"] = values[-1]
    for name, passed in zip(names, values):  # the first broken rule, in the judge's order
        if passed == 1.0:
            continue
        if name.startswith("mutated-"):
            return Verdict("mismatch", name, f"read-only input `{name[8:]}` was modified")
        if name == "out-guard-written":
            return Verdict("mismatch", name, "wrote outside `out`'s elements")
        if name == "padding-row-not-zero":
            row = int((pad & ~(out == 0).flatten(1).all(1)).nonzero()[0, 0])
            return Verdict("mismatch", name, f"padding row {row} (index {int(idx[row])}) of "
                           f"`out` is not all zeros: {out[row].flatten()[:8].tolist()}",
                           output="out", where=[row])
        if name.startswith("untouched-state-"):
            return _untouched_verdict(case, before["initial_state"], after["initial_state"],
                                      live, name[len("untouched-state-"):])
        if values[len(names)] != 1.0:
            raise Unjudgeable("float64 result exceeds half the range of the stored dtype")
        got, r, bound = ((out[rows, 0], ref["out"], ref["out_bound"]) if name == "out-value"
                         else (state[slots], ref["state"], ref["state_bound"]))
        v = packed_judge.compare(name[: -len("-value")], got, r, bound, rows, slots)
        if v is not None:
            wrong = [n[: -len("-value")] for n, ok in zip(names, values)
                     if n.endswith("-value") and ok != 1.0]
            return replace(v, detail=f"{v.detail} ({judged}; wrong: "
                           f"{', '.join(wrong)})", wrong_outputs=wrong)
    if values[len(names)] != 1.0:
        raise Unjudgeable("float64 result exceeds half the range of the stored dtype")
    return None


def _untouched_verdict(case: Case, before: torch.Tensor, after: torch.Tensor,
                       live: torch.Tensor, what: str) -> Verdict:
    """The first changed cell of the pool base outside the live slots (found chunk by
    chunk; the failure path only)."""
    arg = case.tensors["initial_state"]
    S, o = arg.stride[0], arg.offset
    n = math.prod(arg.shape[1:])
    a, b = _bits(before), _bits(after)
    for i in range(0, a.numel(), CHUNK):
        pos = (a[i:i + CHUNK] != b[i:i + CHUNK]).nonzero().squeeze(1) + i
        if not pos.numel():
            continue
        rel = pos - o
        slot = torch.div(rel, S, rounding_mode="floor")
        inside = (rel >= 0) & (slot < arg.shape[0]) & (rel - slot * S < n)
        named = inside & live[slot.clamp(0, arg.shape[0] - 1)]
        bad = pos[~named]
        if bad.numel():
            cell = int(bad[0])
            return Verdict("mismatch", "untouched-state-written",
                           f"state pool element {cell} of the base buffer ({what}), outside "
                           "every slot named by a non-negative index, changed",
                           output="initial_state", where=[cell])
    return Verdict("mismatch", "untouched-state-written",
                   f"state pool cells outside the live slots changed ({what})",
                   output="initial_state")


def report_notes(report: Any) -> list[str]:
    """The summary's line on the scale stratum: how its cases were judged, the largest
    sizes reached, its cost."""
    how = judged(report)
    if not how:
        return []
    return [f"scale stratum: {how.get('full', 0)} case(s) judged on every live row, "
            f"{how.get('sampled', 0)} on a sample of rows (first and last, the one "
            "naming slot num_slots-1, those around 65,535/65,536 in B and B*HV order, the "
            "rest at random); every untouched cell checked bit-exactly" + _scale_figures(report)]


def _scale_figures(report: Any) -> str:
    """`; largest B ..., ... s per case (6 % of the jobs' time)` for the scale note."""
    big = report.peaks
    spent = report.stratum_seconds.get("scale", 0.0)
    n = sum(judged(report).values())
    total = sum(report.stratum_seconds.values())
    out = ""
    if big:
        out += "; largest " + ", ".join(f"{k} {v:,}" for k, v in big.items())
    if spent and n and total:
        out += (f"; {spent / n:.2f} s per scale case, {100 * spent / total:.0f} % of the jobs' "
                "time")
    return out
