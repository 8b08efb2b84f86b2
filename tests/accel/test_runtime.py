"""Runtime: compiled code calling accel.* through T.call_packed, sessions, buffer table, and
the runtime's promises under faults, threads and aliasing (issue 12)."""

import threading

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.script import tirx as T

import accel
from accel.hw import instructions, runtime
from accel.hw.isa import AluOp, Mem, StoreMode
from tirpat import device


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
        T.call_packed("accel.store", C, i0 * 1024 + j0 * 16, 0, 16, 16, 16, 64, 1, 0, 0)
        T.call_packed("accel.dep_push", 2, 1)
        T.call_packed("accel.dep_pop", 2, 1)
    T.call_packed("accel.sync")


@T.prim_func
def bad_load(A: T.Buffer((64, 64), "int8")):
    T.func_attr({"global_symbol": "bad_load"})
    T.call_packed("accel.load", A, 4000, 1, 0, 16, 16, 16, 64, 0, 0, 0, 0, 0, 0)
    T.call_packed("accel.sync")


@T.prim_func
def copy_then_fail(A: T.Buffer((256,), "int32"), C: T.Buffer((256,), "int32"), offset: T.int32):
    # A through a temporary (whose memory is gone once the call returns) into C, then a LOAD
    # that fails when `offset` is out of range: the STORE before it must never run.
    T.func_attr({"global_symbol": "copy_then_fail"})
    tmp = T.alloc_buffer((256,), "int32")
    for i in range(256):
        tmp[i] = A[i] + 1
    T.call_packed("accel.load", tmp, 0, 3, 0, 16, 16, 16, 16, 0, 0, 0, 0, 0, -1)
    T.call_packed("accel.store", C, 0, 0, 16, 16, 16, 16, 1, 0, -1)
    T.call_packed("accel.load", A, offset, 3, 256, 16, 16, 16, 16, 0, 0, 0, 0, 0, -1)
    T.call_packed("accel.sync")


@pytest.fixture(scope="module")
def compiled():
    return tvm.compile(gemm64, target="llvm")


@pytest.fixture(scope="module")
def failing():
    return tvm.compile(copy_then_fail, target="llvm")


def dense(m, n, k):
    A = te.placeholder((m, k), "int8", name="A")
    B = te.placeholder((n, k), "int8", name="B")
    return te.create_prim_func([A, B, topi.nn.dense(A, B, out_dtype="int32")])


@pytest.fixture(scope="module")
def dense64():
    return accel.build(dense(64, 64, 64))


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
    assert st.instructions == {"LOAD": 129, "STORE": 16, "GEMM": 80, "ALU": 0, "FINISH": 1, "DWMAC": 0, "LUT": 0,
                               "ALU_CHAIN": 0}
    assert st.macs == 64**3
    assert st.bytes == {"dram_to_sram": 2 * 64 * 64 * 4, "sram_to_dram": 64 * 64 * 4}
    # The recorded stream is inspectable, and decodes to what the disassembly shows.
    lines = s.disassembly().splitlines()
    assert len(accel.decode(s.stream())) == len(lines) == 226
    assert lines[1].startswith("0001  LOAD INP[0 ld=16] <- slot0[0 ld=64] 16x16")
    # Borrowed DLTensor slots are released at sync.
    assert all(v is None for v in s.buffers.views)


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
    assert len(inner.buffers) == 3
    np.testing.assert_array_equal(tc.numpy(), want)


def test_errors_inside_compiled_code_name_the_instruction():
    f = tvm.compile(bad_load, target="llvm")
    a = tvm.runtime.tensor(np.zeros((64, 64), np.int8))
    with accel.Session():
        with pytest.raises(accel.DmaRangeError, match=r"instruction #0 `LOAD INP\[0 ld=16\] <- slot0\[4000 "
                                                      r"ld=64\] 16x16`: DRAM elements \[4000, 4976\)"):
            device.invoke(f, a)
        # through TVM's FFI alone the type is lost but the message is kept
        with pytest.raises(Exception, match=r"DRAM elements \[4000, 4976\)"):
            f(a)


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
    assert s.stats.instructions["LOAD"] == 0 and not out.any() and s.pending == 0


