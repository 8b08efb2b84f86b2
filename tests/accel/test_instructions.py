"""The simulator's fast paths against the declared semantics (accel/hw/instructions.py):
random LOAD, STORE, GEMM and ALU instructions run through the simulator (instruction by
instruction, and batched by accel.hw.fused where it applies) and through the declaration's
program (``Instruction.reference``, compiled for the host), compared bit for bit; a failing
declared precondition is an instruction the simulator refuses; and everything the other
layers know of an instruction (encoding fields, runtime argument order, planner roles,
ISA.md's table) is read off the declaration."""

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import accel
from accel.hw import fused, instructions, isa
from accel.hw.errors import AccelError, InstructionError
from accel.hw.instructions import ALU, ALU_CHAIN, DWMAC, GEMM, GEMM_RESET, LOAD, LUT, STORE, AluOp, Mem, StoreMode
from accel.hw.sim import Simulator

T = 16
CONFIG = accel.Config(inp_bytes=8 * 256, wgt_bytes=8 * 256, acc_bytes=8 * 1024)
SIZE = {Mem.INP: CONFIG.inp_elements, Mem.WGT: CONFIG.wgt_elements, Mem.ACC: CONFIG.acc_elements}
FIELD_OF = instructions.FIELD_OF
INT32 = st.integers(-2**31, 2**31 - 1)
#: The ISA class each runtime function ``accel.<name>`` emits.
CLASSES = {"load": isa.Load, "store": isa.Store, "gemm": isa.Gemm, "alu": isa.Alu, "dwmac": isa.Dwmac,
           "lut": isa.Lut, "alu_chain": isa.AluChain}


def _simulator(seed: int) -> Simulator:
    """A simulator whose scratchpads hold random data (extreme int32 values included)."""
    rng = np.random.default_rng(seed)
    sim = Simulator(CONFIG)
    sim.inp[:] = rng.integers(-128, 128, sim.inp.size)
    sim.wgt[:] = rng.integers(-128, 128, sim.wgt.size)
    sim.acc[:] = rng.choice([-2**31, 2**31 - 1, 0, -1, 1, *rng.integers(-2**31, 2**31, 64)], sim.acc.size)
    return sim


def _scratch(sim: Simulator, mem: Mem) -> np.ndarray:
    """A scratchpad's contents in its architectural dtype."""
    return sim.memory(mem).astype(instructions.MEMORIES[mem].dtype)


def _encoded(ins: instructions.device.Instruction, args: dict) -> isa.Instruction:
    """The ISA instruction a call of ``ins`` with ``args`` (by name; ``host`` slot 0) emits."""
    cls = CLASSES[ins.runtime_name.split(".")[1]]
    values = {**args, **{k: v for k, v in ins.fixed.items() if k != "deps"}, "host": 0}
    return cls(**{FIELD_OF.get(k, k): v for k, v in values.items() if FIELD_OF.get(k, k) in cls.__dataclass_fields__})


def _check(sim, ins, args, host):
    """The declared precondition's verdict; when it fails the simulator must refuse too."""
    encoded = _encoded(ins, args)
    reason = ins.check(**args, tile=T)
    if reason is not None:
        with pytest.raises(InstructionError):
            sim.check(0, encoded, host)
        return None
    try:
        sim.check(0, encoded, host)
    except AccelError:
        return None          # out of a scratchpad's or host buffer's range: no precondition says so
    return encoded


@settings(max_examples=60)
@given(st.sampled_from(list(Mem)), st.integers(0, 5), st.integers(0, 40), st.integers(0, 3), st.integers(0, 3),
       st.integers(0, 3), st.integers(0, 3), st.integers(0, 60), st.integers(0, 50), st.integers(-3, 3),
       st.integers(-200, 200), st.integers(0, 100))
