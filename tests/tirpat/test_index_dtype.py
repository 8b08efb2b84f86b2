"""with_index_dtype: the same program with int64 (or int32) index arithmetic."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given
from tvm import te, tirx

import tirpat as tp
from tirpat.tir.index_dtype import index_dtype_of, with_index_dtype
from tirpat.testing import copy_nests, run

NARROW = tirx.transform.ForceNarrowIndexToInt32()


@given(copy_nests())
def test_int64_program_computes_the_same(case):
    """Run both on the same inputs (TVM compiles each); TVM's own narrowing pass and our
    conversion back both give the int32 program again."""
    f64 = with_index_dtype(case.func, "int64")
    assert index_dtype_of(f64.body) == "int64"
    tirx.analysis.verify_well_formed(f64, assert_mode=True)
    inputs = case.inputs(np.random.default_rng(len(case.extents)))
    np.testing.assert_array_equal(run(f64, inputs)[1], run(case.func, inputs)[1])
    assert tvm_ffi.structural_equal(NARROW(tvm.IRModule({"main": f64}))["main"].body, case.func.body,
                                    map_free_vars=True)
    assert tvm_ffi.structural_equal(with_index_dtype(f64, "int32"), case.func, map_free_vars=True)


def test_only_index_arithmetic_changes_type():
    """Loop variables, indices and shapes become int64; stored int32 data stays int32."""
    A = te.placeholder((8, 8), "int32", name="A")
    B = te.compute((8, 8), lambda i, j: A[j, i] * 3, name="B")
    f64 = with_index_dtype(tp.lower(te.create_prim_func([A, B])), "int64")
    text = f64.script()
    assert "T.Buffer((T.int64(8), T.int64(8)), \"int32\")" in text
    assert "A[j, i] * 3" in text  # the data multiply keeps its int32 constant


def test_refusals_name_the_problem():
    A = te.placeholder((8,), "int32", name="A")
    B = te.compute((8,), lambda i: A[i], name="B")
    with pytest.raises(ValueError, match="still has T.sblock blocks.*tp.lower"):
        with_index_dtype(te.create_prim_func([A, B]), "int64")
    with pytest.raises(ValueError, match="index dtype must be one of"):
        with_index_dtype(tp.lower(te.create_prim_func([A, B])), "int16")
    big = tirx.decl_buffer((tirx.IntImm("int64", 1 << 33),), "int8", "big")
    out = tirx.decl_buffer((tirx.IntImm("int64", 4),), "int8", "out")
    i = tirx.Var("i", "int64")
    body = tirx.For(i, tirx.IntImm("int64", 0), tirx.IntImm("int64", 4), 0,
                    tirx.BufferStore(out, tirx.BufferLoad(big, [i + tirx.IntImm("int64", 5_000_000_000)]), [i]))
    with pytest.raises(ValueError, match="index constant [0-9]+ does not fit in int32"):
        with_index_dtype(tirx.PrimFunc([big, out], body), "int32")


def test_as_index_undoes_only_an_exact_widening():
    from tirpat.tir.index_dtype import as_index

    small, big = tirx.Var("small", "int32"), tirx.Var("big", "int64")
    assert as_index("int32", tirx.Cast("int64", small)).same_as(small)
    narrowed = tirx.Cast("int32", big)  # truncates: widening it again must keep the truncation
    assert isinstance(as_index("int64", narrowed), tirx.Cast) and as_index("int64", narrowed).value.same_as(narrowed)
    assert str(as_index("int64", tirx.IntImm("int32", 7)).ty.dtype) == "int64"


def test_vector_indices_take_the_new_type_lane_by_lane():
    """``A[Broadcast(i*4, 4) + Ramp(0, 1, 4)]``: the Broadcast follows its int64 value and
    the Ramp is cast to match, instead of keeping a stale int32x4 type."""
    A, B = tirx.decl_buffer((32,), "int32", "A"), tirx.decl_buffer((32,), "int32", "B")
    i = tirx.Var("i", "int32")
    idx = tirx.Broadcast(i * 4, 4) + tirx.Ramp(tirx.IntImm("int32", 0), tirx.IntImm("int32", 1), 4)
    body = tirx.For(i, 0, 8, 0, tirx.BufferStore(B, tirx.BufferLoad(A, [idx]),
                                                 [tirx.Ramp(i * 4, 1, 4)]))
    f = tirx.PrimFunc([A, B], body).with_attr("global_symbol", "main")
    f64 = with_index_dtype(f, "int64")
    load_index = f64.body.body.value.indices[0]
    assert str(load_index.ty.dtype) == "int64x4" and str(load_index.a.ty.dtype) == "int64x4"
    a = np.arange(32, dtype="int32") * 3
    np.testing.assert_array_equal(run(f64, [a, np.zeros(32, "int32")])[1], run(f, [a, np.zeros(32, "int32")])[1])
