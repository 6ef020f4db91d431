"""The packed decode oracle, shared by the families of that packing (KDA, GDN).

A family hands over its float64 reference (the terms of its decode in float64 on the
same upcast inputs, with forward-error bounds from :func:`packed_bounds`; KDA's
:func:`reference64` is the default) and, for the fused GPU fast path, its gate shape
(:class:`Fused`). The tolerance policy's constants are ``packed_tolerance``'s:

* per element, |got - ref| <= bound (a forward error estimate of float32 arithmetic plus
  one rounding of the stored dtype and its subnormal spacing). Float32 done right sits
  orders of magnitude inside it; one bf16/fp16 rounding of an intermediate (eps 2^-8 /
  2^-11) lands outside it;
* padding rows exactly 0 (``out`` is pre-filled with NaN); every state element outside
  the named slots, guard cells included, bit-identical; read-only inputs bit-identical;
  the returned pair ``is`` the caller's ``(out, initial_state)``.

Layouts whose float64 result does not fit the stored dtype (more than half its max) are
not judged numerically (``Unjudgeable``); the other rules (read-only inputs, guard cells,
padding rows, untouched slots) still hold for them. On CUDA, ``packed_fused`` (imported
on first use: it needs Triton) decides the passes in one kernel.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import Deferred, Unjudgeable
from kda_fuzz.engine.oracle import device_error, same_bits
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families.packed import tolerance as tol

READ_ONLY = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "ssm_state_indices")


def pow2(n: int) -> bool:
    """A power of two (the Helion variants' K and V)."""
    return n > 0 and n & (n - 1) == 0


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers of the same width (NaN-safe equality)."""
    return t.view(_INT_OF_SIZE[t.element_size()])


def reference64(args: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Float64 result and per-element error bounds for the rows with ``idx >= 0``: KDA's
    reference (one gate per key), the judge's default; GDN passes its own."""
    from kda_fuzz_kernels.kda_decode.reference import decode_terms

    state = args["initial_state"]
    f64 = torch.float64
    HV, V, K = state.shape[-3:]
    H = (args["mixed_qkv"].shape[1] - HV * V) // 2 // K
    lb = args["lower_bound"]
    t = decode_terms(args["mixed_qkv"], args["a"], args["b"], args["A_log"], args["dt_bias"],
                     args["scale"], state, args["ssm_state_indices"],
                     args["use_qk_l2norm_in_kernel"], lb, H, f64)
    g, A = t["g"], t["A"]
    A_log = args["A_log"].to(f64).reshape(HV, 1)
    gsens = (g.abs() * (A_log.abs() + 4)
             + A * (t["a"].abs() + t["dt_bias"].abs()) * max(1.0, abs(lb or 0.0)))
    return packed_bounds(args, t, gsens.unsqueeze(2))



def packed_bounds(args: dict[str, Any], t: dict[str, torch.Tensor],
                  gsens: torch.Tensor, beta_rel: float = 0.0) -> dict[str, torch.Tensor]:
    """The float64 result of the delta-rule terms ``t`` with forward-error bounds of float32
    arithmetic, given the gate's sensitivity ``gsens`` (broadcastable to the rows' states
    ``[R, HV, V, K]``); shared by the packed decode families. ``beta_rel``: a relative
    error of beta the tolerance admits besides float32's (GDN: :func:`beta_rounding`)."""
    state, out = args["initial_state"], args["out"]
    K = state.shape[-1]
    gamma = tol.gamma(K)
    k_abs, q_abs = t["k"].abs(), t["q"].abs()
    # exp(g) and sigmoid(b) may underflow (or flush to zero) in float32: an absolute error
    # of one smallest normal each, multiplied by what they scale.
    tiny32 = torch.finfo(torch.float32).smallest_normal
    # [R, HV, V, K] passes are what the judge costs on a large case: each full-size term
    # below is made once and updated in place (same sums, fewer passes and buffers)
    e_state = t["S_dec"].abs()
    delta = t["v"].abs() + torch.einsum("rhvk,rhk->rhv", e_state, k_abs)
    M_r = t["beta"].unsqueeze(-1) * delta
    e_state.mul_(gamma + 4 * tol.U32 * gsens)
    e_state.addcmul_(((gamma + beta_rel) * M_r + tiny32 * delta).unsqueeze(-1),
                     k_abs.unsqueeze(2))
    e_state.add_(t["S0"].abs(), alpha=tiny32).add_(tiny32)  # tiny32 * (|S0| + 1)
    new_state, o = t["S"], t["o"]
    sc = abs(float(args["scale"]))
    sc_ulp = tol.scale_ulp(sc)  # scale itself is rounded to float32
    S_abs = new_state.abs()
    Sq = torch.einsum("rhvk,rhk->rhv", S_abs, q_abs)
    e_out = sc * (
        torch.einsum("rhvk,rhk->rhv", e_state, q_abs)
        + gamma * Sq
        + tiny32 * (1 + q_abs.sum(-1, keepdim=True))
    ) + sc_ulp * Sq + tol.underflow(K)
    # the state's bound: e_state plus one rounding to the stored dtype (in place)
    state_bound = e_state.add_(S_abs, alpha=tol.eps(state.dtype)).add_(tol.tiny(state.dtype))
    return {
        "rows": t["rows"],
        "slots": t["slots"],
        "out": o,
        "state": new_state,
        "out_bound": (e_out * (1 + tol.eps(out.dtype)) + tol.eps(out.dtype) * o.abs()
                      + tol.tiny(out.dtype)),
        "state_bound": state_bound,
    }


def short_dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _excess(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> dict[str, Any] | None:
    """Elements out of tolerance: how many, and the worst one (largest |got - ref| / bound;
    NaN or infinite errors count as infinitely bad), with its position in ``got``."""
    err = (got.to(torch.float64) - ref).abs()
    bad = ~(err <= bound)  # NaN in got is bad
    n_bad = int(bad.sum())
    if not n_bad:
        return None
    ratio = torch.where(bad, err / bound.clamp_min(1e-300), torch.zeros_like(err))
    ratio = torch.nan_to_num(ratio, nan=float("inf"))
    flat = int(ratio.flatten().argmax())
    pos = [int(w) for w in torch.unravel_index(torch.tensor(flat), ratio.shape)]
    worst = err[bad]
    return {"bad": n_bad, "numel": bad.numel(), "pos": pos,
            "got": got.flatten()[flat].item(), "ref": ref.flatten()[flat].item(),
            "bound": bound.flatten()[flat].item(), "ratio": float(ratio.flatten()[flat]),
            "max_error": float(worst.max()) if bool(torch.isfinite(worst).all())
            else float("inf")}


def _place(name: str, pos: list[int], rows: torch.Tensor,
           slots: torch.Tensor) -> tuple[list[int], list[int], str]:
    """For a position among the gathered valid rows (``out[rows, 0]`` is [R, HV, V], the
    state of ``slots`` [R, HV, V, K]): the index in the tensor's own shape (``out`` is
    [B, 1, HV, V], ``initial_state`` [num_slots, HV, V, K]), the minimizer's hint
    ``where`` ([batch row, hv, v(, k)]) and a description in words."""
    row, slot = int(rows[pos[0]]), int(slots[pos[0]])
    hint = [row, *pos[1:]]
    if name == "out":
        return [row, 0, *pos[1:]], hint, f"batch row {row}, value head {pos[1]}, v {pos[2]}"
    return ([slot, *pos[1:]], hint,
            f"slot {slot} of batch row {row}, value head {pos[1]}, v {pos[2]}, k {pos[3]}")


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor,
             rows: torch.Tensor, slots: torch.Tensor) -> Verdict | None:
    """A ``{name}-value`` mismatch naming the worst element (in the tensor's own shape,
    also in ``notes["index"]``) and how many elements are out of tolerance; ``where`` is
    the minimizer's hint [batch row, value head, v(, k)]."""
    x = _excess(got, ref, bound)
    if x is None:
        return None
    index, where, words = _place(name, x["pos"], rows, slots)
    g, r = x["got"], x["ref"]
    return Verdict(
        "mismatch", f"{name}-value",
        f"{name} differs from the float64 reference; worst element {name}"
        f"{index} ({words}): got {g!r}, expected {r!r} (|err|={abs(g - r):.3g} > bound "
        f"{x['bound']:.3g}, {x['ratio']:.3g}x the bound); {x['bad']} of {x['numel']} "
        f"elements out of tolerance",
        output=name, max_error=x["max_error"], where=where,
        notes={"index": index, "out_of_tolerance": x["bad"], "ratio": x["ratio"]},
    )


def layout_summary(case: Case) -> str:
    """B, H (inferred from ``mixed_qkv``'s width), HV, K, V and the state slots, then every
    tensor's dtype, shape and strides and the scalars (``Case.describe``)."""
    try:
        HV, V, K = case.tensors["initial_state"].shape[-3:]
        B, width = case.tensors["mixed_qkv"].shape
        slots = case.tensors["initial_state"].shape[0]
        qk = width - HV * V
        H: Any = qk // (2 * K) if K and qk > 0 and qk % (2 * K) == 0 else f"? ({qk}/(2K))"
        sizes = f"B={B} H={H} HV={HV} K={K} V={V}, {slots} state slot(s)"
    except (KeyError, ValueError, TypeError):  # a broken layout (wrong ndim)
        sizes = "sizes not inferable (broken layout)"
    return f"{sizes}; {case.describe()}"


def packed_sizes(case: Case) -> dict[str, int]:
    """B, slots, HV, V and K of a case, as far as its tensors' ranks allow (for the
    descriptions of corpus files)."""
    out: dict[str, int] = {}
    qkv = case.tensors.get("mixed_qkv")
    st = case.tensors.get("initial_state")
    if qkv is not None and qkv.shape:
        out["B"] = qkv.shape[0]
    if st is not None and len(st.shape) == 4:
        out.update(zip(("slots", "HV", "V", "K"), st.shape))
    return out


Reference = Callable[[dict[str, Any]], dict[str, torch.Tensor]]
# a judge's signature: (case, kwargs, before, after, result, budget) -> verdict or None
Judge = Callable[[Case, dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor], Any,
                  "dict[str, float] | None"], "Verdict | None"]