def test_load_is_its_declared_program(mem, rows, cols, top, bottom, left, right, sram_addr, dram_ld, ld_slack,
                                      pad_value, elem_offset):
    ins = LOAD[mem]
    sim = _simulator(rows + cols)
    host = [np.random.default_rng(cols).integers(-2**31, 2**31, 400).astype(ins.operand("host").dtype)]
    width = left + cols + right
    args = dict(elem_offset=elem_offset, sram_addr=sram_addr, sram_ld=max(width + ld_slack, 0), rows=rows, cols=cols,
                dram_ld=dram_ld, pad_top=top, pad_bottom=bottom, pad_left=left, pad_right=right, pad_value=pad_value)
    encoded = _check(sim, ins, args, host)
    assume(encoded is not None)
    before = _scratch(sim, mem)
    want = ins.reference(**{**args, "host": host[0], "sram_addr": before[sram_addr:]}, tile=T)["sram_addr"]
    sim.execute(encoded, host)
    np.testing.assert_array_equal(_scratch(sim, mem), np.concatenate([before[:sram_addr], want]))


@settings(max_examples=80)
@given(st.sampled_from(list(StoreMode)), st.integers(0, 5), st.integers(0, 40), st.integers(0, 60),
       st.integers(0, 3), st.integers(0, 90), st.integers(0, 100), st.sampled_from([1, 1, 2, 3, 4, 0]))
def test_store_is_its_declared_program(mode, rows, cols, sram_addr, ld_slack, dram_ld, elem_offset, dram_step):
    """Also with an element stride (``dram_step`` > 1, an upsampled layout; 0 is refused by
    both), one by one and batched, and the AUTO tokens' host range holds every element written."""
    from accel.hw.tokens import footprint

    ins = STORE[mode]
    sim = _simulator(rows * 7 + cols)
    host = [np.zeros(400, ins.operand("host").dtype)]
    args = dict(elem_offset=elem_offset, sram_addr=sram_addr, sram_ld=cols + ld_slack, rows=rows, cols=cols,
                dram_ld=dram_ld, dram_step=dram_step)
    encoded = _check(sim, ins, args, host)
    assume(encoded is not None)
    acc = _scratch(sim, Mem.ACC)
    want = ins.reference(**{**args, "host": host[0].copy(), "sram_addr": acc[sram_addr:]}, tile=T)["host"]
    written = np.flatnonzero(ins.reference(**{**args, "host": np.full(400, 7, host[0].dtype),
                                              "sram_addr": np.full(acc.size - sram_addr, 9, np.int32)},
                                           tile=T)["host"] != 7)
    hulls = [(lo, hi) for space, lo, hi, write in footprint(encoded, T) if write and space[0] == "dram"]
    if written.size:
        assert hulls[0][0] <= written.min() and written.max() < hulls[0][1]
    _fused_too(sim, encoded, host, lambda s: np.testing.assert_array_equal(host[0], want))


def _perturbed(draw, args: dict, names) -> dict:
    """``args``, and one time in four one of the ``names`` off the tile grid (what the
    hardware refuses: the declared precondition must say so too)."""
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(names))
        args[name] += draw(st.integers(1, T - 1))
    return args


@st.composite
def gemms(draw):
    reset = draw(st.booleans())
    ins = GEMM_RESET if reset else GEMM
    args = {"ext_out": draw(st.integers(0, 3)), "ext_in": draw(st.integers(0, 3))}
    for p in ("acc", "inp", "wgt"):
        args[f"{p}_addr"] = draw(st.integers(0, 8)) * T
        args[f"{p}_ld"] = draw(st.integers(1, 3)) * T
        args[f"{p}_stride_out"], args[f"{p}_stride_in"] = draw(st.integers(0, 6)) * T, draw(st.integers(0, 6)) * T
    return ins, _perturbed(draw, args, [a for a in args if "ext" not in a])


@settings(max_examples=60)
@given(gemms(), st.integers(0, 1000))
def test_gemm_is_its_declared_program(gemm, seed):
    ins, args = gemm
    sim = _simulator(seed)
    encoded = _check(sim, ins, args, [])
    assume(encoded is not None)
    acc, inp, wgt = (_scratch(sim, m) for m in (Mem.ACC, Mem.INP, Mem.WGT))
    a = args["acc_addr"]
    want = ins.reference(**{**args, "acc_addr": acc[a:], "inp_addr": inp[args["inp_addr"]:],
                            "wgt_addr": wgt[args["wgt_addr"]:]}, tile=T)["acc_addr"]
    _fused_too(sim, encoded, [], lambda s: np.testing.assert_array_equal(_scratch(s, Mem.ACC)[a:], want))


