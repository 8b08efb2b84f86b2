"""The accel pipeline refuses what it cannot run, with errors that name the statement."""

import numpy as np
import pytest
import tvm

import accel
from tirpat.testing import tiled_matmul

SCOPES = ("local.accel_inp", "local.accel_wgt", "local.accel_acc")


def test_an_already_scheduled_workload_only_runs_the_pipeline():
    func = tiled_matmul(32, 32, 32, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    ex = accel.build(func)
    assert ex.report.counts == {"accel.load": 2, "accel.gemm": 1, "accel.zero_init": 1, "accel.store": 1}
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-128, 128, (32, 32), dtype=np.int8) for _ in range(2))
    c = np.zeros((32, 32), np.int32)
    with accel.Session():
        ex(a, b, c)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32).T)


def test_an_unmatched_scratchpad_access_names_the_statement():
    # 8x8 tiles are not the hardware's 16x16x16 GEMM: no rule matches the update.
    func = tiled_matmul(16, 16, 16, (8, 8, 8), decompose_init=True, scopes=SCOPES)
    with pytest.raises(accel.PlanError, match=r"no accel rule matched .*C_local.accel_acc, so it cannot run: C_local_accel_acc\[i_1_init, j_1_init\] = 0"):
        accel.build(func)


def test_accel_calls_in_a_parallel_loop_are_rejected():
    func = tiled_matmul(32, 32, 32, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    outer = func.body
    assert isinstance(outer, tvm.tirx.For)
    par = tvm.tirx.For(outer.loop_var, outer.min, outer.extent, tvm.tirx.ForKind.PARALLEL, outer.body)
    with pytest.raises(accel.PlanError, match=f"parallel loop '{outer.loop_var.name}'"):
        accel.build(func.with_body(par))


def test_runtime_errors_keep_their_type_through_compiled_code():
    func = tiled_matmul(32, 32, 32, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    ex = accel.build(func)
    a = np.zeros((32, 32), np.int8)
    c = np.zeros((32, 32), np.int32)
    with pytest.raises(accel.ScratchpadOverflowError, match="INP"):
        with accel.Session(accel.Config(inp_bytes=256, wgt_bytes=256, acc_bytes=1024)):
            ex(a, a, c)   # built for the default Config: the addresses do not fit this one


def test_pipeline_is_registered_for_tvm_compile():
    func = tiled_matmul(16, 16, 16, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm", tir_pipeline=accel.pipeline_name())
    a = np.ones((16, 16), np.int8)
    ta, tc = tvm.runtime.tensor(a), tvm.runtime.tensor(np.zeros((16, 16), np.int32))
    with accel.Session() as s:
        ex["main"](ta, ta, tc)
    assert (tc.numpy() == 16).all() and s.stats.instructions["GEMM"] == 2