def test_repeated_calls_reuse_validated_instructions_until_sync():
    a = np.ones((16, 16), np.int8)
    with accel.Session() as s:
        for _ in range(3):
            s.load(a, 0, Mem.INP, 0, 16, rows=16, cols=16, dram_ld=16)
        assert s.emitter.instructions[0] is s.emitter.instructions[2]
    assert s.stats.instructions["LOAD"] == 3


# ---------------------------------------------------------------------- the ABI, declared once
def test_every_declared_function_is_registered_with_tvm():
    names = {*instructions.FUNCTIONS, *instructions.OTHER_FUNCTIONS}
    assert set(runtime.RUNTIME.functions) == {n.split(".")[1] for n in names}
    for name in names:
        assert tvm.get_global_func(name) is not None


@pytest.mark.parametrize("name", list(instructions.FUNCTIONS))
def test_session_methods_take_the_declared_arguments(name):
    import inspect

    params = inspect.signature(getattr(accel.Session, name.split(".")[1])).parameters
    assert set(params) - {"self"} == set(instructions.FUNCTIONS[name][0].arguments)


def test_isa_md_lists_the_abi_as_declared():
    import pathlib

    text = (pathlib.Path(accel.__file__).parent / "ISA.md").read_text()
    assert instructions.markdown_table() in text


def test_a_call_with_the_wrong_number_of_arguments_is_a_clear_error():
    with accel.Session():
        with pytest.raises(TypeError, match=r"accel.store takes 10 arguments \(host, elem_offset, .*\) or 9 without "
                                            r"dram_step, got 2"):
            device.invoke(runtime.RUNTIME.functions["store"], np.zeros(4, np.int32), 0)


@T.prim_func
def store_as_compiled_before_dram_step(A: T.Buffer((16, 16), "int32"), C: T.Buffer((16, 24), "int32")):
    T.func_attr({"global_symbol": "store_as_compiled_before_dram_step"})
    T.call_packed("accel.load", A, 0, 3, 0, 16, 16, 16, 16, 0, 0, 0, 0, 0, -1)
    T.call_packed("accel.store", C, 4, 0, 16, 16, 12, 24, 0, -1)       # no dram_step: rows are contiguous
    T.call_packed("accel.sync")


def test_code_compiled_before_the_store_gained_dram_step_still_runs():
    a = np.arange(256, dtype=np.int32).reshape(16, 16) - 100
    c = tvm.runtime.tensor(np.full((16, 24), -1, np.int32))
    tvm.compile(store_as_compiled_before_dram_step, target="llvm")(tvm.runtime.tensor(a), c)
    want = np.full((16, 24), -1, np.int32)
    want[:, 4:16] = a[:, :12]
    np.testing.assert_array_equal(c.numpy(), want)


# ---------------------------------------------------------------------- issue 12
def test_a_failed_call_leaves_nothing_pending_and_writes_nothing(failing):
    """Item 1: the STORE emitted before the failing LOAD never runs, in a Session or not."""
    a = tvm.runtime.tensor(np.arange(256, dtype=np.int32))
    c = tvm.runtime.tensor(np.full(256, -7, np.int32))
    with pytest.raises(accel.DmaRangeError, match=r"<- slot\d+\[1000000 "):
        device.invoke(failing, a, c, 10**6)
    assert runtime.default_session().pending == 0
    runtime.default_session().sync()     # the next sync: nothing of the failed call runs
    with accel.Session() as s:
        with pytest.raises(Exception, match="outside host buffer"):
            failing(a, c, 10**6)         # a bare call (no invoke) is atomic as well
        assert s.pending == 0
    assert (c.numpy() == -7).all()
    failing(a, c, 0)                     # the same function, valid: it runs
    np.testing.assert_array_equal(c.numpy(), np.arange(256) + 1)


class _FaultySession(accel.Session):
    """A session whose ``fail_at``-th instruction call raises (an injected fault)."""

    def __init__(self, fail_at=None):
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    def _emit(self, cls, values, deps):
        self.calls += 1
        if self.calls == self.fail_at:
            raise _Injected(f"fault at call {self.calls}")
        return super()._emit(cls, values, deps)


class _Injected(Exception):
    pass