@st.composite
def alus(draw):
    op, use_imm = draw(st.sampled_from(list(AluOp))), draw(st.booleans())
    imm = draw(st.one_of(INT32, st.integers(-3, 40)))
    args = {"imm": imm, "ext_out": draw(st.integers(0, 3)), "ext_in": draw(st.integers(0, 3)),
            "dst_addr": draw(st.integers(0, 8)) * T, "src_addr": draw(st.integers(0, 8)) * T}
    for name in ("dst_stride_out", "dst_stride_in", "src_stride_out", "src_stride_in"):
        args[name] = draw(st.integers(0, 4)) * T
    return ALU[op, use_imm], _perturbed(draw, args, [a for a in args if "addr" in a or "stride" in a])


@settings(max_examples=100)
@given(alus(), st.integers(0, 1000))
def test_alu_is_its_declared_program(alu, seed):
    ins, args = alu
    sim = _simulator(seed)
    if ins.fixed["op"] == AluOp.SHR and not ins.fixed["use_imm"]:   # shift amounts around [0, 31] and beyond
        sim.acc[:] = np.random.default_rng(seed).integers(-3, 40, sim.acc.size) * (1 + (seed % 2) * 2**20)
    encoded = _check(sim, ins, args, [])
    assume(encoded is not None)
    acc = _scratch(sim, Mem.ACC)
    d, s = args["dst_addr"], args["src_addr"]
    # the source is another view of ACC: its values before the instruction (every read comes first)
    want = ins.reference(**{**args, "dst_addr": acc[d:], "src_addr": acc[s:].copy()}, tile=T)["dst_addr"]
    _fused_too(sim, encoded, [], lambda sim_: np.testing.assert_array_equal(_scratch(sim_, Mem.ACC)[d:], want))


@st.composite
def alu_chains(draw):
    """Random chains (up to 8 steps, up to 6 words: immediates, wide and small, and vectors
    beside src or laid out like the block), one time in eight a malformed code, length,
    immediate word or vector bit, and blocks whose src and vectors may overlap dst."""
    vector = st.builds(instructions.ChainVector, st.integers(0, 4).map(lambda k: k * T), st.booleans())
    steps = draw(st.lists(st.tuples(st.sampled_from(list(AluOp)),
                                    st.one_of(st.none(), INT32, st.integers(-3, 40), vector)),
                          min_size=1, max_size=instructions.CHAIN_STEPS))
    while sum(imm is not None for _, imm in steps) > instructions.CHAIN_IMMEDIATES:
        steps = steps[:-1]
    args = instructions.chain_code(steps)
    bad = draw(st.integers(0, 8))
    if bad == 3:
        args["vectors"] |= 1 << (8 + draw(st.integers(0, 7)))     # a destination's bit without its vector's
    if bad == 0:
        args["code"] |= draw(st.integers(5, 7)) << (4 * draw(st.integers(0, args["length"] - 1)))    # no such op
    elif bad == 1:
        args["length"] = draw(st.sampled_from([0, 9]))
    elif bad == 2:
        args["imm5"] = draw(st.integers(1, 9))    # a word past the used ones (unless all six are used)
    args.update({"ext_out": draw(st.integers(0, 3)), "ext_in": draw(st.integers(0, 3)),
                 "dst_addr": draw(st.integers(0, 8)) * T, "src_addr": draw(st.integers(0, 8)) * T})
    for name in ("dst_stride_out", "dst_stride_in", "src_stride_out", "src_stride_in"):
        args[name] = draw(st.integers(0, 4)) * T
    return _perturbed(draw, args, [a for a in args if "addr" in a or "stride" in a])


@settings(max_examples=100)
@given(alu_chains(), st.integers(0, 1000))
def test_alu_chain_is_its_declared_program(args, seed):
    """Also where src overlaps the block (the chain reads it before it writes) and with shift
    amounts around [0, 31] and beyond; an invalid chain is refused by the declaration and the
    simulator alike."""
    sim = _simulator(seed)
    if seed % 3 == 0:
        sim.acc[:] = np.random.default_rng(seed).integers(-3, 40, sim.acc.size) * (1 + (seed % 2) * 2**20)
    encoded = _check(sim, ALU_CHAIN, args, [])
    assume(encoded is not None)
    acc = _scratch(sim, Mem.ACC)
    d, s = args["dst_addr"], args["src_addr"]
    want = ALU_CHAIN.reference(**{**args, "dst_addr": acc[d:], "src_addr": acc[s:].copy()}, tile=T)["dst_addr"]
    _fused_too(sim, encoded, [], lambda sim_: np.testing.assert_array_equal(_scratch(sim_, Mem.ACC)[d:], want))


