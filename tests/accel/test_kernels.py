"""The compiled kernels of the batched plan (accel.hw.kernels) compute bit for bit what the
numpy steps they replace compute: sums exact in float32, int32 additions wrapping."""

import numpy as np
from hypothesis import given, strategies as st

from accel.hw import kernels


@st.composite
def tap_sums(draw):
    """A tap sum's operands: a source vector of int8 values (-128 and 127 often: the largest
    products), row starts anywhere in it (overlapping rows, repeats), up to the 1024 steps
    float32 sums exactly, and int32 values to add into (near the limits: the sums wrap)."""
    tile = draw(st.sampled_from([2, 4, 16]))
    d, p = draw(st.integers(1, 4)), draw(st.integers(1, tile))
    steps = draw(st.sampled_from([1, 2, 9, 49, 1024]))
    n = draw(st.integers(tile, 3 * tile * p + 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    source = rng.choice(np.array([-128, 127, -1, 0, 1, 5], np.float32), n) if draw(st.booleans()) else \
        rng.integers(-128, 128, n).astype(np.float32)
    xs = rng.integers(0, n - tile + 1, (d, steps, p))
    ws = rng.integers(0, n - tile + 1, (d, steps))
    edge = draw(st.sampled_from([0, 2**31 - 1, -2**31]))
    base = draw(st.integers(0, 5))
    out = (edge - np.sign(edge) * rng.integers(0, 2**24, base + d * p * tile + 3)).astype(np.int32)
    return tile, source, xs, ws, out, base


@given(tap_sums(), st.booleans())
def test_the_tap_sum_kernel_equals_numpys_sum_over_the_taps(drawn, assign):
    tile, source, xs, ws, out, base = drawn
    lanes = np.arange(tile)
    x, w = source[xs[..., None] + lanes], source[ws[..., None] + lanes]
    exact = np.einsum("dspc,dsc->dpc", x.astype(np.int64), w.astype(np.int64)).reshape(-1)
    want = out.copy()
    at = slice(base, base + exact.size)
    want[at] = exact if assign else (want[at].astype(np.int64) + exact).astype(np.int32)     # wraps
    # (from numpy's float32 einsum, as the plan summed before: the same, exact)
    assert (np.einsum("dspc,dsc->dpc", x, w).astype(np.int64).reshape(-1) == exact).all()
    kernels.tap_sum(tile, assign)(source, np.ascontiguousarray(xs), np.ascontiguousarray(ws), out, base)
    np.testing.assert_array_equal(out, want)


def test_kernels_read_and_write_views_at_any_offset():
    """The plan's vectors are views of its workspace at any element offset: no alignment is
    assumed beyond the element's."""
    source = np.arange(41, dtype=np.float32)[1:] % 7
    out = np.zeros(9, np.int32)[1:]
    kernels.tap_sum(4, True)(source, np.array([[[1, 3]]]), np.array([[2]]), out, 0)
    lanes = np.arange(4)
    np.testing.assert_array_equal(out, np.concatenate([source[1 + lanes] * source[2 + lanes],
                                                       source[3 + lanes] * source[2 + lanes]]))


@given(tap_sums(), st.booleans(), st.data())
def test_the_scaled_rows_kernel_equals_numpys_product(drawn, assign, data):
    tile, source, xs, _, out, base = drawn
    starts = np.ascontiguousarray(xs[:, 0, :].reshape(-1))     # as many rows as out holds after base
    w = data.draw(st.integers(0, source.size - 1))
    exact = (source[starts[:, None] + np.arange(tile)].astype(np.int64) * int(source[w])).reshape(-1)
    want = out.copy()
    at = slice(base, base + exact.size)
    want[at] = exact if assign else (want[at].astype(np.int64) + exact).astype(np.int32)     # wraps
    kernels.scaled_rows(tile, assign)(source, starts, w, out, base)
    np.testing.assert_array_equal(out, want)
