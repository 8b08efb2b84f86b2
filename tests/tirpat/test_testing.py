"""tirpat.testing's strategies: each case's numpy reference is what its function computes,
and the facts a case states about itself are what tirpat finds."""

import numpy as np
import pytest
from hypothesis import given

import tirpat as tp
from tirpat.testing import elementwise_nests, reduction_nests, run, unary_nests


@given(elementwise_nests(strided=True))
def test_elementwise_cases_compute_their_reference_and_state_their_regions(case):
    rng = np.random.default_rng(len(case.shape))
    a, b, out = case.inputs(rng)
    np.testing.assert_array_equal(run(case.func, [a, b, out])[2], case.reference(a, b, out))
    op = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "max": tp.max, "min": tp.min}[case.op]
    loads = [tp.is_load(tp.is_buffer(name), None) for name in ("a", "b")]
    (m,) = tp.find_all(tp.is_nest(None, tp.is_store(tp.is_buffer("out"), None, op(*loads))), case.func)
    for name in ("a", "b", "out"):
        region = m.region(name)
        assert (int(region.offset), region.strides) == case.accesses[name].region(), name


def test_elementwise_nests_cover_int8_and_take_ops():
    seen = set()

    @given(elementwise_nests(dtypes=["int8"], ops=["add", "max"]))
    def collect(case):
        seen.add((case.dtype, case.op))

    collect()
    assert seen == {("int8", "add"), ("int8", "max")}
    with pytest.raises(ValueError, match=r"ops must be a non-empty list of \['add', 'max', 'min', 'mul', 'sub'\]"):
        elementwise_nests(ops=["pow"])
    with pytest.raises(ValueError, match="unary_nests: dtypes"):
        unary_nests(dtypes=["int4"])


@given(unary_nests())
def test_unary_cases_compute_their_reference(case):
    rng = np.random.default_rng(len(case.shape))
    a, out = case.inputs(rng)
    if case.op == "exp":
        a = (a / 8).astype(case.dtype)  # keep exp finite
    got = run(case.func, [a, out])[1]
    if case.op == "exp":
        np.testing.assert_allclose(got, case.reference(a), rtol=1e-5)
    else:
        np.testing.assert_array_equal(got, case.reference(a))


@given(reduction_nests())
def test_reduction_cases_compute_their_reference(case):
    rng = np.random.default_rng(len(case.shape))
    a, out = case.inputs(rng)
    got = run(case.func, [a, out])[1]
    if case.dtype.startswith("float"):
        np.testing.assert_allclose(got, case.reference(a), rtol=1e-4, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, case.reference(a))
