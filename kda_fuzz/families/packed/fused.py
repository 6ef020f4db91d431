"""The packed decode judge's fast path on a GPU: one Triton kernel per case computes the
float64 reference of every live row (``reference64`` of KDA or GDN), its forward-error
bounds (``packed_judge.packed_bounds``, with ``packed_tolerance``'s constants) and the
comparison with what the target wrote, in registers, where the torch oracle makes some
twenty full-size ``[R, HV, V, K]`` passes and a device sync to find the live rows. It
also checks padding rows zero and marks the slots that live rows name (for the caller's
check of the rest of the pool).

It only decides that a case passes: the caller reads its summary with the other device
booleans in one sync, and anything else (an element out of bound, a nonzero padding row,
a result too large for the stored dtype, an index past the pool) sends the case to the
torch oracle, whose verdict is the one reported. Summation order aside (float64, far
inside the bounds) it computes what the torch oracle computes; tests check the two agree.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
import triton
import triton.language as tl

from kda_fuzz.families.packed import tolerance as tol
from kda_fuzz_kernels.kda_decode.reference import L2NORM_EPS

TILE = 1024  # elements of the [V, K] tile a program holds (float64, several live copies)

# the summary: the largest |got - ref| / bound of ``out`` and of the state over live rows
# (-1 with no live row; NaN counts as infinite), then counts of elements out of bound,
# results past half the stored dtype's range, nonzero padding values, indices past the pool
OUT_RATIO, STATE_RATIO, OUT_OF_BOUND, UNFIT, PADDING_NONZERO, PAST_POOL = range(6)
COLUMNS = 6

broken: str | None = None  # why the fast path is off in this process (see ``disable``)


def status() -> list[str]:
    """A note for the campaign's summary when the fast path is off in this process."""
    return [] if broken is None else [
        f"the fused GPU judge failed ({broken}); cases were judged by the torch oracle"]


def disable(error: BaseException) -> None:
    """Turn the fast path off for this process after it failed (a Triton that cannot
    compile it here, a bug of ours), saying so once on stderr: judging goes on with the
    torch oracle, and the failure is never a verdict against a target."""
    global broken
    broken = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    print(f"kda-fuzz: the fused GPU judge failed ({broken}); judging with the torch "
          "oracle", file=sys.stderr)


@triton.jit
def _ratio(err, bound, mask):
    r = tl.where(mask, err / bound, -1.0)
    return tl.max(tl.where(r != r, float("inf"), r), 0)


_SIZES = ("num_slots", "H", "HV", "K", "V", "NVB", "s_qkv", "s_a", "s_b", "s_idx", "s0_0",
          "s0_1", "s0_2", "st_0", "st_1", "st_2", "o_0", "o_2")


