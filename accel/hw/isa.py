"""The accel instruction set: instruction classes, binary encoding and disassembly.

Every instruction is 64 bytes: sixteen little-endian uint32 words. Word 0 is the header
(opcode in bits 0-3, the four dependency flags in bits 4-7, an opcode-specific ``func``
byte in bits 8-15, bits 16-31 zero); words 1.. hold the operand fields in the order of
``FIELDS[opcode]``; the remaining words are zero. accel/ISA.md is the full reference.

>>> ins = Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=64,
...            rows=16, cols=16, push_next=True)
>>> decode(encode([ins])) == [ins]
True
>>> disassemble(ins)
'LOAD INP[0 ld=16] <- slot0[0 ld=64] 16x16 [push_next]'
"""

from __future__ import annotations

import enum
import operator
import struct
from dataclasses import dataclass, fields
from typing import Callable, ClassVar, Iterable, Sequence, Union

import numpy as np

from accel.hw.errors import DecodeError
from accel.hw.instructions import (CHAIN_IMM_FIELDS, AluOp, ChainVector, Mem, StoreMode, chain_problem, chain_steps,
                                   chain_uses_src)

__all__ = [
    "INSTRUCTION_BYTES", "Opcode", "Queue", "Mem", "StoreMode", "AluOp", "Instruction",
    "Load", "Store", "Gemm", "Alu", "Finish", "Dwmac", "Lut", "AluChain", "FIELDS", "make", "queue_of", "encode",
    "decode", "disassemble", "ALLOWED_FLAGS",
]

INSTRUCTION_BYTES = 64
_WORDS = INSTRUCTION_BYTES // 4
_U32 = 2**32


class Opcode(enum.IntEnum):
    """Header bits 0-3."""

    LOAD = 0
    STORE = 1
    GEMM = 2
    ALU = 3
    FINISH = 4
    DWMAC = 5
    LUT = 6
    ALU_CHAIN = 7


class Queue(enum.IntEnum):
    """The three in-order command queues; tokens flow only between neighbours.

    >>> Queue.COMPUTE - 1 == Queue.LOAD
    True
    """

    LOAD = 0
    COMPUTE = 1
    STORE = 2


@dataclass(frozen=True, kw_only=True)
class Instruction:
    """Base of all instructions: the VTA-style dependency flags every instruction has.

    ``pop_prev``/``push_prev`` talk to the previous queue (load for compute, compute for
    store), ``pop_next``/``push_next`` to the next one. A pop waits for a token, a push
    sends one when the instruction completes.
    """

    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    opcode: ClassVar[Opcode]
    _signed: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        # Runs once per instruction the runtime emits, so the common case (plain ints and
        # bools of the right kind) is checked without any coercion or formatting.
        values = self.__dict__
        for name, kind, lo, hi in _spec(type(self)):
            value = values[name]
            if kind is int:
                if type(value) is int and lo <= value < hi:
                    continue
            elif kind is bool:
                if value is True or value is False:
                    continue
            elif type(value) is kind:
                continue
            values[name] = self._coerce(name, kind, lo, hi, value)

    def _coerce(self, name: str, kind: type, lo: int, hi: int, value: object) -> object:
        cls = type(self).__name__
        if kind is bool:
            if not isinstance(value, (bool, int, np.integer)) or value not in (0, 1):
                raise ValueError(f"{cls}.{name} must be a bool, got {value!r}")
            return bool(value)
        if kind is not int:
            # compiled code passes an enum field as a plain int: the members by value are one
            # dict lookup, where the enum's constructor costs microseconds per instruction
            member = kind._value2member_map_.get(value) if type(value) is int else None
            if member is not None:
                return member
            try:
                return kind(value)
            except ValueError:
                raise ValueError(f"{cls}.{name}={value!r} is not a {kind.__name__}") from None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{cls}.{name} must be an int, got {value!r}")
        if not lo <= value < hi:
            raise ValueError(f"{cls}.{name}={value} does not fit its 32-bit field [{lo}, {hi - 1}]")
        return int(value)

    def __str__(self) -> str:
        """The instruction's disassembly (what errors quote).

        >>> str(Finish())
        'FINISH'
        """
        return disassemble(self)

    @property
    def flags(self) -> int:
        """The four dependency flags as header bits 4-7 shifted down (bit 0 = pop_prev)."""
        return self.pop_prev | self.pop_next << 1 | self.push_prev << 2 | self.push_next << 3

    def with_flags(self, **flags: bool) -> "Instruction":
        """A copy with some dependency flags replaced.

        >>> Finish().with_flags(pop_prev=True).pop_prev
        True
        """
        # The driver sets flags on thousands of instructions per stream: copy the fields
        # instead of re-running the dataclass constructor (only the bools change).
        for name, value in flags.items():
            if name not in _FLAG_NAMES or (value is not True and value is not False):
                raise ValueError(f"with_flags takes the bool flags {_FLAG_NAMES}, got {name}={value!r}")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(flags)
        return new