@pytest.mark.parametrize("where", [0.0, 0.3, 0.6, 1.0])
def test_a_fault_injected_mid_call_is_relayed_and_leaves_the_session_usable(dense64, where):
    a, b, want = _operands(3)
    c = tvm.runtime.tensor(np.full((64, 64), 5, np.int32))
    with _FaultySession() as counting:
        dense64(a, b, tvm.runtime.tensor(np.zeros((64, 64), np.int32)))
    fail_at = max(1, round(where * counting.calls))     # the first, ..., the last instruction call
    s = _FaultySession(fail_at)
    with pytest.raises(_Injected, match=f"fault at call {fail_at}"):
        with s:
            dense64(a, b, c)
    assert s.pending == 0 and all(v is None for v in s.buffers.views)
    assert (c.numpy() == 5).all() and s.stats.instructions["FINISH"] == 0
    with s:
        dense64(a, b, c)      # the fault was not sticky: the next call runs, alone
    np.testing.assert_array_equal(c.numpy(), want)
    assert s.stats.instructions["FINISH"] == 1


def _in_threads(work, n=4):
    barrier = threading.Barrier(n)
    errors = []

    def run(i):
        barrier.wait()
        try:
            work(i)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


def test_threads_without_a_session_each_get_right_results(dense64):
    """Item 2: each thread's default session is its own."""
    a, b, want = _operands(4)
    sessions = []       # the sessions themselves: a finished thread's could be freed and its id reused

    def work(i):
        for _ in range(8):
            c = np.zeros((64, 64), np.int32)
            dense64(a, b, c)
            np.testing.assert_array_equal(c, want)
        sessions.append(accel.default_session())

    _in_threads(work)
    assert len({id(s) for s in sessions}) == 4


def test_threads_with_their_own_sessions_count_their_own_work(compiled):
    a, b, want = _operands(5)
    ta, tb = tvm.runtime.tensor(a), tvm.runtime.tensor(b)

    def work(i):
        with accel.Session() as s:
            for _ in range(4):
                tc = tvm.runtime.tensor(np.zeros((64, 64), np.int32))
                compiled(ta, tb, tc)
                np.testing.assert_array_equal(tc.numpy(), want)
        assert s.stats.macs == 4 * 64**3

    _in_threads(work)


def test_threads_sharing_one_session_take_turns(compiled):
    a, b, want = _operands(6)
    shared = accel.Session()

    def work(i):
        with shared:
            for _ in range(4):
                tc = tvm.runtime.tensor(np.zeros((64, 64), np.int32))
                compiled(tvm.runtime.tensor(a), tvm.runtime.tensor(b), tc)
                np.testing.assert_array_equal(tc.numpy(), want)

    _in_threads(work)
    assert shared.stats.macs == 16 * 64**3 and shared.stats.instructions["FINISH"] == 16


def test_an_executable_carries_its_config():
    """Item 3: built for tile=32 and run outside any session, it runs on a tile=32 core (a
    session of its own)."""
    config = accel.Config(tile=32)
    ex = accel.build(dense(48, 40, 72), config)
    rng = np.random.default_rng(7)
    a, b = rng.integers(-128, 128, (48, 72), dtype=np.int8), rng.integers(-128, 128, (40, 72), dtype=np.int8)
    c = np.zeros((48, 40), np.int32)
    ex(a, b, c)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32).T)
    assert ex.sessions["accel"].config == config and ex.sessions["accel"].stats.macs > 0
    with pytest.raises(device.OptionsMismatch, match="built for accel with tile=32, but the current accel "
                                                     r"session \(Session\) has tile=16"):
        with accel.Session():
            ex(a, b, c)


