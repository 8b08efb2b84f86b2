"""Stream builder: a session replays a stream it built before, and the result is always the
stream the calls describe (compared with fresh sessions that build every stream); compiled
code's static groups replay their stored Program in one callback, with the same results,
cycles, statistics and recorded stream as calls that run every instruction."""

import importlib.util
import pathlib

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings, strategies as st

import accel
from accel.hw import runtime
from accel.hw import stream as stream_module
from accel.hw.isa import make as isa_make
from accel.hw.isa import Mem, Queue
from accel.hw.stream import AUTO
from tirpat.device import OptionsMismatch

_spec = importlib.util.spec_from_file_location("accel_sim_strategies", pathlib.Path(__file__).with_name("test_sim.py"))
sim_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_tests)

EDGES = [(Queue.LOAD, Queue.COMPUTE), (Queue.COMPUTE, Queue.LOAD), (Queue.COMPUTE, Queue.STORE),
         (Queue.STORE, Queue.COMPUTE)]
instructions = st.one_of(st.sampled_from([Mem.INP, Mem.WGT]).flatmap(sim_tests.dma), sim_tests.gemms(),
                         sim_tests.alus(), sim_tests.dma(Mem.ACC), sim_tests.dma("store"))


@st.composite
def call_lists(draw):
    """Calls as compiled code makes them: instructions with automatic tokens, or with
    explicit tokens (flags of their own, and dep_push/dep_pop pairs)."""
    if draw(st.booleans()):
        return [("ins", ins, AUTO) for ins in draw(st.lists(instructions, min_size=1, max_size=10))]
    steps = draw(st.lists(st.one_of(instructions.map(lambda i: ("ins", i, 0)),
                                    st.sampled_from(EDGES).map(lambda e: ("dep", e, None))), max_size=14))
    # The explicit program stays in program order: every step is fenced on all queues.
    out = []
    for step in steps:
        out.append(step)
        if step[0] == "ins":
            for edge in EDGES:
                out.append(("dep", edge, None))
    return out


def _play(session, calls, host):
    for slot, h in enumerate(host):
        assert session.buffer(h) == slot
    for kind, what, deps in calls:
        if kind == "dep":
            session.dep_push(*what)
            session.dep_pop(*what)
        else:
            values = tuple(getattr(what, f) for f in runtime._FIELDS[type(what)])
            session._emit(type(what), values, deps)
    return session.sync()


def _fresh(calls, host):
    s = accel.Session(sim_tests.SMALL)
    stats = _play(s, calls, host)
    return s.stream(), stats.cycles


@given(call_lists(), call_lists(), st.integers(0, 12))
def test_replayed_streams_equal_freshly_built_ones(calls, other, cut):
    """The same calls three times, then a stream that follows them for a while and
    diverges, then one that stops early: each gives the stream, cycles and memory a
    fresh session gives."""
    host, want = sim_tests._host(), sim_tests._host()
    s = accel.Session(sim_tests.SMALL)
    ref = accel.Session(sim_tests.SMALL)
    ref.builder.keep = 0            # builds every stream
    streams = [calls, calls, calls, calls[:cut] + other, calls[:cut], calls]
    recorded = cycles = 0
    for program in streams:
        stats = _play(s, program, host)
        _play(ref, program, want)
        for got, exp in zip(host, want):
            np.testing.assert_array_equal(got, exp)
        for mem in Mem:
            np.testing.assert_array_equal(s.scratchpad(mem), ref.scratchpad(mem))
        fresh_stream, fresh_cycles = _fresh(program, sim_tests._host())
        assert s.stream()[recorded:] == fresh_stream
        assert stats.cycles - cycles == fresh_cycles
        recorded, cycles = len(s.stream()), stats.cycles
    assert s.builder.replays >= (2 if calls else 0) and ref.builder.replays == 0


