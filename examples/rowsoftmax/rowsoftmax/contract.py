"""The ``rowsoftmax`` family: ``softmax_rows(x, out)`` writes the softmax of each row of
``x`` into ``out`` and returns ``out``.

The contract, as its users read it:

* ``x`` and ``out`` are 2-D, of one shape ``[R, C]`` and one dtype (float16, bfloat16 or
  float32); ``C >= 1``; their rows may lie any distance apart, but each row is
  contiguous (column stride 1; any stride where ``C == 1``). ``R == 0`` is valid.
* A call that breaks a rule raises ``ValueError`` with the message of the first check
  below that fails, exactly, and writes nothing.
* A valid call writes ``out[r, c] = exp(x[r, c]) / sum_j exp(x[r, j])`` to within the
  rounding of ``out``'s dtype, writes nothing else (not ``x``, not a cell of ``out``'s
  buffer outside the view) and returns ``out``.

Checks, in order (the messages are format strings over the call's arguments and the
derived values of ``DERIVED``):

1. ``x must be 2-D, got {x_rank}-D``
2. ``out must have shape {x_shape}, got {out_shape}``
3. ``x must be float16, bfloat16 or float32, got {x_dtype}``
4. ``out must be {x_dtype} like x, got {out_dtype}``
5. ``x must have at least one column``
6. ``rows must be contiguous, got column strides {x_col} (x) and {out_col} (out)``
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from kda_fuzz.engine.case import Case, TensorArg, guarded_arg
from kda_fuzz.engine.contract import DTYPE_NAMES, Check, Contract, MessageValues, Namespace
from kda_fuzz.engine.verdict import Verdict
from rowsoftmax.knobs import KNOBS, MAX_COLS

NAME = "rowsoftmax"
SIGNATURE = ("x", "out")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _col(t: torch.Tensor) -> int:
    return t.stride(1) if t.dim() == 2 else 1


DERIVED = {
    "x_rank": lambda ns: ns.x.dim(),
    "x_shape": lambda ns: tuple(ns.x.shape),
    "out_shape": lambda ns: tuple(ns.out.shape),
    "x_dtype": lambda ns: _name(ns.x.dtype),
    "out_dtype": lambda ns: _name(ns.out.dtype),
    "x_col": lambda ns: _col(ns.x),
    "out_col": lambda ns: _col(ns.out),
}


def _strided_rows(ns: Namespace) -> bool:
    return ns.x.shape[1] > 1 and (ns.x_col != 1 or ns.out_col != 1)


CHECKS = (
    Check(1, lambda ns: ns.x.dim() != 2, "x must be 2-D, got {x_rank}-D"),
    Check(2, lambda ns: ns.out.shape != ns.x.shape,
          "out must have shape {x_shape}, got {out_shape}"),
    Check(3, lambda ns: ns.x.dtype not in DTYPES,
          "x must be float16, bfloat16 or float32, got {x_dtype}"),
    Check(4, lambda ns: ns.out.dtype != ns.x.dtype,
          "out must be {x_dtype} like x, got {out_dtype}"),
    Check(5, lambda ns: ns.x.shape[1] == 0, "x must have at least one column"),
    Check(6, _strided_rows,
          "rows must be contiguous, got column strides {x_col} (x) and {out_col} (out)"),
)

# ------------------------------------------------------------------ cases


@st.composite
def _layout(draw: Any, max_cols: int) -> dict[str, Any]:
    """The fields of a valid call: sizes, dtype, row padding and guard cells, values."""
    return {"rows": draw(st.integers(0, 6)), "cols": draw(st.integers(1, max_cols)),
            "dtype": draw(st.sampled_from(DTYPES)),
            "pad": (draw(st.integers(0, 3)), draw(st.integers(0, 3))),
            "guard": (draw(st.integers(0, 2)), draw(st.integers(0, 2))),
            "scale": draw(st.sampled_from((1.0, 4.0, 16.0))),
            "seed": draw(st.integers(0, 2**16))}


def _build(lay: dict[str, Any], variant: str, device: str, intent: tuple[str, ...],
           x_shape: tuple[int, ...] | None = None, out_shape: tuple[int, ...] | None = None,
           x_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
           col_stride: tuple[int, int] = (1, 1)) -> Case:
    shape = (lay["rows"], lay["cols"])
    x_shape, out_shape = x_shape or shape, out_shape or shape
    gen = torch.Generator().manual_seed(lay["seed"])
    values = torch.randn(x_shape, generator=gen, dtype=torch.float64) * lay["scale"]

    def arg(shape: tuple[int, ...], dtype: torch.dtype, values: torch.Tensor | None,
            pad: int, guard: int, col: int) -> TensorArg:
        if col == 1:
            pads = (pad,) + (0,) * (len(shape) - 1)
            return guarded_arg(shape, dtype, values, pad=pads, guard=guard, device=device)
        # a column stride of ``col``: rows ``col * cols + pad`` apart
        stride = (col * shape[1] + pad, col)
        return guarded_arg(shape, dtype, values, stride=stride, guard=guard, device=device)

    tensors = {
        "x": arg(x_shape, x_dtype or lay["dtype"], values, lay["pad"][0], lay["guard"][0],
                 col_stride[0]),
        # out starts as guard values (NaN) everywhere: a valid call must write every cell
        "out": arg(out_shape, out_dtype or lay["dtype"], None, lay["pad"][1], lay["guard"][1],
                   col_stride[1]),
    }
    return Case(NAME, variant, tensors, {}, intent=intent)


def _no_pins(pins: Any) -> None:
    if pins:
        raise ValueError(f"family {NAME!r} takes no layout pins")


def valid_cases(variant: str, *, device: str = "cpu", family: Any = None,
                pins: Any = None, max_cols: int = MAX_COLS) -> st.SearchStrategy[Case]:
    """Valid calls: ``R`` in 0-6, ``C`` in 1-``max_cols``, padded rows, guard cells."""
    _no_pins(pins)
    return _layout(max_cols).map(lambda lay: _build(lay, variant, device, ("valid",)))


def _other(dtype: torch.dtype) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from([d for d in DTYPES if d != dtype])


@st.composite
def _broken(draw: Any, variant: str, device: str, names: tuple[str, ...]) -> Case:
    lay = draw(_layout(12))
    if "empty" in names:
        lay["cols"] = 0
    if "stride" in names:
        lay["cols"] = max(lay["cols"], 2)
    rows, cols = lay["rows"], lay["cols"]
    kw: dict[str, Any] = {}
    if "rank" in names:
        kw["x_shape"] = (rows, cols, 1)
    if "shape" in names:
        kw["out_shape"] = draw(st.sampled_from([(rows + 1, cols), (rows, cols + 1)]))
    if "x-dtype" in names:
        kw["x_dtype"] = kw["out_dtype"] = torch.float64
    if "out-dtype" in names:
        kw["out_dtype"] = draw(_other(lay["dtype"]))
    if "stride" in names:
        kw["col_stride"] = draw(st.sampled_from([(2, 1), (1, 2), (3, 3)]))
    return _build(lay, variant, device, names, **kw)


# breakage -> the check it aims at
BREAKAGES = {"rank": 1, "shape": 2, "x-dtype": 3, "out-dtype": 4, "empty": 5, "stride": 6}


def broken_arms(variant: str) -> list[tuple[str, tuple[str, ...]]]:
    """One arm per breakage, and shape with out-dtype together (check 2 must win)."""
    return [*((b, (b,)) for b in BREAKAGES), ("shape+out-dtype", ("shape", "out-dtype"))]


def broken_cases(variant: str, *, device: str = "cpu",
                 only: tuple[str, ...] | str | None = None,
                 pins: Any = None) -> st.SearchStrategy[Case]:
    """Broken calls: the breakages ``only`` names, else one arm drawn at random."""
    _no_pins(pins)
    if only is not None:
        return _broken(variant, device, (only,) if isinstance(only, str) else tuple(only))
    return st.sampled_from([names for _, names in broken_arms(variant)]).flatmap(
        lambda names: _broken(variant, device, names))


# ------------------------------------------------------------------ the judge


def _outside(arg: TensorArg) -> torch.Tensor:
    """The cells of ``arg``'s base outside its view (guard cells)."""
    inside = torch.zeros(arg.base.numel(), dtype=torch.bool, device=arg.base.device)
    inside.as_strided(arg.shape, arg.stride, arg.offset).fill_(True)
    return ~inside


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def judge(case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
          after: dict[str, torch.Tensor], result: Any,
          budget: dict[str, float] | None = None) -> Verdict | None:
    """A valid call's outcome, checked in full here (the engine checks none of it): ``x``
    unwritten, nothing of ``out``'s buffer outside the view written, ``out`` returned,
    every cell of ``out`` within the rounding of its dtype of the float64 reference."""
    if case.tensors["x"].device.type == "meta":
        return None
    if not _same_bits(before["x"], after["x"]):
        return Verdict("mismatch", "input-written", "the call wrote into x's buffer",
                       output="x")
    guard = _outside(case.tensors["out"])
    if not _same_bits(before["out"][guard], after["out"][guard]):
        return Verdict("mismatch", "wrote-outside-out",
                       "the call wrote guard cells of out's buffer, outside the view",
                       output="out")
    out = kwargs["out"]
    if not (isinstance(result, torch.Tensor) and result.data_ptr() == out.data_ptr()
            and result.shape == out.shape and result.stride() == out.stride()):
        return Verdict("mismatch", "wrong-return", f"returned {type(result).__name__}, "
                       "not out")
    if out.numel() == 0:
        return None
    ref = torch.softmax(kwargs["x"].double(), dim=1)
    got = out.double()
    info = torch.finfo(out.dtype)
    cols = out.shape[1]
    tol = (info.eps + 8 * cols * torch.finfo(torch.float32).eps) * ref + info.tiny
    err = (got - ref).abs()
    bad = ~(err <= tol)  # NaN counts as wrong
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        worst = float(torch.nan_to_num(err, nan=float("inf")).max())
        return Verdict("mismatch", "out-value",
                       f"{int(bad.sum())} of {out.numel()} cells of out are wrong; at "
                       f"{where}: {float(got[tuple(where)]):g}, reference "
                       f"{float(ref[tuple(where)]):g}", output="out", max_error=worst,
                       where=where)
    return None


CONTRACT = Contract(
    name=NAME,
    signature=SIGNATURE,
    checks=CHECKS,
    derived=DERIVED,
    judge=judge,
    valid_cases=valid_cases,
    broken_cases=broken_cases,
    broken_arms=broken_arms,
    aims=lambda variant: dict(BREAKAGES),
    knobs=KNOBS,
    default_targets={},
    # a message that reads as a check's is known by that check's format string (whatever
    # dtypes or sizes filled it); dtype names in any other message are values too
    message_values=MessageValues(patterns=(DTYPE_NAMES,)),
    doc=__doc__ or "",
)