@dataclass(frozen=True)
class Fused:
    """A family's reference as ``packed_fused`` computes it: one gate per key (KDA) or
    one per value head (GDN)."""

    gate_per_key: bool


KDA_FUSED = Fused(gate_per_key=True)


def fused_status() -> list[str]:
    """``packed_fused.status``, without importing Triton where the fast path never ran."""
    module = sys.modules.get(f"{__package__}.fused")
    return module.status() if module is not None else []


def judge(case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
          after: dict[str, torch.Tensor], result: Any,
          budget: dict[str, float] | None = None, *,
          reference: Reference | None = None, fused: Fused | None = None,
          sampled: Judge | None = None, facts: dict[str, Any] | None = None,
          defer: bool = False) -> Verdict | Deferred | None:
    """The differential and semantic oracle for a layout the contract accepts.

    ``before`` holds the bases as they were handed over, ``after`` the same bases after
    the call; ``kwargs`` the views the target received. Raises ``Unjudgeable``.
    With a ``budget`` dict, it is filled with the error budget used: the largest
    |got - ref| / bound per output and dtype (``"out/float32"``, ``"state/bfloat16"``;
    1.0 is the tolerance), read back in the same device sync; outputs with no valid row
    are left out. Scale cases (``notes["scale"]``) go to ``sampled`` where one is given
    (KDA's contract judge passes ``kda_scale.judge_sampled``), which tells ``facts`` how
    it judged.
    ``reference``: the float64 result and bounds (default :func:`reference64`, with
    ``fused`` :data:`KDA_FUSED`); a sibling family of the same packing (GDN) passes its
    own and shares this policy. ``fused``: the same reference as one kernel
    (``packed_fused``), which decides the passes on CUDA. ``defer``: there, its launches
    are made and a :class:`~kda_fuzz.engine.contract.Deferred` returned, which reads them.
    """
    if sampled is not None and case.notes.get("scale"):
        # GPU-scale cases: bit-exact everywhere, math sampled
        return sampled(case, kwargs, before, after, result, budget, facts=facts)
    out, state = kwargs["out"], kwargs["initial_state"]
    if not (isinstance(result, tuple | list) and len(result) == 2
            and result[0] is out and result[1] is state):
        got = type(result).__name__
        return Verdict("mismatch", "returned-objects",
                       f"must return the caller's own (out, initial_state); got {got}")
    if reference is None:  # KDA's own
        reference, fused = reference64, KDA_FUSED
    of: Reference = reference
    ref_args = {n: case.tensors[n].view(before[n]) for n in case.tensors}
    ref_args.update(case.scalars)

    def by_torch() -> Verdict | None:
        masks = _masks(case, kwargs, before, after)
        ref = of(ref_args)
        if _all_pass(kwargs, before, after, ref, masks, budget):  # one sync on the common path
            return None
        return _diagnose(kwargs, before, after, ref, masks)

    if fused is None or out.device.type != "cuda":
        return by_torch()
    if not defer:
        if _fused_pass(case, ref_args, kwargs, before, after, fused, budget):
            return None  # one sync, no torch reference: the common path on a GPU
        return by_torch()
    read = _fused_launch(case, ref_args, kwargs, before, after, fused, batched=True)
    if read is None:
        return by_torch()

    def finish() -> Verdict | None:
        return None if _fused_read(read, out, state, budget) else by_torch()
    return Deferred(finish)  # read with its batch (the campaign's --read-every)


