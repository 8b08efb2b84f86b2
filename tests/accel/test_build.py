"""accel.build: real TE/topi workloads offloaded to the simulator, bit-exact vs numpy."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import te, topi

import accel
from accel.compiler.schedule import schedule

EPILOGUES = ["none", "bias", "bias_relu", "requant_saturate", "requant_wrap", "clip_int32"]


def workload(kind, m, n, k, epilogue, batch=2, shift=5):
    """A TE workload and its numpy reference: ``(prim_func, make_inputs, reference)``."""
    if kind == "batch_matmul":
        A = te.placeholder((batch, m, k), "int8", name="A")
        B = te.placeholder((batch, n, k), "int8", name="B")
        acc = topi.nn.batch_matmul(A, B, out_dtype="int32")
        ref = lambda a, b: np.einsum("bmk,bnk->bmn", a.astype(np.int64), b.astype(np.int64))  # noqa: E731
        out_shape = (batch, m, n)
    elif kind == "matmul":
        A = te.placeholder((m, k), "int8", name="A")
        B = te.placeholder((k, n), "int8", name="B")
        acc = topi.nn.matmul(A, B, out_dtype="int32")
        ref = lambda a, b: a.astype(np.int64) @ b.astype(np.int64)  # noqa: E731
        out_shape = (m, n)
    else:
        A = te.placeholder((m, k), "int8", name="A")
        B = te.placeholder((n, k), "int8", name="B")
        acc = topi.nn.dense(A, B, out_dtype="int32")
        ref = lambda a, b: a.astype(np.int64) @ b.astype(np.int64).T  # noqa: E731
        out_shape = (m, n)
    bias = te.placeholder((n,), "int32", name="bias")
    params = [A, B]
    out = acc
    if epilogue != "none":
        params.append(bias)
        out = topi.add(acc, bias)
    if epilogue in ("bias_relu", "requant_wrap"):
        out = topi.nn.relu(out)
    if epilogue == "requant_saturate":
        r = out
        out = te.compute(r.shape, lambda *i: te.max(te.min((r(*i) + (1 << (shift - 1))) >> shift, 127), -128).astype("int8"), name="requant")
    elif epilogue == "requant_wrap":
        r = out
        out = te.compute(r.shape, lambda *i: ((r(*i) + (1 << (shift - 1))) >> shift).astype("int8"), name="requant")
    elif epilogue == "clip_int32":
        out = topi.clip(out, -1000, 1000)

    def reference(a, b, bias_v=None):
        r = ref(a, b)
        if epilogue != "none":
            r = r + bias_v
        r = ((r + 2**31) % 2**32) - 2**31   # int32 wrap-around, as the hardware
        if epilogue in ("bias_relu", "requant_wrap"):
            r = np.maximum(r, 0)
        if epilogue == "requant_saturate":
            return np.clip((r + (1 << (shift - 1))) >> shift, -128, 127).astype(np.int8)
        if epilogue == "requant_wrap":
            return ((r + (1 << (shift - 1))) >> shift).astype(np.int64).astype(np.int8)
        if epilogue == "clip_int32":
            r = np.clip(r, -1000, 1000)
        return r.astype(np.int32)

    def inputs(rng):
        a = rng.integers(-128, 128, [int(d) for d in A.shape], dtype=np.int8)
        b = rng.integers(-128, 128, [int(d) for d in B.shape], dtype=np.int8)
        args = [a, b]
        if epilogue != "none":
            args.append(rng.integers(-5000, 5000, (n,), dtype=np.int32))
        out_dtype = "int8" if epilogue.startswith("requant") else "int32"
        return args, np.zeros(out_shape, out_dtype)

    return te.create_prim_func(params + [out]), inputs, reference


def run(func, inputs, reference, rng, config=None):
    ex = accel.build(func, config)
    args, out = inputs(rng)
    with accel.Session(config) as s:
        ex(*args, out)
    np.testing.assert_array_equal(out, reference(*args))
    return ex, s


@settings(max_examples=40)
@given(st.sampled_from(["dense", "matmul", "batch_matmul"]), st.integers(1, 300), st.integers(1, 300),
       st.integers(1, 300), st.sampled_from(EPILOGUES))
def test_build_and_run_is_bit_exact(kind, m, n, k, epilogue):
    if kind == "batch_matmul":
        m, n, k = (max(1, x // 3) for x in (m, n, k))
    func, inputs, reference = workload(kind, m, n, k, epilogue)
    ex, s = run(func, inputs, reference, np.random.default_rng(m * n + k))
    assert ex.report.share("accel") == 1.0
    assert ex.report.partitions[0].rules["accel.gemm"] >= 1 and s.stats.instructions["GEMM"] >= 1


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_multiples_of_16_offload_fully(epilogue):
    func, inputs, reference = workload("dense", 32, 48, 64, epilogue)
    ex, s = run(func, inputs, reference, np.random.default_rng(0))
    assert ex.report.share("accel") == 1.0
    assert "100.0%" in str(ex.report)
    assert ex.report.partitions[0].on_host == []
    if epilogue != "none":
        assert s.stats.instructions["ALU"] + s.stats.instructions["ALU_CHAIN"] > 0


def test_saturating_epilogue_uses_the_saturate_store():
    func, inputs, reference = workload("dense", 16, 16, 16, "requant_saturate")
    _, s = run(func, inputs, reference, np.random.default_rng(1))
    assert "SATURATE" in s.disassembly()
    func, inputs, reference = workload("dense", 16, 16, 16, "requant_wrap")
    _, s = run(func, inputs, reference, np.random.default_rng(1))
    assert "WRAP" in s.disassembly() and "SATURATE" not in s.disassembly()


def test_matmul_transposes_on_the_cpu_and_says_so():
    func, inputs, reference = workload("matmul", 20, 24, 40, "none")
    ex, _ = run(func, inputs, reference, np.random.default_rng(2))
    assert any("transposes B" in why for _, why in ex.report.partitions[0].on_host)


def test_non_gemm_reductions_stay_on_the_cpu_with_a_reason():
    A = te.placeholder((16, 16), "int8", name="A")
    k = te.reduce_axis((0, 16), "k")
    S = te.compute((16,), lambda i: te.sum(A[i, k].astype("int32"), axis=k), name="rowsum")
    with pytest.warns(UserWarning, match="rowsum it is not an int8 x int8 -> int32 multiply-accumulate"):
        ex = accel.build(te.create_prim_func([A, S]))
    assert ex.report.share("accel") == 0.0 and ex.report.partitions[0].on_host[0][0] == "rowsum"
    a = np.arange(256, dtype=np.int8).reshape(16, 16)
    out = np.zeros(16, np.int32)
    ex(a, out)
    np.testing.assert_array_equal(out, a.astype(np.int32).sum(1))


def test_scratchpad_overflow_names_the_buffer():
    # scheduled for the default Config, compiled for a smaller one: the planner refuses it,
    # first in a user's words, then the detail
    func, _, _ = workload("dense", 32, 32, 32, "none")
    scheduled, _ = schedule(func, accel.Config())
    tiny = accel.Config(acc_bytes=1024)
    with pytest.raises(accel.ScratchpadOverflow, match=r"accel cannot run the function 'main': its scratchpad "
                       r"buffers do not fit .* Detail: main: scratchpad ACC overflows by \d+ bytes when allocating "
                       r"T_matmul_NT_local.accel_acc"):
        accel.build(scheduled, tiny)


def test_call_time_checks():
    func, inputs, _ = workload("dense", 16, 16, 16, "none")
    ex = accel.build(func)
    args, out = inputs(np.random.default_rng(0))
    with pytest.raises(TypeError, match="argument A: expected dtype int8, got int32"):
        ex(args[0].astype(np.int32), args[1], out)
    with pytest.raises(ValueError, match=r"argument T_matmul_NT: expected shape \(16, 16\)"):
        ex(args[0], args[1], np.zeros((16, 8), np.int32))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        ex(args[0], out)


def test_dynamic_shapes_are_rejected():
    n = tvm.tirx.Var("n", "int32")
    A = te.placeholder((n, 16), "int8", name="A")
    B = te.placeholder((16, 16), "int8", name="B")
    with pytest.raises(ValueError, match="dynamic shape"):
        accel.build(te.create_prim_func([A, B, topi.nn.dense(A, B, out_dtype="int32")]))


@given(st.sampled_from([16, 37]), st.sampled_from([48, 20]), st.sampled_from([64, 29]))
def test_a_relax_legalized_matmul_builds_as_it_is(m, n, k):
    """LegalizeOps gives a private PrimFunc with int64 indices: it builds and runs exactly."""
    from tirpat.testing import legalized_matmul

    func = legalized_matmul(m, n, k)["matmul"]
    assert "global_symbol" not in (func.attrs or {}) and "T.int64" in func.script()

    def inputs(rng):
        return [rng.integers(-128, 128, (m, k), dtype="int8"), rng.integers(-128, 128, (k, n), dtype="int8")], \
            np.zeros((m, n), "int32")

    ex, _ = run(func, inputs, lambda a, b: a.astype("int32") @ b.astype("int32"), np.random.default_rng(m + n + k))
    assert ex.report.share("accel") == 1.0



def test_relax_nchw_conv_with_bias_and_requantise():
    """The Relax-legalized NCHW conv2d + [1, F, 1, 1] bias + requantise with the ReLU folded
    into the clip (shared/repros/nchw_conv_bias_requant.py) runs on accel, bit-exact."""
    import pathlib

    path = pathlib.Path("/work/shared/repros/nchw_conv_bias_requant.py")
    if not path.exists():
        pytest.skip("the shared reproducers are not here")
    func = tvm.script.from_source(path.read_text())
    ex = accel.build(func)
    assert ex.report.share("accel") == 1.0 and ex.report.partitions[0].epilogue == ["bias", "requantise", "ReLU"]
    rng = np.random.default_rng(0)
    args = [rng.integers(-128, 128, (1, 3, 8, 8), dtype=np.int8), rng.integers(-128, 128, (8, 3, 3, 3), dtype=np.int8),
            rng.integers(-3000, 3000, (1, 8, 1, 1), dtype=np.int32)]
    out, want = np.zeros((1, 8, 8, 8), np.int8), tvm.runtime.tensor(np.zeros((1, 8, 8, 8), np.int8))
    with accel.Session():
        ex(*args, out)
    ref = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")
    ref["main"](*[tvm.runtime.tensor(a) for a in args], want)
    np.testing.assert_array_equal(out, want.numpy())


@pytest.mark.parametrize("a_dtype, b_dtype, out_dtype", [("float32", "float32", "float32"),
                                                          ("uint8", "int8", "int32"), ("int16", "int16", "int32")])
def test_what_accel_cannot_take_warns_with_the_dtypes(a_dtype, b_dtype, out_dtype):
    import tirpat as tp

    A = te.placeholder((16, 16), a_dtype, name="A")
    B = te.placeholder((16, 16), b_dtype, name="B")
    func = te.create_prim_func([A, B, topi.nn.dense(A, B, out_dtype=out_dtype)])
    with pytest.warns(tp.OffloadWarning, match=f"found {a_dtype} x {b_dtype} -> {out_dtype}"):
        accel.build(func)
    with pytest.raises(tp.OffloadError, match="stays on the host"):
        accel.build(func, strict=True)


def test_no_multiply_accumulate_is_not_100_percent():
    import tirpat as tp

    A = te.placeholder((16, 16), "int8", name="A")
    B = te.compute((16, 16), lambda i, j: A[i, j] + 1, name="B")
    with pytest.warns(tp.OffloadWarning, match=r"none of accel's rules matched its code \(tp.explain\(rules, "
                                               r"func\) on its scheduled, tp.lower'ed PrimFunc says why\)"):
        ex = accel.build(te.create_prim_func([A, B]))
    assert "100.0%" not in str(ex.report) and "no matmul or convolution" in str(ex.report)


def test_report_says_when_the_device_macs_include_padding():
    func, inputs, reference = workload("dense", 20, 24, 40, "none")
    ex, s = run(func, inputs, reference, np.random.default_rng(3))
    assert s.stats.macs > ex.report.total_macs
    assert f"the device executes {s.stats.macs:,} MACs" in str(ex.report)
