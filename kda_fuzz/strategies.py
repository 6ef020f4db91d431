"""Hypothesis strategies of packed decode layouts, for your own property tests.

Each strategy draws :class:`~kda_fuzz.engine.case.Case` values: the arguments of one call of a
family's entry point (tensors as strided views of guarded buffers, scalars), with the
contract variant they were drawn for. Give one to :func:`kda_fuzz.check` or
:func:`kda_fuzz.assert_conforms` with your kernel::

    from hypothesis import given
    import kda_fuzz
    from kda_fuzz.strategies import valid_layouts

    @given(valid_layouts("kda", "triton", H=16, HV=32, K=128, V=128, state="bfloat16",
                         B=[1, 3, 64]))
    def test_my_kernel(case):
        kda_fuzz.assert_conforms(my_kernel, case)

A family is named (a built-in one, or one the ``pyproject.toml`` of the project the
current directory is in registers) or given as its :class:`~kda_fuzz.engine.contract.Contract`.
Both strategies compose like any other (``map``, ``filter``, ``one_of``, ``@example``
with a case you built) and build on any device (``device="cuda"``). Shrinking is
Hypothesis' own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import Contract
from kda_fuzz.families import contract_of

__all__ = ["breakages", "broken_layouts", "valid_layouts"]


def _resolve(family: str | Contract, variant: str | None) -> tuple[Contract, str]:
    contract = contract_of(family)  # a project's family by name, or a Contract (registered)
    variant = variant or contract.variants[0]
    contract.checks_for(variant)  # raises ValueError naming the variants
    return contract, variant


def valid_layouts(family: str | Contract = "kda", variant: str | None = None, *,
                  device: str = "cpu", budget: int | None = None, max_b: int | None = None,
                  **pins: Any) -> st.SearchStrategy[Case]:
    """Layouts the contract ``variant`` accepts (default: the family's first variant).

    ``pins`` fix layout fields, each to a value, a list of values (one is drawn per case)
    or a strategy: ``B``, ``H``, ``HV``, ``K``, ``V``, ``num_slots`` (or ``slots``),
    ``spare_slots``, the dtypes (``qkv_dtype`` or ``dtype``, ``ab_dtype``, ``param_dtype``,
    ``out_dtype``, ``state_dtype`` or ``state``, ``idx_dtype`` or ``indices``; a
    ``torch.dtype`` or a name such as ``"bf16"``), ``padding`` (``"none"``, ``"some"``,
    ``"first"``, ``"last"``, ``"all"``), ``pad_value`` (``"-1"``, ``"any"``, ``"min"``),
    ``strides`` (False: contiguous tensors, no padded rows or slots), the pads one by one
    (``qkv_row_pad``, ``a_row_pad``, ``b_row_pad``, ``slot_pad``, ``guard``),
    ``use_qk_l2norm_in_kernel`` (or ``l2norm``), ``lower_bound`` (None: off; not in gdn)
    and ``scale``. Unpinned fields are drawn over the whole valid space, within ``budget``
    state elements per case (pinned sizes go past it) and ``max_b`` rows. A pin no valid
    layout can have raises ``ValueError`` here, not at the first draw."""
    contract, variant = _resolve(family, variant)
    kw: dict[str, Any] = {"device": device, "pins": pins}
    if budget is not None:
        kw["budget"] = budget
    if max_b is not None:
        kw["max_b"] = max_b
    return contract.valid_cases(variant, **kw)


def breakages(family: str | Contract = "kda", variant: str | None = None
              ) -> dict[str, int | None]:
    """The named breakages of a variant and the check each aims at (None: a semantic rule
    the checks may not see; a contract that accepts it has a validation gap)."""
    contract, variant = _resolve(family, variant)
    if contract.aims is None:
        return {name: None for arm, names in contract.broken_arms(variant) for name in names}
    return dict(contract.aims(variant))


def broken_layouts(family: str | Contract = "kda", variant: str | None = None, *,
                   checks: int | Iterable[int] | None = None,
                   breakages: str | Iterable[str] | None = None,
                   device: str = "cpu") -> st.SearchStrategy[Case]:
    """Layouts the contract ``variant`` rejects: a valid layout with breakages applied.

    ``checks``: each case is broken by one breakage aimed at one of these check numbers.
    ``breakages``: these named breakages, applied together (see :func:`breakages` for the
    names). Neither: one to three breakages at random. The expected outcome always comes
    from the contract (the first failing check wins), whatever was applied."""
    contract, variant = _resolve(family, variant)
    if checks is not None and breakages is not None:
        raise ValueError("give checks or breakages, not both")
    if breakages is not None:
        names = (breakages,) if isinstance(breakages, str) else tuple(breakages)
        return contract.broken_cases(variant, device=device, only=names)
    if checks is None:
        return contract.broken_cases(variant, device=device)
    wanted = {checks} if isinstance(checks, int) else set(checks)
    aims = globals()["breakages"](contract, variant)
    chosen = sorted(n for n, c in aims.items() if c in wanted)
    numbers = {c.number for c in contract.checks_for(variant)}
    if not wanted <= numbers:
        raise ValueError(f"variant {variant!r} of {contract.name!r} has no check(s) "
                         f"{sorted(wanted - numbers)} (it has {sorted(numbers)})")
    if not chosen:
        raise ValueError(f"no breakage of {contract.name}/{variant} aims at check(s) "
                         f"{sorted(wanted)}")
    return st.one_of(*(contract.broken_cases(variant, device=device, only=(n,))
                       for n in chosen))
