"""Functional simulator of the accel core.

A stream runs in three steps: every instruction is checked against the Config and the
buffer table (so a bad stream writes nothing), the cycle model (:mod:`accel.hw.cycles`)
schedules the three queues, and the instructions take effect in the order they start
there, each atomically. Scratchpads persist between streams.

:meth:`Simulator.compile` turns a stream into a :class:`Program`: the checked stream, its
:class:`~accel.hw.cycles.Timing` and, once it first executes, an execution plan (one
prepared numpy call per instruction over views of the scratchpads and host buffers, made
once). A compiled call emits the same stream every time, so a session runs its Program
again: then the only check left is the buffer table's signature (the dtype, size and
writability of every host buffer the stream touches), and host views are remade only
for buffers whose memory moved. ``execute=False`` runs the cycle model alone (timing-only).

>>> import numpy as np
>>> from accel.hw.emitter import Emitter
>>> from accel.hw.isa import Mem, StoreMode
>>> a = np.arange(256, dtype=np.int8) % 7; w = np.eye(16, dtype=np.int8).ravel(); c = np.zeros(256, np.int8)
>>> sim = Simulator(); em = Emitter(lambda i, ins: sim.check(i, ins, [a, w, c]))
>>> _ = em.load(Mem.INP, 0, 16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16)
>>> _ = em.load(Mem.WGT, 0, 16, slot=1, dram_offset=0, dram_ld=16, rows=16, cols=16, push_next=True)
>>> _ = em.gemm(0, 0, 0, 16, 16, 16, reset=True)
>>> _ = em.gemm(0, 0, 0, 16, 16, 16, pop_prev=True, push_next=True)
>>> _ = em.store(0, 16, slot=2, dram_offset=0, dram_ld=16, rows=16, cols=16, mode=StoreMode.WRAP, pop_prev=True)
>>> stats = sim.run(em.finish(), [a, w, c])
>>> bool((c == a).all()), stats.macs
(True, 4096)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
import threading
import weakref
from functools import partial
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
from threadpoolctl import ThreadpoolController

from accel.hw import cycles, fused
from accel.hw.config import Config
from accel.hw.emitter import verify
from accel.hw.errors import (
    AlignmentError, DmaRangeError, DtypeMismatchError, InstructionError,
    ScratchpadOverflowError, UnknownSlotError,
)
from accel.hw.instructions import (
    ALU_UFUNCS, LOAD_HOST_DTYPE, LUT_ENTRIES, OPERAND_RANGE, STORE_HOST_DTYPE, alu_operand, chain_problem,
    ChainVector, chain_steps, chain_uses_src, distinct_starts,
)
from accel.hw.isa import Alu, AluChain, Dwmac, Gemm, Instruction, Load, Lut, Mem, Opcode, Store, StoreMode
from accel.hw.stats import Stats

__all__ = ["Simulator", "Program", "one_blas_thread"]

Buffers = Sequence[Optional[np.ndarray]]
Op = Callable[[], object]

# int8 x int8 products are at most 2**14; float32 sums them exactly while the total
# stays within its 24-bit mantissa, float64 within 53 bits.
_F32_EXACT_TERMS = 2**24 // 2**14


def _chain_vectors(c: AluChain) -> list[tuple[int, int, int]]:
    """``(start, stride_out, stride_in)`` of each vector a chain's steps read besides ``src``."""
    return [imm.place(c) for _, imm in chain_steps(c.length, c.code, c.immediates, c.vectors)
            if isinstance(imm, ChainVector)]