def test_a_replay_follows_the_buffer_table_it_runs_on():
    """Borrowed tensors get the same slots call after call: a replayed stream reads and
    writes this call's tensors, refuses one that became too small before writing
    anything, and orders slots that now share memory as a fresh build does."""
    def calls(s, x, y, out):
        s.load(x, 0, Mem.ACC, 0, 16, rows=4, cols=16, dram_ld=16, deps=AUTO)
        s.alu(accel.AluOp.ADD, 0, src_addr=0, ext_out=4, dst_stride_out=16, src_stride_out=16, deps=AUTO)
        s.store(out, 0, 0, 16, rows=4, cols=16, dram_ld=16, deps=AUTO)
        s.load(y, 0, Mem.ACC, 64, 16, rows=4, cols=16, dram_ld=16, deps=AUTO)
        s.store(out, 64, 64, 16, rows=4, cols=16, dram_ld=16, deps=AUTO)
        return s.sync()

    s = accel.Session()
    for seed in range(3):
        x = np.random.default_rng(seed).integers(-99, 99, 64, dtype=np.int32)
        tx, ty = tvm.runtime.tensor(x), tvm.runtime.tensor(x + 1)
        tout = tvm.runtime.tensor(np.zeros(128, np.int32))
        calls(s, tx, ty, tout)
        np.testing.assert_array_equal(tout.numpy(), np.concatenate([2 * x, x + 1]))
    assert s.builder.replays == 2

    # the LOAD from y now reads what the first STORE wrote: a fresh build orders them
    tout = tvm.runtime.tensor(np.zeros(128, np.int32))
    ty = tout._create_view((64,), "int32", 0)
    x = np.arange(64, dtype=np.int32)
    calls(s, tvm.runtime.tensor(x), ty, tout)
    fresh = accel.Session()
    fout = tvm.runtime.tensor(np.zeros(128, np.int32))
    calls(fresh, tvm.runtime.tensor(x), fout._create_view((64,), "int32", 0), fout)
    np.testing.assert_array_equal(tout.numpy(), fout.numpy())
    np.testing.assert_array_equal(tout.numpy()[64:], 2 * x)
    assert s.stream()[-len(fresh.stream()):] == fresh.stream()

    small = tvm.runtime.tensor(np.zeros(100, np.int32))
    with pytest.raises(accel.DmaRangeError, match="outside host buffer slot"):
        calls(s, tvm.runtime.tensor(x), tvm.runtime.tensor(x), small)
    assert not small.numpy().any() and s.pending == 0


def test_an_instruction_made_in_one_stream_is_checked_again_in_another_against_its_table(monkeypatch):
    """Another stream repeating a call reuses the instruction made for it; one that reads no
    host slot needs no new check, but a LOAD is checked against the new stream's buffer
    table: a host buffer too small now is refused at the call, naming the range."""
    made = []
    monkeypatch.setattr(stream_module, "make", lambda cls, fields: made.append(cls) or isa_make(cls, fields))
    s = accel.Session()
    big, small = tvm.runtime.tensor(np.zeros(256, np.int8)), tvm.runtime.tensor(np.zeros(16, np.int8))
    s.alu(accel.AluOp.ADD, 0, imm=1, use_imm=True, deps=AUTO)
    s.alu(accel.AluOp.ADD, 16, imm=1, use_imm=True, deps=AUTO)
    s.load(big, 0, Mem.INP, 0, 16, rows=16, cols=16, dram_ld=16, deps=AUTO)
    s.sync()
    assert made == [accel.Alu, accel.Alu, accel.Load]
    made.clear()
    s.alu(accel.AluOp.ADD, 32, imm=1, use_imm=True, deps=AUTO)     # another stream, not a replay
    s.alu(accel.AluOp.ADD, 16, imm=1, use_imm=True, deps=AUTO)
    assert made == [accel.Alu]
    with pytest.raises(accel.DmaRangeError, match=r"\[0, 256\) are outside host buffer slot 0 of 16"):
        s.load(small, 0, Mem.INP, 0, 16, rows=16, cols=16, dram_ld=16, deps=AUTO)
    assert made == [accel.Alu]