@pytest.mark.parametrize("alias", ["reshape", "offset view"])
def test_aliased_host_views_are_ordered_by_memory(alias):
    """Item 4: a STORE through one view of a buffer, then a LOAD through another view."""
    src = (np.arange(256, dtype=np.int32) % 100) + 1
    host = np.zeros(512, np.int8)
    out = np.zeros(256, np.int32)
    if alias == "reshape":
        into, offset = host.reshape(32, 16), 0          # same memory, another shape
    else:
        into, offset = host[256:], 256                  # part of the same memory
    with accel.Session() as s:
        s.load(src, 0, Mem.ACC, 0, 16, rows=16, cols=16, dram_ld=16, deps=accel.AUTO)
        # a slow ALU step first, so that the LOAD queue would run ahead without a token
        s.alu(AluOp.ADD, 0, imm=0, use_imm=True, ext_out=16, dst_stride_out=16, deps=accel.AUTO)
        s.store(into, 0, 0, 16, rows=16, cols=16, dram_ld=16, mode=StoreMode.WRAP, deps=accel.AUTO)
        s.load(host, offset, Mem.INP, 0, 16, rows=16, cols=16, dram_ld=16, deps=accel.AUTO)
        s.load(np.eye(16, dtype=np.int8), 0, Mem.WGT, 0, 16, rows=16, cols=16, dram_ld=16, deps=accel.AUTO)
        s.gemm(256, 0, 0, 16, 16, 16, reset=True, deps=accel.AUTO)
        s.gemm(256, 0, 0, 16, 16, 16, deps=accel.AUTO)
        s.store(out, 0, 256, 16, rows=16, cols=16, dram_ld=16, deps=accel.AUTO)
    np.testing.assert_array_equal(out, src)


def test_inputs_are_never_written_back(dense64):
    """Item 8: read-only and broadcast inputs are fine; a read-only output is named."""
    a, b, want = _operands(8)
    a.flags.writeable = False
    row = np.broadcast_to(b[:1], (64, 64))
    c = np.zeros((64, 64), np.int32)
    dense64(a, row, c)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ row.astype(np.int32).T)
    frozen = np.zeros((64, 64), np.int32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="argument T_matmul_NT is read-only, but main writes it"):
        dense64(a, b, frozen)


def test_default_sessions_keep_only_their_last_stream(dense64):
    """Item 10: recording is bounded where nobody asked for it."""
    a, b, _ = _operands(9)
    for _ in range(3):
        dense64(a, b, np.zeros((64, 64), np.int32))
    one = accel.decode(dense64.sessions["accel"].stream())
    dense64(a, b, np.zeros((64, 64), np.int32))
    assert len(accel.decode(dense64.sessions["accel"].stream())) == len(one)
    with accel.Session(record=2) as s:
        for _ in range(3):
            dense64(a, b, np.zeros((64, 64), np.int32))
    assert len(accel.decode(s.stream())) == 2 * len(one)
    with accel.Session(record=False) as s:
        dense64(a, b, np.zeros((64, 64), np.int32))
    assert s.stream() == b"" and s.stats.instructions["FINISH"] == 1


def test_bad_host_buffers_and_deps_are_clear_errors():
    s = accel.Session()
    with pytest.raises(TypeError, match="a host buffer must be a numpy array or a tvm.runtime.Tensor, got list"):
        s.load([1, 2, 3], 0, Mem.ACC, 0, 16, rows=1, cols=3, dram_ld=3)
    with pytest.raises(TypeError, match=r"deps must be AUTO \(-1\) or a 4-bit mask .* got 'x'"):
        s.load(np.zeros(3, np.int32), 0, Mem.ACC, 0, 16, rows=1, cols=3, dram_ld=3, deps="x")
    with pytest.raises(ValueError, match="got 16"):
        s.load(np.zeros(3, np.int32), 0, Mem.ACC, 0, 16, rows=1, cols=3, dram_ld=3, deps=16)
    assert s.pending == 0


def test_the_hardware_side_loads_neither_the_compiler_nor_the_model_level():
    import json
    import subprocess
    import sys

    probe = (
        "import json, sys, tvm\n"
        "before = set(tvm.tirx.compilation_pipeline.PIPELINE_MAP)\n"
        "import accel.hw.runtime, accel.hw.instructions, accel.hw.sim, accel.hw.tokens, tirpat.device\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('accel.compiler', 'tirpat.model')))\n"
        "new = sorted(set(tvm.tirx.compilation_pipeline.PIPELINE_MAP) - before)\n"
        "print(json.dumps([loaded, new, sorted(accel.hw.runtime.RUNTIME.functions)]))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded, pipelines, functions = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [] and pipelines == []
    assert functions == sorted(n.split(".")[1] for n in (*instructions.FUNCTIONS, *instructions.OTHER_FUNCTIONS))