def _masks(case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
           after: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Cells of the ``out`` base outside the view (guards), the state base's cells that
    changed outside the slots named by an index (``written``: two passes over the pool),
    and the padding rows; no device sync."""
    idx = case.tensors["ssm_state_indices"].view(before["ssm_state_indices"]).to(torch.long)
    n = case.tensors["initial_state"].shape[0]
    named = torch.zeros(n + 1, dtype=torch.bool, device=idx.device)
    named.index_fill_(0, torch.where((idx >= 0) & (idx < n), idx, n), True)
    return {"guard": _out_guard(case, after), "written": _written(case, before, after, named[:n]),
            "pad": kwargs["ssm_state_indices"] < 0}


def _out_guard(case: Case, after: dict[str, torch.Tensor]) -> torch.Tensor:
    """The cells of ``out``'s base outside the view."""
    guard = torch.ones_like(after["out"], dtype=torch.bool)
    case.tensors["out"].view(guard).fill_(False)
    return guard


def _written(case: Case, before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
             named: torch.Tensor) -> torch.Tensor:
    """The state base's cells that changed outside the ``named`` slots (a bool per slot):
    two passes over the pool."""
    written = _bits(after["initial_state"]) != _bits(before["initial_state"])
    case.tensors["initial_state"].view(written).masked_fill_(named[:, None, None, None], False)
    return written


def _fused_pass(case: Case, views: dict[str, Any], kwargs: dict[str, Any],
                before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], fused: Fused,
                budget: dict[str, float] | None) -> bool:
    """Whether every rule holds, decided by ``packed_fused`` and a few byte comparisons in
    one read of the device (some ten kernels in all); raises ``Unjudgeable`` where
    the torch oracle would. False sends the case to the torch oracle (which names the
    broken rule, or finds none)."""
    read = _fused_launch(case, views, kwargs, before, after, fused)
    return read is not None and _fused_read(read, kwargs["out"], kwargs["initial_state"],
                                            budget)


