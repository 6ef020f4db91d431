"""The project's own property tests: the family's strategies by name, held to the
contract by ``kda_fuzz.assert_conforms`` (``pytest tests corpus`` also replays corpus/)."""

from hypothesis import given, settings
from rowsoftmax.kernels import softmax_rows

import kda_fuzz
from kda_fuzz.strategies import broken_layouts, valid_layouts


@settings(max_examples=25, deadline=None, database=None)
@given(valid_layouts("rowsoftmax"))
def test_valid_calls(case):
    kda_fuzz.assert_conforms(softmax_rows, case)


@settings(max_examples=25, deadline=None, database=None)
@given(broken_layouts("rowsoftmax", checks=[2, 4]))
def test_shape_and_dtype_checks(case):
    kda_fuzz.assert_conforms(softmax_rows, case)