def _fused_too(sim, encoded, host, compare):
    """Run ``encoded`` on a copy of ``sim`` instruction by instruction and, where the batched
    path takes it, on another copy batched; ``compare`` each simulator afterwards."""
    stream = [encoded, isa.Finish()]
    batched = Simulator(CONFIG)
    for mem in Mem:
        batched.memory(mem)[:] = sim.memory(mem)
    plan = fused.fuse(batched, stream, batched.compile(stream, host).timing.order(), host)
    sim.execute(encoded, host)
    compare(sim)
    if plan:
        assert plan.run(host, batched)
        compare(batched)


# -- what the other layers read off the declarations ------------------------------------------
def test_the_encoding_fields_are_the_declared_arguments():
    for name, forms in instructions.FUNCTIONS.items():
        cls = CLASSES[name.split(".")[1]]
        fields = {f.name for f in dataclasses.fields(cls)} - {"pop_prev", "pop_next", "push_prev", "push_next"}
        assert {FIELD_OF.get(a, a) for a in forms[0].arguments if a != "deps"} == fields
        # the words: all but the header's func byte (DWMAC has no func field)
        assert set(isa.FIELDS[cls.opcode]) <= fields


def test_the_scratchpads_are_declared_once():
    from accel.compiler import rules, schedule
    from accel.compiler.planner import AccelPlanner

    assert list(Mem) == [Mem.INP, Mem.WGT, Mem.ACC] and isa.Mem is Mem
    assert rules.SCOPES == {m.scope: mem for mem, m in instructions.MEMORIES.items()}
    planner = AccelPlanner(CONFIG)
    assert {s: m.capacity for s, m in planner.memories.items()} == {
        instructions.INP.scope: CONFIG.inp_elements, instructions.WGT.scope: CONFIG.wgt_elements,
        instructions.ACC.scope: CONFIG.acc_elements}
    assert CONFIG.acc_elements == CONFIG.acc_bytes // 4
    # the scheduler's footprint is the memories' (a looped buffer twice, rounded to tiles)
    need = schedule.footprint(schedule.Extents(4, 4, 4, operands=(True,)), T, 1, 2, 2, False)
    assert need[rules.ACC] == instructions.ACC.footprint(T * T * 2, repeated=True, options={"tile": T}) + \
        instructions.ACC.footprint(T * 2, repeated=True, options={"tile": T})


def test_the_planner_reads_roles_off_the_declarations():
    from tvm import tirx

    from accel.compiler.planner import _scratch_uses
    from accel.compiler.rules import address

    acc, inp = instructions.ACC.buffer((256,), "acc"), instructions.INP.buffer((256,), "inp")
    wgt = instructions.WGT.buffer((256,), "wgt")
    zero = dict(acc_ld=T, inp_ld=T, wgt_ld=T, ext_out=1, ext_in=1, acc_stride_out=0, acc_stride_in=0,
                inp_stride_out=0, inp_stride_in=0, wgt_stride_out=0, wgt_stride_in=0)
    gemm = GEMM.call(acc_addr=address(acc, 0), inp_addr=address(inp, 0), wgt_addr=address(wgt, 0), **zero)
    reset = GEMM_RESET.call(acc_addr=address(acc, 0), inp_addr=address(inp, 0), wgt_addr=address(wgt, 0), **zero)
    roles = lambda stmt: [(b.name, r, w) for b, r, w, _ in _scratch_uses(stmt)]  # noqa: E731
    assert roles(gemm) == [("acc", True, True), ("inp", True, False), ("wgt", True, False)]
    assert roles(reset) == [("acc", False, True), ("inp", False, False), ("wgt", False, False)]   # reads nothing
    assert roles(tirx.Evaluate(0)) == []