def _fused_launch(case: Case, views: dict[str, Any], kwargs: dict[str, Any],
                  before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                  fused: Fused, batched: bool = False) -> Callable[[], list[float]] | None:
    """``_fused_values`` launched; what reads them back (a sync), or None where the fast
    path does not judge this case. ``batched`` (a read left for later): they go to a row of
    ``BATCH``, read with the other rows in one transfer (where it has none free, alone)."""
    from kda_fuzz.families.packed import fused as pf

    if pf.broken is not None or not _as_handed(case, kwargs, after):
        return None
    try:
        row = BATCH.row(2 + pf.COLUMNS, kwargs["initial_state"].device) if batched else None
        if row is not None:  # a row of the batch's buffer, read with the others at once
            _fused_values(case, views, kwargs, before, after, fused, values=row[0])
            index = row[1]
            return lambda: BATCH.read(index)
        return _fused_values(case, views, kwargs, before, after, fused).tolist
    except Exception as e:
        if device_error(e):  # the target's asynchronous fault: the caller's to report
            raise
        pf.disable(e)  # the fast path's own failure, never a verdict: torch from now on
        return None


class _Batch:
    """The fused judge's values of cases launched and not read yet (a campaign's
    ``--read-every`` batch): each case's in a row of one device buffer, so that the first
    read copies every row launched so far in one transfer (one wait on the device) and
    the others read that copy. Rows are handed out again once each has been read; while
    a batch is being read, or full, there is none (the case's values are read alone)."""

    ROWS = 64

    def __init__(self) -> None:
        self.rows: torch.Tensor | None = None
        self.used = 0  # rows handed out
        self.done = 0  # rows read
        self.host: list[list[float]] | None = None  # the copy being read

    def row(self, width: int, device: torch.device) -> tuple[torch.Tensor, int] | None:
        """A free row (and its index) of ``width`` float64 on ``device``, or None."""
        if self.host is not None or self.used >= self.ROWS:
            return None
        if self.rows is None or self.rows.device != device or self.rows.shape[1] != width:
            if self.used:
                return None  # (rows of another device still to read)
            self.rows = torch.empty(self.ROWS, width, dtype=torch.float64, device=device)
        self.used += 1
        return self.rows[self.used - 1], self.used - 1

    def read(self, index: int) -> list[float]:
        """Row ``index``'s values (the first read of a batch copies all its rows)."""
        assert self.rows is not None and index < self.used
        if self.host is None:
            self.host = self.rows[:self.used].tolist()
        values = self.host[index]
        self.done += 1
        if self.done == self.used:  # every row read: the buffer is free again
            self.used = self.done = 0
            self.host = None
        return values


