"""``tp.build`` on a TIR workload (a PrimFunc, or a module of PrimFuncs, as ``tvm.compile``
takes): each PrimFunc goes whole to the target's first backend, the result is a
``tp.CompiledKernel`` called destination-passing, and the report is the model build's."""

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import te, topi

import tirpat as tp


def dense(m, n, k):
    A = te.placeholder((m, k), "int8", name="A")
    W = te.placeholder((n, k), "int8", name="W")
    return te.create_prim_func([A, W, topi.nn.dense(A, W, out_dtype="int32")])


def operands(m, n, k, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, (m, k), dtype=np.int8), rng.integers(-128, 128, (n, k), dtype=np.int8),
            np.zeros((m, n), np.int32))


def llvm(func, *args):
    tensors = [tvm.runtime.tensor(a) for a in args]
    tvm.compile(tvm.IRModule({"main": func}), "llvm")["main"](*tensors)
    return tensors[-1].numpy()


@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 90))
def test_a_primfunc_for_accel_computes_what_llvm_computes(m, n, k):
    import accel

    func = dense(m, n, k)
    kernel = tp.build(func, "accel, llvm")
    a, w, out = operands(m, n, k, m * n + k)
    with accel.Session() as session:
        kernel(a, w, out)
    np.testing.assert_array_equal(out, llvm(func, a, w, np.zeros_like(out)))
    (part,) = kernel.report.partitions
    assert (part.backend, part.function, part.pattern) == ("accel", "main", "tir")
    assert part.macs == kernel.report.total_macs == m * n * k and kernel.report.share("accel") == 1.0
    assert part.rules["accel.gemm"] >= 1 and session.stats.instructions["GEMM"] >= 1
    assert part.device_macs == session.stats.macs >= m * n * k


def test_a_kernel_call_holds_its_session_running_once_around_its_work(monkeypatch):
    """As a compiled model's call does: a device sets up once per call what each of its
    streams would (accel: BLAS on one thread), and undoes it at the end."""
    import contextlib

    import accel

    held = []

    @contextlib.contextmanager
    def running(self):
        held.append(("enter", self.pending))
        yield
        held.append(("exit", self.pending))

    monkeypatch.setattr(accel.Session, "running", running)
    func = dense(20, 20, 40)
    kernel = tp.build(func, "accel, llvm")
    a, w, out = operands(20, 20, 40, 3)
    kernel(a, w, out)
    assert held == [("enter", 0), ("exit", 0)]
    np.testing.assert_array_equal(out, llvm(func, a, w, np.zeros_like(out)))


def test_a_host_only_target_compiles_it_for_the_host_and_says_so():
    func = dense(8, 16, 32)
    kernel = tp.build(func, "llvm")
    a, w, out = operands(8, 16, 32, 0)
    kernel(a, w, out)
    np.testing.assert_array_equal(out, a.astype(np.int32) @ w.astype(np.int32).T)
    report = kernel.report
    assert report.partitions == [] and report.macs == {"host": 8 * 16 * 32}
    assert [(h.var, h.reason) for h in report.on_host] == [("main", "the target has no backend")]


def test_a_module_of_primfuncs_is_called_by_its_entry():
    mod = tvm.IRModule({"dense_a": dense(16, 16, 16), "dense_b": dense(32, 16, 16)})
    kernel = tp.build(mod, "accel, llvm", entry="dense_b")
    assert [p.function for p in kernel.report.partitions] == ["dense_a", "dense_b"]
    a, w, out = operands(32, 16, 16, 1)
    kernel(a, w, out)
    np.testing.assert_array_equal(out, a.astype(np.int32) @ w.astype(np.int32).T)
    with pytest.raises(ValueError, match="the workload has no function 'main'"):
        tp.build(mod, "accel, llvm")


def test_what_a_tir_workload_cannot_take_is_refused_by_name():
    func = dense(8, 8, 8)
    with pytest.raises(TypeError, match="params is for Relax models, not a TIR workload"):
        tp.build(func, "accel, llvm", params={"A": np.zeros((8, 8), np.int8)})
    with pytest.raises(TypeError, match="tp.build takes a Relax IRModule, a PrimFunc or an IRModule of "
                                        r"PrimFuncs, or an ONNX model \(an onnx.ModelProto or the path of an .onnx "
                                        r"file\), got 'm.py', a path that is not an .onnx file"):
        tp.build("m.py", "accel, llvm")
    with pytest.raises(TypeError, match=r"\.onnx file\), got NoneType"):
        tp.build(None, "accel, llvm")


def test_a_backend_error_lowering_it_is_raised_not_fallen_back():
    """There is no partition to fall back: the backend's own error reaches the caller."""
    n = tvm.tirx.Var("n", "int32")
    A = te.placeholder((n, 16), "int8", name="A")
    W = te.placeholder((16, 16), "int8", name="W")
    with pytest.raises(ValueError, match="dynamic shape"):
        tp.build(te.create_prim_func([A, W, topi.nn.dense(A, W, out_dtype="int32")]), "accel, llvm")


def test_a_kernel_takes_a_zero_dimensional_array():
    # a scalar buffer argument stays 0-d on its way in (np.ascontiguousarray would make it
    # (1,), which the compiled entry's shape check refuses)
    a = te.placeholder((), "int32", name="A")
    kernel = tp.build(te.create_prim_func([a, te.compute((4,), lambda i: a[()] * i, name="B")]), "llvm")
    out = np.zeros(4, np.int32)
    kernel(np.array(3, np.int32), out)
    assert out.tolist() == [0, 3, 6, 9]