@st.composite
def loads(draw):
    mem = draw(st.sampled_from(list(Mem)))
    rows, cols = draw(st.integers(0, 4)), draw(st.integers(0, 20))
    top, bottom, left, right = (draw(st.integers(0, 2)) for _ in range(4))
    return LOAD[mem], dict(elem_offset=draw(st.integers(0, 50)), sram_addr=draw(st.integers(0, 60)),
                           sram_ld=left + cols + right + draw(st.integers(0, 3)), rows=rows, cols=cols,
                           dram_ld=draw(st.integers(0, 30)), pad_top=top, pad_bottom=bottom, pad_left=left,
                           pad_right=right, pad_value=draw(st.integers(-128, 127)))


@settings(max_examples=60)
@given(st.one_of(loads(), gemms(), alus()), st.integers(0, 1000))
def test_the_dependency_tokens_cover_what_the_declared_program_writes(case, seed):
    """accel.hw.tokens.footprint (the AUTO tokens' memory ranges) holds every scratchpad
    element the declared program writes (found as those that differ from what they held,
    run from two different contents), and what the planner reads off the program
    (``elements_written``) for a LOAD or a GEMM reset is exactly those."""
    from accel.hw.tokens import footprint

    ins, args = case
    sim = _simulator(seed)
    host = [np.random.default_rng(seed).integers(-128, 128, 400).astype(
        ins.operand("host").dtype if "host" in ins.arguments else "int8")]
    encoded = _check(sim, ins, args, host)
    assume(encoded is not None)
    hulls = {space[1]: (lo, hi) for space, lo, hi, write in footprint(encoded, T) if write and space[0] == "sram"}
    for op in ins.memory_operands:
        if not op.writes:
            continue
        mem = Mem[op.memory.name]
        start, written = args[op.name], np.zeros(SIZE[mem], bool)
        for shift in (0, 1):
            before = {o.name: (_scratch(sim, Mem[o.memory.name]) + shift).astype(o.dtype)[args[o.name]:]
                      for o in ins.memory_operands}
            after = ins.reference(**{**args, **before, **({"host": host[0]} if "host" in ins.arguments else {})},
                                  tile=T)[op.name]
            written[start:] |= after != before[op.name]
        where = np.flatnonzero(written)
        if where.size:
            lo, hi = hulls[mem]
            assert lo <= where.min() and where.max() < hi
        if op.role == "write":      # what the planner asks: every element written, each stored anew
            scalars = {o.name: args[o.name] for o in ins.operands if o.kind == "scalar"}
            np.testing.assert_array_equal(where, ins.elements_written(op.name, **scalars, tile=T) + start)


# -- DWMAC, the per-channel multiply-accumulate ---------------------------------------------------
@st.composite
def dwmacs(draw):
    args = {"ext_out": draw(st.integers(0, 5)), "ext_in": draw(st.integers(0, 5))}
    for p in ("acc", "inp", "wgt"):
        args[f"{p}_addr"] = draw(st.integers(0, 8)) * T
        # a stride of 0 on ACC is a reduction (the kernel's taps); on INP or WGT a broadcast
        args[f"{p}_stride_out"], args[f"{p}_stride_in"] = draw(st.integers(0, 6)) * T, draw(st.integers(0, 4)) * T
    args["acc_ld"], args["inp_ld"] = draw(st.integers(1, 3)) * T, draw(st.integers(1, 3)) * T
    return _perturbed(draw, args, [a for a in args if "ext" not in a])


@settings(max_examples=80)
@given(dwmacs(), st.integers(0, 1000))
def test_dwmac_is_its_declared_program(args, seed):
    sim = _simulator(seed)
    encoded = _check(sim, DWMAC, args, [])
    assume(encoded is not None)
    acc, inp, wgt = (_scratch(sim, m) for m in (Mem.ACC, Mem.INP, Mem.WGT))
    a = args["acc_addr"]
    want = DWMAC.reference(**{**args, "acc_addr": acc[a:], "inp_addr": inp[args["inp_addr"]:],
                              "wgt_addr": wgt[args["wgt_addr"]:]}, tile=T)["acc_addr"]
    _fused_too(sim, encoded, [], lambda s: np.testing.assert_array_equal(_scratch(s, Mem.ACC)[a:], want))


