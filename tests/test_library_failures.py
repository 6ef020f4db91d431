"""The environment is not the kernel: a kernel library failing in its own code with the
versions installed here (numpy 2.4 under triton 3.6's interpreter, a deprecation made an
error, a missing name) is an environment error, counted as not a verdict or exit 2; the
kernel's own errors stay findings. And numpy 2.4 runs a ``range(pid, n, step)`` loop under
the interpreter (``execution/cpu.py``'s repair)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kda_fuzz import cli
from kda_fuzz.campaign.results import require_executed
from kda_fuzz.campaign.runner import campaign
from kda_fuzz.engine.oracle import EnvironmentFailure
from kda_fuzz.engine.targets import Target
from kda_fuzz.execution import cpu as _execution
from kda_fuzz.execution.cpu import ExecutionEnvironmentError, NotAScalar, environment_error
from kda_fuzz.families import get_contract
from tests.foreign import triton_grid_stride
from tests.test_kernels import Shape, check_kernel, make_case

KDA = get_contract("kda")
SMALL = {"budget": 2048, "max_b": 6}
NUMPY = importlib.metadata.version("numpy")
TRITON = importlib.metadata.version("triton")
numpy_24 = pytest.mark.skipif(tuple(int(p) for p in NUMPY.split(".")[:2]) < (2, 4),
                              reason="numpy < 2.4 converts one-element arrays itself")


def _raised(fn: Callable[[], Any]) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


@pytest.fixture
def unrepaired(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter as triton ships it: int() of a one-element array."""
    monkeypatch.setattr(_execution, "_scalar_index_patch", lambda interp: [])


def _grid_stride_args() -> tuple[Any, ...]:
    c = make_case(Shape(B=3, H=1, HV=2, K=8, V=8, slots=5, indices=(3, -1, 1)))
    return c.args(c.initial_state, c.out)


def test_grid_stride_loop_runs_under_the_interpreter() -> None:
    """B * HV = 6 pairs over 4 programs: two of them loop twice."""
    check_kernel(triton_grid_stride.decode,
                 make_case(Shape(B=3, H=1, HV=2, K=8, V=8, slots=5, indices=(3, -1, 1))))


@numpy_24
def test_numpy_24_in_the_interpreter_is_an_environment_error(unrepaired: None) -> None:
    e = _raised(lambda: triton_grid_stride.decode(*_grid_stride_args()))
    assert not isinstance(e, ExecutionEnvironmentError)
    assert "only 0-dimensional arrays" in repr(e)  # the failure of item 4, as reported
    cause = environment_error(e) or ""
    assert f"triton {TRITON}" in cause and f"numpy {NUMPY}" in cause, cause
    assert "not the kernel's" in cause


@numpy_24
def test_a_campaign_counts_it_as_not_a_verdict(unrepaired: None) -> None:
    report = campaign(KDA, "triton", [Target("grid", triton_grid_stride.decode)],
                      max_examples=12, seed=5, valid_share=1.0, **SMALL)
    assert not report.failures and report.valid_cases == 0 and report.unexecutable > 0
    with pytest.raises(EnvironmentFailure, match=f"numpy {NUMPY}"):
        require_executed(report)


@numpy_24
def test_the_cli_exits_2_with_one_line(unrepaired: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["fuzz", "--target", "tests.foreign.triton_grid_stride:decode",
                   "--contract", "triton", "--max-examples", "8", "--seed", "1", "--no-save",
                   "--no-isolate", "--jobs", "1", "--valid-share", "1.0", "--budget", "2048",
                   "--max-b", "6"])
    err = capsys.readouterr().err
    assert rc == 2, err
    line = next(x for x in err.splitlines() if "environment error" in x)
    assert f"numpy {NUMPY}" in line and f"triton {TRITON}" in line, err
    assert "Traceback" not in err


def test_the_repaired_kernel_is_judged_and_a_bug_in_it_found() -> None:
    report = campaign(KDA, "triton", [Target("grid", triton_grid_stride.decode)],
                      max_examples=12, seed=5, valid_share=1.0, **SMALL)
    assert not report.failures and report.unexecutable == 0 and report.valid_cases > 0
    skipping = campaign(KDA, "triton", [Target("skip", triton_grid_stride.skipping_decode)],
                        max_examples=30, seed=5, valid_share=1.0, **SMALL)
    assert skipping.failures and skipping.unexecutable == 0
    assert all(f.verdict.kind == "mismatch" for f in skipping.failures)


@triton.jit
def _block_bound(x, y, N: tl.constexpr):
    o = tl.arange(0, N)
    for i in range(0, o + 1):  # a block as a loop bound: the kernel's error (a GPU's too)
        tl.store(y + i, tl.load(x + i))


def test_a_block_used_as_a_scalar_stays_the_kernels_error() -> None:
    x, y = torch.rand(4), torch.zeros(4)
    e = _raised(lambda: _block_bound[(1,)](x, y, N=4))
    assert any(isinstance(c, NotAScalar) for c in _execution._causes(e)), repr(e)
    assert environment_error(e) is None


# --- the rules, on exceptions raised inside a library's files ----------------------------


def _raised_in(module: Any, code: str) -> BaseException:
    """What ``code`` raises when run as if it were ``module``'s source (its frames name
    that file, as a failure inside the library does)."""
    try:
        exec(compile(code, module.__file__, "exec"), {"np": np})
    except BaseException as e:
        return e
    raise AssertionError("no exception")


def _interpreter() -> Any:
    from triton.runtime import interpreter

    return interpreter


def _helion_kernel_module() -> Any:
    import sys

    import helion.runtime.kernel  # noqa: F401  (the attribute is helion's decorator)

    return sys.modules["helion.runtime.kernel"]


@pytest.mark.parametrize(("module", "code", "words"), [
    (_interpreter, "int(np.array([[3]]))", "only 0-dimensional"),
    (_interpreter, "import warnings\nwith warnings.catch_warnings():\n"
                   "    warnings.simplefilter('error')\n"
                   "    warnings.warn('x is deprecated', DeprecationWarning)",
     "deprecation warning of triton"),
    (_interpreter, "np.not_in_this_numpy", "does not work with the libraries installed"),
    (_helion_kernel_module, "from torch import not_in_this_torch",
     "does not work with the libraries installed"),
], ids=["numpy-conversion", "deprecation-as-error", "numpy-name-missing", "import-missing"])
def test_a_library_failing_in_its_own_code_is_the_environment(
        module: Callable[[], Any], code: str, words: str) -> None:
    e = _raised_in(module(), code)
    assert words in (environment_error(e) or ""), repr(e)
    try:  # wrapped by the kernel's own code: still the library's
        raise RuntimeError("kernel launch failed") from e
    except RuntimeError as wrapped:
        assert words in (environment_error(wrapped) or "")


def _own_conversion() -> None:
    int(np.array([1, 2]))  # the kernel's own wrapper


@pytest.mark.parametrize("call", [
    _own_conversion,
    lambda: (_ for _ in ()).throw(TypeError(
        "only 0-dimensional arrays can be converted to Python scalars")),  # its own words
    lambda: exec(compile("raise ValueError('bad block shape')", _interpreter().__file__,
                         "exec")),  # a library's ordinary error: not a known failure
], ids=["own-int", "own-words", "library-valueerror"])
def test_the_kernels_own_errors_are_not_the_environment(call: Callable[[], Any]) -> None:
    assert environment_error(_raised(call)) is None
