"""Hypothesis strategies for packed KDA decode layouts: valid ones and broken ones.

A valid layout is drawn as a small ``KdaLayout`` value (sizes, dtypes, strides, value
profiles, a seed) and built into a ``Case`` whose tensors are strided views of base
buffers with guard cells (NaN for floats) around them, so out-of-bounds reads poison the
result and out-of-bounds writes are seen. A broken layout is a valid one with one or
more named breakages applied; each breakage aims at one check, or at a semantic rule the
checks may not see (those that the contract accepts are reported as validation gaps).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import reject
from hypothesis import strategies as st

from kda_fuzz.engine.case import Case, TensorArg, guarded_arg
from kda_fuzz.families.packed.pins import normalize as pin_strategies

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)
EDGE_DIMS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 100, 127,
             128, 129, 160, 192, 255, 256)
EDGE_B = (1, 2, 3, 31, 32, 33, 64, 65, 127, 128, 255, 256)
DEFAULT_BUDGET = 1 << 18  # B * HV * V * K elements of state touched per valid case


@dataclass(frozen=True)
class Values:
    """How the numbers of one case are drawn (all from ``KdaLayout.seed``)."""

    qkv_kind: str = "normal"
    qkv_scale: float = 1.0
    gate_center: float = 0.0
    gate_spread: float = 1.0
    dt_scale: float = 0.5
    A_log_lo: float = -1.0
    A_log_width: float = 1.0
    b_scale: float = 1.0
    state_kind: str = "normal"
    state_scale: float = 1.0


# Gate regimes: x = a + dt_bias against A = exp(A_log). Large x only matters next to a
# small A (else exp(g) is 0 either way), so the two are drawn together.
GATE_REGIMES = {
    "typical": dict(gate_center=0.0, gate_spread=1.0, A_log_lo=-1.0, A_log_width=1.0),
    "threshold": dict(gate_center=20.0, gate_spread=0.5, A_log_lo=-6.0, A_log_width=2.0),
    "large-x-small-A": dict(gate_center=90.0, gate_spread=10.0, A_log_lo=-12.0,
                            A_log_width=6.0),
    "wide": dict(gate_center=10.0, gate_spread=30.0, A_log_lo=-9.0, A_log_width=9.0),
    "negative-x": dict(gate_center=-30.0, gate_spread=5.0, A_log_lo=0.0, A_log_width=3.0),
    "exact-20": dict(gate_center=20.0, gate_spread=0.0, A_log_lo=-3.0, A_log_width=0.0),
}


@dataclass(frozen=True)
class KdaLayout:
    """Everything that defines one packed decode call, before tensors exist."""

    B: int
    H: int
    HV: int
    K: int
    V: int
    spare_slots: int = 0
    qkv_dtype: torch.dtype = torch.float32
    ab_dtype: torch.dtype = torch.float32
    param_dtype: torch.dtype = torch.float32
    out_dtype: torch.dtype = torch.float32
    state_dtype: torch.dtype = torch.float32
    idx_dtype: torch.dtype = torch.int32
    padding: str = "none"  # none | some | all | first | last
    tail_padding: int = 0  # trailing padding rows (batch-size bucketing), included in B
    pad_value: str = "-1"  # -1 | any | min
    qkv_row_pad: int = 0
    a_row_pad: int = 0
    b_row_pad: int = 0
    slot_pad: int = 0
    guard: int = 0
    use_qk_l2norm_in_kernel: bool = False
    lower_bound: float | None = None
    scale: float | None = None  # None: K ** -0.5
    values: Values = Values()
    seed: int = 0

    @property
    def num_slots(self) -> int:
        return self.B + self.spare_slots

    @property
    def width(self) -> int:
        return 2 * self.H * self.K + self.HV * self.V


# ------------------------------------------------------------------------ building


def _fill(gen: torch.Generator, n: int, kind: str, scale: float) -> torch.Tensor:
    """``n`` float32 values of a profile kind (every stored dtype is at most float32 wide,
    so nothing is lost; one kernel for the plain kinds)."""
    dev = gen.device
    if kind == "zeros" or n == 0:
        return torch.zeros(n, dtype=torch.float32, device=dev)
    std = scale * (1e-6 if kind == "tiny" else 1.0)
    x = torch.empty(n, dtype=torch.float32, device=dev).normal_(0.0, std, generator=gen)
    if kind == "mixed":  # magnitudes spread over 1e-6..1e2, with exact zeros
        exp10 = torch.empty(n, dtype=torch.float32, device=dev).uniform_(-6.0, 2.0,
                                                                         generator=gen)
        keep = torch.rand(n, generator=gen, device=dev) > 0.1
        x = x.mul_(torch.pow(10.0, exp10)).mul_(keep)
    return x


def _uniform(gen: torch.Generator, n: int, lo: float, width: float) -> torch.Tensor:
    return torch.empty(n, dtype=torch.float32, device=gen.device).uniform_(lo, lo + width,
                                                                           generator=gen)


def strided_arg(shape: tuple[int, ...], dtype: torch.dtype, values: torch.Tensor | None,
                stride: tuple[int, ...] | None = None, guard: int = 0,
                device: str | torch.device = "cpu") -> TensorArg:
    """A ``TensorArg`` of ``shape``/``stride`` in a base with ``guard`` sentinel cells each side
    (:func:`kda_fuzz.engine.case.guarded_arg`)."""
    return guarded_arg(shape, dtype, values, stride=stride, guard=guard, device=device)


def _row_strided(gen: torch.Generator, rows: int, width: int, pad: int, dtype: torch.dtype,
                 values: torch.Tensor, guard: int) -> TensorArg:
    return strided_arg((rows, width), dtype, values, (width + pad, 1), guard, gen.device)


def _padding(p: KdaLayout) -> torch.Tensor | None:
    """Which rows are padding (a host mask: its count is known without a device sync;
    None: no row is)."""
    B = p.B
    if p.padding == "some":
        pad = torch.rand(B, generator=torch.Generator().manual_seed(p.seed)) < 0.3
    elif p.padding == "all":
        pad = torch.ones(B, dtype=torch.bool)
    else:
        pad = torch.zeros(B, dtype=torch.bool)
        if p.padding == "first":
            pad[:1] = True
        elif p.padding == "last":
            pad[-1:] = True
    pad[B - p.tail_padding :] = True
    return pad if bool(pad.any()) else None


def _indices(p: KdaLayout, gen: torch.Generator, pad: torch.Tensor | None) -> torch.Tensor:
    """The state indices, in ``p.idx_dtype``, made on the host: on a GPU they come from a
    host generator of their own and go over in one copy from pinned memory (a device
    permutation and masking took several launches)."""
    B, host = p.B, gen
    if gen.device.type != "cpu":
        host = torch.Generator().manual_seed(((p.seed << 1) | 1) % 2**64)
    idx = torch.randperm(p.num_slots, generator=host)[:B].to(torch.int64)
    if pad is not None and p.pad_value in ("-1", "min"):
        idx.masked_fill_(pad, -1 if p.pad_value == "-1" else -(2**31))
    elif pad is not None:
        idx = torch.where(pad, -torch.randint(1, p.num_slots + 3, (B,), generator=host), idx)
    idx = idx.to(p.idx_dtype)
    return idx if gen.device.type == "cpu" else idx.pin_memory()


def build(p: KdaLayout, variant: str, device: str = "cpu") -> Case:
    """The concrete ``Case`` of a layout (valid when ``p``'s sizes are), made on ``device``.

    Values come from ``p.seed`` with the device's own generator (a CUDA case holds other
    numbers than a CPU case of the same layout; corpus files keep the bytes)."""
    dev = torch.device(device)
    if dev.type == "meta":
        return build(p, variant).on("meta")
    gen = torch.Generator(device=dev).manual_seed(p.seed)
    vals = p.values
    B, HV, K, V, g = p.B, p.HV, p.K, p.V, p.guard
    qkv = _fill(gen, B * p.width, vals.qkv_kind, vals.qkv_scale)
    a = torch.empty(B * HV * K, dtype=torch.float32, device=dev).normal_(
        vals.gate_center, vals.gate_spread, generator=gen)
    dt = _fill(gen, HV * K, "normal", vals.dt_scale)
    A_log = _uniform(gen, HV, vals.A_log_lo, vals.A_log_width)
    b = _fill(gen, B * HV, "normal", vals.b_scale)
    slot = HV * V * K + p.slot_pad
    state = _fill(gen, p.num_slots * HV * V * K, vals.state_kind, vals.state_scale)
    pad = _padding(p)
    tensors = {
        "mixed_qkv": _row_strided(gen, B, p.width, p.qkv_row_pad, p.qkv_dtype, qkv, g),
        "a": _row_strided(gen, B, HV * K, p.a_row_pad, p.ab_dtype, a, g),
        "b": _row_strided(gen, B, HV, p.b_row_pad, p.ab_dtype, b, g),
        "A_log": strided_arg((HV,), p.param_dtype, A_log, guard=g, device=dev),
        "dt_bias": strided_arg((HV * K,), p.param_dtype, dt, guard=g, device=dev),
        "initial_state": strided_arg((p.num_slots, HV, V, K), p.state_dtype, state,
                                     (slot, V * K, K, 1), g, dev),
        "out": strided_arg((B, 1, HV, V), p.out_dtype, None, guard=g, device=dev),
        "ssm_state_indices": strided_arg((B,), p.idx_dtype, _indices(p, gen, pad), guard=g,
                                         device=dev),
    }
    scalars = {
        "scale": float(K**-0.5 if p.scale is None and K > 0 else (p.scale or 0.0)),
        "use_qk_l2norm_in_kernel": p.use_qk_l2norm_in_kernel,
        "lower_bound": p.lower_bound,
    }
    live = B - (int(pad.sum()) if pad is not None else 0)
    return Case("kda", variant, tensors, scalars, ("valid",), {
        "layout": repr(p), "rows": B, "live_rows": live, "tail_rows": p.tail_padding})


# ------------------------------------------------------------------- valid layouts


BUCKETS = tuple(4**i for i in range(16))  # batch buckets: 1, 4, 16, ..., 4^15


def bucket_size(B: int) -> int:
    """The batch bucket of ``B``: the next power of four (1, 4, 16, 64, ...)."""
    size = 1
    while size < B:
        size *= 4
    return size


@functools.cache
def _dim(variant: str, hi: int = 256) -> st.SearchStrategy[int]:
    hi = max(1, min(256, hi))
    if variant == "helion":
        return st.sampled_from([d for d in POW2 if d <= hi])
    return st.one_of(st.sampled_from([d for d in EDGE_DIMS if d <= hi]), st.integers(1, hi))


@functools.cache
def _small_or(hi: int, lo: int = 1) -> st.SearchStrategy[int]:
    return st.one_of(st.just(0), st.integers(lo, hi))


_VALUE_CHOICES = {  # first choice of each: the plainest profile, where shrinking goes
    "qkv_kind": ("normal", "mixed", "tiny", "zeros"),
    "qkv_scale": (1.0, 0.1, 3.0, 10.0),
    "dt_scale": (0.5, 0.0, 2.0),
    "b_scale": (1.0, 0.1, 5.0, 30.0),
    "state_kind": ("normal", "mixed", "zeros", "tiny"),
    "state_scale": (1.0, 0.01, 10.0, 100.0),
}

# Every profile, listed once: one draw per example rather than one per field (a draw
# costs Hypothesis about as much as building a small layout on a GPU).
_VALUES = st.sampled_from([
    Values(**GATE_REGIMES[regime], **dict(zip(_VALUE_CHOICES, combo)))
    for regime in GATE_REGIMES
    for combo in itertools.product(*_VALUE_CHOICES.values())
])


def values() -> st.SearchStrategy[Values]:
    """Value profiles from exact zeros and 1e-6 vectors to large, gates around softplus' 20."""
    return _VALUES