@triton.jit(do_not_specialize=_SIZES)  # one compile per dtype mix and tile, not per size
def _judge_rows(
    qkv, a, b, A_log, dt_bias, idx, s0, st, out, consts, part, named,
    num_slots, H, HV, K, V, NVB,
    s_qkv, s_a, s_b, s_idx, s0_0, s0_1, s0_2, st_0, st_1, st_2, o_0, o_2,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, HAS_LB: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
):
    f64 = tl.float64
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    vb = tl.program_id(2).to(tl.int64)
    slot = tl.load(idx + row * s_idx).to(tl.int64)
    offs_v = vb * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    mv = offs_v < V
    mk = offs_k < K
    m2 = mv[:, None] & mk[None, :]
    got_o = tl.load(out + row * o_0 + h * o_2 + offs_v, mask=mv, other=0).to(f64)
    pbase = part + ((row * HV + h) * NVB + vb) * 6
    live = (slot >= 0) & (slot < num_slots)
    tl.store(pbase + 4, tl.sum(tl.where(mv & (got_o != 0) & (slot < 0), 1.0, 0.0), 0))
    tl.store(pbase + 5, tl.where(slot >= num_slots, 1.0, 0.0))
    if live:
        if (h == 0) & (vb == 0):
            tl.store(named + slot, 1)  # the pool check's mask of named slots
        scale = tl.load(consts + 0)
        sc = tl.load(consts + 1)
        sc_ulp = tl.load(consts + 2)
        lb = tl.load(consts + 3)
        lbf = tl.load(consts + 4)
        eps_s = tl.load(consts + 5)
        tiny_s = tl.load(consts + 6)
        eps_o = tl.load(consts + 7)
        tiny_o = tl.load(consts + 8)
        half_s = tl.load(consts + 9)
        half_o = tl.load(consts + 10)
        gamma = tl.load(consts + 11)
        tiny32 = tl.load(consts + 12)
        u4 = tl.load(consts + 13)

        hq = h // (HV // H)
        base = qkv + row * s_qkv
        q = tl.load(base + hq * K + offs_k, mask=mk, other=0).to(f64)
        k = tl.load(base + H * K + hq * K + offs_k, mask=mk, other=0).to(f64)
        v = tl.load(base + 2 * H * K + h * V + offs_v, mask=mv, other=0).to(f64)
        if L2NORM:
            l2eps = tl.load(consts + 14)
            q = q / tl.sqrt(tl.sum(q * q, 0) + l2eps)
            k = k / tl.sqrt(tl.sum(k * k, 0) + l2eps)
        if GATE_PER_KEY:
            av = tl.load(a + row * s_a + h * K + offs_k, mask=mk, other=0).to(f64)
            dt = tl.load(dt_bias + h * K + offs_k, mask=mk, other=0).to(f64)
        else:
            av = tl.load(a + row * s_a + h).to(f64)
            dt = tl.load(dt_bias + h).to(f64)
        x = av + dt
        alog = tl.load(A_log + h).to(f64)
        A = tl.exp(alog)
        if HAS_LB:
            g = lb / (1.0 + tl.exp(-(A * x)))
        else:
            ex = tl.exp(x)
            u = 1.0 + ex  # log1p(exp(x)), accurate for tiny exp(x)
            log1p = tl.where(u == 1.0, ex, tl.log(u) * ex / (u - 1.0))
            g = -A * tl.where(x <= 20.0, log1p, x)
        beta = 1.0 / (1.0 + tl.exp(-(tl.load(b + row * s_b + h).to(f64))))
        gsens = tl.abs(g) * (tl.abs(alog) + 4.0) + A * (tl.abs(av) + tl.abs(dt)) * lbf

        S0 = tl.load(s0 + slot * s0_0 + h * s0_1 + offs_v[:, None] * s0_2 + offs_k[None, :],
                     mask=m2, other=0).to(f64)
        if GATE_PER_KEY:
            S_dec = S0 * tl.exp(g)[None, :]
            gs = gsens[None, :]
        else:
            S_dec = S0 * tl.exp(g)
            gs = gsens
        r = beta * (v - tl.sum(S_dec * k[None, :], 1))
        S = S_dec + r[:, None] * k[None, :]
        o = tl.sum(S * q[None, :], 1) * scale

        k_abs = tl.abs(k)
        q_abs = tl.abs(q)
        e = tl.abs(S_dec)
        delta = tl.abs(v) + tl.sum(e * k_abs[None, :], 1)
        beta_rel = tl.load(consts + 16)
        e = e * (gamma + u4 * gs) + (((gamma + beta_rel) * beta * delta + tiny32 * delta)[:, None]
                                     * k_abs[None, :]) + tiny32 * tl.abs(S0) + tiny32
        S_abs = tl.abs(S)
        Sq = tl.sum(S_abs * q_abs[None, :], 1)
        e_out = sc * (tl.sum(e * q_abs[None, :], 1) + gamma * Sq
                      + tiny32 * (1.0 + tl.sum(q_abs, 0))) + sc_ulp * Sq \
            + tl.load(consts + 15)
        s_bound = e + eps_s * S_abs + tiny_s
        o_bound = e_out * (1.0 + eps_o) + eps_o * tl.abs(o) + tiny_o

        got_s = tl.load(st + slot * st_0 + h * st_1 + offs_v[:, None] * st_2 + offs_k[None, :],
                        mask=m2, other=0).to(f64)
        err_s = tl.abs(got_s - S)
        err_o = tl.abs(got_o - o)
        bad = tl.sum(tl.sum(tl.where(m2 & ~(err_s <= s_bound), 1.0, 0.0), 1), 0) \
            + tl.sum(tl.where(mv & ~(err_o <= o_bound), 1.0, 0.0), 0)
        unfit = tl.sum(tl.sum(tl.where(m2 & ~(S_abs <= half_s), 1.0, 0.0), 1), 0) \
            + tl.sum(tl.where(mv & ~(tl.abs(o) <= half_o), 1.0, 0.0), 0)
        tl.store(pbase + 0, _ratio(err_o, o_bound, mv))
        tl.store(pbase + 1, tl.max(_ratio(err_s, s_bound, m2), 0))
        tl.store(pbase + 2, bad)
        tl.store(pbase + 3, unfit)
    else:
        tl.store(pbase + 0, -1.0)
        tl.store(pbase + 1, -1.0)
        tl.store(pbase + 2, 0.0)
        tl.store(pbase + 3, 0.0)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@functools.lru_cache(maxsize=256)