_FLAG_NAMES = ("pop_prev", "pop_next", "push_prev", "push_next")
_BOOL_FIELDS = frozenset(_FLAG_NAMES + ("reset", "use_imm"))
_ENUM_FIELDS = {"mem": Mem, "mode": StoreMode, "op": AluOp}
_SPECS: dict[type, tuple[tuple[str, type, int, int], ...]] = {}


def _spec(cls: type) -> tuple[tuple[str, type, int, int], ...]:
    """(name, kind, lo, hi) per field: kind is int, bool or the field's enum class."""
    spec = _SPECS.get(cls)
    if spec is None:
        spec = tuple(
            (f.name, _ENUM_FIELDS.get(f.name) or (bool if f.name in _BOOL_FIELDS else int),
             *((-(2**31), 2**31) if f.name in cls._signed else (0, _U32)))
            for f in fields(cls))
        _SPECS[cls] = spec
    return spec


@dataclass(frozen=True, kw_only=True)
class Load(Instruction):
    """2-D strided DMA from host buffer ``slot`` into scratchpad ``mem``, with padding.

    Reads ``rows x cols`` elements at ``dram_offset + r*dram_ld + c`` and writes a
    ``(pad_top+rows+pad_bottom) x (pad_left+cols+pad_right)`` block at
    ``sram_addr + r*sram_ld + c``; the border is ``pad_value``.

    >>> Load(mem=Mem.ACC, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=0,
    ...      rows=16, cols=16).rows
    16
    """

    mem: Mem
    sram_addr: int
    sram_ld: int
    slot: int
    dram_offset: int
    dram_ld: int
    rows: int
    cols: int
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    pad_value: int = 0

    opcode: ClassVar[Opcode] = Opcode.LOAD
    _signed: ClassVar[frozenset[str]] = frozenset({"pad_value"})

    @property
    def dram_width(self) -> int:
        """Host elements one row spans: ``cols`` (a LOAD reads each row contiguously)."""
        return self.cols


@dataclass(frozen=True, kw_only=True)
class Store(Instruction):
    """2-D strided DMA of ``rows x cols`` int32 ACC elements to host buffer ``slot``, element
    ``[r, c]`` to ``dram_offset + r*dram_ld + c*dram_step``.

    >>> Store(sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16,
    ...       mode=StoreMode.SATURATE).mode.name
    'SATURATE'
    """

    sram_addr: int
    sram_ld: int
    slot: int
    dram_offset: int
    dram_ld: int
    rows: int
    cols: int
    dram_step: int = 1
    mode: StoreMode = StoreMode.INT32

    opcode: ClassVar[Opcode] = Opcode.STORE

    @property
    def dram_width(self) -> int:
        """Host elements one row spans: its ``cols`` elements are ``dram_step`` apart.

        >>> Store(sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=64, rows=4, cols=16, dram_step=2).dram_width
        31
        """
        return (self.cols - 1) * self.dram_step + 1 if self.cols else 0


@dataclass(frozen=True, kw_only=True)
class Gemm(Instruction):
    """``acc += inp @ wgt.T`` on tiles, over two loop levels (``reset`` zeroes acc instead).

    Step ``(o, i)`` for ``o < ext_out``, ``i < ext_in`` uses the tiles at
    ``X_addr + o*X_stride_out + i*X_stride_in`` (X in acc/inp/wgt), each ``tile`` rows
    of ``tile`` elements with row stride ``X_ld``. Addresses are elements.

    >>> Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16).ext_out
    1
    """

    acc_addr: int
    inp_addr: int
    wgt_addr: int
    acc_ld: int
    inp_ld: int
    wgt_ld: int
    ext_out: int = 1
    ext_in: int = 1
    acc_stride_out: int = 0
    acc_stride_in: int = 0
    inp_stride_out: int = 0
    inp_stride_in: int = 0
    wgt_stride_out: int = 0
    wgt_stride_in: int = 0
    reset: bool = False

    opcode: ClassVar[Opcode] = Opcode.GEMM