def test_a_call_made_in_another_stream_is_checked_again_only_when_its_slot_changed(monkeypatch):
    """What a LOAD's check reads of the buffer table is its slot's dtype, size and
    writability: a later stream whose slot has the same ones (another tensor, elsewhere)
    does not check the LOAD again, one whose slot has another dtype refuses it at the call
    with the check's own error (as a fresh session does)."""
    checked = []
    from accel.hw.sim import Simulator
    check = Simulator.check
    monkeypatch.setattr(Simulator, "check", lambda self, i, ins, b: checked.append(ins.opcode) or check(self, i, ins, b))
    s = accel.Session()
    s.builder.keep = 0            # builds every stream (a replayed one is checked as a whole at its sync)

    def load(host):
        return s.load(host, 0, Mem.INP, 0, 16, rows=16, cols=16, dram_ld=16, deps=AUTO)

    load(tvm.runtime.tensor(np.zeros(256, np.int8)))
    s.sync()
    assert checked.count(accel.Opcode.LOAD) == 1
    load(tvm.runtime.tensor(np.ones(256, np.int8)))       # slot 0 again: int8, 256 elements, writable
    s.sync()
    assert checked.count(accel.Opcode.LOAD) == 1
    wrong = tvm.runtime.tensor(np.zeros(256, np.int32))
    with pytest.raises(accel.DtypeMismatchError) as err:
        load(wrong)
    with pytest.raises(accel.DtypeMismatchError) as fresh:
        accel.Session().load(wrong, 0, Mem.INP, 0, 16, rows=16, cols=16, dram_ld=16, deps=AUTO)
    assert str(err.value) == str(fresh.value) and s.pending == 0


_STORE_THEN_LOAD = [accel.Store(sram_addr=0, sram_ld=16, slot=3, dram_offset=0, dram_ld=16, rows=1, cols=16,
                                 mode=accel.StoreMode.WRAP),
                     accel.Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=1,
                                cols=16)]


@settings(deadline=None, max_examples=40)
@given(st.lists(instructions, min_size=1, max_size=10), st.lists(st.integers(0, 20), max_size=24),
       st.integers(1, 4))
@example(_STORE_THEN_LOAD, [], 2)     # the LOAD reads what the STORE wrote only in the second stream
def test_streams_equal_those_the_tracker_builds_instruction_by_instruction(program, picks, streams):
    """A session's streams (instructions made, checked and placed once per call, then again
    in later streams on tensors elsewhere) equal streams built one instruction at a time
    with the plain tracker (order, emit, record) on the same buffer table: the same
    instructions, order and tokens."""
    from accel.hw.emitter import Emitter
    from accel.hw.isa import encode
    from accel.hw.tokens import DependencyTracker
    from tirpat.device.buffers import BufferTable

    s = accel.Session(sim_tests.SMALL)
    calls = [program[k % len(program)] for k in picks] or program      # repeats within a stream
    for n in range(streams):
        host = [tvm.runtime.tensor(h) for h in sim_tests._host()]          # new memory each stream
        if n % 2:       # and where slot 3 (a STORE's) overlaps slot 0 (a LOAD's): tokens order them
            shared = tvm.runtime.tensor(np.concatenate([sim_tests._host()[0], np.zeros(1, np.int8)]))
            host[0], host[3] = shared._create_view((1024,), "int8", 0), shared._create_view((1024,), "int8", 1)
        ordered = calls if n % 2 else program + calls
        for slot, h in enumerate(host):
            assert s.buffer(h) == slot
        for ins in ordered:
            s._emit(type(ins), tuple(getattr(ins, f) for f in runtime._FIELDS[type(ins)]), AUTO)
        s.sync()
        table = BufferTable()
        for h in host:
            table.slot(h)
        em, deps = Emitter(lambda i, ins: s.simulator.check(i, ins, table.views)), DependencyTracker(16, table.byte_range)
        for ins in ordered:
            deps.record(ins, em.emit(deps.order(em, ins)))
        assert s.stream()[-len(encode(em.instructions)) - 64:] == encode(em.finish())


@pytest.fixture(scope="module")
def dense():
    from tvm import te, topi

    A = te.placeholder((48, 64), "int8", name="A")
    W = te.placeholder((32, 64), "int8", name="W")
    return accel.build(te.create_prim_func([A, W, topi.nn.dense(A, W, out_dtype="int32")]))