def _consts(values: tuple[float, ...], dev: torch.device) -> torch.Tensor:
    """The kernel's float64 constants on ``dev``, made once per distinct set (a campaign's
    family has one; only the kernel reads them)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dev.type == "cuda":  # from pinned memory: no sync
        t = t.pin_memory().to(dev, non_blocking=True)
    return t


def summary(views: dict[str, Any], got_state: torch.Tensor, got_out: torch.Tensor, *,
            gate_per_key: bool, named: torch.Tensor, out: torch.Tensor | None = None
            ) -> torch.Tensor:
    """The case's summary (``COLUMNS`` float64 values on its device, see the column
    names; written into ``out`` where given): ``views`` are the arguments as handed to
    the target (``initial_state`` the state before the call), ``got_*`` the caller's
    tensors after it. ``named`` (int8, one per slot, zeros) gets a 1 for each slot a live
    row names. On CPU tensors the kernel runs in the Triton interpreter (tests)."""
    state, qkv = views["initial_state"], views["mixed_qkv"]
    num_slots, HV, V, K = state.shape
    B = qkv.shape[0]
    H = (qkv.shape[1] - HV * V) // 2 // K
    BK = _next_pow2(K)
    BV = max(1, min(_next_pow2(V), TILE // BK))
    NVB = triton.cdiv(V, BV)
    dev = state.device
    scale, lb = float(views["scale"]), views.get("lower_bound")
    sc = abs(scale)
    ds, do = got_state.dtype, got_out.dtype
    values = [scale, sc, tol.scale_ulp(sc), lb or 0.0, max(1.0, abs(lb or 0.0)),
              tol.eps(ds), tol.tiny(ds), tol.eps(do), tol.tiny(do), tol.half_max(ds),
              tol.half_max(do), tol.gamma(K), torch.finfo(torch.float32).smallest_normal,
              4 * tol.U32, L2NORM_EPS, tol.underflow(K),
              0.0 if gate_per_key else tol.beta_rounding(views["b"].dtype)]
    # (not named ``params``: Triton's generated binder has a local of that name)
    consts = _consts(tuple(values), dev)
    part = torch.empty((B * HV * NVB, COLUMNS), dtype=torch.float64, device=dev)
    if part.numel() == 0:
        empty = torch.tensor([-1.0, -1.0, 0, 0, 0, 0], dtype=torch.float64)
        return (empty.to(dev, non_blocking=True) if out is None
                else out.copy_(empty, non_blocking=True))
    idx = views["ssm_state_indices"]
    args = (qkv, views["a"], views["b"], views["A_log"], views["dt_bias"], idx, state,
            got_state, got_out, consts, part, named, num_slots, H, HV, K, V, NVB,
            qkv.stride(0), views["a"].stride(0), views["b"].stride(0), idx.stride(0),
            state.stride(0), state.stride(1), state.stride(2),
            got_state.stride(0), got_state.stride(1), got_state.stride(2),
            got_out.stride(0), got_out.stride(2))
    meta = dict(BK=BK, BV=BV, L2NORM=bool(views["use_qk_l2norm_in_kernel"]),
                HAS_LB=lb is not None, GATE_PER_KEY=gate_per_key)
    grid = (B, HV, NVB)
    if dev.type == "cpu":
        from kda_fuzz.execution.cpu import launch_triton

        launch_triton(_judge_rows, grid, dev, *args, **meta)
    else:
        tile = BK * BV  # small tiles (many programs of little work): fewer idle threads
        _judge_rows[grid](*args, **meta, num_warps=1 if tile <= 256 else 2 if tile <= 512 else 4)
    return torch.amax(part, 0) if out is None else torch.amax(part, 0, out=out)