def test_dwmac_encoding_cycles_and_disassembly():
    d = isa.Dwmac(acc_addr=32, inp_addr=0, wgt_addr=16, acc_ld=16, inp_ld=32, ext_out=3, ext_in=3,
                  inp_stride_out=512, inp_stride_in=16, wgt_stride_out=48, wgt_stride_in=16, pop_prev=True)
    data = isa.encode(d)
    words = np.frombuffer(data, "<u4")
    assert words[0] == isa.Opcode.DWMAC | 1 << 4 and words[1:14].tolist() == [
        32, 0, 16, 16, 32, 3, 3, 0, 0, 512, 16, 48, 16] and not words[14:].any()
    assert isa.decode(data) == [d]
    assert isa.disassemble(d) == ("DWMAC ACC[32 ld=16] += INP[0 ld=32] * WGT[16] loop 3x3 "
                                  "(acc+0/0 inp+512/16 wgt+48/16) [pop_prev]")
    with pytest.raises(accel.DecodeError, match="invalid func"):
        isa.decode(bytes([isa.Opcode.DWMAC, 1]) + data[2:])
    # ISA.md section 6: a step costs a GEMM step's cycles and gives tile x tile MACs
    from accel.hw import cycles
    timing = cycles.schedule([d.with_flags(pop_prev=False), isa.Finish()], CONFIG)
    assert cycles.cost(d, CONFIG) == 9 * CONFIG.tile_cycles + CONFIG.issue_overhead    # 16 MACs a cycle
    fast = accel.Config(dwmac_macs_per_cycle=T * T)     # a lane array fed a whole tile a cycle
    assert cycles.cost(d, fast) == 9 + fast.issue_overhead
    assert timing.macs == 9 * T * T and timing.busy["gemm"] == cycles.cost(d, CONFIG)


def test_a_depthwise_convolution_through_the_session():
    """A 3x3 stride-2 depthwise convolution of a padded 16-channel image, one DWMAC per strip
    of 16 output pixels, through accel.Session (automatic tokens), equals numpy's."""
    rng = np.random.default_rng(0)
    h, w, c, k, s = 5, 33, 16, 3, 2
    image = rng.integers(-128, 128, (h, w, c)).astype(np.int8)
    kernel = rng.integers(-128, 128, (k, k, c)).astype(np.int8)
    wp = w + 2                                   # padding 1 on the left and right
    ow = (wp - k) // s + 1
    out = np.zeros((ow, c), np.int32)
    with accel.Session() as sess:       # the last strip's pixels past the row read INP beyond it
        sess.load(image.reshape(-1), w * c, Mem.INP, 0, wp * c, rows=k, cols=w * c, dram_ld=w * c,
                  pad_left=c, pad_right=c, deps=accel.AUTO)   # input rows 1..3 feed output row 1
        sess.load(kernel.reshape(-1), 0, Mem.WGT, 0, c, rows=k * k, cols=c, dram_ld=c, deps=accel.AUTO)
        for x0 in range(0, ow, T):
            sess.gemm(x0 * c, 0, 0, c, T, T, reset=True, deps=accel.AUTO)
            sess.dwmac(x0 * c, x0 * s * c, 0, c, s * c, ext_out=k, ext_in=k, inp_stride_out=wp * c,
                       inp_stride_in=c, wgt_stride_out=k * c, wgt_stride_in=c, deps=accel.AUTO)
        sess.store(out.reshape(-1), 0, 0, c, rows=ow, cols=c, dram_ld=c, deps=accel.AUTO)
    padded = np.pad(image[1:1 + k].astype(np.int32), ((0, 0), (1, 1), (0, 0)))
    want = sum(padded[i, j:j + s * ow:s] * kernel[i, j] for i in range(k) for j in range(k))
    np.testing.assert_array_equal(out, want)


@settings(max_examples=40)
@given(dwmacs(), st.integers(0, 1000))
def test_the_dependency_tokens_cover_what_dwmac_writes(args, seed):
    test_the_dependency_tokens_cover_what_the_declared_program_writes.hypothesis.inner_test((DWMAC, args), seed)


# -- LUT, the 256-entry int8 table on ACC vectors -------------------------------------------------
@st.composite
def luts(draw):
    args = {"ext_out": draw(st.integers(0, 4)), "ext_in": draw(st.integers(0, 4)),
            "dst_addr": draw(st.integers(0, 8)) * T, "lut_addr": draw(st.integers(0, 8)) * T,
            "dst_stride_out": draw(st.integers(0, 6)) * T, "dst_stride_in": draw(st.integers(0, 4)) * T}
    return _perturbed(draw, args, [a for a in args if "ext" not in a])


