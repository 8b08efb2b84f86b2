"""Runtime: compiled TVMScript calling accel.* through T.call_packed, sessions, buffer table."""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import accel
from accel.hw import runtime
from accel.hw.isa import Mem


@T.prim_func
def gemm64(A: T.Buffer((64, 64), "int8"), B: T.Buffer((64, 64), "int8"),
           C: T.Buffer((64, 64), "int32")):
    # C = A @ B.T on 16x16 tiles: INP and WGT double-buffered by k0 parity, tokens via
    # dep_push/dep_pop (queues: 0 load, 1 compute, 2 store).
    T.func_attr({"global_symbol": "gemm64"})
    for i0, j0 in T.grid(4, 4):
        T.call_packed("accel.gemm", 1, 0, 0, 0, 16, 16, 16, 1, 1, 0, 0, 0, 0, 0, 0, 0)
        for k0 in range(4):
            T.call_packed("accel.load", A, i0 * 1024 + k0 * 16, 1, k0 % 2 * 256, 16, 16, 16, 64,
                          0, 0, 0, 0, 0, 0)
            T.call_packed("accel.load", B, j0 * 1024 + k0 * 16, 2, k0 % 2 * 256, 16, 16, 16, 64,
                          0, 0, 0, 0, 0, 0)
            T.call_packed("accel.dep_push", 0, 1)
            T.call_packed("accel.dep_pop", 0, 1)
            T.call_packed("accel.gemm", 0, 0, k0 % 2 * 256, k0 % 2 * 256, 16, 16, 16, 1, 1,
                          0, 0, 0, 0, 0, 0, 0)
            T.call_packed("accel.dep_push", 1, 0)
            T.call_packed("accel.dep_pop", 1, 0)
        T.call_packed("accel.dep_push", 1, 2)
        T.call_packed("accel.dep_pop", 1, 2)
        T.call_packed("accel.store", C, i0 * 1024 + j0 * 16, 0, 16, 16, 16, 64, 0, 0)
        T.call_packed("accel.dep_push", 2, 1)
        T.call_packed("accel.dep_pop", 2, 1)
    T.call_packed("accel.sync")


@T.prim_func
def bad_load(A: T.Buffer((64, 64), "int8")):
    T.func_attr({"global_symbol": "bad_load"})
    T.call_packed("accel.load", A, 4000, 1, 0, 16, 16, 16, 64, 0, 0, 0, 0, 0, 0)
    T.call_packed("accel.sync")


@pytest.fixture(scope="module")
def compiled():
    return tvm.compile(gemm64, target="llvm")


def _operands(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (64, 64), dtype=np.int8)
    b = rng.integers(-128, 128, (64, 64), dtype=np.int8)
    return a, b, a.astype(np.int32) @ b.astype(np.int32).T


def test_compiled_primfunc_runs_a_64_cubed_gemm_on_the_simulator(compiled):
    a, b, want = _operands(0)
    ta, tb, tc = (tvm.runtime.tensor(x) for x in (a, b, np.zeros((64, 64), np.int32)))
    with accel.Session() as s:
        compiled(ta, tb, tc)
    np.testing.assert_array_equal(tc.numpy(), want)
    st = s.stats
    # 128 tile loads and the NOP that carries the last WAR pop
    assert st.instructions == {"LOAD": 129, "STORE": 16, "GEMM": 80, "ALU": 0, "FINISH": 1}
    assert st.macs == 64**3
    assert st.bytes == {"dram_to_sram": 2 * 64 * 64 * 4, "sram_to_dram": 64 * 64 * 4}
    # The recorded stream is inspectable, and decodes to what the disassembly shows.
    lines = s.disassembly().splitlines()
    assert len(accel.decode(s.stream())) == len(lines) == 226
    assert lines[1].startswith("0001  LOAD INP[0 ld=16] <- slot0[0 ld=64] 16x16")
    # Borrowed DLTensor slots are released at sync.
    assert all(v is None for v in s._table)


def test_calls_outside_a_session_use_the_default_session(compiled):
    a, b, want = _operands(1)
    tc = tvm.runtime.tensor(np.zeros((64, 64), np.int32))
    before = runtime.default_session().stats.macs
    compiled(tvm.runtime.tensor(a), tvm.runtime.tensor(b), tc)
    np.testing.assert_array_equal(tc.numpy(), want)
    assert runtime.default_session().stats.macs == before + 64**3
    assert accel.current_session() is runtime.default_session()


def test_sessions_nest_and_repeated_runs_do_not_grow_the_buffer_table(compiled):
    a, b, want = _operands(2)
    ta, tb = tvm.runtime.tensor(a), tvm.runtime.tensor(b)
    tc = tvm.runtime.tensor(np.zeros((64, 64), np.int32))
    with accel.Session() as outer:
        with accel.Session() as inner:
            for _ in range(3):
                compiled(ta, tb, tc)
        assert accel.current_session() is outer
    assert inner.stats.instructions["FINISH"] == 3 and outer.stats.cycles == 0
    assert len(inner._table) == 3
    np.testing.assert_array_equal(tc.numpy(), want)


def test_errors_inside_compiled_code_name_the_instruction():
    f = tvm.compile(bad_load, target="llvm")
    a = tvm.runtime.tensor(np.zeros((64, 64), np.int8))
    with accel.Session() as s:
        with pytest.raises(Exception, match=r"instruction #0 `LOAD INP\[0 ld=16\] <- slot0\[4000 "
                                            r"ld=64\] 16x16`: DRAM elements \[4000, 4976\)"):
            f(a)
        s.discard()


def test_host_dtype_must_match_the_scratchpad():
    with accel.Session() as s:
        with pytest.raises(accel.DtypeMismatchError):
            s.load(np.zeros(16, np.int32), 0, Mem.INP, 0, 16, rows=1, cols=16, dram_ld=16)


def test_non_contiguous_host_arrays_are_rejected():
    with pytest.raises(ValueError, match="C-contiguous"):
        accel.Session().buffer(np.zeros((4, 4), np.int8)[:, ::2])


def test_session_exit_with_exception_discards_the_stream():
    out = np.zeros(16, np.int32)
    src = np.ones(16, np.int32)
    with pytest.raises(KeyError):
        with accel.Session() as s:
            s.load(src, 0, Mem.ACC, 0, 16, rows=1, cols=16, dram_ld=16)
            raise KeyError("boom")
    assert s.stats.instructions["LOAD"] == 0 and not out.any()


def test_global_functions_are_registered():
    for name in runtime.GLOBAL_FUNCTIONS:
        assert tvm.get_global_func(name) is not None


def test_repeated_calls_reuse_validated_instructions_until_sync():
    a = np.ones((16, 16), np.int8)
    with accel.Session() as s:
        for _ in range(3):
            s.load(a, 0, Mem.INP, 0, 16, rows=16, cols=16, dram_ld=16)
        assert len(s._cache) == 1
        assert s.emitter.instructions[0] is s.emitter.instructions[2]
    assert not s._cache and s.stats.instructions["LOAD"] == 3
