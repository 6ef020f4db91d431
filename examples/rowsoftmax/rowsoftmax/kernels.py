"""Two implementations of ``softmax_rows(x, out)`` (rowsoftmax/contract.py): a correct
one, and one with two planted bugs (out's dtype checked before its shape; no max
subtraction, in the input's dtype). Both raise ValueError with the contract's exact
messages."""

from __future__ import annotations

import torch

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_rank(x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D, got {x.dim()}-D")


def _check_shape(x: torch.Tensor, out: torch.Tensor) -> None:
    if out.shape != x.shape:
        raise ValueError(f"out must have shape {tuple(x.shape)}, got {tuple(out.shape)}")


def _check_dtypes(x: torch.Tensor, out: torch.Tensor) -> None:
    if x.dtype not in SUPPORTED:
        raise ValueError(f"x must be float16, bfloat16 or float32, got {_name(x.dtype)}")
    if out.dtype != x.dtype:
        raise ValueError(f"out must be {_name(x.dtype)} like x, got {_name(out.dtype)}")


def _check_rest(x: torch.Tensor, out: torch.Tensor) -> None:
    if x.shape[1] == 0:
        raise ValueError("x must have at least one column")
    if x.shape[1] > 1 and (x.stride(1) != 1 or out.stride(1) != 1):
        raise ValueError(f"rows must be contiguous, got column strides {x.stride(1)} "
                         f"(x) and {out.stride(1)} (out)")


def softmax_rows(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[r] = softmax(x[r])`` for each row, in float32; returns ``out``."""
    _check_rank(x)
    _check_shape(x, out)
    _check_dtypes(x, out)
    _check_rest(x, out)
    if x.shape[0]:
        v = x.float()
        e = torch.exp(v - v.amax(dim=1, keepdim=True))
        out.copy_(e / e.sum(dim=1, keepdim=True))
    return out


def softmax_rows_buggy(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The planted bugs: dtypes checked before shapes (check 4 before check 2), and the
    softmax computed in the input's own dtype with no max subtraction (bfloat16 rows are
    off by more than its rounding; float16 rows with values past ~11 overflow to NaN)."""
    _check_rank(x)
    _check_dtypes(x, out)  # bug 1: check 2 must come first
    _check_shape(x, out)
    _check_rest(x, out)
    if x.shape[0]:
        e = torch.exp(x)  # bug 2: no max subtraction, not in float32
        out.copy_(e / e.sum(dim=1, keepdim=True))
    return out
