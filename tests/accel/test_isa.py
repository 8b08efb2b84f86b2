"""ISA encoding: round trips, decode robustness, disassembly, Config validation."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

import accel
from accel.hw import isa
from accel.hw.isa import Alu, AluOp, Finish, Gemm, Load, Mem, Queue, Store, StoreMode, queue_of

u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
small = st.integers(0, 64)


def _with_flags(ins, draw):
    allowed = {Queue.LOAD: ("pop_next", "push_next"), Queue.STORE: ("pop_prev", "push_prev"),
               Queue.COMPUTE: ("pop_prev", "pop_next", "push_prev", "push_next")}[queue_of(ins)]
    return ins.with_flags(**{f: draw(st.booleans()) for f in allowed})


@st.composite
def instructions(draw):
    kind = draw(st.sampled_from(["load", "store", "gemm", "alu", "finish"]))
    num = draw(st.sampled_from([u32, small]))
    if kind == "load":
        ins = Load(mem=draw(st.sampled_from(list(Mem))), pad_value=draw(i32),
                   **{f: draw(num) for f in isa.FIELDS[isa.Opcode.LOAD] if f != "pad_value"})
    elif kind == "store":
        ins = Store(mode=draw(st.sampled_from(list(StoreMode))),
                    **{f: draw(num) for f in isa.FIELDS[isa.Opcode.STORE]})
    elif kind == "gemm":
        ins = Gemm(reset=draw(st.booleans()), **{f: draw(num) for f in isa.FIELDS[isa.Opcode.GEMM]})
    elif kind == "alu":
        ins = Alu(op=draw(st.sampled_from(list(AluOp))), use_imm=draw(st.booleans()), imm=draw(i32),
                  **{f: draw(num) for f in isa.FIELDS[isa.Opcode.ALU] if f != "imm"})
    else:
        ins = Finish()
    return _with_flags(ins, draw)


@given(st.lists(instructions(), max_size=8))
def test_encode_decode_round_trip(stream):
    data = isa.encode(stream)
    assert len(data) == isa.INSTRUCTION_BYTES * len(stream)
    assert isa.decode(data) == stream
    text = isa.disassemble(data)
    assert len(text.splitlines()) == len(stream)


@given(st.binary(max_size=4 * isa.INSTRUCTION_BYTES))
def test_decode_of_random_bytes_only_raises_decode_error(data):
    try:
        stream = isa.decode(data)
    except accel.DecodeError:
        return
    assert isa.encode(stream) == data


@given(st.lists(instructions(), min_size=1, max_size=4), st.data())
def test_corrupted_streams_raise_or_reencode(stream, data):
    raw = bytearray(isa.encode(stream))
    cut = data.draw(st.integers(0, len(raw) - 1))
    if data.draw(st.booleans()):
        if cut % isa.INSTRUCTION_BYTES == 0:  # a whole-instruction prefix is a valid stream
            assert isa.decode(bytes(raw[:cut])) == stream[:cut // isa.INSTRUCTION_BYTES]
            return
        with pytest.raises(accel.DecodeError, match="truncated"):
            isa.decode(bytes(raw[:cut]))
    else:
        raw[cut] ^= 1 << data.draw(st.integers(0, 7))
        try:
            decoded = isa.decode(bytes(raw))
        except accel.DecodeError as e:
            assert "instruction #" in str(e)
        else:
            assert isa.encode(decoded) == bytes(raw)


@pytest.mark.parametrize("word0, message", [
    (0xF, "unknown opcode"),
    (0x1_0000, "reserved header bits"),
    (isa.Opcode.LOAD | 0 << 8, "invalid func"),            # memory id 0
    (isa.Opcode.STORE | 3 << 8, "invalid func"),           # no such store mode
    (isa.Opcode.ALU | 7 << 8, "invalid func"),             # no such ALU op
    (isa.Opcode.LOAD | 1 << 8 | 1 << 4, "not valid on the load queue"),   # pop_prev on LOAD
    (isa.Opcode.STORE | 1 << 5, "not valid on the store queue"),          # pop_next on STORE
    (isa.Opcode.FINISH | 1 << 8, "invalid func"),
])
def test_malformed_headers_are_named(word0, message):
    raw = word0.to_bytes(4, "little") + bytes(60)
    with pytest.raises(accel.DecodeError, match=message):
        isa.decode(raw)


def test_unused_words_must_be_zero():
    raw = bytearray(isa.encode(Finish()))
    raw[60] = 1
    with pytest.raises(accel.DecodeError, match="unused words"):
        isa.decode(bytes(raw))


def test_fields_are_range_checked():
    with pytest.raises(ValueError, match="32-bit"):
        Gemm(acc_addr=-1, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16)
    with pytest.raises(ValueError, match="32-bit"):
        Alu(op=AluOp.ADD, dst_addr=0, imm=2**31)
    with pytest.raises(ValueError, match="not a Mem"):
        Load(mem=0, sram_addr=0, sram_ld=0, slot=0, dram_offset=0, dram_ld=0, rows=0, cols=0)
    with pytest.raises(ValueError, match="not valid on the store queue"):
        isa.encode(Store(sram_addr=0, sram_ld=0, slot=0, dram_offset=0, dram_ld=0, rows=0,
                         cols=0, push_next=True))


def _all_fields(cls, **values):
    """Every field of ``cls`` (the dict ``isa.make`` takes): defaults, then ``values``."""
    base = {"mem": Mem.ACC, "op": AluOp.SHR, "mode": StoreMode.INT32, "use_imm": True, "reset": False}
    out = {f.name: base.get(f.name, False if f.type == "bool" else 0) for f in dataclasses.fields(cls)}
    out.update(values)
    return out


@pytest.mark.parametrize("cls, name", [(Alu, "imm"), (Load, "pad_value")])
@pytest.mark.parametrize("value", [2**31, 2**32 + 2, -(2**31) - 1, 2**40])
def test_signed_fields_are_range_checked_by_make(cls, name, value):
    """make() is the runtime's constructor: a signed field outside int32 must not pass
    (SHR #(2**32+2) ran as a shift by 31 and was recorded as SHR #2)."""
    with pytest.raises(ValueError, match=f"{cls.__name__}.{name}={value} does not fit"):
        isa.make(cls, _all_fields(cls, **{name: value}))
    edge = 2**31 - 1 if value > 0 else -(2**31)
    assert getattr(isa.make(cls, _all_fields(cls, **{name: edge})), name) == edge


def test_signed_fields_are_range_checked_at_the_session():
    s = accel.Session()
    with pytest.raises(ValueError, match="Alu.imm=2147483648 does not fit"):
        s.alu(AluOp.ADD, 0, imm=2**31, use_imm=True)
    with pytest.raises(ValueError, match="Load.pad_value=4294967298 does not fit"):
        s.load(np.zeros(16, np.int32), 0, Mem.ACC, 0, 16, rows=1, cols=1, dram_ld=1,
               pad_right=1, pad_value=2**32 + 2)
    assert s.pending == 0


def test_acc_loads_go_to_the_compute_queue():
    load = dict(sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=1, cols=16)
    assert queue_of(Load(mem=Mem.ACC, **load)) is Queue.COMPUTE
    assert queue_of(Load(mem=Mem.WGT, **load)) is Queue.LOAD


def test_disassembly_is_readable():
    g = Gemm(acc_addr=0, inp_addr=256, wgt_addr=512, acc_ld=64, inp_ld=16, wgt_ld=16,
             ext_out=4, ext_in=2, acc_stride_out=16, inp_stride_in=256, wgt_stride_out=256,
             pop_prev=True)
    assert isa.disassemble(g) == ("GEMM ACC[0 ld=64] += INP[256 ld=16] x WGT[512 ld=16]^T "
                                  "loop 4x2 (acc+16/0 inp+0/256 wgt+256/0) [pop_prev]")


@pytest.mark.parametrize("kwargs, message", [
    ({"tile": 12}, "power of two"),
    ({"tile": 0}, "positive"),
    ({"acc_bytes": 100}, "multiple of 64"),
    ({"inp_bytes": 16 * 8}, "at least one 16x16 tile"),
    ({"issue_overhead": -1}, "issue_overhead"),
    ({"unit_queue": -1}, "unit_queue must be an int >= 0"),
    ({"unit_queue": True}, "unit_queue"),
    ({"dma_bytes_per_cycle": 1.5}, "positive int"),
])
def test_config_rejects_impossible_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        accel.Config(**kwargs)


def test_config_defaults_match_the_design():
    c = accel.Config()
    assert (c.tile, c.gemm_macs_per_cycle, c.dma_bytes_per_cycle, c.alu_lanes) == (16, 256, 64, 16)
    assert (c.inp_bytes, c.wgt_bytes, c.acc_bytes) == (32 * 1024, 256 * 1024, 128 * 1024)
    assert c.tile_cycles == 16
    assert c.unit_queue == 2
