"""How a module rule's replacement is bound to a site: parameters inlined into the real
buffer accesses (as LowerMatchBuffer inlines tensorize's match_buffers), offsets that are
affine only given the loops' bounds, and thread launches merged with the kernel's."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given
from hypothesis import strategies as st
from tvm import tirx
from tvm.script import tirx as T

import tirpat as tp
from tirpat.testing import run


@T.prim_func
def row_copy(src: T.Buffer((4, 8), "float32", offset_factor=1), dst: T.Buffer((4, 8), "float32", offset_factor=1)):
    for i, j in T.grid(4, 8):
        dst[i, j] = src[i, j]


@T.prim_func
def row_copy_doubled(src: T.Buffer((4, 8), "float32", offset_factor=1), dst: T.Buffer((4, 8), "float32", offset_factor=1)):
    for i, j in T.grid(4, 8):
        dst[i, j] = src[i, j] * T.float32(2)


DOUBLE = tp.Rewriter.from_module({"pattern": row_copy, "replacement": row_copy_doubled}, name="double")


def _accesses(func):
    found = []
    tvm_ffi.structural_walk(func.body, [(tvm.ir.TensorLoad, found.append), (tirx.BufferStore, found.append)])
    return found


def wrapped_copy(period, k1_extent, step):
    """``Out[k0, k1, i, j] = W[(k0*8*step + k1*4*step + i) % period, j]``: after a layout
    transform, the row index is affine in ``i`` only given ``0 <= i < 4``."""

    @T.prim_func
    def f(W: T.Buffer((32, 8), "float32"), Out: T.Buffer((4, k1_extent, 4, 8), "float32")):
        for k0, k1, i, j in T.grid(4, k1_extent, 4, 8):
            Out[k0, k1, i, j] = W[(k0 * 8 * step + k1 * 4 * step + i) % period, j]

    return f


@given(st.sampled_from([16, 32]), st.sampled_from([1, 2]), st.sampled_from([1, 2]))
def test_an_index_affine_given_the_loop_bounds_binds_a_region(period, k1_extent, step):
    f = wrapped_copy(period, k1_extent, step)
    new = DOUBLE(f)
    assert DOUBLE.report.counts == {"double": 1}, str(tp.explain(DOUBLE, f))
    w = np.arange(32 * 8, dtype="float32").reshape(32, 8)
    out = run(new, [w, np.zeros((4, k1_extent, 4, 8), "float32")])[1]
    k0, k1, i = np.meshgrid(np.arange(4), np.arange(k1_extent), np.arange(4), indexing="ij")
    want = 2 * w[(k0 * 8 * step + k1 * 4 * step + i) % period]
    np.testing.assert_array_equal(out, want)


def test_an_index_that_wraps_inside_the_nest_is_refused():
    # (k0*2 + i) % 16 wraps around inside the 4 rows of one tile when k0 = 7
    @T.prim_func
    def f(W: T.Buffer((16, 8), "float32"), Out: T.Buffer((8, 4, 8), "float32")):
        for k0, i, j in T.grid(8, 4, 8):
            Out[k0, i, j] = W[(k0 * 2 + i) % 16, j]

    assert DOUBLE(f).same_as(f) and DOUBLE.report.counts == {}
    assert "plus an offset free of the matched loops" in str(tp.explain(DOUBLE, f))


def test_parameters_become_accesses_of_the_bound_buffer():
    """No buffer view is left: the replacement reads and writes the target's own buffers at
    the region's base plus its index, so later passes see the real accesses."""

    @T.prim_func
    def f(A: T.Buffer((8, 8), "float32"), B: T.Buffer((8, 8), "float32")):
        for t, i, j in T.grid(2, 4, 8):
            B[t * 4 + i, j] = A[t * 4 + i, j]

    new = DOUBLE(f)
    assert DOUBLE.report.counts == {"double": 1}
    decls = []
    tvm_ffi.structural_walk(new.body, (tirx.DeclBuffer, decls.append))
    assert decls == []
    assert {a.source.name if isinstance(a, tvm.ir.TensorLoad) else a.buffer.name for a in _accesses(new)} == {"A", "B"}
    assert "B[t * 4 + i, j] = A[t * 4 + i, j] * T.float32(2.0)" in new.script()