BATCH = _Batch()


def _fused_read(read: Callable[[], list[float]], out: torch.Tensor, state: torch.Tensor,
                budget: dict[str, float] | None) -> bool:
    """``_fused_pass``'s decision on the values ``read()`` returns (see there)."""
    from kda_fuzz.families.packed import fused as pf

    try:
        changed, touched, *s = read()
    except Exception as e:
        if device_error(e):  # the target's asynchronous fault: the caller's to report
            raise
        pf.disable(e)  # the fast path's own failure, never a verdict: torch from now on
        return False
    if s[pf.PAST_POOL] or changed or touched or s[pf.PADDING_NONZERO]:
        return False
    if s[pf.UNFIT]:  # every rule but the numbers holds (as in _diagnose)
        raise Unjudgeable("float64 result exceeds half the range of the stored dtype")
    if s[pf.OUT_OF_BOUND]:
        return False
    if budget is not None and s[pf.OUT_RATIO] >= 0:
        budget[f"out/{short_dtype(out.dtype)}"] = s[pf.OUT_RATIO]
        budget[f"state/{short_dtype(state.dtype)}"] = s[pf.STATE_RATIO]
    return True


def _fused_values(case: Case, views: dict[str, Any], kwargs: dict[str, Any],
                  before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                  fused: Fused, values: torch.Tensor | None = None) -> torch.Tensor:
    """``_fused_pass``'s launches, no sync: on the case's device, the bytes changed, the
    pool cells written outside the named slots, then ``packed_fused``'s summary (in
    ``values`` where given: ``2 + COLUMNS`` float64 on that device)."""
    from kda_fuzz.families.packed import fused as pf

    out, state = kwargs["out"], kwargs["initial_state"]
    # what is read back, written in place by each reduction (no stack, cast or cat)
    if values is None:
        values = torch.empty(2 + pf.COLUMNS, dtype=torch.float64, device=state.device)
    named = torch.zeros(state.shape[0], dtype=torch.int8, device=state.device)
    pf.summary(views, state, out, gate_per_key=fused.gate_per_key, named=named,
               out=values[2:])
    _changed_bytes(case, before, after, out=values[0])
    # the pool: every cell outside the slots the kernel saw named is bit-identical
    written = _written(case, before, after, named.view(torch.bool))
    torch.sum(written.view(-1), 0, dtype=torch.float64, out=values[1])
    return values


def _as_handed(case: Case, kwargs: dict[str, Any], after: dict[str, torch.Tensor]) -> bool:
    """``out`` and ``initial_state`` are still the views handed over (a target may have
    resized or re-typed them: the kernel would read past them; the torch oracle says so)."""
    for name in ("out", "initial_state"):
        t, arg, base = kwargs[name], case.tensors[name], after[name]
        if (tuple(t.shape), t.stride(), t.dtype) != (arg.shape, arg.stride, arg.dtype) or \
                t.data_ptr() != base.data_ptr() + arg.offset * base.element_size():
            return False
    return True