@dataclass(frozen=True, kw_only=True)
class Alu(Instruction):
    """``acc[dst] = op(acc[dst], imm or acc[src])`` on ``tile``-lane ACC vectors.

    Step ``(o, i)`` works on the vector at ``dst_addr + o*dst_stride_out + i*dst_stride_in``
    (and likewise ``src``). All reads happen before any write.

    >>> Alu(op=AluOp.SHR, use_imm=True, imm=4, dst_addr=0, ext_out=16, dst_stride_out=16).op.name
    'SHR'
    """

    op: AluOp
    dst_addr: int
    src_addr: int = 0
    imm: int = 0
    use_imm: bool = False
    ext_out: int = 1
    ext_in: int = 1
    dst_stride_out: int = 0
    dst_stride_in: int = 0
    src_stride_out: int = 0
    src_stride_in: int = 0

    opcode: ClassVar[Opcode] = Opcode.ALU
    _signed: ClassVar[frozenset[str]] = frozenset({"imm"})


@dataclass(frozen=True, kw_only=True)
class Dwmac(Instruction):
    """``acc[p, c] += inp[p, c] * wgt[c]`` on a tile of ``tile`` pixels (rows) x ``tile``
    channels (lanes), over two loop levels: the per-channel multiply-accumulate of a
    depthwise convolution (one weight row per kernel tap, broadcast over the pixels).

    Step ``(o, i)`` uses the ACC and INP tiles at ``X_addr + o*X_stride_out + i*X_stride_in``
    (row stride ``X_ld``) and the ``tile`` weights at ``wgt_addr + o*wgt_stride_out +
    i*wgt_stride_in``. Addresses are elements.

    >>> Dwmac(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=32, ext_out=3, ext_in=3,
    ...       inp_stride_out=512, inp_stride_in=16, wgt_stride_out=48, wgt_stride_in=16).ext_in
    3
    """

    acc_addr: int
    inp_addr: int
    wgt_addr: int
    acc_ld: int
    inp_ld: int
    ext_out: int = 1
    ext_in: int = 1
    acc_stride_out: int = 0
    acc_stride_in: int = 0
    inp_stride_out: int = 0
    inp_stride_in: int = 0
    wgt_stride_out: int = 0
    wgt_stride_in: int = 0

    opcode: ClassVar[Opcode] = Opcode.DWMAC


@dataclass(frozen=True, kw_only=True)
class Lut(Instruction):
    """``acc[d] = wgt[lut_addr + clip(acc[d], -128, 127) + 128]`` on each lane of the
    ``tile``-lane ACC vectors at ``dst_addr + o*dst_stride_out + i*dst_stride_in``, over two
    loop levels: a 256-entry int8 table (in WGT, loaded by DMA) applied after a requantise.
    A value outside int8 reads the entry of the end it passes. Addresses are elements.

    >>> Lut(dst_addr=32, lut_addr=256, ext_out=4, dst_stride_out=16).ext_out
    4
    """

    dst_addr: int
    lut_addr: int
    ext_out: int = 1
    ext_in: int = 1
    dst_stride_out: int = 0
    dst_stride_in: int = 0

    opcode: ClassVar[Opcode] = Opcode.LUT


