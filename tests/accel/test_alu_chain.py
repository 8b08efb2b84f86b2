"""ALU_CHAIN: up to eight ALU operations in one pass over a block. Merged chains compute what
the ALU instructions they replace compute, one at a time, on the simulator and on the batched
plan (int32 wrap, SHR's clipping, a src overlapping the block read before the chain writes);
the encoding round-trips and refuses malformed chains; the cycle model charges one pass; and
the compiler's merge (accel/compiler/chains.py) only merges what agrees, bit for bit with
llvm on a compiled model."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import tirx

import accel
from accel.compiler.chains import merge_chains
from accel.hw import cycles, fused, isa
from accel.hw.emitter import Emitter
from accel.hw.errors import DecodeError, InstructionError
from accel.hw.instructions import (ACC, ALU, ALU_CHAIN, ALU_UFUNCS, CHAIN_IMMEDIATES, CHAIN_STEPS, AluOp, ChainVector,
                                   alu_operand, chain_code, distinct_starts)
from accel.hw.isa import Alu, AluChain, Finish, Load, Mem, Store, StoreMode
from accel.hw.sim import Simulator
from accel.hw.tokens import DependencyTracker

T = 16
ROWS = 96          # the ACC rows the tests load, work on and store back (1536 int32 values)
#: values that wrap: int32's ends, around 0, and large products and sums
EXTREMES = [-2**31, 2**31 - 1, -1, 0, 1, 2**30, -2**30, 46341, -46341, 31, 32, 40]
IMMEDIATES = st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from(EXTREMES), st.integers(-3, 40))


def _auto(program):
    em, deps = Emitter(), DependencyTracker(T)
    for ins in program:
        deps.record(ins, em.emit(deps.order(em, ins)))
    return em.finish()


@st.composite
def _block(draw, base: int = 0):
    """``(addr, ext_out, ext_in, stride_out, stride_in)`` of distinct vectors inside the rows."""
    ext_out, ext_in = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    so, si = draw(st.integers(0, 5)) * T, draw(st.integers(0, 3)) * T
    if not distinct_starts(ext_out, so, ext_in, si):
        so, si = ext_in * T, T
    span = (ext_out - 1) * so + (ext_in - 1) * si + T
    addr = draw(st.integers(0, (ROWS * T - span) // T)) * T
    return addr, ext_out, ext_in, so, si


@st.composite
def chains(draw):
    """A chain's steps ``(op, imm or None)`` and its fields: a block, and a src that is
    outside it, overlaps it, or is a broadcast row (strides 0)."""
    steps = draw(st.lists(st.tuples(st.sampled_from(list(AluOp)), st.one_of(st.none(), IMMEDIATES)),
                          min_size=1, max_size=CHAIN_STEPS))
    while sum(imm is not None for _, imm in steps) > CHAIN_IMMEDIATES:
        steps.pop()
    addr, ext_out, ext_in, so, si = draw(_block())
    src = draw(st.sampled_from(["apart", "overlapping", "broadcast"]))
    span = (ext_out - 1) * so + (ext_in - 1) * si + T
    if src == "overlapping":
        s_addr = max(0, min(addr + draw(st.integers(-2, 2)) * T, ROWS * T - span))
        s_so, s_si = so, si
    else:
        s_so, s_si = (0, 0) if src == "broadcast" else (so, si)
        s_span = (ext_out - 1) * s_so + (ext_in - 1) * s_si + T
        free = [a for a in range(0, ROWS * T - s_span + 1, T) if a + s_span <= addr or a >= addr + span]
        s_addr = draw(st.sampled_from(free)) if free else addr
    fields = dict(dst_addr=addr, src_addr=s_addr, ext_out=ext_out, ext_in=ext_in, dst_stride_out=so,
                  dst_stride_in=si, src_stride_out=s_so, src_stride_in=s_si)
    return steps, fields


def _vectors(acc, addr, ext_out, ext_in, so, si):
    return np.stack([acc[addr + o * so + i * si:addr + o * so + i * si + T]
                     for o in range(ext_out) for i in range(ext_in)])


def _model(acc: np.ndarray, steps, f) -> np.ndarray:
    """ACC after the chain, by its definition: each vector's values (and src's) as they were
    before it, the steps in turn, int32 arithmetic."""
    out = acc.copy()
    v = _vectors(acc, f["dst_addr"], f["ext_out"], f["ext_in"], f["dst_stride_out"], f["dst_stride_in"])
    s = _vectors(acc, f["src_addr"], f["ext_out"], f["ext_in"], f["src_stride_out"], f["src_stride_in"])
    for op, imm in steps:
        v = ALU_UFUNCS[op](v, alu_operand(op, np.int32(imm) if imm is not None else s)).astype(np.int32)
    k = 0
    for o in range(f["ext_out"]):
        for i in range(f["ext_in"]):
            at = f["dst_addr"] + o * f["dst_stride_out"] + i * f["dst_stride_in"]
            out[at:at + T] = v[k]
            k += 1
    return out


def _stream(middle):
    load = Load(mem=Mem.ACC, sram_addr=0, sram_ld=T, slot=0, dram_offset=0, dram_ld=T, rows=ROWS, cols=T)
    store = Store(sram_addr=0, sram_ld=T, slot=1, dram_offset=0, dram_ld=T, rows=ROWS, cols=T, mode=StoreMode.INT32)
    return _auto([load, *middle, store])


def _run(stream, data, batched: bool) -> np.ndarray:
    """What the stream stores, run instruction by instruction or through its batched plan."""
    sim = Simulator()
    host = [data.copy(), np.zeros(ROWS * T, np.int32)]
    if batched:
        plan = fused.fuse(sim, stream, sim.compile(stream, host).timing.order(), host)
        assert plan is not None and plan.run(host, sim)
    else:
        sim.run(stream, host)
    return host[1]


def _one_at_a_time(steps, f):
    return [Alu(op=op, use_imm=imm is not None, imm=imm or 0, **f) for op, imm in steps]


@settings(max_examples=120)
@given(chains(), st.integers(0, 2**32 - 1))
def test_a_chain_is_its_alu_instructions_in_one_pass(chain, seed):
    steps, f = chain
    rng = np.random.default_rng(seed)
    data = np.where(rng.random(ROWS * T) < 0.3, rng.choice(EXTREMES, ROWS * T),
                    rng.integers(-2**31, 2**31, ROWS * T)).astype(np.int32)
    if seed % 3 == 0:       # shift amounts from src around [0, 31] and beyond
        data = rng.integers(-3, 40, ROWS * T).astype(np.int32)
    merged = _stream([AluChain(**chain_code(steps), **f)])
    got = [_run(merged, data, batched) for batched in (False, True)]
    want = _model(data, steps, f)
    for stored in got:
        np.testing.assert_array_equal(stored, want)
    # one ALU instruction a step computes the same where it never reads a src vector an earlier
    # step wrote: src apart from the block, or read by the first step only
    d0 = f["dst_addr"]
    d1 = d0 + (f["ext_out"] - 1) * f["dst_stride_out"] + (f["ext_in"] - 1) * f["dst_stride_in"] + T
    s0 = f["src_addr"]
    s1 = s0 + (f["ext_out"] - 1) * f["src_stride_out"] + (f["ext_in"] - 1) * f["src_stride_in"] + T
    apart = s1 <= d0 or d1 <= s0
    if apart or all(imm is not None for _, imm in steps[1:]):
        separate = _stream(_one_at_a_time(steps, f))
        for batched in (False, True):
            np.testing.assert_array_equal(_run(separate, data, batched), want)


@pytest.mark.parametrize("steps", [
    [(AluOp.MUL, 0), (AluOp.ADD, None), (AluOp.MUL, 3), (AluOp.ADD, None)],
    [(AluOp.ADD, None), (AluOp.MUL, 0), (AluOp.MAX, -5), (AluOp.ADD, None), (AluOp.SHR, 1)],
    [(AluOp.MUL, 2), (AluOp.ADD, 7), (AluOp.MUL, 0)],
])
@pytest.mark.parametrize("src", [dict(src_addr=T, src_stride_out=T), dict(src_addr=8 * T, src_stride_out=0)])
def test_a_chain_zeroing_and_reading_src_between_steps_plans_like_the_reference(steps, src):
    """The batched plan follows a chain's later steps on the run the step before made (a
    product by 0 starts a fresh run of zeros), reading src as it was when the chain began:
    overlapping the block, or one row broadcast."""
    rng = np.random.default_rng(7)
    data = rng.integers(-2**20, 2**20, ROWS * T).astype(np.int32)
    f = dict(dst_addr=0, ext_out=4, dst_stride_out=T, **src)
    stream = _stream([AluChain(**chain_code(steps), **f)])
    want = _model(data, steps, {"ext_in": 1, "dst_stride_in": 0, "src_stride_in": 0, **f})
    for batched in (False, True):
        np.testing.assert_array_equal(_run(stream, data, batched), want)


def test_a_chain_reads_an_overlapping_src_before_it_writes():
    # dst vectors 0..3, src the vectors 1..4: ADD src twice doubles what src held before
    data = np.arange(ROWS * T, dtype=np.int32)
    f = dict(dst_addr=0, src_addr=T, ext_out=4, dst_stride_out=T, src_stride_out=T)
    got = _run(_stream([AluChain(**chain_code([(AluOp.ADD, None), (AluOp.ADD, None)]), **f)]), data, False)
    np.testing.assert_array_equal(got[:4 * T], data[:4 * T] + 2 * data[T:5 * T])
    separate = _run(_stream(_one_at_a_time([(AluOp.ADD, None), (AluOp.ADD, None)], f)), data, False)
    assert not np.array_equal(separate[:4 * T], got[:4 * T])     # one op at a time sees its own writes


@given(chains(), st.booleans(), st.booleans())
def test_the_encoding_round_trips(chain, pop, push):
    steps, f = chain
    ins = AluChain(**chain_code(steps), **f, pop_prev=pop, push_next=push)
    data = isa.encode(ins)
    assert len(data) == isa.INSTRUCTION_BYTES and isa.decode(data) == [ins]
    assert ins.steps == [(op, imm) for op, imm in steps]
    assert isa.disassemble(ins).startswith(f"ALU_CHAIN ACC[{f['dst_addr']}]")


#: Where the vector-operand tests put a block (dst), the row src broadcasts, the rows beside it
#: (vectors with src's strides) and a block laid out like dst (vectors with its strides).
_DST, _SRC, _LIKE_DST = 0, 40 * T, 64 * T


@settings(max_examples=20)
@given(st.lists(st.tuples(st.sampled_from(list(AluOp)), st.one_of(
    st.none(), IMMEDIATES, st.integers(0, 7).map(lambda k: ChainVector(k * T)),
    st.integers(0, 3).map(lambda k: ChainVector(_LIKE_DST - _DST + k * T, of_dst=True)))),
    min_size=1, max_size=CHAIN_STEPS), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_a_chain_reads_vectors_beside_src_and_laid_out_like_its_block(steps, ext_out, seed):
    """A per-channel requantise's operands in one chain: rows beside the broadcast ``src`` (a
    bias, clamp bounds, multipliers: offsets from src, its strides) and a block like the
    destination (a temporary: an offset from dst, its strides), each step its own. The
    chain, run instruction by instruction and batched, is the ALU instructions it replaces."""
    while sum(imm is not None for _, imm in steps) > CHAIN_IMMEDIATES:
        steps.pop()
    f = dict(dst_addr=_DST, src_addr=_SRC, ext_out=ext_out, ext_in=2, dst_stride_out=2 * T, dst_stride_in=T,
             src_stride_out=0, src_stride_in=T)
    rng = np.random.default_rng(seed)
    data = np.where(rng.random(ROWS * T) < 0.3, rng.choice(EXTREMES, ROWS * T),
                    rng.integers(-2**31, 2**31, ROWS * T)).astype(np.int32)
    separate = []
    for op, imm in steps:
        if imm is None or isinstance(imm, ChainVector):
            like_dst = isinstance(imm, ChainVector) and imm.of_dst
            at = (f["dst_addr"] if like_dst else f["src_addr"]) + (imm.offset if imm is not None else 0)
            strides = (f["dst_stride_out"], f["dst_stride_in"]) if like_dst else (0, T)
            separate.append(Alu(op=op, use_imm=False, dst_addr=f["dst_addr"], src_addr=at, ext_out=ext_out, ext_in=2,
                                dst_stride_out=2 * T, dst_stride_in=T, src_stride_out=strides[0],
                                src_stride_in=strides[1]))
        else:
            separate.append(Alu(op=op, use_imm=True, imm=imm, dst_addr=f["dst_addr"], ext_out=ext_out, ext_in=2,
                                dst_stride_out=2 * T, dst_stride_in=T))
    merged = AluChain(**chain_code(steps), **f)
    assert merged.steps == [(op, imm) for op, imm in steps] and isa.decode(isa.encode(merged)) == [merged]
    want = _run(_stream(separate), data, False)
    for batched in (False, True):
        np.testing.assert_array_equal(_run(_stream([merged]), data, batched), want)


def test_a_vector_overlapping_the_block_is_read_before_the_chain_writes():
    # the block's vectors 0..3 and, laid out like it one vector on, 1..4: ADD it twice
    data = np.arange(ROWS * T, dtype=np.int32)
    f = dict(dst_addr=0, ext_out=4, dst_stride_out=T)
    on = ChainVector(T, of_dst=True)
    for batched in (False, True):
        got = _run(_stream([AluChain(**chain_code([(AluOp.ADD, on), (AluOp.ADD, on)]), **f)]), data, batched)
        np.testing.assert_array_equal(got[:4 * T], data[:4 * T] + 2 * data[T:5 * T])


def test_the_cycle_model_holds_a_chain_back_only_for_the_vectors_it_reads():
    """A chain reading a temporary below the next block's accumulator and a per-channel vector
    above it does not wait for that block's GEMM: the scoreboard compares each vector's range,
    not their hull."""
    from accel.hw.isa import Gemm
    config = accel.Config()
    gemm = Gemm(reset=True, acc_addr=32 * T, inp_addr=0, wgt_addr=0, acc_ld=T, inp_ld=T, wgt_ld=T, ext_out=8)
    chain = AluChain(dst_addr=0, src_addr=64 * T, ext_out=8, dst_stride_out=T, src_stride_out=0,
                     **chain_code([(AluOp.MUL, None), (AluOp.ADD, ChainVector(16 * T, of_dst=True))]))
    apart = cycles.schedule([gemm, chain, Finish()], config)
    assert apart.start[1] < apart.end[0]            # it runs beside the GEMM
    reading = AluChain(dst_addr=0, src_addr=64 * T, ext_out=8, dst_stride_out=T, src_stride_out=0,
                       **chain_code([(AluOp.MUL, None), (AluOp.ADD, ChainVector(32 * T, of_dst=True))]))
    assert cycles.schedule([gemm, reading, Finish()], config).start[1] >= apart.end[0]   # it reads what it writes


@pytest.mark.parametrize("change, why", [
    (lambda w: w.__setitem__(0, int(w[0]) & 0xFFFF00FF), "invalid func"),              # length 0
    (lambda w: w.__setitem__(0, int(w[0]) & 0xFFFF00FF | 9 << 8), "invalid func"),     # length 9
    (lambda w: w.__setitem__(1, w[1] | 0x5), "no ALU op 5"),
    (lambda w: w.__setitem__(1, w[1] | 0x8 << 8), "code bits past step 1"),
    (lambda w: w.__setitem__(5, 7), "immediate words past the 1"),
    (lambda w: w.__setitem__(0, int(w[0]) | 1 << 17), "vectors bit 1 is set, but step 1 takes no word"),
    (lambda w: w.__setitem__(0, int(w[0]) | 1 << 24), "vectors bit 8 is set, but step 0's word is no vector"),
    (lambda w: w.__setitem__(0, int(w[0]) | 1 << 20), "vectors bits past step 1"),
])
def test_decode_refuses_malformed_chains(change, why):
    words = np.frombuffer(isa.encode(AluChain(dst_addr=0, **chain_code([(AluOp.MUL, 3), (AluOp.ADD, None)]))),
                          "<u4").copy()
    change(words)
    with pytest.raises(DecodeError, match=why):
        isa.decode(words.tobytes())


def test_the_simulator_refuses_what_no_chain_is():
    sim = Simulator()
    with pytest.raises(InstructionError, match="no ALU chain: step 0 has no ALU op 6"):
        sim.check(3, AluChain(dst_addr=0, length=1, code=0xE), [])
    with pytest.raises(InstructionError, match="misaligned"):      # src is checked only when a step reads it
        sim.check(3, AluChain(dst_addr=0, src_addr=8, **chain_code([(AluOp.ADD, None)])), [])
    sim.check(3, AluChain(dst_addr=0, src_addr=8, **chain_code([(AluOp.ADD, 1)])), [])
    with pytest.raises(InstructionError, match="overlap each other"):
        sim.check(3, AluChain(dst_addr=0, ext_out=2, **chain_code([(AluOp.ADD, 1)])), [])


@pytest.mark.parametrize("length", [1, 5, 8])
def test_a_chain_costs_one_pass_and_a_cycle_a_stage(length):
    config = accel.Config()
    steps = [(AluOp.ADD, 1)] * min(length, CHAIN_IMMEDIATES) + [(AluOp.ADD, None)] * (length - CHAIN_IMMEDIATES)
    chain = AluChain(dst_addr=0, ext_out=8, ext_in=4, dst_stride_out=64, dst_stride_in=T, **chain_code(steps))
    one = Alu(op=AluOp.ADD, use_imm=True, imm=1, dst_addr=0, ext_out=8, ext_in=4, dst_stride_out=64, dst_stride_in=T)
    assert cycles.cost(chain, config) == 32 + length - 1 + config.issue_overhead
    assert cycles.cost(chain, config) == cycles.cost(one, config) + length - 1
    timing = cycles.schedule([chain, Finish()], config)
    assert timing.busy["alu"] == 32 + length - 1 + config.issue_overhead and timing.instructions["ALU_CHAIN"] == 1


# -- the compiler's merge ------------------------------------------------------------------------
def _buffers():
    return [tirx.decl_buffer((1024,), "int32", name, scope=ACC.scope) for name in ("acc", "bias", "other")]


def _alu(op, dst, imm=None, src=None, offset=0, ext_out=16, src_stride_out=0):
    return ALU[op, imm is not None].call(
        dst_addr=dst.access_ptr("rw"), src_addr=src.access_ptr("r", offset=offset) if src is not None else 0,
        imm=imm if imm is not None else 0, ext_out=ext_out, ext_in=1, dst_stride_out=T, dst_stride_in=0, src_stride_out=src_stride_out,
        src_stride_in=0)


def _merged(stmts):
    body = merge_chains(tirx.PrimFunc([], tirx.SeqStmt(stmts))).body
    calls = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    return [(c.value.args[0].value, c.value.args[1].value if c.value.args[0].value == "accel.alu_chain" else None)
            for c in calls]


def test_merge_packs_a_requantise_into_chains_of_at_most_six_immediates():
    acc, bias, _ = _buffers()
    epilogue = [_alu(AluOp.ADD, acc, src=bias), _alu(AluOp.MAX, acc, 0), _alu(AluOp.MIN, acc, 6000),
                _alu(AluOp.MUL, acc, 12345), _alu(AluOp.ADD, acc, 1 << 20), _alu(AluOp.SHR, acc, 21),
                _alu(AluOp.MAX, acc, -128), _alu(AluOp.MIN, acc, 127)]
    assert _merged(epilogue) == [("accel.alu_chain", 7), ("accel.alu", None)]
    chain = merge_chains(tirx.PrimFunc([], tirx.SeqStmt(epilogue))).body.seq[0].value
    args = ALU_CHAIN.arguments_of(chain)
    steps = isa.AluChain(**{k: v.value for k, v in args.items() if k not in ("dst_addr", "src_addr", "deps")},
                         dst_addr=0).steps
    assert steps == [(AluOp.ADD, None), (AluOp.MAX, 0), (AluOp.MIN, 6000), (AluOp.MUL, 12345), (AluOp.ADD, 1 << 20),
                     (AluOp.SHR, 21), (AluOp.MAX, -128)]


def test_merge_keeps_apart_what_a_chain_would_compute_otherwise():
    acc, bias, other = _buffers()
    # src in the block's own buffer: only as the chain's first step (it reads before it writes)
    assert _merged([_alu(AluOp.ADD, acc, src=acc, offset=512, ext_out=8), _alu(AluOp.MUL, acc, 3, ext_out=8)]) == \
        [("accel.alu_chain", 2)]
    assert _merged([_alu(AluOp.MUL, acc, 3, ext_out=8), _alu(AluOp.ADD, acc, src=acc, offset=512, ext_out=8)]) == \
        [("accel.alu", None)] * 2
    # vectors of one kind (src's strides), and others laid out like the block, in one chain; a
    # second kind splits it
    assert _merged([_alu(AluOp.ADD, acc, src=bias), _alu(AluOp.ADD, acc, src=other)]) == [("accel.alu_chain", 2)]
    assert _merged([_alu(AluOp.ADD, acc, src=bias), _alu(AluOp.MUL, acc, src=bias)]) == [("accel.alu_chain", 2)]
    assert _merged([_alu(AluOp.ADD, acc, src=bias), _alu(AluOp.ADD, acc, src=bias, src_stride_out=T)]) == \
        [("accel.alu_chain", 2)]
    assert _merged([_alu(AluOp.ADD, acc, src=bias), _alu(AluOp.ADD, acc, src=other, src_stride_out=2 * T)]) == \
        [("accel.alu", None)] * 2
    # six words at most: immediates and vectors besides src
    assert _merged([_alu(AluOp.ADD, acc, src=bias)] + [_alu(AluOp.ADD, acc, src=other, offset=T * k)
                                                       for k in range(7)]) == [("accel.alu_chain", 7), ("accel.alu", None)]
    # another block: other destination buffer or extents
    assert _merged([_alu(AluOp.MUL, acc, 3), _alu(AluOp.MUL, other, 3)]) == [("accel.alu", None)] * 2
    assert _merged([_alu(AluOp.MUL, acc, 3), _alu(AluOp.MUL, acc, 3, ext_out=8)]) == [("accel.alu", None)] * 2
    # at most eight steps
    assert _merged([_alu(AluOp.ADD, acc, src=bias)] * 9) == [("accel.alu_chain", 8), ("accel.alu", None)]


def test_a_compiled_requantise_runs_as_chains_bit_exact_with_llvm():
    from tirpat.model.integerize.fixed_point import Requantize
    from tirpat.model.integerize.rules import emit_requantize
    from tirpat.testing.differential import assert_matches_llvm
    from tirpat.testing.int8_models import int8_layer

    rq = Requantize.choose([0.0123456789], [2**20], -128, 127, zero_point=3, precise=True)
    mod = int8_layer("conv2d", 4, 20, 24, lambda bb, y: bb.emit(emit_requantize([y], rq)), seed=1, bias=2**14,
                     layout="NHWC")
    model = assert_matches_llvm(mod, "accel, llvm", calls=2, seed=1)
    counts = model.stats["accel"].instructions
    # per block: the bias and clamp, the temporary's copy and chain, the accumulator's chain
    assert counts["ALU"] == 0 and counts["ALU_CHAIN"] == 3 * counts["STORE"]


def test_a_per_channel_requantise_runs_as_three_chains_bit_exact_with_llvm():
    """Per-channel multipliers: the bias, the clamp's bounds and both multipliers are vectors of
    their own, the temporary a block like the accumulator: one chain each for the bias and
    clamp, the temporary and the accumulator, no ALU instruction alone."""
    from tirpat.model.integerize.fixed_point import Requantize
    from tirpat.model.integerize.rules import emit_requantize
    from tirpat.testing.differential import assert_matches_llvm
    from tirpat.testing.int8_models import int8_layer

    n = 20
    rq = Requantize.choose([np.random.default_rng(2).uniform(5e-4, 2e-3, n)], [np.full(n, 146_000)], -128, 127,
                           zero_point=3, precise=True)
    assert rq.split and rq.clamp is not None
    mod = int8_layer("conv2d", 3, n, 8, lambda bb, y: bb.emit(emit_requantize([y], rq)), seed=1, bias=2**14,
                     layout="NHWC")
    model = assert_matches_llvm(mod, "accel, llvm", calls=2, seed=1)
    counts = model.stats["accel"].instructions
    assert counts["ALU"] == 0 and counts["ALU_CHAIN"] == 3 * counts["STORE"]


def test_the_automatic_tokens_order_a_chain_by_its_block_and_src():
    from accel.hw.tokens import footprint

    reads_src = AluChain(dst_addr=64, src_addr=0, ext_out=2, dst_stride_out=T, src_stride_out=T,
                         **chain_code([(AluOp.MUL, 3), (AluOp.ADD, None)]))
    assert [(space[1], lo, hi, write) for space, lo, hi, write in footprint(reads_src, T)] == \
        [(Mem.ACC, 64, 96, True), (Mem.ACC, 0, 32, False)]
    # src unread: no range (its fields are not checked either)
    no_src = AluChain(dst_addr=64, src_addr=0, ext_out=2, dst_stride_out=T, **chain_code([(AluOp.MUL, 3)]))
    assert [(lo, hi) for _, lo, hi, _ in footprint(no_src, T)] == [(64, 96)]
    # a STORE of the block after the chain waits for it (RAW), one of src does not (both read)
    of = lambda addr: Store(sram_addr=addr, sram_ld=T, slot=0, dram_offset=0, dram_ld=T, rows=2, cols=T)  # noqa: E731
    assert _auto([reads_src, of(64)])[1].pop_prev and not _auto([reads_src, of(0)])[1].pop_prev
    # a chain writing a block that a STORE before it reads waits for the STORE (WAR)
    assert _auto([of(0), AluChain(dst_addr=0, ext_out=2, dst_stride_out=T, **chain_code([(AluOp.MUL, 3)]))])[1].pop_next


def test_merge_passes_an_immediate_computed_at_run_time_through():
    acc, _, _ = _buffers()
    n = tirx.Var("n", "int32")
    merged = merge_chains(tirx.PrimFunc([n], tirx.SeqStmt([_alu(AluOp.MUL, acc, 3), _alu(AluOp.ADD, acc, n * 2)])))
    args = ALU_CHAIN.arguments_of(merged.body.value)
    assert args["imm0"].value == 3 and str(args["imm1"]) == "n * 2" and args["length"].value == 2


def test_a_temporary_zeroed_by_its_chain_waits_for_no_earlier_block_in_the_batched_plan():
    """Blocks that reuse one temporary region, each zeroed by its chain's MUL #0 before the
    copy: the zeros read nothing, so every block's steps batch together (one numpy call a
    step for all blocks), and the results are instruction-by-instruction execution's."""
    blocks = 6
    program = []
    for b in range(blocks):
        acc = 64 * T * b
        program += [Load(mem=Mem.ACC, sram_addr=acc, sram_ld=T, slot=0, dram_offset=acc, dram_ld=T, rows=64, cols=T),
                    AluChain(dst_addr=ROWS * T * 4, src_addr=acc, ext_out=64, dst_stride_out=T, src_stride_out=T,
                             **chain_code([(AluOp.MUL, 0), (AluOp.ADD, None), (AluOp.MUL, 3), (AluOp.SHR, 1)])),
                    Store(sram_addr=ROWS * T * 4, sram_ld=T, slot=1, dram_offset=acc, dram_ld=T, rows=64, cols=T)]
    stream = _auto(program)
    data = np.random.default_rng(0).integers(-2**31, 2**31, blocks * 64 * T).astype(np.int32)
    got, want = [data.copy(), np.zeros_like(data)], [data.copy(), np.zeros_like(data)]
    sim, ref = Simulator(), Simulator()
    plan = fused.fuse(sim, stream, sim.compile(stream, got).timing.order(), got)
    assert plan is not None and plan.run(got, sim)
    ref.run(stream, want)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[1], (data * 3) >> 1)
    assert len(plan._alu_steps) == 1        # + acc, * 3, >> 1: each one batch over the six blocks, one chain