@functools.cache
def _bucket_tops(largest: int) -> st.SearchStrategy[int]:
    return st.sampled_from([b for b in BUCKETS if b <= largest])


@functools.cache
def _shortfall(top: int) -> st.SearchStrategy[int]:
    return st.one_of(st.just(0), st.integers(1, 3), st.integers(0, max(0, top - top // 4 - 1)))


@functools.cache
def _free_batch(max_b: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(EDGE_B), st.integers(1, max_b))


def _batch(draw: Callable, cap: int, max_b: int, bucket: bool) -> tuple[int, int]:
    """Rows B (at most ``cap``) and, with ``bucket``, the padding rows that fill B up to
    its bucket. Bucketed, the bucket is drawn first, then how far short of it B falls:
    not at all, a few rows, or anywhere down to the bucket below (a kernel sees the
    bucket's size whatever B is; most of its rows are the layout's own, not filler).
    The strategies are made once per size (a new one costs Hypothesis more than a draw)."""
    if not bucket:
        return max(1, min(cap, draw(_free_batch(max_b)))), 0
    top = draw(_bucket_tops(bucket_size(cap)))
    B = max(1, min(cap, top - draw(_shortfall(top))))
    return B, bucket_size(B) - B


# Padding rows of a layout: all four kinds with live rows come three times as often as a
# batch that is padding only (which checks no arithmetic, and at a large B costs as much
# device time as a live one).
# Strategies a draw of a layout uses, each made once (Hypothesis validates a new strategy
# object at its first draw: about as costly as the draw itself)
@functools.cache
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@functools.cache
def _divisors(n: int, most: int = 8) -> st.SearchStrategy[int]:
    return st.sampled_from([d for d in range(1, min(most, n) + 1) if n % d == 0])


@functools.cache
def _spare(most: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, min(3, most)), st.integers(0, most))


@functools.cache
def _same_or_any(dtype: torch.dtype) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from((dtype, *FLOATS))


@functools.cache
def _fp32_or(dtype: torch.dtype) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from((torch.float32, dtype))


_FLOAT_DTYPES = st.sampled_from(FLOATS)
_INDEX_DTYPES = st.sampled_from(INDEX_DTYPES)
_FLAGS = st.booleans()
_STRIDED = st.just(True)
_UNPADDED = st.just(0)
_LOWER_BOUNDS = st.one_of(st.none(), st.none(), st.sampled_from((-5.0, -1.0, -0.1, -20.0)),
                          st.floats(-30.0, -1e-3))
_SCALES = st.one_of(st.none(), st.sampled_from((1.0, 0.0, -1.0)),
                    st.floats(-4.0, 4.0, allow_subnormal=False))
_PADDING = st.sampled_from(("none", "some", "first", "last") * 3 + ("all",))
_PAD_VALUE = st.sampled_from(("-1", "any", "min"))
_SEED = st.integers(0, 2**32 - 1)


@st.composite
def layouts(draw: Callable, variant: str, budget: int = DEFAULT_BUDGET,
            max_b: int = 256, max_spare: int = 64, bucket: bool = False,
            family: KdaLayout | None = None, max_bhv: int | None = None,
            pins: Mapping[str, Any] | None = None) -> KdaLayout:
    """Valid ``KdaLayout`` values of a contract variant, within ``budget`` state elements.

    ``bucket`` rounds B up to a power of four with trailing padding rows, so that a
    shape-specialising kernel compiles once per bucket rather than once per batch size.
    ``family`` fixes everything a kernel may compile for (head counts and dims, dtypes,
    strides, flags); only B, padding, indices and values are drawn. ``max_bhv`` bounds
    B * HV (programs of an interpreted kernel launch). ``pins`` fix fields to a value, a
    list of values or a strategy (:mod:`kda_fuzz.families.packed.pins`); pinned sizes override
    the budget."""
    pz = pins if pins is not None and all(isinstance(v, st.SearchStrategy)
                                          for v in pins.values()) \
        else pin_strategies(pins, variant)

    def pick(name: str, default: st.SearchStrategy[Any]) -> Any:
        return draw(pz[name]) if name in pz else draw(default)

    if family is not None:
        per_row = max(1, family.HV * family.V * family.K)
        B, tail = _batch(draw, max(1, min(max_b, budget // per_row)), max_b, bucket)
        fixed = {n: draw(s) for n, s in pz.items() if n in _FAMILY_PINS}  # e.g. capabilities
        if "strides" in pz and not draw(pz["strides"]):
            fixed.update(dict.fromkeys(("qkv_row_pad", "a_row_pad", "b_row_pad", "slot_pad",
                                        "guard"), 0))
        return replace(
            family, B=B + tail, tail_padding=tail,
            padding=pick("padding", _PADDING), pad_value=pick("pad_value", _PAD_VALUE),
            values=draw(values()), seed=draw(_SEED), **fixed,
        )
    K = pick("K", _dim(variant, budget))
    V = pick("V", _dim(variant, max(1, budget // K)))
    per_head = max(1, V * K)
    max_hv = max(1, min(64, budget // per_head, max_bhv or 64))
    if "HV" in pz:
        HV = draw(pz["HV"])
        H = pick("H", _divisors(HV))
    else:
        H = pick("H", _ints(1, min(8, max_hv)))
        HV = H * draw(_ints(1, max(1, min(8, max_hv // H))))
    if min(H, HV, K, V) < 1 or HV % H or (variant == "helion"
                                          and not (_is_pow2(K) and _is_pow2(V))):
        reject()  # a user's strategy drew sizes no valid layout has
    cap = max(1, min(max_b, budget // (HV * per_head), (max_bhv or HV * max_b) // HV))
    slots = draw(pz["num_slots"]) if "num_slots" in pz else None
    if slots is not None:
        cap = max(1, min(cap, slots))
    if "B" in pz:
        B, tail = draw(pz["B"]), 0
    else:
        B, tail = _batch(draw, cap, max_b, bucket)
    if slots is not None and B + tail > slots:
        if "B" in pz:
            reject()  # a pinned B larger than the pinned pool
        B, tail = slots, 0
    max_spare = max(0, min(max_spare, 2 * budget // (HV * per_head) - B))
    qkv_dtype = pick("qkv_dtype", _FLOAT_DTYPES)
    same_or = _same_or_any(qkv_dtype)
    if slots is not None:
        spare = slots - B - tail
    else:
        spare = pick("spare_slots", _spare(max_spare))
    strided = pick("strides", _STRIDED)

    def pad(name: str, hi: int) -> int:
        return pick(name, _small_or(hi) if strided else _UNPADDED)

    return KdaLayout(
        B=B + tail, H=H, HV=HV, K=K, V=V, tail_padding=tail,
        spare_slots=spare,
        qkv_dtype=qkv_dtype,
        ab_dtype=pick("ab_dtype", same_or),
        param_dtype=pick("param_dtype", _fp32_or(qkv_dtype)),
        out_dtype=pick("out_dtype", same_or),
        state_dtype=pick("state_dtype", _FLOAT_DTYPES),
        idx_dtype=pick("idx_dtype", _INDEX_DTYPES),
        padding=pick("padding", _PADDING),
        pad_value=pick("pad_value", _PAD_VALUE),
        qkv_row_pad=pad("qkv_row_pad", 64),
        a_row_pad=pad("a_row_pad", 32),
        b_row_pad=pad("b_row_pad", 8),
        slot_pad=pad("slot_pad", 64),
        guard=pad("guard", 16),
        use_qk_l2norm_in_kernel=pick("use_qk_l2norm_in_kernel", _FLAGS),
        lower_bound=pick("lower_bound", _LOWER_BOUNDS),
        scale=pick("scale", _SCALES),
        values=pick("values", values()),
        seed=draw(_SEED),
    )


# fields of a compile family a pin may still fix (dtypes, flags, strides; not its sizes)
_FAMILY_PINS = ("qkv_dtype", "ab_dtype", "param_dtype", "out_dtype", "state_dtype",
                "idx_dtype", "qkv_row_pad", "a_row_pad", "b_row_pad", "slot_pad", "guard",
                "use_qk_l2norm_in_kernel", "lower_bound", "scale")


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def valid_cases(variant: str, *, budget: int = DEFAULT_BUDGET, device: str = "cpu",
                max_b: int = 256, bucket: bool = False, family: KdaLayout | None = None,
                max_bhv: int | None = None, pins: Mapping[str, Any] | None = None
                ) -> st.SearchStrategy[Case]:
    """Cases that the contract variant accepts, built on ``device`` (``pins``: fields
    fixed to values, lists or strategies, see :mod:`kda_fuzz.families.packed.pins`)."""
    pz = pin_strategies(pins, variant)  # checked now, not at the first draw
    return layouts(variant, budget, max_b, bucket=bucket, family=family, max_bhv=max_bhv,
                   pins=pz).map(lambda p: build(p, variant, device))


def families(variant: str, n: int, seed: int = 0, budget: int = DEFAULT_BUDGET
             ) -> list[KdaLayout]:
    """``n`` compile families (everything but B, padding and values) spread over the
    contract's space, edges first: a campaign on a shape-specialising kernel spends its
    examples family by family, so each compiles a few batch buckets, not every example."""
    import random

    rng = random.Random(seed)
    dims = POW2 if variant == "helion" else EDGE_DIMS
    out = []
    for i in range(n):
        K = rng.choice(dims)
        V = rng.choice([d for d in dims if d * K <= budget] or [1])
        max_hv = max(1, min(64, budget // (K * V)))
        H = rng.randint(1, min(8, max_hv))
        HV = H * rng.randint(1, max(1, min(8, max_hv // H)))
        f32 = torch.float32
        act = rng.choice(FLOATS) if i else torch.bfloat16
        out.append(KdaLayout(
            B=1, H=H, HV=HV, K=K, V=V, spare_slots=rng.choice((0, 1, 7)),
            qkv_dtype=act, ab_dtype=act, param_dtype=f32, out_dtype=act,
            state_dtype=rng.choice(FLOATS) if i else f32,
            idx_dtype=rng.choice(INDEX_DTYPES),
            qkv_row_pad=rng.choice((0, 0, 16, 3)), a_row_pad=rng.choice((0, 0, 5)),
            b_row_pad=rng.choice((0, 2)), slot_pad=rng.choice((0, 0, 32)),
            guard=rng.choice((0, 4)), use_qk_l2norm_in_kernel=rng.random() < 0.5,
            lower_bound=rng.choice((None, None, -5.0)),
            scale=rng.choice((None, None, 0.5)),
        ))
    return out


# ------------------------------------------------------------------ broken layouts

Breaker = Callable[[Callable, Case, KdaLayout], Case]


@dataclass(frozen=True)
class Breakage:
    """A named way to break a valid layout.

    ``check``: the check it aims at (None: a semantic rule with no check of its own).
    ``semantic``: the result is wrong whatever the checks say; if the contract accepts
    it, that is a validation gap of the contract, not a target failure.
    """

    name: str
    check: int | None
    apply: Breaker | None = None
    semantic: bool = False
    rebuild: Callable[[Callable, KdaLayout], KdaLayout] | None = None  # sizes, not tensors


def _seed(draw: Callable) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def _randn(draw: Callable, shape: tuple[int, ...]) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.randn(max(n, 0), generator=_seed(draw), dtype=torch.float64)


def _like(draw: Callable, old: TensorArg, shape: tuple[int, ...],
          stride: tuple[int, ...] | None = None) -> TensorArg:
    """A fresh random tensor of ``old``'s dtype and device with another shape/stride."""
    if old.dtype.is_floating_point:
        vals = _randn(draw, shape)
    else:
        n = 1
        for s in shape:
            n *= s
        vals = torch.full((n,), -1, dtype=torch.int64)
    return strided_arg(shape, old.dtype, vals, stride, device=old.device)


def _put(case: Case, name: str, arg: TensorArg, label: str) -> Case:
    tensors = dict(case.tensors)
    tensors[name] = arg
    intent = (*[i for i in case.intent if i != "valid"], label)
    return Case(case.contract, case.variant, tensors, dict(case.scalars), intent, dict(case.notes))


def _shape(case: Case, name: str) -> tuple[int, ...]:
    return case.tensors[name].shape


def _reshape(name: str, label: str, shapes: Callable[[tuple[int, ...]], list]) -> Breaker:
    """Replace ``name`` by a tensor of another rank, holding the same elements."""

    def apply(draw: Callable, case: Case, p: KdaLayout) -> Case:
        new = draw(st.sampled_from(shapes(_shape(case, name))))
        return _put(case, name, _like(draw, case.tensors[name], tuple(new)), label)

    return apply


def _last_stride(name: str, label: str) -> Breaker:
    """Replace ``name`` by a view of the same shape whose last dim is not unit-stride."""

    def apply(draw: Callable, case: Case, p: KdaLayout) -> Case:
        shp = _shape(case, name)
        if not shp:  # a 0-d tensor (an earlier rank breakage) has no last dim
            return case
        step = draw(st.sampled_from((2, 3, 0)))
        wide = (*shp[:-1], max(shp[-1], 1) * step if step else 1)
        stride = (*torch.empty(wide, device="meta").stride()[:-1], step)
        return _put(case, name, _like(draw, case.tensors[name], shp, stride), label)

    return apply


def _resize(name: str, label: str, dim: int) -> Breaker:
    """Change one size of ``name`` by a small nonzero amount."""

    def apply(draw: Callable, case: Case, p: KdaLayout) -> Case:
        shp = list(_shape(case, name))
        if dim >= len(shp):  # an earlier breakage changed its rank: nothing to resize
            return case
        d = draw(st.sampled_from((1, -1, 2, 3)))
        shp[dim] = shp[dim] + d if shp[dim] + d >= 0 else shp[dim] + 1
        return _put(case, name, _like(draw, case.tensors[name], tuple(shp)), label)

    return apply


def _width(label: str, widths: Callable[[KdaLayout], list[int]]) -> Breaker:
    """Replace ``mixed_qkv`` by one of another packed width (same rows)."""

    def apply(draw: Callable, case: Case, p: KdaLayout) -> Case:
        options = [w for w in widths(p) if w >= 0 and w != p.width] or [p.width + 1]
        w = draw(st.sampled_from(options))
        old = case.tensors["mixed_qkv"]
        return _put(case, "mixed_qkv", _like(draw, old, (p.B, w)), label)

    return apply


def _to_meta(name: str) -> Breaker:
    """Move one tensor to the ``meta`` device (the second device of a one-device machine)."""

    def apply(draw: Callable, case: Case, p: KdaLayout) -> Case:
        old = case.tensors[name]
        arg = TensorArg(old.base.to("meta"), old.shape, old.stride, old.offset)
        return _put(case, name, arg, f"device:{name}")

    return apply


def _out_noncontiguous(draw: Callable, case: Case, p: KdaLayout) -> Case:
    B, HV, V = p.B, p.HV, p.V
    kind = draw(st.sampled_from(("padded", "transposed")))
    if kind == "transposed" and HV > 1 and V > 1:
        stride = (HV * V, HV * V, 1, HV)
    else:
        stride = (HV * (V + 1), HV * (V + 1), V + 1, 1) if V > 0 else (2, 2, 1, 1)
    return _put(case, "out", _like(draw, case.tensors["out"], (B, 1, HV, V), stride),
                f"out-noncontiguous:{kind}")


def _state_k_major(draw: Callable, case: Case, p: KdaLayout) -> Case:
    n, HV, V, K = p.num_slots, p.HV, p.V, p.K
    stride = (HV * V * K, V * K, 1, V)  # a K-major pool viewed as [slots, HV, V, K]
    return _put(case, "initial_state", _like(draw, case.tensors["initial_state"],
                                             (n, HV, V, K), stride), "state-k-major")


def _state_inner_stride(draw: Callable, case: Case, p: KdaLayout) -> Case:
    n, HV, V, K = p.num_slots, p.HV, p.V, p.K
    pad = draw(st.integers(1, 8))
    stride = (HV * V * (K + pad), V * (K + pad), K + pad, 1)
    return _put(case, "initial_state", _like(draw, case.tensors["initial_state"],
                                             (n, HV, V, K), stride), "state-padded-inner")


def _indices_strided(draw: Callable, case: Case, p: KdaLayout) -> Case:
    old = case.tensors["ssm_state_indices"]
    if old.shape != (p.B,):  # already reshaped by another breakage
        return case
    vals = old.view().to(torch.int64)
    return _put(case, "ssm_state_indices",
                strided_arg((p.B,), old.dtype, vals, (2,), device=old.device),
                "indices-strided")


def _non_pow2(draw: Callable, p: KdaLayout) -> KdaLayout:
    bad = draw(st.sampled_from((3, 5, 6, 12, 48, 96, 100)))
    which = draw(st.sampled_from(("K", "V", "both")))
    q = replace(p, K=bad if which != "V" else p.K, V=bad if which != "K" else p.V)
    return q if q.HV * q.K * q.V <= 1 << 16 else replace(q, H=1, HV=1)


def _two_heads_two_values(draw: Callable, p: KdaLayout) -> KdaLayout:
    """Sizes of 1 make any stride pattern contiguous: give the view something to break."""
    return replace(p, HV=p.HV if p.HV > 1 else 2 * p.H, V=max(p.V, 2))


def _k_at_least_two(draw: Callable, p: KdaLayout) -> KdaLayout:
    """Every width is a multiple of K = 1."""
    return replace(p, K=max(p.K, 2))


def _degenerate(draw: Callable, p: KdaLayout) -> KdaLayout:
    # V or HV of 0 passes every check; K or H of 0 leaves no q/k segment (check 20).
    which = draw(st.sampled_from(("V", "HV", "K", "H")))
    return replace(p, **{which: 0})


def _zero_k(draw: Callable, p: KdaLayout) -> KdaLayout:
    return replace(p, K=0)


def _bad_heads(p: KdaLayout) -> list[int]:
    return [2 * h * p.K + p.HV * p.V for h in range(1, 2 * p.HV + 2) if p.HV % h != 0]


def _rank_variants(ndim_ok: int) -> Callable[[tuple[int, ...]], list]:
    def shapes(shp: tuple[int, ...]) -> list:
        n = 1
        for s in shp:
            n *= s
        out = [(n,), (1, *shp), (*shp, 1), ()]
        return [s for s in out if len(s) != ndim_ok]

    return shapes


def _each(names: tuple[str, ...], check: int, label: str,
          make: Callable[[str], Breaker]) -> tuple[Breakage, ...]:
    """One breakage per tensor name, so every tensor gets its share of examples."""
    return tuple(Breakage(f"{label}:{n}", check, make(n)) for n in names)


def _out_shape(which: str) -> Breaker:
    def apply(draw: Callable, case: Case, p: KdaLayout) -> Case:
        B, HV, V = p.B, p.HV, p.V
        shp = {"B": (B + 1, 1, HV, V), "HV": (B, 1, HV + 1, V), "V": (B, 1, HV, V + 1),
               "rank": (B, HV, V), "swap": (B, 1, V, HV) if V != HV else (B, 2, HV, V)}[which]
        return _put(case, "out", _like(draw, case.tensors["out"], shp), f"out-shape:{which}")

    return apply


ALL_TENSORS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out",
               "ssm_state_indices")

BREAKAGES: tuple[Breakage, ...] = (
    Breakage("rank:mixed_qkv", 1, _reshape("mixed_qkv", "qkv-rank", _rank_variants(2))),
    Breakage("last-stride:mixed_qkv", 2, _last_stride("mixed_qkv", "qkv-last-stride")),
    *_each(("a", "b"), 3, "rank", lambda n: _reshape(n, f"{n}-rank", _rank_variants(2))),
    *_each(("a", "b"), 4, "last-stride", lambda n: _last_stride(n, f"{n}-stride")),
    *_each(("A_log", "dt_bias"), 5, "rank",
           lambda n: _reshape(n, f"{n}-rank", _rank_variants(1))),
    *_each(("A_log", "dt_bias"), 6, "stride", lambda n: _last_stride(n, f"{n}-stride")),
    Breakage("rank:ssm_state_indices", 7, _reshape("ssm_state_indices", "indices-rank",
                                                   _rank_variants(1))),
    Breakage("out-noncontiguous", 8, _out_noncontiguous, rebuild=_two_heads_two_values),
    *_each(ALL_TENSORS, 9, "device", _to_meta),
    *_each(("a", "b"), 10, "batch", lambda n: _resize(n, f"{n}-batch", 0)),
    Breakage("batch:ssm_state_indices", 11, _resize("ssm_state_indices", "indices-batch", 0)),
    Breakage("rank:initial_state", 12, _reshape("initial_state", "state-rank",
                                                _rank_variants(4))),
    Breakage("state-k-major", 13, _state_k_major, rebuild=_two_heads_two_values),
    Breakage("non-pow2-head-dim", 14, rebuild=_non_pow2),
    Breakage("a-width", 15, _resize("a", "a-width", 1)),
    Breakage("b-width", 16, _resize("b", "b-width", 1)),
    Breakage("A_log-numel", 17, _resize("A_log", "A_log-numel", 0)),
    Breakage("dt_bias-numel", 18, _resize("dt_bias", "dt_bias-numel", 0)),
    *_each(("B", "HV", "V", "rank", "swap"), 19, "out-shape", _out_shape),
    Breakage("odd-qk-width", 20, _width("odd-qk-width", lambda p: [p.width + 1, p.width - 1,
                                                                    p.HV * p.V, p.HV * p.V - 2])),
    Breakage("q-not-divisible", 21, _width("q-not-divisible", lambda p: [
        2 * (p.H * p.K + d) + p.HV * p.V for d in range(1, max(2, p.K))][:8]),
        rebuild=_k_at_least_two),
    Breakage("heads-not-dividing", 22, _width("heads-not-dividing", _bad_heads)),
    Breakage("missing-k-segment", None, _width("missing-k-segment", lambda p: [
        p.H * p.K + p.HV * p.V]), semantic=True),
    Breakage("extra-segment", None, _width("extra-segment", lambda p: [
        p.width + e for e in (p.K, 2 * p.K, p.HV * p.V, 2 * p.H * p.K, 4 * p.K)]),
        semantic=True),
    Breakage("qk-width-mismatch", None, _width("qk-width-mismatch", lambda p: [
        p.width + d for d in (1, 2, p.K, -1, -2) if p.width + d > p.HV * p.V]), semantic=True),
    Breakage("state-padded-inner", None, _state_inner_stride, semantic=True),
    Breakage("indices-strided", None, _indices_strided, semantic=True),
    Breakage("zero-size", None, rebuild=_degenerate, semantic=True),
    # K = 0 behind a q/k segment that passes check 20: check 21 then divides by K.
    Breakage("zero-K-behind-qk", None, _width("zero-K-behind-qk", lambda p: [
        2 * h + p.HV * p.V for h in (1, 2, 3, 8)]), rebuild=_zero_k, semantic=True),
)


def breakages(variant: str) -> tuple[Breakage, ...]:
    """The breakages that make sense for a variant (check 14 only exists for helion)."""
    return tuple(b for b in BREAKAGES if not (b.check == 14 and variant != "helion"))


def broken_arms(variant: str) -> list[tuple[str, tuple[str, ...]]]:
    """Strata of broken layouts: each breakage alone, then each pair aimed at two
    consecutive checks (so that every adjacent order of checks is exercised)."""
    return arms_of(breakages(variant))


def arms_of(options: tuple[Breakage, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """``broken_arms`` of any set of breakages (shared by the packed decode families)."""
    arms = [(b.name, (b.name,)) for b in options]
    checks = sorted({b.check for b in options if b.check is not None})

    def tensor(name: str) -> str:
        return name.split(":")[-1]

    for first, second in itertools.pairwise(checks):
        pairs = [(a.name, b.name) for a in options if a.check == first
                 for b in options if b.check == second and tensor(a.name) != tensor(b.name)]
        if pairs:
            arms.append(("+".join(pairs[0]), pairs[0]))
    return arms


def broken_cases(variant: str, *, budget: int = 4096, device: str = "cpu",
                 only: tuple[str, ...] | str | None = None, max_breaks: int = 3,
                 pins: Mapping[str, Any] | None = None) -> st.SearchStrategy[Case]:
    """A valid small layout with breakages applied: those named by ``only``, else one to
    ``max_breaks`` drawn at random. Size changes (rebuilds) are applied first. ``pins``
    fix fields of the valid layout broken (e.g. what a target does not support)."""
    return broken_from(variant, breakages(variant), build, budget=budget, device=device,
                       only=only, max_breaks=max_breaks, pins=pin_strategies(pins, variant))


@st.composite
def broken_from(draw: Callable, variant: str, options: tuple[Breakage, ...],
                build: Callable[[KdaLayout, str, str], Case], *, budget: int = 4096,
                device: str = "cpu", only: tuple[str, ...] | str | None = None,
                max_breaks: int = 3, pins: Mapping[str, Any] | None = None) -> Case:
    """``broken_cases`` over any breakages and layout builder (shared by the families)."""
    p = draw(layouts(variant, budget=budget, max_b=8, max_spare=4,
                     pins=pins if pins else None))
    if only is not None:
        names = (only,) if isinstance(only, str) else tuple(only)
        chosen = [b for b in options if b.name in names]
        if len(chosen) != len(names):
            raise ValueError(f"unknown breakage in {names!r} for variant {variant!r}")
    else:
        n = draw(st.integers(1, max_breaks))
        chosen = draw(st.lists(st.sampled_from(options), min_size=1, max_size=n,
                               unique_by=lambda b: b.name))
    chosen = sorted(chosen, key=lambda b: b.rebuild is None)
    for brk in chosen:
        if brk.rebuild is not None:
            p = brk.rebuild(draw, p)
    case = build(p, variant, device)
    for brk in chosen:
        if brk.apply is not None:
            case = brk.apply(draw, case, p)
    case.intent = tuple(b.name for b in chosen)
    case.notes["breakages"] = [b.name for b in chosen]
    case.notes["semantic"] = any(b.semantic for b in chosen)
    return case
