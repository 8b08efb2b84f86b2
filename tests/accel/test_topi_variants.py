"""Other people's TVM code: topi variants built for accel give exactly what TVM's CPU build gives."""

import numpy as np
import pytest
import tvm
from tvm import te, topi

import accel


def _dense():
    A = te.placeholder((40, 24), "int8", name="A")
    W = te.placeholder((30, 24), "int8", name="W")
    return A, W, topi.nn.dense(A, W, out_dtype="int32")


def dense_bias_param():
    A, W, _ = _dense()
    b = te.placeholder((30,), "int32", name="b")
    return [A, W, b], topi.nn.dense(A, W, b, out_dtype="int32")


def matmul_transpose_a():
    A = te.placeholder((24, 40), "int8", name="A")
    B = te.placeholder((24, 30), "int8", name="B")
    return [A, B], topi.nn.matmul(A, B, transpose_a=True, out_dtype="int32")


def batch_matmul_transposed_a():
    X = te.placeholder((2, 24, 20), "int8", name="X")
    Y = te.placeholder((2, 24, 18), "int8", name="Y")
    return [X, Y], topi.nn.batch_matmul(X, Y, transpose_a=True, transpose_b=False, out_dtype="int32")


def residual_add():
    A, W, D = _dense()
    R = te.placeholder((40, 30), "int32", name="R")
    return [A, W, R], topi.add(D, R)


def shift_clip_cast():
    A, W, D = _dense()
    return [A, W], topi.cast(topi.clip(topi.right_shift(D, 3), -128, 127), "int8")


def fixed_point_multiply():
    A, W, D = _dense()
    return [A, W], topi.fixed_point_multiply(D, 1 << 30, 0)


def subtract_bias():
    A, W, D = _dense()
    b = te.placeholder((30,), "int32", name="b")
    return [A, W, b], topi.subtract(D, b)


def relu_plus_itself():
    A, W, D = _dense()
    return [A, W], topi.add(topi.nn.relu(D), D)


WORKLOADS = [dense_bias_param, matmul_transpose_a, batch_matmul_transposed_a, residual_add, shift_clip_cast,
             fixed_point_multiply, subtract_bias, relu_plus_itself]


@pytest.mark.parametrize("make", WORKLOADS, ids=lambda f: f.__name__)
def test_accel_build_equals_the_cpu_build(make):
    params, out = make()
    func = te.create_prim_func(params + [out])
    rng = np.random.default_rng(0)
    args = [rng.integers(-128, 128, [int(d) for d in p.shape], dtype=str(p.dtype)) if str(p.dtype) == "int8"
            else rng.integers(-5000, 5000, [int(d) for d in p.shape], dtype=str(p.dtype)) for p in params]
    shape, dtype = [int(d) for d in out.shape], str(out.dtype)

    cpu = tvm.compile(func, target="llvm")
    expect = tvm.runtime.tensor(np.zeros(shape, dtype))
    cpu["main"](*[tvm.runtime.tensor(a) for a in args], expect)

    ex = accel.build(func)
    got = np.zeros(shape, dtype)
    with accel.Session():
        ex(*args, got)
    np.testing.assert_array_equal(got, expect.numpy())
    assert ex.report.share("accel") == 1.0