@settings(max_examples=80)
@given(luts(), st.integers(0, 1000), st.booleans())
def test_lut_is_its_declared_program(args, seed, in_range):
    """Values in int8 (what a requantise leaves) index the table; any others, the clamped end."""
    sim = _simulator(seed)
    if in_range:
        sim.acc[:] = np.random.default_rng(seed).integers(-130, 130, sim.acc.size)
    encoded = _check(sim, LUT, args, [])
    assume(encoded is not None)
    acc, wgt = _scratch(sim, Mem.ACC), _scratch(sim, Mem.WGT)
    d = args["dst_addr"]
    want = LUT.reference(**{**args, "dst_addr": acc[d:], "lut_addr": wgt[args["lut_addr"]:]}, tile=T)["dst_addr"]
    _fused_too(sim, encoded, [], lambda s: np.testing.assert_array_equal(_scratch(s, Mem.ACC)[d:], want))


def test_lut_encoding_cycles_and_disassembly():
    u = isa.Lut(dst_addr=32, lut_addr=256, ext_out=4, ext_in=2, dst_stride_out=64, dst_stride_in=16, push_next=True)
    data = isa.encode(u)
    words = np.frombuffer(data, "<u4")
    assert words[0] == isa.Opcode.LUT | 8 << 4 and words[1:7].tolist() == [32, 256, 4, 2, 64, 16]
    assert not words[7:].any() and isa.decode(data) == [u]
    assert isa.disassemble(u) == "LUT ACC[32] = WGT[256 + ACC[32] + 128] loop 4x2 (dst+64/16) [push_next]"
    with pytest.raises(accel.DecodeError, match="invalid func"):
        isa.decode(bytes([isa.Opcode.LUT, 1]) + data[2:])
    # ISA.md section 6: like an ALU op, alu_lanes lanes a cycle, on the ALU unit
    from accel.hw import cycles
    assert cycles.cost(u, CONFIG) == 8 * -(-T // CONFIG.alu_lanes) + CONFIG.issue_overhead
    timing = cycles.schedule([u.with_flags(push_next=False), isa.Finish()], CONFIG)
    assert timing.busy["alu"] == cycles.cost(u, CONFIG) and timing.macs == 0
    sim = Simulator(CONFIG)
    with pytest.raises(accel.hw.errors.ScratchpadOverflowError):     # the table must fit WGT
        sim.check(0, isa.Lut(dst_addr=0, lut_addr=CONFIG.wgt_elements - T), [])
    with pytest.raises(InstructionError, match="overlap"):
        sim.check(0, isa.Lut(dst_addr=0, lut_addr=0, ext_out=2), [])


def test_a_requantise_then_table_through_the_session():
    """Requantise int32 accumulators (ADD, SHR, MAX, MIN), apply a HardSwish-like table loaded
    into WGT by DMA, store int8: through accel.Session (automatic tokens), equal to numpy's."""
    rng = np.random.default_rng(1)
    acc = rng.integers(-2**16, 2**16, (4, T)).astype(np.int32)
    x = np.arange(-128, 128)
    table = np.clip(x * np.clip(x + 48, 0, 96) // 96, -128, 127).astype(np.int8)
    out = np.zeros((4, T), np.int8)
    with accel.Session(CONFIG) as sess:
        sess.load(acc.reshape(-1), 0, Mem.ACC, 0, T, rows=4, cols=T, dram_ld=T, deps=accel.AUTO)
        sess.load(table, 0, Mem.WGT, 2 * T, 256, rows=1, cols=256, dram_ld=256, deps=accel.AUTO)
        for op, imm in ((AluOp.ADD, 1 << 7), (AluOp.SHR, 8), (AluOp.MAX, -128), (AluOp.MIN, 127)):
            sess.alu(op, 0, imm=imm, use_imm=True, ext_out=4, dst_stride_out=T, deps=accel.AUTO)
        sess.lut(0, 2 * T, ext_out=4, dst_stride_out=T, deps=accel.AUTO)
        sess.store(out.reshape(-1), 0, 0, T, rows=4, cols=T, dram_ld=T, mode=StoreMode.WRAP, deps=accel.AUTO)
    np.testing.assert_array_equal(out, table[np.clip((acc + 128) >> 8, -128, 127) + 128])
    assert sess.stats.instructions["LUT"] == 1


@settings(max_examples=40)
@given(luts(), st.integers(0, 1000))
def test_the_dependency_tokens_cover_what_lut_writes(args, seed):
    test_the_dependency_tokens_cover_what_the_declared_program_writes.hypothesis.inner_test((LUT, args), seed)


# -- STORE's element stride (upsampled layouts) ----------------------------------------------------
def test_strided_store_encoding_cycles_and_disassembly():
    s = isa.Store(sram_addr=64, sram_ld=16, slot=2, dram_offset=5, dram_ld=128, rows=4, cols=16, dram_step=2,
                  mode=StoreMode.WRAP)
    data = isa.encode(s)
    words = np.frombuffer(data, "<u4")
    assert words[0] == isa.Opcode.STORE | int(StoreMode.WRAP) << 8
    assert words[1:9].tolist() == [64, 16, 2, 5, 128, 4, 16, 2] and not words[9:].any()
    assert isa.decode(data) == [s] and s.dram_width == 31
    assert isa.disassemble(s) == "STORE slot2[5 ld=128 step=2] <- ACC[64 ld=16] 4x16 WRAP"
    assert isa.disassemble(dataclasses.replace(s, dram_step=1)) == "STORE slot2[5 ld=128] <- ACC[64 ld=16] 4x16 WRAP"
    # ISA.md section 6: a strided row is one burst over the bytes it spans (31: one cycle each), or one beat
    # per element where that is cheaper (a transposing store); the bytes written count as written
    from accel.hw import cycles
    assert cycles.cost(s, CONFIG) == 4 * 1 + CONFIG.issue_overhead
    assert cycles.cost(dataclasses.replace(s, dram_step=1), CONFIG) == 1 + CONFIG.issue_overhead
    assert cycles.cost(dataclasses.replace(s, dram_step=1000, dram_ld=1), CONFIG) == 4 * 16 + CONFIG.issue_overhead
    timing = cycles.schedule([s, isa.Finish()], CONFIG)
    assert timing.bytes["sram_to_dram"] == 64


def test_a_strided_store_through_the_session_interleaves_rows():
    """Two STOREs of one ACC block, ``dram_step = 2`` at offsets 0 and 1, write every value
    twice side by side (a nearest resize along a row); a stride of 0 and overlapping rows
    are refused with their reason."""
    a = np.arange(64, dtype=np.int32).reshape(4, 16)
    out = np.zeros((4, 32), np.int8)
    with accel.Session(CONFIG) as sess:
        sess.load(a.reshape(-1), 0, Mem.ACC, 0, 16, rows=4, cols=16, dram_ld=16, deps=accel.AUTO)
        for b in range(2):
            sess.store(out.reshape(-1), b, 0, 16, rows=4, cols=16, dram_ld=32, dram_step=2, mode=StoreMode.WRAP,
                       deps=accel.AUTO)
    np.testing.assert_array_equal(out, np.repeat(a, 2, axis=1).astype(np.int8))
    # rows interleaved: dram_ld 1, dram_step 4 writes the 4 x 16 block transposed
    t = np.zeros((16, 4), np.int32)
    with accel.Session(CONFIG) as sess:
        sess.load(a.reshape(-1), 0, Mem.ACC, 0, 16, rows=4, cols=16, dram_ld=16, deps=accel.AUTO)
        sess.store(t.reshape(-1), 0, 0, 16, rows=4, cols=16, dram_ld=1, dram_step=4, deps=accel.AUTO)
    np.testing.assert_array_equal(t, a.T)
    for step, ld, match in ((0, 32, "dram_step 0 must be at least 1"), (2, 30, "overwrite each other"),
                            (2, 2, "overwrite each other")):
        with pytest.raises(InstructionError, match=match):
            with accel.Session(CONFIG) as sess:
                sess.store(out.reshape(-1), 0, 0, 16, rows=2, cols=16, dram_ld=ld, dram_step=step,
                           mode=StoreMode.WRAP)