def _changed_bytes(case: Case, before: dict[str, torch.Tensor],
                   after: dict[str, torch.Tensor], *, out: torch.Tensor) -> None:
    """How many bytes of the read-only inputs' bases and of the guard cells of ``out``'s
    base changed, summed into ``out`` (a 0-dim float64 device tensor; four kernels)."""
    olds, news = [before[n] for n in READ_ONLY], [after[n] for n in READ_ONLY]
    arg = case.tensors["out"]
    if arg.view().is_contiguous():  # the view is one run of the base: guards around it
        cut = (slice(0, arg.offset), slice(arg.offset + arg.view().numel(), None))
        olds += [before["out"][c] for c in cut]
        news += [after["out"][c] for c in cut]
    else:
        guard = _out_guard(case, after)
        olds.append(before["out"][guard])  # (a sync; valid layouts never come here)
        news.append(after["out"][guard])
    a = torch.cat([t.view(torch.uint8) for t in olds])  # 1-D bases and runs of them
    b = torch.cat([t.view(torch.uint8) for t in news])
    torch.sum(a != b, 0, dtype=torch.float64, out=out)


def within(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor,
            ratios: list[torch.Tensor] | None = None) -> torch.Tensor:
    """All elements within bound (a device boolean); with ``ratios``, appends the largest
    |got - ref| / bound (NaN when an error is NaN) as a 0-dim float64 device tensor."""
    err = (got - ref).abs_()  # promoted to float64 in the subtraction
    if ratios is not None:
        ratios.append((err / bound).amax() if err.numel()
                      else torch.zeros((), dtype=torch.float64, device=err.device))
    return (err <= bound).all()