@dataclass(frozen=True, kw_only=True)
class AluChain(Instruction):
    """Up to eight ALU operations applied in turn to every ``tile``-lane ACC vector of a block,
    in one pass: ``v = dst; v = op_k(v, imm or src)`` for each step ``k``; ``dst = v``.

    ``length`` steps (1..8); step ``k``'s code is bits ``4k .. 4k+3`` of ``code`` (bits 0-2 its
    :class:`AluOp`, bit 3 set for an immediate); the immediates ``imm0`` .. ``imm5`` are those of
    the steps that take one, in step order (:func:`accel.hw.instructions.chain_code` makes the
    fields); the others read the one vector operand at ``src_addr + o*src_stride_out +
    i*src_stride_in``. Bit ``k`` of ``vectors`` (header bits 16-31) makes step ``k``'s word
    the offset of its vector operand from ``src_addr``, read with src's strides, and bit ``8 +
    k`` too from ``dst_addr``, with the destination's (a
    :class:`~accel.hw.instructions.ChainVector`). Every read (of dst and of each vector, by
    any step) happens before any write.

    >>> from accel.hw.instructions import chain_code
    >>> c = AluChain(dst_addr=0, ext_out=4, dst_stride_out=16, **chain_code([(AluOp.MUL, 3), (AluOp.SHR, 1)]))
    >>> c.steps
    [(<AluOp.MUL: 4>, 3), (<AluOp.SHR: 3>, 1)]
    """

    length: int
    code: int
    dst_addr: int
    src_addr: int = 0
    imm0: int = 0
    imm1: int = 0
    imm2: int = 0
    imm3: int = 0
    imm4: int = 0
    imm5: int = 0
    ext_out: int = 1
    ext_in: int = 1
    dst_stride_out: int = 0
    dst_stride_in: int = 0
    src_stride_out: int = 0
    src_stride_in: int = 0
    vectors: int = 0

    opcode: ClassVar[Opcode] = Opcode.ALU_CHAIN
    _signed: ClassVar[frozenset[str]] = frozenset(CHAIN_IMM_FIELDS)

    @property
    def immediates(self) -> tuple[int, ...]:
        """The six immediate words, ``imm0`` first."""
        values = self.__dict__
        return tuple(values[n] for n in CHAIN_IMM_FIELDS)

    @property
    def steps(self) -> list:
        """The steps ``(op, imm)`` in order, ``imm`` None for the vector operand ``src``, a
        :class:`~accel.hw.instructions.ChainVector` for another (ValueError for fields that
        are no chain)."""
        problem = chain_problem(self.length, self.code, self.immediates, self.vectors)
        if problem is not None:
            raise ValueError(f"AluChain: {problem}")
        return chain_steps(self.length, self.code, self.immediates, self.vectors)


@dataclass(frozen=True, kw_only=True)
class Finish(Instruction):
    """End of stream: a compute-queue barrier that completes when every queue has drained.

    >>> Finish().opcode.name
    'FINISH'
    """

    opcode: ClassVar[Opcode] = Opcode.FINISH


_CLASSES: dict[Opcode, type[Instruction]] = {
    Opcode.LOAD: Load, Opcode.STORE: Store, Opcode.GEMM: Gemm, Opcode.ALU: Alu, Opcode.FINISH: Finish,
    Opcode.DWMAC: Dwmac, Opcode.LUT: Lut, Opcode.ALU_CHAIN: AluChain,
}
#: The fields the header's func byte holds (see ``_func``), per opcode.
_FUNC_FIELDS = {Opcode.LOAD: ("mem",), Opcode.STORE: ("mode",), Opcode.GEMM: ("reset",), Opcode.ALU: ("op", "use_imm"),
                Opcode.FINISH: (), Opcode.DWMAC: (), Opcode.LUT: (), Opcode.ALU_CHAIN: ("length",)}
#: The field the header's bits 16-31 hold, per opcode (reserved, zero, for the others).
_HIGH_FIELDS = {Opcode.ALU_CHAIN: "vectors"}
#: Operand words 1.. in this order: the class's fields as declared, but the dependency
#: flags and the header's fields (so the dataclass is the one operand list).
FIELDS: dict[Opcode, tuple[str, ...]] = {
    op: tuple(f.name for f in fields(cls) if f.name not in _FLAG_NAMES and f.name not in _FUNC_FIELDS[op]
              and f.name != _HIGH_FIELDS.get(op))
    for op, cls in _CLASSES.items()}
_SIGNED_WORDS = {op: {i + 1 for i, n in enumerate(names) if n in _CLASSES[op]._signed}
                 for op, names in FIELDS.items()}
#: The dependency flags (``Instruction.flags`` bits) meaningful per queue: the load queue
#: has no previous neighbour, the store queue no next one.
ALLOWED_FLAGS = {Queue.LOAD: 0b1010, Queue.COMPUTE: 0b1111, Queue.STORE: 0b0101}