# -- thread launches ----------------------------------------------------------------------

@T.prim_func
def warp_fill(C: T.Buffer((32,), "float32", scope="shared", offset_factor=1)):
    for i in range(32):
        C[i] = T.float32(0)


def _warp_fill_impl(threads):
    @T.prim_func
    def impl(C: T.Buffer((32,), "float32", scope="shared", offset_factor=1)):
        tx = T.launch_thread("threadIdx.x", threads)
        C[tx % 32] = T.float32(0)

    return impl


def _kernel(threads_in_kernel):
    """A kernel that zeroes two shared arrays; with ``threads_in_kernel`` it launches
    threadIdx.x itself, around both."""

    @T.prim_func
    def with_tx(out: T.Buffer((64,), "float32")):
        bx = T.launch_thread("blockIdx.x", 1)
        tx = T.launch_thread("threadIdx.x", threads_in_kernel)
        S = T.alloc_buffer((64,), "float32", scope="shared")
        for i in range(32):
            S[i] = T.float32(0)
        for i in range(32):
            S[32 + i] = T.float32(0)
        out[tx] = S[tx]

    @T.prim_func
    def without_tx(out: T.Buffer((64,), "float32")):
        bx = T.launch_thread("blockIdx.x", 1)
        S = T.alloc_buffer((64,), "float32", scope="shared")
        for i in range(32):
            S[i] = T.float32(0)
        for i in range(32):
            S[32 + i] = T.float32(0)
        out[0] = S[0]

    return with_tx if threads_in_kernel else without_tx


def _launches(func):
    found = []

    def on_attr(a):
        if a.attr_key == "thread_extent":
            found.append((a.node.thread_tag, int(a.value)))

    tvm_ffi.structural_walk(func.body, (tirx.AttrStmt, on_attr), order="pre")
    return found


def test_a_replacements_thread_launch_merges_into_the_kernels():
    rw = tp.Rewriter.from_module({"pattern": warp_fill, "replacement": _warp_fill_impl(32)}, name="fill")
    merged = rw(_kernel(32).with_attr("global_symbol", "k"))
    assert rw.report.counts == {"fill": 2}
    assert _launches(merged) == [("blockIdx.x", 1), ("threadIdx.x", 32)]
    tirx.analysis.verify_well_formed(merged, assert_mode=True)
    # both replacements use the kernel's own thread variable
    tx = [a.node.var for a in _attrs(merged) if a.node.thread_tag == "threadIdx.x"][0]
    stores = [s for s in _accesses(merged) if isinstance(s, tirx.BufferStore) and s.buffer.name == "S"]
    assert len(stores) == 2 and all(tp.tir.analysis.uses_any(s.indices[0], [tx]) for s in stores)


def test_a_kernel_without_the_threads_gets_one_launch_at_its_top():
    rw = tp.Rewriter.from_module({"pattern": warp_fill, "replacement": _warp_fill_impl(32)}, name="fill")
    hoisted = rw(_kernel(0).with_attr("global_symbol", "k"))
    assert rw.report.counts == {"fill": 2}
    assert _launches(hoisted) == [("blockIdx.x", 1), ("threadIdx.x", 32)]
    assert isinstance(hoisted.body.body, tirx.AttrStmt)  # right under blockIdx.x, around the allocation
    tirx.analysis.verify_well_formed(hoisted, assert_mode=True)


def test_launches_of_different_extents_in_one_kernel_are_an_error():
    rw = tp.Rewriter.from_module({"pattern": warp_fill, "replacement": _warp_fill_impl(32)}, name="fill")
    with pytest.raises(tp.RewriteError, match=r"rule 'fill'.*threadIdx.x is launched with 32 threads .* with 64"):
        rw(_kernel(64).with_attr("global_symbol", "k"))


def _attrs(func):
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.AttrStmt, lambda a: found.append(a) if a.attr_key == "thread_extent" else None))
    return found