def fits(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Finite and within half the range of ``dtype`` (a device boolean)."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    return t.abs().amax() <= tol.half_max(dtype)  # NaN and inf propagate: False


def _all_pass(kwargs: dict[str, Any], before: dict[str, torch.Tensor],
              after: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
              masks: dict[str, torch.Tensor], budget: dict[str, float] | None = None) -> bool:
    """Every rule of ``_diagnose`` at once, as device booleans read back together (with
    ``budget``, the error-budget ratios too, in the same read; see ``judge``)."""
    out, state = kwargs["out"], kwargs["initial_state"]
    ratios: list[torch.Tensor] | None = [] if budget is not None else None
    flags = [(_bits(before[n]) == _bits(after[n])).all() for n in READ_ONLY]
    flags += [fits(ref["out"], out.dtype), fits(ref["state"], state.dtype)]
    flags.append(((_bits(after["out"]) == _bits(before["out"])) | ~masks["guard"]).all())
    flags.append(((out == 0).flatten(1).all(1) | ~masks["pad"]).all())
    flags.append(within(out[ref["rows"], 0], ref["out"], ref["out_bound"], ratios))
    flags.append(~masks["written"].any())
    flags.append(within(state[ref["slots"]], ref["state"], ref["state_bound"], ratios))
    if ratios is None or budget is None:
        return bool(torch.stack(flags).all())
    values = torch.cat([torch.stack(flags).to(torch.float64), torch.stack(ratios)]).tolist()
    if ref["rows"].numel():
        budget[f"out/{short_dtype(out.dtype)}"] = values[-2]
        budget[f"state/{short_dtype(state.dtype)}"] = values[-1]
    return all(v == 1.0 for v in values[:-2])


def _diagnose(kwargs: dict[str, Any], before: dict[str, torch.Tensor],
              after: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
              masks: dict[str, torch.Tensor]) -> Verdict | None:
    """The first broken rule, in order, with its evidence. A float64 result too large for
    the stored dtype is not judged numerically (``Unjudgeable``); every other rule still
    holds for it."""
    out, state = kwargs["out"], kwargs["initial_state"]
    for name in READ_ONLY:
        if not same_bits(before[name], after[name]):
            return Verdict("mismatch", f"mutated-{name}", f"read-only input `{name}` was modified")

    # out: guard cells untouched, padding rows exactly zero, valid rows within bound.
    guard = masks["guard"]
    if not torch.equal(_bits(after["out"])[guard], _bits(before["out"])[guard]):
        return Verdict("mismatch", "out-guard-written", "wrote outside `out`'s elements")
    idx = kwargs["ssm_state_indices"].to(torch.long)
    pad = masks["pad"].nonzero().squeeze(1)
    if pad.numel():
        pad_vals = out[pad]
        if not bool((pad_vals == 0).all()):
            row = int(pad[(pad_vals != 0).flatten(1).any(1)][0])
            return Verdict("mismatch", "padding-row-not-zero",
                           f"padding row {row} (index {int(idx[row])}) of `out` is not all zeros: "
                           f"{out[row].flatten()[:8].tolist()}", output="out", where=[row])
    if not bool(fits(ref["out"], out.dtype) & fits(ref["state"], state.dtype)):
        v = _untouched(masks)
        if v is not None:
            return v
        raise Unjudgeable("float64 result exceeds half the range of the stored dtype")
    rows, slots = ref["rows"], ref["slots"]
    v = compare("out", out[rows, 0], ref["out"], ref["out_bound"], rows, slots)
    if v is not None:  # say what the state looks like too
        sx = _excess(state[slots], ref["state"], ref["state_bound"])
        if sx is None:
            tail = "state: within tolerance"
        else:
            index, _, words = _place("initial_state", sx["pos"], rows, slots)
            tail = (f"state: {sx['bad']} of {sx['numel']} elements out of tolerance "
                    f"(worst initial_state{index}, {words}: {sx['ratio']:.3g}x the bound)")
        outputs = ["out", "initial_state"] if sx else ["out"]
        return replace(v, detail=f"{v.detail}; {tail}",
                       notes={**v.notes, "state_out_of_tolerance": sx["bad"] if sx else 0},
                       wrong_outputs=outputs)

    # state: every cell of the pool outside the named slots bit-identical; those within bound.
    return _untouched(masks) or compare("initial_state", state[slots], ref["state"],
                                         ref["state_bound"], rows, slots)


def _untouched(masks: dict[str, torch.Tensor]) -> Verdict | None:
    """The pool's cells outside the slots named by a non-negative index are unchanged."""
    written = masks["written"]
    if bool(written.any()):
        cell = int(written.nonzero()[0, 0])
        return Verdict("mismatch", "untouched-state-written",
                       f"state pool element {cell} of the base buffer, outside every slot named by "
                       f"a non-negative index, changed", output="initial_state", where=[cell])
    return None


def cross_judge(case: Case, before: dict[str, torch.Tensor],
                results: list[tuple[str, dict[str, Any]]], *,
                reference: Reference | None = None) -> Verdict | None:
    """Peer mode: two implementations' outputs on the same accepted layout agree within
    the sum of their tolerance bounds (each bound as in ``judge``)."""
    ref_args = {n: case.tensors[n].view(before[n]) for n in case.tensors}
    ref_args.update(case.scalars)
    ref = (reference or reference64)(ref_args)
    (name_a, a), (name_b, b) = results[0], results[1]
    rows, slots = ref["rows"], ref["slots"]
    for output, got_a, got_b, bound in (
        ("out", a["out"][rows, 0], b["out"][rows, 0], ref["out_bound"]),
        ("initial_state", a["initial_state"][slots], b["initial_state"][slots],
         ref["state_bound"]),
    ):
        v = compare(output, got_a, got_b.to(torch.float64), 2 * bound, rows, slots)
        if v is not None:
            detail = v.detail.replace("the float64 reference", name_b).replace(
                "got", f"{name_a} gave", 1).replace("expected", f"{name_b} gave", 1)
            return Verdict("mismatch", f"peers-disagree-{output}", detail, output=output,
                           max_error=v.max_error, where=v.where, notes=v.notes)
    return None



def upgrade_verdict(v: Verdict) -> Verdict:
    """A verdict read from a corpus file in today's terms: files written before
    ``wrong_outputs`` was recorded said that the state was out of tolerance too (wrong
    values of ``out``) only by ``notes["state_out_of_tolerance"]``."""
    if v.wrong_outputs or not v.notes.get("state_out_of_tolerance"):
        return v
    named = sorted({*([v.output] if v.output else []), "initial_state"})
    return replace(v, wrong_outputs=named)