def make(cls: type[Instruction], values: dict) -> Instruction:
    """Build an instruction from a dict of every field, with the constructor's validation.

    The runtime's hot path: a frozen dataclass' keyword constructor costs several µs, so
    the unsigned fields are range-checked in bulk and only the rest field by field.

    >>> make(Finish, dict(pop_prev=True, pop_next=False, push_prev=False, push_next=False))
    Finish(pop_prev=True, pop_next=False, push_prev=False, push_next=False)
    """
    ins = object.__new__(cls)
    fields_ = ins.__dict__
    fields_.update(values)
    count, getter, others = _BULK.get(cls) or _bulk(cls)
    if len(fields_) != count:
        raise TypeError(f"{cls.__name__} needs exactly the fields {[n for n, *_ in _spec(cls)]}")
    ints = getter(fields_)
    if set(map(type, ints)) == {int} and min(ints) >= 0 and max(ints) < _U32:
        for name, kind, lo, hi in others:
            value = fields_[name]
            if kind is bool:
                ok = value is True or value is False
            elif kind is int:  # a signed field: range-checked like every other one
                ok = type(value) is int and lo <= value < hi
            else:
                ok = type(value) is kind
            if not ok:
                fields_[name] = ins._coerce(name, kind, lo, hi, value)
    else:
        ins.__post_init__()
    return ins


_BULK: dict[type, tuple[int, Callable, tuple]] = {}


def _bulk(cls: type) -> tuple[int, Callable, tuple]:
    """The number of fields of ``cls``, a getter returning its unsigned int fields as a
    tuple, and the spec (see :func:`_spec`) of the other fields."""
    names = tuple(n for n, kind, lo, _ in _spec(cls) if kind is int and lo == 0)
    getter = operator.itemgetter(*names) if len(names) > 1 else (
        (lambda d, n=names[0]: (d[n],)) if names else (lambda d: (0,)))
    others = tuple(spec for spec in _spec(cls) if spec[0] not in names)
    bulk = _BULK[cls] = (len(_spec(cls)), getter, others)
    return bulk


# enum members as module globals for the per-instruction paths: a member found through its
# class costs ~200 ns on Python 3.11 (its metaclass), a global ~20 ns
_LOAD, _STORE, _ACC = Opcode.LOAD, Opcode.STORE, Mem.ACC
_LOAD_QUEUE, _COMPUTE_QUEUE, _STORE_QUEUE = Queue.LOAD, Queue.COMPUTE, Queue.STORE


def queue_of(ins: Instruction) -> Queue:
    """The queue an instruction issues to.

    LOADs into ACC go to the compute queue, as in VTA, so that they are ordered against
    GEMM/ALU (RAW) and against STOREs (WAR) by the compute queue's own tokens.

    >>> queue_of(Finish()).name
    'COMPUTE'
    """
    op = ins.opcode
    if op is _LOAD:
        return _COMPUTE_QUEUE if ins.mem is _ACC else _LOAD_QUEUE
    if op is _STORE:
        return _STORE_QUEUE
    return _COMPUTE_QUEUE


def _func(ins: Instruction) -> int:
    op = ins.opcode
    if op is Opcode.LOAD:
        return int(ins.mem)
    if op is Opcode.STORE:
        return int(ins.mode)
    if op is Opcode.GEMM:
        return int(ins.reset)
    if op is Opcode.ALU:
        return int(ins.op) | int(ins.use_imm) << 4
    if op is Opcode.ALU_CHAIN:
        return ins.length
    return 0


def _encode_one(ins: Instruction) -> bytes:
    allowed = ALLOWED_FLAGS[queue_of(ins)]
    if ins.flags & ~allowed:
        raise ValueError(f"{disassemble(ins)}: dependency flags not valid on the "
                         f"{queue_of(ins).name.lower()} queue")
    high = _HIGH_FIELDS.get(ins.opcode)
    words = [ins.opcode | ins.flags << 4 | _func(ins) << 8 | (getattr(ins, high) << 16 if high else 0)]
    words += [getattr(ins, n) & 0xFFFFFFFF for n in FIELDS[ins.opcode]]
    words += [0] * (_WORDS - len(words))
    return struct.pack(f"<{_WORDS}I", *words)


