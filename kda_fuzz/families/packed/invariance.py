"""Batch invariance of a packed decode step: a row's result must not depend on which other
rows share its batch, nor on its place in it.

A valid case yields three sub-batches: its first live row alone (a batch of one), the same
row in place with every other row made padding (the batch's shapes kept), and all its rows
in reverse order. Each keeps everything else of the case as it is (dtypes, strides and
offsets of every tensor, guard cells, the whole state pool), so that only the batch
changes. The last two keep every shape, so a kernel specialized on shapes compiles nothing
for them. ``differs`` compares a sub-batch's rows with the same rows of the full batch,
bitwise: ``out`` row by row, and the state slot each live row names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from kda_fuzz.engine.case import Case, TensorArg
from kda_fuzz.engine.contract import BatchInvariance

# the tensors whose first dimension is the batch (row b of each belongs to row b)
ROWS = ("mixed_qkv", "a", "b", "out", "ssm_state_indices")


def _rows_of(view: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``view``'s ``rows`` (of its first dimension), in that order: a slice for a run of
    consecutive rows, a flipped slice for a reversed run (no index tensor to copy to the
    device: that would wait for the device's queue), else an index."""
    lo, hi = min(rows), max(rows)
    if rows == list(range(lo, hi + 1)):
        return view[lo:hi + 1]
    if rows == list(range(hi, lo - 1, -1)):
        return view[lo:hi + 1].flip(0)
    return view[torch.tensor(rows).to(view.device)]


def _take_rows(arg: TensorArg, rows: list[int]) -> TensorArg:
    """``arg`` with only ``rows`` of its first dimension, in that order: the same strides,
    offset and guard cells (a base as long as the fewer rows need, copied from ``arg``'s)."""
    shape = (len(rows), *arg.shape[1:])
    reach = sum((n - 1) * abs(s) for n, s in zip(shape, arg.stride) if n > 0)
    need = arg.offset + reach + 1 if all(shape) else arg.offset
    base = torch.empty(max(need, 1), dtype=arg.base.dtype, device=arg.base.device)
    n = min(base.numel(), arg.base.numel())
    base[:n] = arg.base[:n]
    if n < base.numel():
        base[n:] = 0
    out = TensorArg(base, shape, arg.stride, arg.offset)
    if rows and all(shape):
        out.view(base).copy_(_rows_of(arg.view(), rows))
    return out


def _padded(arg: TensorArg, keep: int) -> TensorArg:
    """``ssm_state_indices`` with every row but ``keep`` made padding (-1): a copy."""
    base = arg.base.clone()
    out = TensorArg(base, arg.shape, arg.stride, arg.offset)
    view = out.view(base)
    kept = view[keep].clone()
    view.fill_(-1)
    view[keep] = kept
    return out


def sub_batches(case: Case) -> Iterator[tuple[str, Case, list[int]]]:
    """``(name, sub-case, rows)``, each built when it is drawn (cheapest first): each
    sub-case's row ``j`` is the case's row ``rows[j]`` (-1: a padding row of the sub-case,
    none of the case's). None for a case with no live row or a single row."""
    idx = case.tensors["ssm_state_indices"].view().to(torch.long).cpu()
    B = idx.shape[0] if idx.dim() == 1 else 0
    live = (idx >= 0).nonzero().flatten().tolist() if B else []
    if not live or B < 2:
        return
    notes = {k: v for k, v in case.notes.items() if k not in ("rows", "live_rows", "tail_rows")}

    def taken(rows: list[int]) -> Case:
        tensors = {n: (_take_rows(t, rows) if n in ROWS else t) for n, t in case.tensors.items()}
        return replace(case, tensors=tensors, notes=notes)

    yield "alone", taken([live[0]]), [live[0]]
    if len(live) > 1:  # (a single live row: the case is its own padded sub-batch)
        tensors = {**case.tensors, "ssm_state_indices": _padded(
            case.tensors["ssm_state_indices"], live[0])}
        yield ("padded", replace(case, tensors=tensors, notes=notes),
               [b if b == live[0] else -1 for b in range(B)])
    rows = list(range(B - 1, -1, -1))
    yield "reversed", taken(rows), rows


def differs(case: Case, full: dict[str, Any], sub_case: Case, sub: dict[str, Any],
            rows: list[int]) -> str | None:
    """Where the sub-batch's results differ bitwise from the full batch's (None: nowhere):
    the first row whose ``out`` or state slot differs, found in one comparison each."""
    pairs = [(j, r) for j, r in enumerate(rows) if r >= 0]
    if not pairs:
        return None
    idx = case.tensors["ssm_state_indices"].view().to(torch.long).cpu().tolist()
    js, rs = [j for j, _ in pairs], [r for _, r in pairs]
    found = _unequal_rows(_rows_of(full["out"], rs), _rows_of(sub["out"], js))
    out_rows = [js[i] for i in found]
    slots = [(j, r, idx[r]) for j, r in pairs if idx[r] >= 0]
    state_rows: list[int] = []
    if slots:
        at = torch.tensor([s for _, _, s in slots]).to(full["initial_state"].device)
        bad = _unequal_rows(full["initial_state"][at], sub["initial_state"][at])
        state_rows = [slots[i][0] for i in bad]
    for j in sorted({*out_rows, *state_rows}):
        r = rows[j]
        if j in out_rows:
            return f"`out` row {r} (row {j} of the sub-batch): " \
                f"{_first(full['out'][r], sub['out'][j])}"
        slot = idx[r]
        return f"state slot {slot} of row {r} (row {j} of the sub-batch): " \
            f"{_first(full['initial_state'][slot], sub['initial_state'][slot])}"
    return None


def _unequal_rows(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """The rows (first dimension) where ``a`` and ``b`` differ in any bit."""
    if a.shape != b.shape:
        return list(range(max(a.shape[0] if a.dim() else 0, b.shape[0] if b.dim() else 0)))
    if a.numel() == 0:
        return []
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
    if bits is None:  # (no such dtype in the packed families)
        return [i for i in range(a.shape[0]) if not torch.equal(a[i], b[i])]
    ne = a.contiguous().view(bits) != b.contiguous().view(bits)
    return ne.reshape(a.shape[0], -1).any(1).nonzero().flatten().tolist()


def _first(a: torch.Tensor, b: torch.Tensor) -> str:
    fa, fb = a.flatten(), b.flatten()
    diff = ~((fa == fb) | (fa.isnan() & fb.isnan()))
    at = int(diff.nonzero()[0, 0]) if bool(diff.any()) else 0
    return f"element {at}: {fa[at].item()!r} in the full batch, {fb[at].item()!r} in the sub-batch"


BATCH = BatchInvariance(sub_batches, differs, unit="rows")

__all__ = ["BATCH", "ROWS", "differs", "sub_batches"]
