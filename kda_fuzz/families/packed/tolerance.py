"""The packed decode families' tolerance policy: the constants and small helpers of the
forward-error bounds, shared by the torch oracle (``packed_judge``) and its fused GPU
form (``packed_fused``).

Per element, |got - ref| <= bound, where the bound is a forward error estimate of float32
arithmetic built from the magnitudes of the terms (``gamma``: 8 (K + 16) 2^-24 per
accumulated product; ``scale_ulp``: the float32 rounding of ``scale``, subnormal
included; ``underflow``: an absolute term of 2^-150 per product), plus one rounding of
the stored dtype (``eps`` times |ref|) and the dtype's subnormal spacing (``tiny``).
Results past ``half_max`` of the stored dtype are not judged numerically.
``beta_rounding``: the relative error of beta rounded once to ``b``'s dtype (GDN).
"""

from __future__ import annotations

import torch

U32 = 2.0**-24


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def tiny(dtype: torch.dtype) -> float:
    fi = torch.finfo(dtype)
    return fi.smallest_normal * fi.eps


def half_max(dtype: torch.dtype) -> float:
    """Half the dtype's range: a float64 result past it is not judged numerically."""
    return 0.5 * torch.finfo(dtype).max


def gamma(K: int) -> float:
    """The forward-error factor of one accumulated product over K terms in float32."""
    return 8.0 * (K + 16) * U32


def underflow(K: int) -> float:
    """The absolute error that underflow may add to one ``out`` element in float32: in the
    standard model each product or quotient is ``(x op y)(1 + d) + e`` with ``|e| <= 2^-150``
    (half the subnormal spacing), and one element takes at most 2K + 2 of them (K products
    with ``q``, each maybe with ``scale`` folded in, and ``scale`` itself)."""
    return (2 * K + 2) * 2.0**-150


def scale_ulp(sc: float) -> float:
    """The float32 rounding of ``|scale|``: 2^-24 relative, or the subnormal spacing
    2^-149 when it is tiny (a float64 scale of 1e-44 is subnormal in float32)."""
    return max(sc * U32, 2.0**-149)


def beta_rounding(b_dtype: torch.dtype) -> float:
    """The relative error of beta rounded once to ``b``'s dtype (unit roundoff, eps / 2):
    what GDN's tolerance admits (spec section 3, last paragraph)."""
    return eps(b_dtype) / 2