def encode(instructions: Union[Instruction, Iterable[Instruction]]) -> bytes:
    """Encode one instruction or a sequence of them as 64 bytes each.

    >>> len(encode([Finish(), Finish()]))
    128
    """
    if isinstance(instructions, Instruction):
        instructions = [instructions]
    return b"".join(_encode_one(i) for i in instructions)


def _decode_func(op: Opcode, func: int, at: str) -> dict:
    try:
        if op is Opcode.LOAD:
            return {"mem": Mem(func)}
        if op is Opcode.STORE:
            return {"mode": StoreMode(func)}
        if op is Opcode.GEMM:
            if func > 1:
                raise ValueError
            return {"reset": bool(func)}
        if op is Opcode.ALU:
            if func & ~0x1F:
                raise ValueError
            return {"op": AluOp(func & 0xF), "use_imm": bool(func >> 4)}
        if op is Opcode.ALU_CHAIN:
            if not 1 <= func <= 8:
                raise ValueError
            return {"length": func}
    except ValueError:
        raise DecodeError(f"{at}: invalid func byte {func:#04x} for {op.name}") from None
    if func:
        raise DecodeError(f"{at}: invalid func byte {func:#04x} for {op.name}")
    return {}


def decode(data: Union[bytes, bytearray, memoryview]) -> list[Instruction]:
    """Decode a byte stream; a truncated or malformed stream raises :class:`DecodeError`.

    >>> decode(encode(Finish()))
    [Finish(pop_prev=False, pop_next=False, push_prev=False, push_next=False)]
    """
    data = bytes(data)
    if len(data) % INSTRUCTION_BYTES:
        raise DecodeError(f"stream of {len(data)} bytes is truncated: instructions are "
                          f"{INSTRUCTION_BYTES} bytes each")
    words = np.frombuffer(data, dtype="<u4").reshape(-1, _WORDS)
    out: list[Instruction] = []
    for index, row in enumerate(words.tolist()):
        at = f"instruction #{index} (byte {index * INSTRUCTION_BYTES})"
        header = row[0]
        try:
            op = Opcode(header & 0xF)
        except ValueError:
            raise DecodeError(f"{at}: unknown opcode {header & 0xF}") from None
        high = _HIGH_FIELDS.get(op)
        if header >> 16 and high is None:
            raise DecodeError(f"{at}: reserved header bits 16-31 are set ({header:#010x})")
        names = FIELDS[op]
        if any(row[1 + len(names):]):
            raise DecodeError(f"{at}: unused words of a {op.name} instruction are not zero")
        kwargs = _decode_func(op, header >> 8 & 0xFF, at)
        if high is not None:
            kwargs[high] = header >> 16
        flags = header >> 4 & 0xF
        for bit, name in enumerate(_FLAG_NAMES):
            kwargs[name] = bool(flags >> bit & 1)
        signed = _SIGNED_WORDS[op]
        for w, name in enumerate(names, start=1):
            value = row[w]
            kwargs[name] = value - _U32 if w in signed and value >= 2**31 else value
        ins = _CLASSES[op](**kwargs)
        if op is Opcode.ALU_CHAIN:
            problem = chain_problem(ins.length, ins.code, ins.immediates, ins.vectors)
            if problem is not None:
                raise DecodeError(f"{at}: {problem}")
        if flags & ~ALLOWED_FLAGS[queue_of(ins)]:
            raise DecodeError(f"{at}: dependency flags {flags:#06b} not valid on the "
                              f"{queue_of(ins).name.lower()} queue")
        out.append(ins)
    return out


def _flags_text(ins: Instruction) -> str:
    names = [n for n in _FLAG_NAMES if getattr(ins, n)]
    return f" [{' '.join(names)}]" if names else ""


def _loops(ins: Instruction, *ops: str) -> str:
    if ins.ext_out == 1 and ins.ext_in == 1:
        return ""
    strides = " ".join(
        f"{p}+{getattr(ins, p + '_stride_out')}/{getattr(ins, p + '_stride_in')}" for p in ops)
    return f" loop {ins.ext_out}x{ins.ext_in} ({strides})"


_SYMBOLS = {AluOp.ADD: "+=", AluOp.MUL: "*=", AluOp.SHR: ">>=", AluOp.MAX: "max=", AluOp.MIN: "min="}