def test_a_compiled_call_is_built_once_and_replayed(dense):
    rng = np.random.default_rng(0)
    with accel.Session() as s:
        for _ in range(4):
            a = rng.integers(-128, 128, (48, 64), dtype=np.int8)
            w = rng.integers(-128, 128, (32, 64), dtype=np.int8)
            out = np.zeros((48, 32), np.int32)
            dense(a, w, out)
            np.testing.assert_array_equal(out, a.astype(np.int32) @ w.astype(np.int32).T)
    # the first call built the stream; the later ones ran it again in one callback each
    assert s.replayed == 3 and s.builder.replays == 0
    assert s.builder._recordings[0].program._fused     # the later calls ran the batched plan


def test_a_stored_stream_is_fused_as_it_first_runs(dense):
    """The stream a static group stores runs again at every later call, so its batched plan
    is made at its first run (the second call already runs it, and the per-instruction calls
    are never prepared); a stream no group stores waits for its third run, so a stream run
    once or twice never pays for the analysis."""
    a, w = np.ones((48, 64), np.int8), np.ones((32, 64), np.int8)
    with accel.Session() as s:
        dense(a, w, np.zeros((48, 32), np.int32))
    (program,) = [stored.stream for variants in s._replays.values() for stored in variants]
    assert program._fused and program._ops is None
    called = accel.Session()
    called.kept_replays = 0
    with called:
        dense(a, w, np.zeros((48, 32), np.int32))
    assert called.builder._recordings[0].program._fused is None


def _account(stats):
    return stats.cycles, stats.busy, stats.instructions, stats.bytes, stats.macs, stats.timeline.text()


@settings(deadline=None, max_examples=8)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=3, max_size=3))
def test_replayed_calls_equal_calls_that_run_every_instruction(dense, seeds):
    """A session that replays each call's stream in one callback and one that makes every
    call (it keeps no streams) compute the same, bit-exact with numpy, on new tensors each
    call, with the same cycles, statistics and recorded stream."""
    replayed, called = accel.Session(), accel.Session()
    called.kept_replays = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        a = rng.integers(-128, 128, (48, 64), dtype=np.int8)
        w = rng.integers(-128, 128, (32, 64), dtype=np.int8)
        outs = []
        for s in (replayed, called):
            out = np.zeros((48, 32), np.int32)
            with s:
                dense(a, w, out)
            outs.append(out)
        np.testing.assert_array_equal(outs[0], a.astype(np.int32) @ w.astype(np.int32).T)
        np.testing.assert_array_equal(outs[0], outs[1])
    assert replayed.replayed == len(seeds) - 1 and called.replayed == 0
    assert _account(replayed.stats) == _account(called.stats)
    assert replayed.stream() == called.stream() and replayed.disassembly() == called.disassembly()


def test_a_replay_refuses_a_session_of_another_config(dense):
    """The Config check (code built for one refuses a session of another) comes before any
    replay: a session that stored the stream does not run it for code of another Config."""
    a, w = np.ones((48, 64), np.int8), np.ones((32, 64), np.int8)
    with accel.Session() as s:
        dense(a, w, np.zeros((48, 32), np.int32))
        dense(a, w, np.zeros((48, 32), np.int32))
    assert s.replayed == 1
    with accel.Session(accel.Config(tile=32)):
        with pytest.raises(OptionsMismatch, match="tile=16"):
            dense(a, w, np.zeros((48, 32), np.int32))


def test_a_timing_only_session_counts_the_same_cycles_and_computes_nothing(dense):
    a = np.ones((48, 64), np.int8)
    w = np.ones((32, 64), np.int8)
    out = np.zeros((48, 32), np.int32)
    with accel.Session(timing_only=True) as timed:
        dense(a, w, out)
        dense(a, w, out)
    assert not out.any()
    with accel.Session() as executed:
        dense(a, w, out)
        dense(a, w, out)
    assert (out == 64).all()
    assert (timed.stats.cycles, timed.stats.busy, timed.stats.macs) == \
        (executed.stats.cycles, executed.stats.busy, executed.stats.macs)