def _view(base: np.ndarray, offset: int, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """A (bounds-checked elsewhere) strided view of a flat array, strides in elements.

    ``np.ndarray`` over the base's buffer still refuses a view reaching outside it, and
    costs a tenth of ``as_strided``.
    """
    item = base.itemsize
    return np.ndarray(tuple(shape), base.dtype, buffer=base, offset=offset * item,
                      strides=tuple(s * item for s in strides))


def _disjoint(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a strided view addresses every element at most once (sufficient test)."""
    span = 0  # the highest offset reachable through the smaller-stride dimensions
    for stride, extent in sorted((s, e) for e, s in zip(shape, strides) if e > 1):
        if stride <= span:
            return False
        span += (extent - 1) * stride
    return True


_GEMM_ALIGNED = tuple(f"{p}_{f}" for p in ("acc", "inp", "wgt")
                      for f in ("addr", "ld", "stride_out", "stride_in"))
_GEMM_OPERANDS = (("acc", Mem.ACC), ("inp", Mem.INP), ("wgt", Mem.WGT))
_DWMAC_ALIGNED = ("acc_addr", "acc_ld", "acc_stride_out", "acc_stride_in", "inp_addr", "inp_ld",
                  "inp_stride_out", "inp_stride_in", "wgt_addr", "wgt_stride_out", "wgt_stride_in")
_LUT_ALIGNED = ("dst_addr", "dst_stride_out", "dst_stride_in", "lut_addr")
_ALU_ALIGNED = tuple(f"{p}_{f}" for p in ("dst", "src") for f in ("addr", "stride_out", "stride_in"))


_RUNS_BEFORE_FUSING = 2
# enum members as module globals for the per-instruction paths: a member found through its
# class costs ~200 ns on Python 3.11 (its metaclass), a global ~20 ns
_LOAD, _STORE, _GEMM, _ALU, _DWMAC, _LUT = Opcode.LOAD, Opcode.STORE, Opcode.GEMM, Opcode.ALU, Opcode.DWMAC, Opcode.LUT
_ALU_CHAIN = Opcode.ALU_CHAIN
_ACC = Mem.ACC
# The simulator's matrix products are a stream's blocks (tens to a few hundred rows): a
# multi-threaded BLAS splits them across cores and then waits for every thread, which on
# a busy machine costs 20-50x the product itself (the PaddleOCR classifier's 43 streams:
# 105 ms of matmul with OpenBLAS's 2 threads on 2 shared cores, 5 ms with one). So a run
# limits BLAS to one thread, restoring the caller's setting afterwards: by the libraries'
# own calls (about 1 us), not threadpoolctl's limit(), which queries every library each
# time (about 19 us). A caller that runs many streams (a compiled model's call, see
# Session.running) holds the limit around all of them instead: a stream run while its
# thread holds it leaves the setting alone (setting and restoring cost ~6 us a stream).
_BLAS = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]


class _Holders(threading.local):
    count = 0       # this thread's holders inside one_blas_thread


_blas_holders = _Holders()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS runs on one thread inside (the simulator's products are small blocks); the
    setting found is restored when this thread's outermost holder leaves, on an exception
    too. Each thread sets and restores on its own (OpenBLAS takes a new setting only from
    the thread that started it, and ignores one from another).

    >>> with one_blas_thread():
    ...     with one_blas_thread():
    ...         all(lib.get_num_threads() == 1 for lib in _BLAS)
    True
    """
    held = _blas_holders.count
    threads = [] if held else [lib.get_num_threads() for lib in _BLAS]
    for lib, n in zip(_BLAS, threads):
        if n != 1:
            lib.set_num_threads(1)
    _blas_holders.count = held + 1
    try:
        yield
    finally:
        _blas_holders.count = held
        for lib, n in zip(_BLAS, threads):
            if n != 1:
                lib.set_num_threads(n)


_MISSING = object()
_PREPARED_LIMIT = 1 << 14
_FLAG_NAMES = frozenset(("pop_prev", "pop_next", "push_prev", "push_next"))
_GETTERS: dict[type, Callable] = {}


def _fields_of(ins: Instruction) -> tuple:
    """The instruction's class and every field but the dependency flags."""
    getter = _GETTERS.get(type(ins))
    if getter is None:
        names = [f.name for f in dataclasses.fields(ins) if f.name not in _FLAG_NAMES]
        getter = _GETTERS[type(ins)] = operator.itemgetter(*names)
    return type(ins), getter(ins.__dict__)


class Simulator:
    """The core's state (scratchpads) and the machinery to run streams against host buffers.

    ``buffers[slot]`` is the flat (1-D, contiguous) numpy view of host buffer ``slot``.

    >>> Simulator().acc.shape
    (32768,)
    """

    def __init__(self, config: Optional[Config] = None) -> None:
        self.config = config or Config()
        c = self.config
        # INP/WGT hold int8 values; keeping them as float32 (exact for int8) lets GEMM call
        # BLAS without converting operands on every instruction. They are one array, INP then
        # WGT: a fused plan reads and writes both in one call each (FusedPlan._calls).
        scratchpads = np.zeros(c.inp_elements + c.wgt_elements, np.float32)
        self.inp, self.wgt = scratchpads[:c.inp_elements], scratchpads[c.inp_elements:]
        self.acc = np.zeros(c.acc_elements, np.int32)
        self._sizes = {Mem.INP: c.inp_elements, Mem.WGT: c.wgt_elements, Mem.ACC: c.acc_elements}
        self._temps: dict[tuple, np.ndarray] = {}
        self._prepared: dict[tuple, Optional[Op]] = {}
        #: arrays the fused plans of this simulator's streams run in, by role (see
        #: :meth:`accel.hw.fused.FusedPlan.run`): shared, as the simulator runs one stream at a time
        self.workspace: dict[str, np.ndarray] = {}
        #: the fused plans bound to that workspace (bound again to its final arrays when a model's
        #: call ends: :func:`accel.hw.fused.settle`), not kept alive by it
        self.plans: weakref.WeakSet = weakref.WeakSet()
        self.settled: tuple = ()    # the workspace's arrays when its plans were last bound to them all
        #: the schedules and plans made on this simulator by the shape of their streams: a stream
        #: of one of those shapes gets them (:class:`accel.hw.fused.Shapes`)
        self.shapes = fused.Shapes()

    def memory(self, mem: Mem) -> np.ndarray:
        """The backing array of a scratchpad (INP/WGT as exact float32, ACC as int32)."""
        return {Mem.INP: self.inp, Mem.WGT: self.wgt, Mem.ACC: self.acc}[Mem(mem)]

    # ------------------------------------------------------------------ checks
    def check(self, index: int, ins: Instruction, buffers: Buffers) -> None:
        """Raise an :class:`InstructionError` subclass if ``ins`` is invalid; never writes.

        >>> from accel.hw.isa import Gemm
        >>> Simulator().check(5, Gemm(acc_addr=8, inp_addr=0, wgt_addr=0, acc_ld=16,
        ...                           inp_ld=16, wgt_ld=16), [])
        Traceback (most recent call last):
          ...
        accel.hw.errors.AlignmentError: instruction #5 `GEMM ACC[8 ld=16] += INP[0 ld=16] x WGT[0 ld=16]^T`: acc_addr=8 is not a multiple of the tile width 16 (misaligned tile)
        """
        op = ins.opcode
        if op is _LOAD:
            self._check_load(index, ins, buffers)
        elif op is _STORE:
            self._check_store(index, ins, buffers)
        elif op is _GEMM:
            self._check_gemm(index, ins)
        elif op is _ALU:
            self._check_alu(index, ins)
        elif op is _DWMAC:
            self._check_dwmac(index, ins)
        elif op is _LUT:
            self._check_lut(index, ins)
        elif op is _ALU_CHAIN:
            self._check_alu_chain(index, ins)

    def _host(self, index: int, ins: Instruction, buffers: Buffers, dtype: np.dtype) -> np.ndarray:
        slot = ins.slot
        buf = buffers[slot] if slot < len(buffers) else None
        if buf is None:
            raise UnknownSlotError(index, ins, f"buffer slot {slot} is not in the buffer table "
                                               f"({len(buffers)} slots)")
        if buf.dtype != dtype:
            raise DtypeMismatchError(index, ins, f"host buffer slot {slot} is {buf.dtype}, "
                                                 f"this transfer needs {dtype}")
        return buf

    def _check_dram(self, index: int, ins: Instruction, buf: np.ndarray) -> None:
        end = ins.dram_offset + (ins.rows - 1) * ins.dram_ld + ins.dram_width
        if end > buf.size:
            raise DmaRangeError(index, ins, f"DRAM elements [{ins.dram_offset}, {end}) are "
                                            f"outside host buffer slot {ins.slot} of {buf.size} elements")

    def _check_sram(self, index: int, ins: Instruction, mem: Mem, end: int) -> None:
        size = self._sizes[mem]
        if end > size:
            raise ScratchpadOverflowError(index, ins, f"touches {mem.name} up to element {end - 1}, "
                                                      f"beyond its {size} elements")

    def _check_load(self, index: int, ins: Load, buffers: Buffers) -> None:
        acc = ins.mem is _ACC
        if not acc and not -128 <= ins.pad_value <= 127:
            raise InstructionError(index, ins, f"pad_value {ins.pad_value} does not fit int8")
        if ins.rows and ins.cols:
            self._check_dram(index, ins, self._host(index, ins, buffers, LOAD_HOST_DTYPE[ins.mem]))
        height = ins.pad_top + ins.rows + ins.pad_bottom
        width = ins.pad_left + ins.cols + ins.pad_right
        if height and width:
            if height > 1 and ins.sram_ld < width:
                raise InstructionError(index, ins, f"sram_ld {ins.sram_ld} is smaller than the "
                                                   f"block width {width}: rows would overlap")
            self._check_sram(index, ins, ins.mem, ins.sram_addr + (height - 1) * ins.sram_ld + width)

    def _check_store(self, index: int, ins: Store, buffers: Buffers) -> None:
        if ins.dram_step < 1:
            raise InstructionError(index, ins, f"dram_step {ins.dram_step} must be at least 1")
        if not (ins.rows and ins.cols):
            return
        buf = self._host(index, ins, buffers, STORE_HOST_DTYPE[ins.mode])
        if not buf.flags.writeable:
            raise InstructionError(index, ins, f"host buffer slot {ins.slot} is read-only: "
                                               f"a STORE cannot write it")
        self._check_dram(index, ins, buf)
        if not distinct_starts(ins.rows, ins.dram_ld, ins.cols, ins.dram_step):
            raise InstructionError(index, ins, f"dram_ld {ins.dram_ld} and dram_step {ins.dram_step} write two "
                                               f"of the {ins.rows} x {ins.cols} elements to one place: they "
                                               f"would overwrite each other")
        self._check_sram(index, ins, Mem.ACC, ins.sram_addr + (ins.rows - 1) * ins.sram_ld + ins.cols)

    def _misaligned(self, index: int, ins: Instruction, names: Sequence[str]) -> AlignmentError:
        t = self.config.tile
        name = next(n for n in names if getattr(ins, n) % t)
        return AlignmentError(index, ins, f"{name}={getattr(ins, name)} is not a multiple of the "
                                          f"tile width {t} (misaligned tile)")

    def _check_gemm(self, index: int, g: Gemm) -> None:
        t = self.config.tile
        mask = t - 1  # the tile is a power of two
        if g.reset:
            if (g.acc_addr | g.acc_ld | g.acc_stride_out | g.acc_stride_in) & mask:
                raise self._misaligned(index, g, _GEMM_ALIGNED[:4])
            operands = _GEMM_OPERANDS[:1]
        else:
            if (g.acc_addr | g.acc_ld | g.acc_stride_out | g.acc_stride_in | g.inp_addr | g.inp_ld
                    | g.inp_stride_out | g.inp_stride_in | g.wgt_addr | g.wgt_ld | g.wgt_stride_out
                    | g.wgt_stride_in) & mask:
                raise self._misaligned(index, g, _GEMM_ALIGNED)
            operands = _GEMM_OPERANDS
        eo, ei = g.ext_out, g.ext_in
        if not (eo and ei):
            return
        values = g.__dict__
        for p, mem in operands:
            ld = values[p + "_ld"]
            if ld < t:
                raise AlignmentError(index, g, f"{p}_ld={ld} is smaller than the tile width {t}")
            end = (values[p + "_addr"] + (eo - 1) * values[p + "_stride_out"]
                   + (ei - 1) * values[p + "_stride_in"] + (t - 1) * ld + t)
            self._check_sram(index, g, mem, end)

    def _check_dwmac(self, index: int, d: Dwmac) -> None:
        t = self.config.tile
        if (d.acc_addr | d.acc_ld | d.acc_stride_out | d.acc_stride_in | d.inp_addr | d.inp_ld | d.inp_stride_out
                | d.inp_stride_in | d.wgt_addr | d.wgt_stride_out | d.wgt_stride_in) & (t - 1):
            raise self._misaligned(index, d, _DWMAC_ALIGNED)
        eo, ei = d.ext_out, d.ext_in
        if not (eo and ei):
            return
        for p, mem, ld in (("acc", Mem.ACC, d.acc_ld), ("inp", Mem.INP, d.inp_ld), ("wgt", Mem.WGT, None)):
            if ld is not None and ld < t:
                raise AlignmentError(index, d, f"{p}_ld={ld} is smaller than the tile width {t}")
            values = d.__dict__
            self._check_sram(index, d, mem, values[p + "_addr"] + (eo - 1) * values[p + "_stride_out"]
                             + (ei - 1) * values[p + "_stride_in"] + (t - 1) * (ld or 0) + t)

    def _check_alu(self, index: int, a: Alu) -> None:
        t = self.config.tile
        bits = a.dst_addr | a.dst_stride_out | a.dst_stride_in
        if not a.use_imm:
            bits |= a.src_addr | a.src_stride_out | a.src_stride_in
        if bits & (t - 1):
            raise self._misaligned(index, a, _ALU_ALIGNED[:3] if a.use_imm else _ALU_ALIGNED)
        eo, ei = a.ext_out, a.ext_in
        if not (eo and ei):
            return
        self._check_sram(index, a, Mem.ACC, a.dst_addr + (eo - 1) * a.dst_stride_out
                         + (ei - 1) * a.dst_stride_in + t)
        if not a.use_imm:
            self._check_sram(index, a, Mem.ACC, a.src_addr + (eo - 1) * a.src_stride_out
                             + (ei - 1) * a.src_stride_in + t)
        # Vectors are tile-aligned, so they are either identical or disjoint.
        if not distinct_starts(eo, a.dst_stride_out, ei, a.dst_stride_in):
            raise InstructionError(index, a, "ALU destination vectors overlap each other")

    def _check_alu_chain(self, index: int, c: AluChain) -> None:
        problem = chain_problem(c.length, c.code, c.immediates, c.vectors)
        if problem is not None:
            raise InstructionError(index, c, f"no ALU chain: {problem}")
        t = self.config.tile
        uses_src = chain_uses_src(c.length, c.code, c.vectors)
        bits = c.dst_addr | c.dst_stride_out | c.dst_stride_in
        if uses_src:
            bits |= c.src_addr | c.src_stride_out | c.src_stride_in
        if bits & (t - 1):
            raise self._misaligned(index, c, _ALU_ALIGNED if uses_src else _ALU_ALIGNED[:3])
        vectors = _chain_vectors(c)
        if any(start % t for start, _, _ in vectors):
            raise InstructionError(index, c, f"a vector of the chain starts at ACC element "
                                             f"{next(a for a, _, _ in vectors if a % t)}, not a multiple of the "
                                             f"tile width {t} (misaligned tile)")
        eo, ei = c.ext_out, c.ext_in
        if not (eo and ei):
            return
        self._check_sram(index, c, Mem.ACC, c.dst_addr + (eo - 1) * c.dst_stride_out + (ei - 1) * c.dst_stride_in + t)
        if uses_src:
            self._check_sram(index, c, Mem.ACC, c.src_addr + (eo - 1) * c.src_stride_out
                             + (ei - 1) * c.src_stride_in + t)
        for start, so, si in vectors:
            if start < 0:
                raise ScratchpadOverflowError(index, c, f"reads a vector at ACC element {start}, below 0")
            self._check_sram(index, c, Mem.ACC, start + (eo - 1) * so + (ei - 1) * si + t)
        if not distinct_starts(eo, c.dst_stride_out, ei, c.dst_stride_in):
            raise InstructionError(index, c, "ALU destination vectors overlap each other")

    def _check_lut(self, index: int, u: Lut) -> None:
        t = self.config.tile
        if (u.dst_addr | u.dst_stride_out | u.dst_stride_in | u.lut_addr) & (t - 1):
            raise self._misaligned(index, u, _LUT_ALIGNED)
        eo, ei = u.ext_out, u.ext_in
        if not (eo and ei):
            return
        self._check_sram(index, u, Mem.ACC, u.dst_addr + (eo - 1) * u.dst_stride_out + (ei - 1) * u.dst_stride_in + t)
        self._check_sram(index, u, Mem.WGT, u.lut_addr + LUT_ENTRIES)
        if not distinct_starts(eo, u.dst_stride_out, ei, u.dst_stride_in):
            raise InstructionError(index, u, "LUT destination vectors overlap each other")

    # ------------------------------------------------------------------ cycle model
    def cost(self, ins: Instruction) -> int:
        """Busy cycles of one instruction, issue overhead included (:func:`accel.hw.cycles.cost`).

        >>> from accel.hw.isa import Gemm
        >>> Simulator().cost(Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16,
        ...                       wgt_ld=16, ext_out=2, ext_in=4))
        132
        """
        return cycles.cost(ins, self.config)

    def schedule(self, stream: Sequence[Instruction]) -> list[tuple[int, int]]:
        """(start, end) cycle of every instruction (:func:`accel.hw.cycles.schedule`).

        >>> from accel.hw.isa import Finish
        >>> Simulator().schedule([Finish()])
        [(0, 4)]
        """
        timing = cycles.schedule(stream, self.config)
        return list(zip(timing.start, timing.end))

    # ------------------------------------------------------------------ running streams
    def compile(self, stream: Sequence[Instruction], buffers: Buffers, *, verified: bool = False,
                checked: bool = False) -> "Program":
        """Check, verify and schedule a FINISH-terminated stream; nothing is written.

        Raises an :class:`accel.hw.errors.AccelError` if any instruction is invalid or the
        tokens deadlock. ``verified=True`` skips the stream's form check for a stream that
        :meth:`accel.hw.emitter.Emitter.finish` just verified, ``checked=True`` the
        instruction checks for a stream whose every instruction was checked against this
        buffer table as it was emitted (what a session does). The tokens are checked by
        the schedule either way: a stream that would hang stalls the cycle model, which
        raises :func:`~accel.hw.emitter.verify`'s error.
        """
        if not checked:
            for index, ins in enumerate(stream):
                self.check(index, ins, buffers)
        if not verified:
            verify(stream, tokens=False)
        shape = self.shapes.of(stream)
        return Program(self, list(stream), self.shapes.timing(shape, lambda: cycles.schedule(stream, self.config)),
                       shape)

    def run(self, stream: Sequence[Instruction], buffers: Buffers, stats: Optional[Stats] = None,
            *, verified: bool = False, checked: bool = False, execute: bool = True) -> Stats:
        """Check, schedule and execute a FINISH-terminated stream; returns (updated) stats.

        Raises an :class:`accel.hw.errors.AccelError` before anything is written if any
        instruction is invalid or the tokens deadlock (``verified`` and ``checked`` as in
        :meth:`compile`). ``execute=False`` only runs the cycle model: stats advance,
        scratchpads and host buffers stay as they are.
        """
        program = self.compile(stream, buffers, verified=verified, checked=checked)
        return program.run(buffers, stats, execute=execute)

    def execute(self, ins: Instruction, buffers: Buffers) -> None:
        """Apply one already-checked instruction to the scratchpads / host buffers."""
        op = self._op(ins, buffers)
        if op is not None:
            op()

    # ------------------------------------------------------------------ instruction semantics
    # Each instruction becomes a prepared call over views made once; running it again costs
    # one numpy call or two. These builders are the simulator's only account of what the
    # instructions do.
    def _op(self, ins: Instruction, buffers: Buffers) -> Optional[Op]:
        """The prepared call that applies ``ins`` (None when it changes nothing)."""
        op = ins.opcode
        if op is Opcode.LOAD:
            return self._load(ins, buffers)
        if op is Opcode.STORE:
            return self._store(ins, buffers)
        if op is Opcode.FINISH:
            return None
        # GEMM and ALU touch only the scratchpads: one prepared call serves every
        # instruction with the same fields (a blocked loop repeats a handful of them).
        key = _fields_of(ins)
        prepared = self._prepared.get(key, _MISSING)
        if prepared is _MISSING:
            if len(self._prepared) >= _PREPARED_LIMIT:
                self._prepared.clear()
            prepared = self._prepared[key] = (self._gemm(ins) if op is Opcode.GEMM else
                                              self._dwmac(ins) if op is Opcode.DWMAC else
                                              self._lut(ins) if op is Opcode.LUT else
                                              self._alu_chain(ins) if op is _ALU_CHAIN else self._alu(ins))
        return prepared

    def _scratch(self, shape: tuple, dtype) -> np.ndarray:
        """A temporary shared by every prepared call of that shape (calls run one at a time)."""
        key = (shape, dtype)
        buf = self._temps.get(key)
        if buf is None:
            buf = self._temps[key] = np.empty(shape, dtype)
        return buf

    def _load(self, ins: Load, buffers: Buffers) -> Optional[Op]:
        height = ins.pad_top + ins.rows + ins.pad_bottom
        width = ins.pad_left + ins.cols + ins.pad_right
        if not (height and width):
            return None
        block = _view(self.memory(ins.mem), ins.sram_addr, (height, width), (ins.sram_ld, 1))
        if not (ins.rows and ins.cols):
            return partial(block.fill, ins.pad_value)
        src = _view(buffers[ins.slot], ins.dram_offset, (ins.rows, ins.cols), (ins.dram_ld, 1))
        if height == ins.rows and width == ins.cols:
            return partial(np.copyto, block, src)
        inner = block[ins.pad_top:ins.pad_top + ins.rows, ins.pad_left:ins.pad_left + ins.cols]
        fill, value = block.fill, ins.pad_value

        def padded_load() -> None:
            fill(value)
            np.copyto(inner, src)

        return padded_load

    def _store(self, ins: Store, buffers: Buffers) -> Optional[Op]:
        if not (ins.rows and ins.cols):
            return None
        shape = (ins.rows, ins.cols)
        src = _view(self.acc, ins.sram_addr, shape, (ins.sram_ld, 1))
        dst = _view(buffers[ins.slot], ins.dram_offset, shape, (ins.dram_ld, ins.dram_step))
        # int32 -> int8 casts keep the low byte: the wrap mode, and exact after clipping.
        if ins.mode is StoreMode.INT32:
            return partial(np.copyto, dst, src)
        if ins.mode is StoreMode.WRAP:
            return partial(np.copyto, dst, src, casting="unsafe")
        clipped = self._scratch(shape, np.int32)

        def saturating_store() -> None:
            np.clip(src, -128, 127, out=clipped)
            np.copyto(dst, clipped, casting="unsafe")

        return saturating_store

    def _gemm(self, g: Gemm) -> Optional[Op]:
        t = self.config.tile
        if not (g.ext_out and g.ext_in):
            return None
        if not g.reset:
            op = self._gemm_as_matmul(g)
            if op is not None:
                return op
        loops = [(g.ext_out, g.acc_stride_out, g.inp_stride_out, g.wgt_stride_out),
                 (g.ext_in, g.acc_stride_in, g.inp_stride_in, g.wgt_stride_in)]
        loops = [lp for lp in loops if lp[0] > 1]
        acc_dims = [k for k, lp in enumerate(loops) if lp[1]]
        acc_shape = [loops[k][0] for k in acc_dims] + [t, t]
        acc_strides = [loops[k][1] for k in acc_dims] + [g.acc_ld, 1]
        acc = _view(self.acc, g.acc_addr, acc_shape, acc_strides)
        if g.reset:
            return partial(acc.fill, 0)
        inp_dims = [k for k, lp in enumerate(loops) if lp[2]]
        wgt_dims = [k for k, lp in enumerate(loops) if lp[3]]
        # Loops whose every stride is 0 repeat the same product: a multiplication, not a sum.
        repeat = math.prod(lp[0] for lp in loops if not (lp[1] or lp[2] or lp[3]))
        terms = t * math.prod(lp[0] for lp in loops if not lp[1] and (lp[2] or lp[3]))
        ftype = np.float32 if terms <= _F32_EXACT_TERMS else np.float64
        inp = _view(self.inp, g.inp_addr, [loops[k][0] for k in inp_dims] + [t, t],
                    [loops[k][2] for k in inp_dims] + [g.inp_ld, 1])
        wgt = _view(self.wgt, g.wgt_addr, [loops[k][0] for k in wgt_dims] + [t, t],
                    [loops[k][3] for k in wgt_dims] + [g.wgt_ld, 1])
        letters = "ab"
        out_dims = [k for k in acc_dims if k in inp_dims or k in wgt_dims]
        spec = (f"{''.join(letters[k] for k in inp_dims)}rc,{''.join(letters[k] for k in wgt_dims)}nc"
                f"->{''.join(letters[k] for k in out_dims)}rn")
        # Broadcast over acc loops that neither operand moves along.
        delta_shape = [loops[k][0] if k in out_dims else 1 for k in acc_dims] + [t, t]
        if _disjoint(acc_shape, acc_strides):
            accumulate = partial(np.add, acc, out=acc)
        else:  # overlapping acc tiles: accumulate every contribution element by element
            index = np.zeros(acc_shape, np.int64) + g.acc_addr
            for axis, (extent, stride) in enumerate(zip(acc_shape, acc_strides)):
                shape = [1] * len(acc_shape)
                shape[axis] = extent
                index += (np.arange(extent) * stride).reshape(shape)
            accumulate = lambda delta: np.add.at(self.acc, index, np.broadcast_to(delta, acc_shape))  # noqa: E731

        def blocked_gemm() -> None:
            prod = np.einsum(spec, inp.astype(ftype, copy=False), wgt.astype(ftype, copy=False),
                             optimize=True)
            if ftype is np.float32 and repeat == 1:
                delta = prod.astype(np.int32)
            else:  # exact integers beyond int32: reduce modulo 2**32 through int64
                delta = prod.astype(np.int64)
                if repeat > 1:
                    delta *= repeat
                delta = delta.astype(np.int32)
            accumulate(delta.reshape(delta_shape))

        return blocked_gemm

    def _gemm_as_matmul(self, g: Gemm) -> Optional[Op]:
        """The common case as one matrix product: each loop extends one of M, N or K by
        adjacent tiles (what a blocked schedule emits). None when it does not apply."""
        t = self.config.tile
        size = {"m": t, "n": t, "k": t}
        for ext, acc_s, inp_s, wgt_s in ((g.ext_out, g.acc_stride_out, g.inp_stride_out, g.wgt_stride_out),
                                         (g.ext_in, g.acc_stride_in, g.inp_stride_in, g.wgt_stride_in)):
            if ext == 1:
                continue
            if acc_s == 0 and inp_s == t and wgt_s == t:
                dim = "k"
            elif inp_s == 0 and acc_s == t and wgt_s == t * g.wgt_ld:
                dim = "n"
            elif wgt_s == 0 and acc_s == t * g.acc_ld and inp_s == t * g.inp_ld:
                dim = "m"
            else:
                return None
            if size[dim] != t:
                return None
            size[dim] *= ext
        m, n, k = size["m"], size["n"], size["k"]
        if (m > t and g.acc_ld < n) or not _disjoint((m, n), (g.acc_ld, 1)):
            return None
        inp = _view(self.inp, g.inp_addr, (m, k), (g.inp_ld, 1))
        wgt_t = _view(self.wgt, g.wgt_addr, (n, k), (g.wgt_ld, 1)).T
        acc = _view(self.acc, g.acc_addr, (m, n), (g.acc_ld, 1))
        delta = self._scratch((m, n), np.int32)
        if k <= _F32_EXACT_TERMS:
            prod = self._scratch((m, n), np.float32)

            def matmul() -> None:
                np.matmul(inp, wgt_t, out=prod)
                np.copyto(delta, prod, casting="unsafe")   # exact: integers below 2**24
                np.add(acc, delta, out=acc)
        else:
            prod, wide = self._scratch((m, n), np.float64), self._scratch((m, n), np.int64)

            def matmul() -> None:
                np.matmul(inp, wgt_t, out=prod, dtype=np.float64)
                np.copyto(wide, prod, casting="unsafe")   # exact below 2**53
                np.copyto(delta, wide, casting="unsafe")  # modulo 2**32: int32 wrap-around
                np.add(acc, delta, out=acc)

        return matmul

    def _dwmac(self, d: Dwmac) -> Optional[Op]:
        t = self.config.tile
        if not (d.ext_out and d.ext_in):
            return None
        loops = (d.ext_out, d.ext_in)
        inp = _view(self.inp, d.inp_addr, (*loops, t, t), (d.inp_stride_out, d.inp_stride_in, d.inp_ld, 1))
        wgt = _view(self.wgt, d.wgt_addr, (*loops, 1, t), (d.wgt_stride_out, d.wgt_stride_in, 0, 1))
        # Loops along which the accumulator stays put are sums: reduce them first (exact in
        # float64 for any extent the 32-bit fields allow, then modulo 2**32 like int32).
        reduce = tuple(k for k, s in enumerate((d.acc_stride_out, d.acc_stride_in)) if s == 0)
        shape = [e for k, e in enumerate(loops) if k not in reduce] + [t, t]
        strides = [s for k, s in enumerate((d.acc_stride_out, d.acc_stride_in)) if k not in reduce] + [d.acc_ld, 1]
        acc = _view(self.acc, d.acc_addr, shape, strides)
        if _disjoint(shape, strides):
            accumulate = partial(np.add, acc, out=acc)
        else:  # overlapping accumulator tiles: every contribution, element by element
            index = np.zeros(shape, np.int64) + d.acc_addr
            for axis, (extent, stride) in enumerate(zip(shape, strides)):
                index += (np.arange(extent) * stride).reshape([extent if k == axis else 1 for k in range(len(shape))])
            accumulate = lambda delta: np.add.at(self.acc, index, delta)  # noqa: E731

        def per_channel_mac() -> None:
            prod = np.multiply(inp, wgt, dtype=np.float64)      # int8 x int8: exact
            delta = prod.sum(axis=reduce) if reduce else prod
            accumulate(delta.astype(np.int64).astype(np.int32))

        return per_channel_mac

    def _lut(self, u: Lut) -> Optional[Op]:
        t = self.config.tile
        if not (u.ext_out and u.ext_in):
            return None
        dst = _view(self.acc, u.dst_addr, (u.ext_out, u.ext_in, t), (u.dst_stride_out, u.dst_stride_in, 1))
        table = self.wgt[u.lut_addr:u.lut_addr + LUT_ENTRIES]
        index = self._scratch(dst.shape, np.int32)

        def lookup() -> None:
            np.clip(dst, -128, 127, out=index)
            np.add(index, 128, out=index)
            np.copyto(dst, table[index], casting="unsafe")    # WGT's float32 holds int8 exactly

        return lookup

    def _alu(self, a: Alu) -> Optional[Op]:
        t = self.config.tile
        if not (a.ext_out and a.ext_in):
            return None
        dst = _view(self.acc, a.dst_addr, (a.ext_out, a.ext_in, t), (a.dst_stride_out, a.dst_stride_in, 1))
        ufunc, op = ALU_UFUNCS[a.op], a.op
        # ufuncs buffer overlapping operands, which gives the read-everything-first semantics.
        if a.use_imm:
            return partial(ufunc, dst, np.int32(alu_operand(op, a.imm)), out=dst)
        src = _view(self.acc, a.src_addr, (a.ext_out, a.ext_in, t), (a.src_stride_out, a.src_stride_in, 1))
        if op in OPERAND_RANGE:
            return lambda: ufunc(dst, alu_operand(op, src), out=dst)
        return partial(ufunc, dst, src, out=dst)

    def _alu_chain(self, c: AluChain) -> Optional[Op]:
        t = self.config.tile
        eo, ei = c.ext_out, c.ext_in
        if not (eo and ei):
            return None
        dst = _view(self.acc, c.dst_addr, (eo, ei, t), (c.dst_stride_out, c.dst_stride_in, 1))
        span = lambda addr, so, si: (addr, addr + (eo - 1) * so + (ei - 1) * si + t)  # noqa: E731
        d0, d1 = span(c.dst_addr, c.dst_stride_out, c.dst_stride_in)
        calls = []

        def operand(addr: int, so: int, si: int) -> np.ndarray:
            # The steps run one after the other over the whole block, in place (the destination
            # vectors are distinct, so each element's chain is its own); a vector the block
            # overlaps is read once first, as the chain reads every operand before it writes.
            vector = _view(self.acc, addr, (eo, ei, t), (so, si, 1))
            v0, v1 = span(addr, so, si)
            if d0 < v1 and v0 < d1:
                # (the shared temporary holds one copy: a second one gets its own)
                copy = np.empty(vector.shape, np.int32) if calls else self._scratch(vector.shape, np.int32)
                snapshot, vector = vector, copy
                calls.append(partial(np.copyto, vector, snapshot))
            return vector

        src = operand(c.src_addr, c.src_stride_out, c.src_stride_in) if any(
            imm is None for _, imm in c.steps) else None
        operands = []
        for op, imm in c.steps:
            if isinstance(imm, ChainVector):
                operands.append(operand(*imm.place(c)))
            else:
                operands.append(src if imm is None else np.int32(alu_operand(op, imm)))
        for (op, imm), b in zip(c.steps, operands):
            ufunc = ALU_UFUNCS[op]
            if isinstance(b, np.ndarray) and op in OPERAND_RANGE:
                calls.append(lambda ufunc=ufunc, op=op, b=b: ufunc(dst, alu_operand(op, b), out=dst))
            else:
                calls.append(partial(ufunc, dst, b, out=dst))

        def chain() -> None:
            for call in calls:
                call()

        return chain


class Program:
    """A checked, scheduled stream of one :class:`Simulator`, ready to run any number of times.

    Besides the stream and its :class:`~accel.hw.cycles.Timing` it keeps the signature of
    the buffer table it was checked against: per host slot the stream touches, the dtype,
    the elements it reaches and whether it is written. Those are the only facts the
    checks read from the buffer table, so a table with the same signature needs no
    instruction checked again.

    >>> from accel.hw.isa import Finish
    >>> p = Simulator().compile([Finish()], [])
    >>> p.run([]).cycles, p.run([]).cycles      # each run returns fresh stats
    (4, 4)
    """

    def __init__(self, simulator: Simulator, stream: list[Instruction], timing: cycles.Timing,
                 shape: Optional[fused.Shape] = None) -> None:
        self.simulator = simulator
        self.stream = stream
        self.timing = timing
        self.shape = shape      # (see accel.hw.fused.Shapes: made by compile, read by fuse)
        self.signature = _signature(stream)
        self._ops: Optional[list[tuple[int, int, Op]]] = None
        self._hosts: dict[int, tuple[np.ndarray, int]] = {}  # slot -> (flat view, address) the calls use
        self._runs = 0
        self._fused = None      # the batched plan (accel.hw.fused), made at the third run (see _execute); False: none
        self._gemms = any(ins.opcode is _GEMM for ins in stream)
        self._checked: dict[int, tuple] = {}    # the last few tuples of buffers checked, by id (kept alive)

    def run(self, buffers: Buffers, stats: Optional[Stats] = None, *, execute: bool = True,
            again: bool = False) -> Stats:
        """Execute the stream on ``buffers`` (unless ``execute=False``) and account its
        cycles in ``stats`` (new Stats when None), which are returned. ``again`` says the
        caller will run this Program again (a session stores it to replay): its batched plan
        is then made now, at its first run, not at its third.

        Raises the check's error, before anything is written, if the buffer table differs
        from the one the stream was checked against in a way that matters. A tuple of
        buffers (a session's replay gives the views it made, run after run) is checked
        once: the same tuple again, one of the last few checked, is not checked again.
        """
        sim = self.simulator
        if self._checked.get(id(buffers)) is not buffers:
            if not self._matches(buffers):
                for index, ins in enumerate(self.stream):   # raises, naming the instruction
                    sim.check(index, ins, buffers)
            if type(buffers) is tuple:      # a list may be changed before the next run: checked each time
                fused.remember(self._checked, buffers)
        if execute:
            # only products instruction by instruction call BLAS (a batched plan's are compiled):
            # a stream without them (an element-wise core's) leaves the caller's thread setting
            # alone instead of setting it twice
            if self._gemms and not _blas_holders.count:
                with one_blas_thread():
                    self._execute(buffers, again)
            else:
                self._execute(buffers, again)
        stats = stats if stats is not None else Stats(sim.config)
        stats.add(self.timing)
        return stats

    def prepare(self, buffers: tuple) -> None:
        """Get ready to run again on ``buffers``, a tuple of views a session's replay will
        give (see :meth:`tirpat.device.Session.prepare_stored`), without running: the tuple
        checked, the batched plan's calls made for it. Nothing for a stream without a plan
        (run instruction by instruction) or for buffers it does not fit (the run checks them)."""
        if self._fused and self._matches(buffers):
            fused.remember(self._checked, buffers)
            self._fused.prepare(buffers, self.simulator)

    def _execute(self, buffers: Buffers, again: bool) -> None:
        """Run the batched plan when the stream has one, else the prepared calls one by one.
        The plan is made at the third run (following a stream symbolically costs a few runs'
        worth: a stream run once or twice never pays for it), or at the first when the caller
        says the Program runs ``again`` (then the per-instruction calls are never prepared)."""
        self._runs += 1
        if self._fused is None and (again or self._runs > _RUNS_BEFORE_FUSING):
            self._fused = fused.fuse(self.simulator, self.stream, self.timing.order(), buffers, self.shape) or False
        if self._fused and self._fused.run(buffers, self.simulator):
            return
        for _, _, op in self._prepare(buffers):
            op()

    def _matches(self, buffers: Buffers) -> bool:
        for slot, (dtype, end, written) in self.signature.items():
            buf = buffers[slot] if slot < len(buffers) else None
            if buf is None or buf.dtype != dtype or buf.size < end or (written and not buf.flags.writeable):
                return False
        return True

    def _prepare(self, buffers: Buffers) -> list[tuple[int, int, Op]]:
        """The prepared calls in execution order, as ``(stream index, host slot or -1,
        call)``; the calls of a slot whose memory moved since the last run are remade."""
        sim, stream = self.simulator, self.stream
        if self._ops is None:
            self._ops = []
            for i in self.timing.order():
                op = sim._op(stream[i], buffers)
                if op is not None:
                    self._ops.append((i, _slot_of(stream[i]), op))
            self._hosts = {slot: (buffers[slot], _address(buffers[slot])) for slot in self.signature}
            return self._ops
        moved = set()
        for slot, (flat, address) in self._hosts.items():
            now = buffers[slot]
            if now is not flat:
                if _address(now) != address:
                    moved.add(slot)
                self._hosts[slot] = (now, _address(now))
        if moved:
            self._ops = [(i, slot, sim._op(stream[i], buffers) if slot in moved else op)
                         for i, slot, op in self._ops]
        return self._ops


def _slot_of(ins: Instruction) -> int:
    """The host slot an instruction reads or writes, -1 for none."""
    op = ins.opcode
    if op is _LOAD or op is _STORE:
        return ins.slot if ins.rows and ins.cols else -1
    return -1


def _address(flat: np.ndarray) -> int:
    return flat.__array_interface__["data"][0]


def _signature(stream: Sequence[Instruction]) -> dict[int, tuple[np.dtype, int, bool]]:
    """Per host slot: (dtype, elements reached, written) over the whole stream."""
    out: dict[int, tuple[np.dtype, int, bool]] = {}
    for ins in stream:
        slot = _slot_of(ins)
        if slot < 0:
            continue
        if ins.opcode is _LOAD:
            dtype, written = LOAD_HOST_DTYPE[ins.mem], False
        else:
            dtype, written = STORE_HOST_DTYPE[ins.mode], True
        end = ins.dram_offset + (ins.rows - 1) * ins.dram_ld + ins.dram_width
        seen = out.get(slot)
        if seen is not None:
            end, written = max(end, seen[1]), written or seen[2]
        out[slot] = (dtype, end, written)
    return out