def _chain_operand(ins: "AluChain", imm) -> str:
    """A chain step's operand as text: ``#imm``, ``ACC[src]``, or a vector's ``ACC[address]``,
    with ``(dst)`` where it is read with the destination's strides."""
    if imm is None:
        return f"ACC[{ins.src_addr}]"
    if isinstance(imm, ChainVector):
        return f"ACC[{ins.dst_addr + imm.offset}](dst)" if imm.of_dst else f"ACC[{ins.src_addr + imm.offset}]"
    return f"#{imm}"


def disassemble(ins: Union[Instruction, Sequence[Instruction], bytes]) -> str:
    """One readable line per instruction (bytes are decoded first).

    >>> print(disassemble([Alu(op=AluOp.ADD, use_imm=True, imm=8, dst_addr=32), Finish()]))
    0000  ALU ADD ACC[32] += #8
    0001  FINISH
    """
    if isinstance(ins, (bytes, bytearray, memoryview)):
        ins = decode(ins)
    if not isinstance(ins, Instruction):
        return "\n".join(f"{k:04d}  {disassemble(i)}" for k, i in enumerate(ins))
    op = ins.opcode
    if op is Opcode.LOAD:
        pads = (ins.pad_top, ins.pad_bottom, ins.pad_left, ins.pad_right)
        pad = f" pad={pads} value={ins.pad_value}" if any(pads) else ""
        text = (f"LOAD {ins.mem.name}[{ins.sram_addr} ld={ins.sram_ld}] <- "
                f"slot{ins.slot}[{ins.dram_offset} ld={ins.dram_ld}] {ins.rows}x{ins.cols}{pad}")
    elif op is Opcode.STORE:
        step = f" step={ins.dram_step}" if ins.dram_step != 1 else ""
        text = (f"STORE slot{ins.slot}[{ins.dram_offset} ld={ins.dram_ld}{step}] <- "
                f"ACC[{ins.sram_addr} ld={ins.sram_ld}] {ins.rows}x{ins.cols} {ins.mode.name}")
    elif op is Opcode.GEMM:
        body = (f"ACC[{ins.acc_addr} ld={ins.acc_ld}] = 0" if ins.reset else
                f"ACC[{ins.acc_addr} ld={ins.acc_ld}] += INP[{ins.inp_addr} ld={ins.inp_ld}] "
                f"x WGT[{ins.wgt_addr} ld={ins.wgt_ld}]^T")
        text = f"GEMM {body}{_loops(ins, 'acc') if ins.reset else _loops(ins, 'acc', 'inp', 'wgt')}"
    elif op is Opcode.ALU:
        sym = _SYMBOLS[ins.op]
        src = f"#{ins.imm}" if ins.use_imm else f"ACC[{ins.src_addr}]"
        loops = _loops(ins, "dst") if ins.use_imm else _loops(ins, "dst", "src")
        text = f"ALU {ins.op.name} ACC[{ins.dst_addr}] {sym} {src}{loops}"
    elif op is Opcode.ALU_CHAIN:
        if chain_problem(ins.length, ins.code, ins.immediates, ins.vectors) is None:  # an invalid one is quoted
            steps = "; ".join(f"{_SYMBOLS[o]} {_chain_operand(ins, imm)}" for o, imm in ins.steps)
        else:
            steps = f"length={ins.length} code={ins.code:#x} imm={list(ins.immediates)} vectors={ins.vectors:#x}"
        uses_src = chain_uses_src(ins.length, ins.code, ins.vectors)
        text = f"ALU_CHAIN ACC[{ins.dst_addr}] {steps}{_loops(ins, 'dst', 'src') if uses_src else _loops(ins, 'dst')}"
    elif op is Opcode.DWMAC:
        text = (f"DWMAC ACC[{ins.acc_addr} ld={ins.acc_ld}] += INP[{ins.inp_addr} ld={ins.inp_ld}] "
                f"* WGT[{ins.wgt_addr}]{_loops(ins, 'acc', 'inp', 'wgt')}")
    elif op is Opcode.LUT:
        text = f"LUT ACC[{ins.dst_addr}] = WGT[{ins.lut_addr} + ACC[{ins.dst_addr}] + 128]{_loops(ins, 'dst')}"
    else:
        text = "FINISH"
    return text + _flags_text(ins)
