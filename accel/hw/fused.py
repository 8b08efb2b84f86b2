"""A stream's dataflow, executed in a few batched numpy calls instead of one per instruction.

Most instructions of a compiled stream move tiles: a LOAD copies host data (or padding)
into INP or WGT, GEMMs multiply tiles the LOADs brought and add the products into
accumulators that a reset zeroed (or a LOAD filled), ALU instructions rework finished
accumulators, a STORE copies them out. Followed symbolically once, in execution order,
every scratchpad element is known to hold either one host element or pad value (INP,
WGT) or one *accumulator value* (ACC). Accumulator values are numbered like SSA values:
a reset, an ACC LOAD or an ALU instruction makes new ones, a GEMM adds products to the
current ones, a STORE or an ALU reads them. Then the whole stream is:

1. assemble the *source vector*: the host buffers read and the pad values, one after the
   other, int8 (a copy, no conversion). A tile row a LOAD brought is ``tile`` consecutive
   host elements (or one pad value): every GEMM operand is read a tile row at a time from
   where it starts in the source vector (:class:`_Gather`; rows that are no run are copied
   to the end of the source vector at each run, so that every read is whole rows);
2. multiply: the products that go into one accumulator tile form a row of tiles of the
   input times a row of tiles of the weight, concatenated along K; accumulator tiles
   whose input rows are the same and whose weight rows are the same are blocks of one
   matrix product (a convolution's whole im2col GEMM is a single call of the compiled
   int8 x int8 -> int32 :func:`accel.hw.kernels.gemm`, exact, which reads the operands'
   rows where they start, gathered into no copy); DWMACs whose steps all add into one
   tile (a depthwise kernel's taps) are one gather and one sum over the taps per step
   count (a few tiles at a time, in cache), those that add each value once (a widening)
   one product each, the others one weighted bincount; a product that alone adds into
   values a reset (or an ACC LOAD of zero pads alone) zeroed writes them instead;
3. ALU, ALU chain and LUT instructions, batched by dependency level and steps (a chain's
   steps are its batch's program: what they make before its last step is read by nothing but
   the next step, so it gets no value numbers; a chain reading several vectors is a batch per
   run of steps that read one, each run's vector taken as the chain began; a LUT's step is
   its table), a chain of batches
   each working in place on what the one before made (a requantisation's multiply, shift, add,
   clamps, then a lookup) as one pass of a compiled kernel, and chains over the same rows that
   read each other's results as those rows (a requantisation's bias, zero point and scale) as
   one pass too;
4. STOREs, batched per host buffer (int8 rows a pass makes last: written by that pass);
5. the scratchpads' final contents, as instruction-by-instruction execution leaves them
   (of ACC, the elements the stream changed).

The value numbers are the plan's own, so they are laid out for these steps: what one
product adds into, and what one ALU batch writes and the batch before it wrote, are runs
of consecutive numbers, which numpy reads and writes as views instead of gathering and
scattering element by element. An ALU batch is independent element by element, so it
runs in the order of the values it reads, and writes over them when nothing else reads
them (a requantisation's chain of ALU batches works in place, in cache); values ACC
LOADs bring are numbered in the order the ALU batches read them. Index arrays that are
no run but affine in a multi-index (tiles of a product's rows, a broadcast bias row) are
read and written as strided views; the rest by tile rows. A run's ALU batches are calls
bound once to views of the value vector, which with the source vector lives in the
simulator's workspace: all its plans run in the same arrays (in cache), and none keeps
anything there from one run to the next. A chain of batches in place is one call of
:func:`accel.hw.kernels.alu_chain`, every step of a few tile rows in registers before the
next rows, instead of a numpy pass over memory per step (its lookups read their tables where
the source vector holds them; an operand that is no rows of the value vector is copied into
rows past the plan's values first). The whole run is such a list of
calls, each one numpy call (or kernel) over views of the workspace, the scratchpads and the
host buffers made at its first run on a tuple of buffers: a session's replay gives the same
tuple call after call, and a model's hundred streams making their views and index objects
(and a kernel's DLPack tensors) again at every run cost more than the small ones' arithmetic.

STOREs, ACC LOADs and the scratchpads' final contents that are no views (an NCHW output
written from tiles of pixels, an upsampling's every other host element, rows of data and pad)
are copied run by run by a compiled pass (:class:`_Copies`), a STORE's narrowing to int8 on
the way.

Lanes nobody reads are not read exactly: an ALU batch's result that reaches no STORE and
is not what ACC ends with (a layer of 8 channels computes 16 lanes) lets its operands read
any value there, and an input element that only multiplies a weight's zero pad any finite
value; their rows are then runs (views, whole rows) instead of element gathers or padded
copies. What the stream stores and what the scratchpads end with stay exact.

:func:`fuse` returns None for a stream this does not cover, and the
:class:`~accel.hw.sim.Program` keeps executing it instruction by instruction: a LOAD that
reads host memory the stream stored earlier, a product added to an accumulator value
that was already read (a STORE or ALU in between), a GEMM step mixing scratchpad
contents in ways no tile describes. Products are exact and int32 addition wraps, so the
order in which products are summed does not change any value.

A model's layers of one shape with other requantisation constants make streams that differ only
in their ALU immediates: a simulator keeps its plans (and schedules) by the shape of their streams
(:class:`Shapes`), and a stream of a shape fused before gets a copy of that plan with its own
operands instead of a pass of its own.

>>> import numpy as np
>>> from accel.hw.sim import Simulator
>>> from accel.hw.isa import Gemm, Load, Mem, Store, Finish
>>> a = np.arange(256, dtype=np.int8) % 5; w = np.eye(16, dtype=np.int8).ravel(); c = np.zeros(256, np.int32)
>>> stream = [Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16),
...           Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=16, rows=16, cols=16),
...           Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16, reset=True),
...           Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16),
...           Store(sram_addr=0, sram_ld=16, slot=2, dram_offset=0, dram_ld=16, rows=16, cols=16), Finish()]
>>> sim = Simulator(); plan = fuse(sim, stream, range(len(stream)), [a, w, c])
>>> plan.run([a, w, c]), bool((c == a).all()), plan.matmuls
(True, True, 1)
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import operator
import weakref
from functools import partial
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from accel.hw import kernels
from accel.hw.instructions import (ALU_UFUNCS, CHAIN_IMM_FIELDS, LUT_ENTRIES, OPERAND_RANGE, AluOp, ChainVector,
                                   alu_operand)
from accel.hw.isa import Alu, AluChain, Dwmac, Gemm, Instruction, Load, Lut, Mem, Opcode, Store, StoreMode
from accel.hw.timing import Timing

__all__ = ["fuse", "FusedPlan", "Shape", "Shapes", "remember", "drop_building"]

Buffers = Sequence[Optional[np.ndarray]]

# int8 x int8 products are at most 2**14: float32 sums up to 1024 of them exactly.
_F32_EXACT_TERMS = 2**24 // 2**14
# Tap sums gather this many input elements at a time (256 KB of float32: in L2 with room).
_TAPS_AT_ONCE = 1 << 16
# enum members as module globals for the per-instruction paths (a stream has up to a million
# instructions): a member found through its class costs ~200 ns on Python 3.11, a global ~20 ns
_LOAD, _STORE, _GEMM, _ALU, _DWMAC, _LUT = Opcode.LOAD, Opcode.STORE, Opcode.GEMM, Opcode.ALU, Opcode.DWMAC, Opcode.LUT
_ALU_CHAIN, _MUL = Opcode.ALU_CHAIN, AluOp.MUL
_ACC, _INP = Mem.ACC, Mem.INP


def _block(addr: int, ld: int, rows: int, cols: int, step: int = 1) -> np.ndarray:
    """Element indices of a ``rows x cols`` block at ``addr`` with row stride ``ld`` (and
    element stride ``step``: a STORE's ``dram_step``)."""
    return addr + _block_offsets(ld, rows, cols, step)


def _vectors(addr: int, ext_out: int, stride_out: int, ext_in: int, stride_in: int, lanes: int) -> np.ndarray:
    """Element indices of the ``lanes``-wide vector of every ``(o, i)`` step, flattened."""
    return addr + _vector_offsets(ext_out, stride_out, ext_in, stride_in, lanes)


# A stream repeats a few shapes thousands of times: their offsets are made once (read-only).
@functools.lru_cache(maxsize=1024)
def _block_offsets(ld: int, rows: int, cols: int, step: int = 1) -> np.ndarray:
    return _frozen(np.arange(rows)[:, None] * ld + np.arange(cols)[None, :] * step)


@functools.lru_cache(maxsize=1024)
def _flat_block_offsets(ld: int, rows: int, cols: int, step: int = 1) -> np.ndarray:
    return _block_offsets(ld, rows, cols, step).reshape(-1)


@functools.lru_cache(maxsize=1024)
def _step_offsets(ext_out: int, stride_out: int, ext_in: int, stride_in: int) -> np.ndarray:
    return _frozen((np.arange(ext_out)[:, None] * stride_out + np.arange(ext_in)[None, :] * stride_in).reshape(-1))


@functools.lru_cache(maxsize=1024)
def _tile_offsets(ext_out: int, stride_out: int, ext_in: int, stride_in: int, ld: int, tile: int) -> np.ndarray:
    """Offsets of the ``tile x tile`` elements (row stride ``ld``) at every ``(o, i)`` step of
    a loop, ``[steps, tile, tile]``."""
    steps = _step_offsets(ext_out, stride_out, ext_in, stride_in)
    return _frozen(steps[:, None, None] + _block_offsets(ld, tile, tile))


@functools.lru_cache(maxsize=1024)
def _vector_offsets(ext_out: int, stride_out: int, ext_in: int, stride_in: int, lanes: int) -> np.ndarray:
    return _frozen((_step_offsets(ext_out, stride_out, ext_in, stride_in)[:, None] + np.arange(lanes)).reshape(-1))


class _Loop(NamedTuple):
    """Of a GEMM's loop over its three operands, what depends on the loop's shape alone (a
    stream's GEMMs repeat a few shapes): per operand, the offsets of the ``tile x tile``
    elements of each distinct step address (``[distinct, tile, tile]``, read-only, in the
    order the steps first reach them), and per distinct accumulator address the distinct
    input and weight addresses of its steps, in step order (``x``, ``w``: each a call that
    picks those from a sequence over the distinct ones, as a tuple). An operand's elements
    are its address plus these, one addition.

    >>> loop = _Loop.of(2, 2, 32, 0, 16, 0, 1, 16, 32, 1, 16, 2)
    >>> loop.acc[:, 0, 0].tolist(), loop.inp[:, 0, 0].tolist(), loop.inp[1].tolist()
    ([0, 32], [0, 1], [[1, 2], [17, 18]])
    >>> [pick("abcd") for pick in loop.x], [pick("abcd") for pick in loop.w]
    ([('a', 'b'), ('a', 'b')], [('a', 'b'), ('c', 'd')])
    """

    acc: np.ndarray
    inp: np.ndarray
    wgt: np.ndarray
    x: list
    w: list
    wgt_at: list        # the weight's distinct step addresses (``wgt[:, 0, 0]``)

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def of(ext_out: int, ext_in: int, acc_stride_out: int, acc_stride_in: int, acc_ld: int, inp_stride_out: int,
           inp_stride_in: int, inp_ld: int, wgt_stride_out: int, wgt_stride_in: int, wgt_ld: int, tile: int) -> "_Loop":
        def distinct(stride_out: int, stride_in: int, ld: int) -> tuple[np.ndarray, np.ndarray]:
            steps = _step_offsets(ext_out, stride_out, ext_in, stride_in)
            starts, first, inverse = np.unique(steps, return_index=True, return_inverse=True)
            order = np.argsort(first)            # first reached first
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            return _frozen(starts[order][:, None, None] + _block_offsets(ld, tile, tile)), rank[inverse]

        acc, a = distinct(acc_stride_out, acc_stride_in, acc_ld)
        inp, x = distinct(inp_stride_out, inp_stride_in, inp_ld)
        wgt, w = distinct(wgt_stride_out, wgt_stride_in, wgt_ld)
        steps = [np.flatnonzero(a == j) for j in range(len(acc))]
        return _Loop(acc, inp, wgt, [_picker(x[k].tolist()) for k in steps], [_picker(w[k].tolist()) for k in steps],
                     wgt[:, 0, 0].tolist())


def _picker(at: list) -> Callable[[Sequence], tuple]:
    """A call that gives the items of a sequence at ``at``, as a tuple (an itemgetter: a GEMM's
    tiles pick their operands' numbers tens of thousands of times a stream)."""
    pick = operator.itemgetter(*at)
    return pick if len(at) > 1 else lambda items: (pick(items),)


@functools.lru_cache(maxsize=8)
def _identity(first: int, n: int, dtype=np.intp) -> np.ndarray:
    """``first, first + 1, ..., first + n - 1`` (read-only, of ``dtype``): what a scratchpad's
    elements hold when a stream starts (source codes, value numbers), made once per simulator
    shape and copied by each builder, instead of counted again.

    >>> _identity(4, 3).tolist()
    [4, 5, 6]
    """
    return _frozen(np.arange(first, first + n, dtype=dtype))


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` followed by zeros, ``size`` elements in all: the zeros as ``np.zeros`` hands them
    out (pages the system zeroes when first written), not written by a copy.

    >>> _grown(np.array([3, 4], np.int32), 4).tolist()
    [3, 4, 0, 0]
    """
    out = np.zeros(size, a.dtype)
    out[:a.size] = a
    return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class _Sources:
    """Where loaded values come from, as indices into one vector that the plan assembles
    at run time: the scratchpad elements from before the stream that are read (codes
    below ``lead``, which :meth:`keep` picks), then every host buffer read, whole, then
    the pad values (negative codes until then), each repeated ``tile`` times so that a
    tile row of one pad value is ``tile`` consecutive elements like a row of host data
    (see :class:`_Gather`)."""

    def __init__(self, lead: int, buffers: Buffers, tile: int) -> None:
        self.lead = lead
        self.size = lead
        self.buffers = buffers
        self.tile = tile
        self.slots: dict[int, int] = {}         # slot -> start of its elements
        self.pads: dict[int, int] = {}          # pad value -> code (negative)
        self.kept = np.arange(0)                # the codes below ``lead`` that are read
        self.extra: list[np.ndarray] = []       # vector indices of the elements of extra rows
        self.extra_size = 0

    def keep(self, codes: np.ndarray) -> None:
        """Keep, of the leading codes, those in ``codes`` (call once, before resolving)."""
        # a mark per leading code, not a sort: the leading codes are INP and WGT, a few
        # hundred thousand, and the codes read millions
        seen = np.zeros(self.lead, bool)
        seen[codes[(codes >= 0) & (codes < self.lead)]] = True
        self.kept = np.flatnonzero(seen)

    def host(self, slot: int) -> int:
        start = self.slots.get(slot)
        if start is None:
            start = self.slots[slot] = self.size
            self.size += self.buffers[slot].size
        return start

    def pad(self, value: int) -> int:
        return self.pads.setdefault(value, -1 - len(self.pads))

    def resolve(self, codes: np.ndarray, *, starts: bool = False) -> np.ndarray:
        """Codes to vector indices: kept leading codes, host buffers, then pads (a row of
        ``tile`` codes along the last axis that all name one pad reads its ``tile`` copies).
        ``starts``: the codes are the first of rows (see :func:`_rows_of`), each resolved
        alone (a pad to the first of its copies)."""
        shift = self.kept.size - self.lead
        index = np.add(codes, shift, dtype=np.intp)     # host codes (most); pads and leading codes are set over it
        # pads (negative) and leading codes are both below ``lead``: one test tells there are none
        low = codes < self.lead
        if not low.any():
            return index
        pads = codes < 0 if self.lead else low
        padded = bool(pads.any())
        t = self.tile
        if padded:
            # a masked copy of the whole formula: cheaper than a boolean gather and scatter
            # (in intp: int32 codes times ``tile`` may not fit in int32)
            np.copyto(index, self.size + shift - t - np.multiply(codes, t, dtype=np.intp), where=pads, casting="unsafe")
        if self.lead:
            early = low & ~pads
            if early.any():
                index[early] = np.searchsorted(self.kept, codes[early])
        if not starts and padded and index.ndim and index.shape[-1] % t == 0:
            rows = index.reshape(-1, t)
            one_pad = _rows_all(pads.reshape(-1, t)) & _rows_all(rows == rows[:, :1])
            rows[one_pad] += np.arange(t)       # the pad's ``tile`` copies, in a run
        return index

    @property
    def base(self) -> int:
        """The vector's elements before its extra rows (kept codes, host buffers, pads)."""
        return self.kept.size + self.size - self.lead + len(self.pads) * self.tile

    def gather(self, codes: np.ndarray, care: Optional[np.ndarray] = None) -> "_Gather":
        """How to read the elements ``codes`` name: a :class:`_Gather` of whole rows, the rows
        that are no run of the vector (host data and pads, a row's end past a buffer's) read
        from copies the run makes after the rest (:meth:`extra_rows`). Where ``care`` (a mask
        shaped like ``codes``) is False any finite value may be read instead (an operand
        that only multiplies a zero pad): a row is a run when the elements it cares about are."""
        return _Gather(self.resolve(codes), self.tile, self, care)

    def zero_pad(self, codes: np.ndarray) -> np.ndarray:
        """Where ``codes`` name the pad value 0 (whatever the run: pads are constants)."""
        zero = self.pads.get(0)
        return np.zeros(codes.shape, bool) if zero is None else codes == zero

    def extra_rows(self, elements: np.ndarray) -> np.ndarray:
        """The starts, in the vector, of rows that copy ``elements`` (``[rows, tile]`` indices)."""
        start = self.base + self.extra_size
        self.extra.append(elements.reshape(-1))
        self.extra_size += elements.size
        return start + np.arange(len(elements)) * self.tile

    def pad_values(self, dtype) -> np.ndarray:
        return np.repeat(np.array(sorted(self.pads, key=lambda v: -self.pads[v]), dtype=dtype), self.tile)


class _Program(NamedTuple):
    """What a plan needs of an ALU instruction's or chain's steps.

    ``steps``: those after its last product by the immediate 0 (what the steps before it make
    is read by none), each ``(op, operand)``: the operand the immediate gives the op
    (:func:`~accel.hw.instructions.alu_operand`), None for the vector operand ``src``;
    ``zeroes``: whether it has such a product (``steps`` then start from zeros); ``reads_old``:
    whether it reads its destination (its first step is no such product); ``reads_src``:
    whether any step reads ``src``; ``steps_read_src``: whether one of ``steps`` does.

    >>> _Program.of([(AluOp.ADD, None), (AluOp.MUL, 0), (AluOp.SHR, 40)])
    _Program(steps=((<AluOp.SHR: 3>, 31),), zeroes=True, reads_old=True, reads_src=True, steps_read_src=False)
    """

    steps: tuple
    zeroes: bool
    reads_old: bool
    reads_src: bool
    steps_read_src: bool

    @classmethod
    def of(cls, steps: Sequence[tuple]) -> "_Program":
        """The program of ``steps``, ``(op, imm)`` each, ``imm`` None for ``src``."""
        zero = [k for k, (op, imm) in enumerate(steps) if op is _MUL and imm == 0]
        live = tuple((op, None if imm is None else alu_operand(op, imm))
                     for op, imm in steps[zero[-1] + 1 if zero else 0:])
        return cls(live, bool(zero), not (zero and zero[0] == 0), any(imm is None for _, imm in steps),
                   any(operand is None for _, operand in live))


def _gemm_elements(g: Gemm, tile: int) -> tuple["_Loop", np.ndarray, np.ndarray]:
    """A GEMM's :class:`_Loop` and the ACC and INP elements of its distinct step tiles."""
    loop = _Loop.of(g.ext_out, g.ext_in, g.acc_stride_out, g.acc_stride_in, g.acc_ld, g.inp_stride_out,
                    g.inp_stride_in, g.inp_ld, g.wgt_stride_out, g.wgt_stride_in, g.wgt_ld, tile)
    return loop, _frozen(g.acc_addr + loop.acc), _frozen(g.inp_addr + loop.inp)


def _dwmac_elements(d: Dwmac, tile: int) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
    """Whether every step of a DWMAC adds into one tile (no step moves the accumulator), its
    ACC elements (that tile's, or every step's, flat), its INP elements ``[steps, tile, tile]``
    and WGT elements ``[steps, tile]`` (a row per step)."""
    one_tile = (d.ext_out == 1 or not d.acc_stride_out) and (d.ext_in == 1 or not d.acc_stride_in)
    acc = d.acc_addr + (_flat_block_offsets(d.acc_ld, tile, tile) if one_tile else _tile_offsets(
        d.ext_out, d.acc_stride_out, d.ext_in, d.acc_stride_in, d.acc_ld, tile).reshape(-1))
    inp = d.inp_addr + _tile_offsets(d.ext_out, d.inp_stride_out, d.ext_in, d.inp_stride_in, d.inp_ld, tile)
    wgt = _vectors(d.wgt_addr, d.ext_out, d.wgt_stride_out, d.ext_in, d.wgt_stride_in, tile).reshape(-1, tile)
    return one_tile, _frozen(acc), _frozen(inp), _frozen(wgt)


def _alu_elements(a: Alu | AluChain, tile: int) -> tuple[np.ndarray, list]:
    """The ACC elements of an ALU or ALU chain instruction's destination vectors, and its
    steps as runs that each read one vector operand at most: ``(program, elements of that
    operand or None)``, a :class:`_Program` each. A chain whose steps read several vectors
    (``src`` and :class:`~accel.hw.instructions.ChainVector` ones) is the runs in turn, each
    over what the one before made, their operands all read before the first (as the chain
    reads every operand before it writes)."""
    steps = a.steps if a.opcode is _ALU_CHAIN else [(a.op, a.imm if a.use_imm else None)]
    dst = _frozen(_vectors(a.dst_addr, a.ext_out, a.dst_stride_out, a.ext_in, a.dst_stride_in, tile))

    def elements(operand) -> np.ndarray:
        start, so, si = (a.src_addr, a.src_stride_out, a.src_stride_in) if operand is None else operand.place(a)
        return _frozen(_vectors(start, a.ext_out, so, a.ext_in, si, tile))

    runs: list = []         # [steps, the vector operand they read (None: src), whether one does]
    for op, imm in steps:
        vector = imm is None or isinstance(imm, ChainVector)
        if not runs or (vector and runs[-1][2] and runs[-1][1] != (None if imm is None else imm)):
            runs.append([[], None, False])
        run = runs[-1]
        run[0].append((op, None if vector else imm))
        if vector:
            run[1], run[2] = (None if imm is None else imm), True
    return dst, [(program, elements(operand) if program.reads_src else None)
                 for program, operand in ((_Program.of(run), operand) for run, operand, _ in runs)]


def _lut_elements(u: Lut, tile: int) -> np.ndarray:
    """The ACC elements of a LUT's vectors."""
    return _frozen(_vectors(u.dst_addr, u.ext_out, u.dst_stride_out, u.ext_in, u.dst_stride_in, tile))


class _Builder:
    """Follows a stream in execution order (see the module doc); ``add`` returns False for
    an instruction the fused plan cannot take."""

    def __init__(self, sim, buffers: Buffers) -> None:
        c = sim.config
        self.tile = c.tile
        self.buffers = buffers
        self.workspace = sim.workspace      # (building's arrays there too: see _layout)
        self.inp_n, self.wgt_n, self.acc_n = c.inp_elements, c.wgt_elements, c.acc_elements
        self.f = _Sources(self.inp_n + self.wgt_n, buffers, self.tile)    # float operands: INP, WGT, int8 host data
        self.i = _Sources(0, buffers, self.tile)                     # int32 host data for ACC LOADs
        # INP and WGT element -> source code: int32 when every code fits (all but a stream reading
        # gigabytes), half the memory that a GEMM's tiles and their keys, a DWMAC's taps move
        fits = self.inp_n + self.wgt_n + sum(b.size for b in buffers if b is not None) < 2**31
        codes = np.dtype(np.int32 if fits else np.int64)
        self.inp = _identity(0, self.inp_n, codes).copy()
        self.wgt = _identity(self.inp_n, self.wgt_n, codes).copy()
        # of INP and WGT, the hull of the elements LOADs wrote: only there may they end the
        # stream with other codes than they began with (WGT is 256K elements: a comparison of
        # all of them costs a small stream as much as its instructions)
        self.written = {Mem.INP: [self.inp_n, 0], Mem.WGT: [self.wgt_n, 0]}
        self.acc = _identity(0, self.acc_n).copy()             # ACC element -> value number
        self.values = self.acc_n                               # value numbers handed out
        # read by a STORE or ALU, or made by an ALU or LUT: a value no product may add into
        self.sealed = np.zeros(self.acc_n, bool)
        self.level = np.zeros(self.acc_n, np.int32)            # ALU depth that made the value
        self.acc_loads: list[tuple[np.ndarray, np.ndarray]] = []
        self.tiles: dict[bytes, list] = {}                     # accumulator tile -> [values, x ids, w ids]
        self.x_ids: dict[bytes, int] = {}
        self.w_ids: dict[bytes, int] = {}
        self.x_tiles: list[np.ndarray] = []
        self.w_tiles: list[np.ndarray] = []
        # (WGT address, row stride) -> number of the weight tile there, until a LOAD writes WGT:
        # a layer's weights stay while its GEMMs read them hundreds of times (a tile's codes
        # are then looked up by two numbers, not made and hashed)
        self.w_at: dict[tuple[int, int], int] = {}
        # (level, steps, new values, old values, src values or None): an ALU or ALU chain
        # instruction, or a LUT (see _alu_batch)
        self.alus: list[tuple] = []
        # id of an instruction -> (it, what its fields alone give: see _known)
        self.known: dict[int, tuple] = {}
        self.tables: dict[bytes, int] = {}                     # a LUT's table (WGT source codes) -> its number
        self.table_codes: list[np.ndarray] = []
        self.dwmacs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # (acc values, inp codes, wgt codes)
        # DWMACs whose steps all add into one tile, by step count: (values [t, t], inp codes
        # [steps, t, t] as _rows_of gives them, wgt codes [steps, t])
        self.tap_sums: dict[int, list[tuple[np.ndarray, tuple[np.ndarray, bool], np.ndarray]]] = {}
        self.stores: list[tuple[int, StoreMode, np.ndarray, np.ndarray]] = []
        self.stored: dict[int, list[tuple[int, int]]] = {}    # host slot -> element ranges stored

    def _new(self, count: int) -> np.ndarray:
        values = np.arange(self.values, self.values + count)
        self.values += count
        if self.values > self.sealed.size:
            grow = max(self.values, 2 * self.sealed.size)
            self.sealed, self.level = _grown(self.sealed, grow), _grown(self.level, grow)
        return values

    def add(self, ins: Instruction) -> bool:
        op = ins.opcode
        if op is _ALU:
            return self._alu(ins)
        if op is _LOAD:
            return self._load(ins)
        if op is _GEMM:
            return self._gemm(ins)
        if op is _STORE:
            return self._store(ins)
        if op is _DWMAC:
            return self._dwmac(ins)
        if op is _LUT:
            return self._lut(ins)
        if op is _ALU_CHAIN:
            return self._alu(ins)
        return True

    def _host_range(self, ins) -> tuple[int, int]:
        return ins.dram_offset, ins.dram_offset + (ins.rows - 1) * ins.dram_ld + ins.dram_width

    def _load(self, ins: Load) -> bool:
        height = ins.pad_top + ins.rows + ins.pad_bottom
        width = ins.pad_left + ins.cols + ins.pad_right
        if not (height and width):
            return True
        acc = ins.mem is _ACC
        sources = self.i if acc else self.f
        if ins.rows and ins.cols:
            stored = self.stored.get(ins.slot)
            if stored is not None:      # (most host buffers read are never stored to)
                lo, hi = self._host_range(ins)
                if any(a < hi and lo < b for a, b in stored):
                    return False        # reads what this stream stored: order matters
        if not acc:
            # INP and WGT take the codes in place, through a view of the block (its rows never
            # overlap: the simulator's check), not as an index array and a scatter
            if ins.mem is _INP:
                memory = self.inp
            else:
                memory = self.wgt
                self.w_at.clear()
            hull, end = self.written[ins.mem], ins.sram_addr + (height - 1) * ins.sram_ld + width
            if ins.sram_addr < hull[0]:
                hull[0] = ins.sram_addr
            if end > hull[1]:
                hull[1] = end
            item = memory.itemsize
            block = np.ndarray((height, width), memory.dtype, memory, ins.sram_addr * item, (ins.sram_ld * item, item))
            if not (ins.rows and ins.cols):
                block.fill(sources.pad(ins.pad_value))
                return True
            start = sources.host(ins.slot) + ins.dram_offset
            inner = block
            if ins.rows != height or ins.cols != width:
                block.fill(sources.pad(ins.pad_value))
                inner = block[ins.pad_top:ins.pad_top + ins.rows, ins.pad_left:ins.pad_left + ins.cols]
            np.add(_block_offsets(ins.dram_ld, ins.rows, ins.cols), start, out=inner)
            return True
        elements = ins.sram_addr + _flat_block_offsets(ins.sram_ld, height, width)
        values = self._new(elements.size)
        self.acc[elements] = values
        if not (ins.rows and ins.cols) and ins.pad_value == 0:
            # only zeros (how a stream clears accumulators a DWMAC adds into): new values that
            # start at zero, as a reset's, made by a fill (or by the product that alone adds
            # into them, see _first_writes), not a code per element copied from the pads
            return True
        if ins.rows and ins.cols:
            codes = _block(sources.host(ins.slot) + ins.dram_offset, ins.dram_ld, ins.rows, ins.cols)
            if ins.rows != height or ins.cols != width:
                inner, codes = codes, np.full((height, width), sources.pad(ins.pad_value), np.int64)
                codes[ins.pad_top:ins.pad_top + ins.rows, ins.pad_left:ins.pad_left + ins.cols] = inner
        else:
            codes = np.full((height, width), sources.pad(ins.pad_value), np.int64)
        self.acc_loads.append((values, codes.reshape(-1)))
        return True

    def _gemm(self, g: Gemm) -> bool:
        if not (g.ext_out and g.ext_in):
            return True
        loop, acc_at, inp_at = self._known(g, _gemm_elements)
        if g.reset:
            # new values start at zero (an element of overlapping tiles just gets one of them)
            self.acc[acc_at] = self._new(acc_at.size).reshape(acc_at.shape)
            return True
        # Steps at the same address see the same tile: each distinct address is looked up once,
        # the tiles of all of them gathered at once (one numpy call each, not one per step), and
        # so is the test of the accumulators: nothing in one GEMM seals them or makes them by ALU.
        acc = self.acc[acc_at]
        if self.sealed[acc].any():
            return False        # adds to a value already read, or made by an ALU
        xids = _intern(self.x_ids, self.x_tiles, self.inp[inp_at])
        wids = self._weights(g.wgt_addr, g.wgt_ld, loop)
        tiles = self.tiles
        for values, key, xs, ws in zip(acc, _keys(acc), loop.x, loop.w):
            entry = tiles.get(key)
            if entry is None:       # a copy: a view would keep every step's tile alive
                entry = tiles[key] = [values.copy(), [], []]
            entry[1] += xs(xids)
            entry[2] += ws(wids)
        return True

    def _weights(self, addr: int, ld: int, loop: "_Loop") -> list[int]:
        """The numbers of the weight tiles at ``addr`` plus each of ``loop``'s distinct weight
        offsets (row stride ``ld``): those not known since WGT was last loaded interned."""
        known = self.w_at
        ids = [known.get((addr + at, ld)) for at in loop.wgt_at]
        if None in ids:
            missing = [k for k, i in enumerate(ids) if i is None]
            for k, i in zip(missing, _intern(self.w_ids, self.w_tiles, self.wgt[addr + loop.wgt[missing]])):
                ids[k] = known[(addr + loop.wgt_at[k], ld)] = i
        return ids

    def _dwmac(self, d: Dwmac) -> bool:
        if not (d.ext_out and d.ext_in):
            return True
        t = self.tile
        one_tile, acc, x, w = self._known(d, _dwmac_elements)
        values = self.acc[acc]
        if self.sealed[values].any():
            return False        # adds to a value already read, or made by an ALU
        x, w = self.inp[x], self.wgt[w]
        if one_tile:        # ``x``: [steps, t, t]; ``w``: [steps, t], a row per step
            # every step adds into the same tile (a depthwise kernel's taps): a sum over steps;
            # its input kept as the first code of each row when every row is a run (tens of
            # millions of codes in a large stream's depthwise layers, a 16th of them kept)
            self.tap_sums.setdefault(d.ext_out * d.ext_in, []).append((values.reshape(t, t), _rows_of(x), w))
        else:
            self.dwmacs.append((values, x.reshape(-1), np.broadcast_to(w[:, None, :], x.shape).reshape(-1)))
        return True

    def _alu(self, a: Alu | AluChain) -> bool:
        """An ALU or ALU chain instruction."""
        if not (a.ext_out and a.ext_in):
            return True
        dst, runs = self._known(a, _alu_elements)
        # (the values the chain's operands hold when it starts: it reads them before it writes)
        operands = [None if src is None else self.acc[src] for _, src in runs]
        for (known, _), src in zip(runs, operands):
            self._alu_batch(dst, known, src)
        return True

    def _known(self, ins: Instruction, work_out: Callable[[Instruction, int], tuple]) -> tuple:
        """What ``work_out`` makes of an instruction's fields and the tile alone (its program,
        the scratchpad elements it reads and writes). A stream repeats a few instruction objects
        thousands of times (a model's layer is a few codes and immediates over and over): worked
        out once per object, which the cache holds (no other object takes its id while the
        builder lives)."""
        known = self.known.get(id(ins))
        if known is None:
            known = self.known[id(ins)] = (ins, work_out(ins, self.tile))
        return known[1]

    def _alu_batch(self, dst: np.ndarray, known: "_Program", src: Optional[np.ndarray]) -> None:
        """An ALU instruction or chain, ``known``'s steps in turn on the values at ACC elements
        ``dst`` (``src`` those of its vector operand when a step reads it): one run of new
        values, its result, of one level (one more than what it reads), and one entry of
        :attr:`alus` carrying the steps that matter (after the last product by the immediate 0).
        No step's values but the last's are read by anything but the next step (a chain reads
        every operand before it writes), so they get no numbers: the plan runs the steps in
        turn over the result's run. A product by the immediate 0 reads nothing: its values
        start at zero, as a reset's do (a temporary zeroed before its copy does not wait for
        the block's last reader), a run of their own that the steps after it read (in place),
        or that ACC takes when it is the last step (unsealed: a product may still add into
        it). No two elements of ``dst`` are one (the simulator's check: an ALU's destination
        vectors never overlap): the new values are a fresh run, leveled and sealed as a slice."""
        n = dst.size
        if known.reads_old:
            old = self.acc[dst]
            self.sealed[old] = True
        if src is not None:
            self.sealed[src] = True
        if known.zeroes:
            zeros = self._new(n)
            if not known.steps:
                self.acc[dst] = zeros
                return
            old, level = zeros, 0
            self.sealed[zeros[0]:zeros[0] + n] = True
        else:
            level = int(self.level[old].max())
        if known.steps_read_src:
            level = max(level, int(self.level[src].max()))
        level += 1
        new = self._new(n)
        self.level[new[0]:new[0] + n] = level       # a fresh run: a slice, not a scatter
        self.sealed[new[0]:new[0] + n] = True
        self.alus.append((level, known.steps, new, old, src if known.steps_read_src else None))
        self.acc[dst] = new

    def _lut(self, u: Lut) -> bool:
        if not (u.ext_out and u.ext_in):
            return True
        dst = self._known(u, _lut_elements)
        old = self.acc[dst]
        self.sealed[old] = True
        level = int(self.level[old].max()) + 1
        new = self._new(dst.size)
        self.level[new[0]:new[0] + new.size] = level     # a fresh run: a slice, not a scatter
        self.sealed[new[0]:new[0] + new.size] = True
        self.acc[dst] = new
        # the table's entries as WGT holds them now (a later LOAD may overwrite them)
        table = _intern(self.tables, self.table_codes, self.wgt[None, u.lut_addr:u.lut_addr + LUT_ENTRIES])[0]
        self.alus.append((level, ((None, table),), new, old, None))     # a lookup in table number ``table``
        return True

    def _store(self, s: Store) -> bool:
        if not (s.rows and s.cols):
            return True
        if self.buffers[s.slot].dtype not in _HOST_DTYPES:
            return False        # (no copy compiled for it)
        values = self.acc[s.sram_addr + _flat_block_offsets(s.sram_ld, s.rows, s.cols)]
        self.sealed[values] = True
        self.stores.append((s.slot, s.mode, s.dram_offset + _flat_block_offsets(s.dram_ld, s.rows, s.cols, s.dram_step),
                            values))
        self.stored.setdefault(s.slot, []).append(self._host_range(s))
        return True

    # ------------------------------------------------------------------ the plan
    def plan(self) -> "FusedPlan":
        t = self.tile
        products = []
        # Accumulator tiles with the same rows of input tiles share a block row, those with
        # the same rows of weight tiles a block column; rows that meet the same columns
        # are one matrix product.
        rows: dict[tuple, int] = {}
        cols: dict[tuple, int] = {}
        meets: dict[int, list[tuple[int, np.ndarray]]] = {}
        for values, xs, ws in self.tiles.values():
            r = rows.setdefault(tuple(xs), len(rows))
            c = cols.setdefault(tuple(ws), len(cols))
            meets.setdefault(r, []).append((c, values))
        row_keys, col_keys = list(rows), list(cols)
        stacked = [np.stack(tiles) for tiles in (self.x_tiles, self.w_tiles) if tiles]     # [tiles, t, t] each
        read = [tiles.reshape(-1) for tiles in stacked]
        read += [codes for _, x, w in self.dwmacs for codes in (x, w)] + self.table_codes
        for group in self.tap_sums.values():
            # the first codes of the rows of a group's DWMACs looked at together (thousands of
            # DWMACs a stream), the codes of those whose rows are no runs each whole
            firsts = [x[0].reshape(-1) for _, x, _ in group if x[1]]
            if firsts:
                read.append(_leading_codes((np.concatenate(firsts), True), t, self.f.lead).reshape(-1))
            read += [x[0].reshape(-1) for _, x, _ in group if not x[1]]
            read += [w.reshape(-1) for _, _, w in group]
        if read:
            self.f.keep(np.concatenate(read))
        blocks: dict[tuple, list[int]] = {}
        for r, targets in meets.items():
            blocks.setdefault(tuple(sorted({c for c, _ in targets})), []).append(r)
        # the tiles whose rows are all runs (or one pad) are known by the first code of each row
        # (most: what LOADs bring), and an operand of such tiles is read as those rows with no
        # index array of its every element made, resolved and looked at
        x_rows, w_rows = (_tile_rows(tiles, self.f.lead) for tiles in stacked) if stacked else (None, None)
        for block_cols, block_rows in blocks.items():
            xi = np.array([row_keys[r] for r in block_rows])          # [R, J] tile numbers
            wi = np.array([col_keys[c] for c in block_cols])          # [C, J]
            x = w = None
            if not x_rows[1][xi].all():
                x = np.concatenate([np.concatenate([self.x_tiles[i] for i in row_keys[r]], axis=1)
                                    for r in block_rows])              # [R*t, J*t]
            if x is not None or not w_rows[1][wi].all():
                w = np.concatenate([np.concatenate([self.w_tiles[i] for i in col_keys[c]], axis=1)
                                    for c in block_cols])              # [C*t, J*t]
            where = {c: k for k, c in enumerate(block_cols)}
            sel_r, sel_c, targets = [], [], []
            for k, r in enumerate(block_rows):
                for c, values in meets[r]:
                    sel_r.append(k)
                    sel_c.append(where[c])
                    targets.append(values)
            targets = np.stack(targets)                                # [N, t, t]
            unique = _distinct(targets, self.values)
            grid = None
            if unique and len(targets) == len(block_rows) * len(block_cols) and \
                    sel_r == sorted(sel_r) and all(sel_c[k] == k % len(block_cols) for k in range(len(sel_c))):
                # every row meets every column once, in order: add the product as it comes
                grid = targets.reshape(len(block_rows), len(block_cols), t, t).transpose(0, 2, 1, 3) \
                    .reshape(len(block_rows) * t, len(block_cols) * t).astype(np.intp)
            # input channels the weights pad with zeros (a layer of 8 channels in 16 lanes):
            # the input's lanes there only multiply zeros, so a row of 8 host elements is
            # read as a run of 16, no copy of it padded
            if x is None:
                xs = self._row_gather(x_rows[0], xi)
            else:
                xs = self.f.gather(x, np.broadcast_to(~self.f.zero_pad(w).all(0), x.shape))
            ws = self._row_gather(w_rows[0], wi) if w is None else self.f.gather(w)
            products.append(_Product(xs, ws, grid, np.array(sel_r), np.array(sel_c), targets.astype(np.intp), unique, t))
        for steps, group in self.tap_sums.items():
            if all(x[1] for _, x, _ in group):     # rows of runs (or of one pad): read as rows from their starts
                targets, x, w = (np.stack(part) for part in zip(*((v, x[0], w) for v, x, w in group)))
                x = _Gather.of_starts(self.f.resolve(x, starts=True), x.shape + (t,), t)
            else:
                x = self._tap_gather(group, steps)
                targets, w = (np.stack(part) for part in zip(*((v, w) for v, _, w in group)))
            products.append(_TapSum(targets.astype(np.intp), x, self.f.gather(w),
                                    np.float32 if steps <= _F32_EXACT_TERMS else np.float64,
                                    _distinct(targets, self.values)))
        if self.dwmacs:
            targets, x, w = (np.concatenate(part) for part in zip(*self.dwmacs))
            products.append(_PerChannel.of(targets.astype(np.intp), x, w, self.values, self.f))
        alus = []
        # ALU batches: by level, then by steps in order of first use (one pass: a stream has
        # tens of thousands of ALU instructions and chains over dozens of levels); a batch's
        # steps as (ufunc, op, operand), a LUT's (None, None, its table's entries as indices into
        # the float sources)
        by_level: dict[int, dict[tuple, list]] = {}
        for lv, steps, new, old, src in self.alus:
            by_level.setdefault(lv, {}).setdefault(steps, []).append((new, old, src))
        # a batch's operands concatenated into the simulator's workspace, where the stream before
        # had its own (tens of MB in a large stream: memory fresh from the system costs several
        # times more to write; nothing the plan keeps is a view of them, see _layout and _operands)
        room = _workspace(self.workspace, _OPERANDS, np.intp,
                          sum(2 * new.size + (0 if src is None else src.size) for _, _, new, _, src in self.alus))
        taken = 0

        def cat(arrays: list[np.ndarray]) -> np.ndarray:
            nonlocal taken
            n = sum(a.size for a in arrays)
            taken += n
            return np.concatenate(arrays, out=room[taken - n:taken])
        for level in sorted(by_level):
            for steps, members in by_level[level].items():
                program = tuple((None, None, self.f.resolve(self.table_codes[imm])) if op is None else
                                (ALU_UFUNCS[op], op, imm) for op, imm in steps)
                alus.append((program, *(cat([m[k] for m in members]) for k in (0, 1)),
                             None if members[0][2] is None else cat([m[2] for m in members])))
        stores = []
        for slot in dict.fromkeys(s[0] for s in self.stores):
            mine = [s for s in self.stores if s[0] == slot]
            dst = np.concatenate([s[2] for s in mine]).astype(np.intp, copy=False)
            src = np.concatenate([s[3] for s in mine]).astype(np.intp, copy=False)
            modes = sorted({int(s[1]) for s in mine})
            # a STORE's mode per element only when they differ (most slots take one mode)
            mode = np.concatenate([np.full(s[2].size, int(s[1]), np.int8) for s in mine]) if len(modes) > 1 else None
            if not _distinct(dst, self.buffers[slot].size):
                # a later STORE to the same host element wins: keep the last of each run
                by_element = np.argsort(dst, kind="stable")
                last = np.ones(dst.size, bool)
                last[:-1] = dst[by_element[1:]] != dst[by_element[:-1]]
                keep = np.sort(by_element[last])
                dst, src = dst[keep], src[keep]
                if mode is not None:
                    mode = mode[keep]
                    modes = np.unique(mode).tolist()
            if mode is None:
                stores.append((slot, StoreMode(modes[0]), dst, src))
            else:
                for m in modes:
                    pick = mode == m
                    stores.append((slot, StoreMode(m), dst[pick], src[pick]))
        acc_loads = None
        if self.acc_loads:
            acc_loads = (np.concatenate([v for v, _ in self.acc_loads]).astype(np.intp, copy=False),
                         self.i.resolve(np.concatenate([c for _, c in self.acc_loads])))
        inp_at, wgt_at = (lo + np.flatnonzero(codes[lo:hi] != _identity(first, n, codes.dtype)[lo:hi])
                          for codes, first, n, (lo, hi) in ((self.inp, 0, self.inp_n, self.written[Mem.INP]),
                                                            (self.wgt, self.inp_n, self.wgt_n, self.written[Mem.WGT])))
        # ACC elements that end the stream with another value than they began with: those
        # given a new value, and those whose value from before the stream products add into
        # (a stream's reset tiles are a small part of ACC: 2% for the PaddleOCR classifier)
        changed = self.acc != _identity(0, self.acc_n)
        added = [np.asarray(p.grid if p.grid is not None else p.targets).reshape(-1) for p in products]
        for into in added:
            changed[into[into < self.acc_n]] = True
        acc_at = np.flatnonzero(changed)
        # the values from before the stream that anything reads or adds into: the only part of
        # ACC a run copies in (most streams reset every accumulator they use)
        before = [*added, *(m for a in alus for m in a[2:] if m is not None), *(s[3] for s in stores)]
        live = _range_below([*before, self.acc[acc_at]], self.acc_n)
        # Value numbers are the plan's own: renumber them so that what one numpy call writes
        # is a contiguous run (a view, not a gather and a scatter), and only the values that
        # products add into start at zero.
        # the values ALU and LUT instructions made: those given a level (at least 1)
        renumber, zeroed, runs, in_place = _layout(
            self.acc_n, self.values, products, alus, acc_loads, self.level[:self.values] > 0,
            np.concatenate([*(s[3] for s in stores), self.acc[acc_at]]),
            _workspace(self.workspace, _RENUMBER, np.intp, self.values))
        products = [p.renumbered(renumber) for p in products]
        # An ALU batch's operands, a STORE's values and host elements, what the scratchpads
        # end with: mostly runs, or a block order away from them (tiles of a matrix product's
        # rows, rows of two interleaved loads), read and written as strided views (no copy)
        # where the indices are affine in a common shape, gathered and scattered otherwise.
        # An ALU batch computes every lane of its tiles, but a layer of 8 channels in 16
        # lanes stores 8: where its results reach neither a STORE nor what ACC ends with, its
        # operands may read any value (their rows then runs, or views, not element gathers)
        cares = _cares(alus, self.values, [*(s[3] for s in self.stores), self.acc[acc_at]])
        # (the runs _layout numbered a batch's results with are known, not looked for again; a
        # batch put in place over ``old`` that reads nothing else reads and writes one run: what
        # _operands makes of it, whatever ``care``, with no pass over it)
        alus = [(program, _Span(start, (new.size,)), _Span(start, (new.size,)), None)
                if same and src is None and new.size > 1 else
                (program, *_operands(renumber[new] if start is None else _Span(start, (new.size,)),
                                     renumber[old], None if src is None else renumber[src], t, care, self.values))
                for (program, new, old, src), care, start, same in zip(alus, cares, runs, in_place)]
        stores = [(slot, mode, *(_views(dst, renumber[src]) or (_Copies(dst, renumber[src], t), None)))
                  for slot, mode, dst, src in stores]
        loaded = None
        if acc_loads is not None:
            # each loaded value once: in the order of the values, a run the load writes as a view
            targets = loaded = renumber[acc_loads[0]]
            order = np.argsort(targets, kind="stable")
            targets, codes = targets[order], acc_loads[1][order]
            acc_loads = _views(targets, codes) or (_Copies(targets, codes, t), None)
        # (None for nothing: a quarter of a model's streams leave INP or ACC as they were)
        finals = [None if not at.size else _views(at, src) or (_Copies(at, src, t), None)
                  for at, src in ((inp_at, self.f.resolve(self.inp[inp_at])), (wgt_at, self.f.resolve(self.wgt[wgt_at])),
                                  (acc_at, renumber[self.acc[acc_at]]))]
        plan = FusedPlan(self, products, alus, stores, acc_loads, *finals)
        plan.zero = _first_writes(products, self.acc_n, zeroed, loaded)
        plan.live = live
        return plan


    def _tap_gather(self, group: list, steps: int) -> "_Gather":
        """The :class:`_Gather` of the inputs of a group of tap sums (``[DWMACs, steps, t, t]``)
        some of whose rows are no runs: what :meth:`_Sources.gather` makes of all their codes
        (where only the weights' zero pads multiply, any value is read), made of it for the
        DWMACs that have such rows alone, and from the rows' first codes for the others (most)."""
        t, lead = self.tile, self.f.lead
        # (a run of leading codes into the host's is no run of the source vector)
        whole = np.array([x[1] and not ((x[0] >= 0) & (x[0] < lead) & (x[0] + t > lead)).any() for _, x, _ in group])
        shape = (len(group), steps, t, t)
        starts = np.empty(shape[:-1], np.intp)
        if whole.any():
            starts[whole] = self.f.resolve(np.stack([x[0] for (_, x, _), k in zip(group, whole) if k]), starts=True)
        codes = np.stack([_codes(x, t) for (_, x, _), k in zip(group, whole) if not k])
        w = np.stack([w for (_, _, w), k in zip(group, whole) if not k])
        care = np.broadcast_to(~self.f.zero_pad(w)[:, :, None, :], codes.shape)     # as for a product
        starts[~whole] = self.f.gather(codes, care).starts.reshape(codes.shape[:-1])
        return _Gather.of_starts(starts, shape, t)

    def _row_gather(self, first: np.ndarray, tiles: np.ndarray) -> "_Gather":
        """The :class:`_Gather` of the operand whose row ``i`` of tiles is the tiles numbered
        ``tiles[i]`` side by side, each of whose rows (``first``: the first code of each row of
        every tile, as :func:`_tile_rows` gives) is a run or one pad: what :meth:`_Sources.gather`
        makes of the operand's codes, from the rows' first codes."""
        n, k = tiles.shape
        t = self.tile
        starts = first[tiles].transpose(0, 2, 1).reshape(n * t, k)
        return _Gather.of_starts(self.f.resolve(starts, starts=True), (n * t, k * t), t)


def _tile_rows(tiles: np.ndarray, lead: int) -> tuple[np.ndarray, np.ndarray]:
    """Of ``[n, t, t]`` tiles of source codes, the first code of each row (``[n, t]``) and
    whether each tile's rows are all runs or one pad (see :func:`_rows_of`) that resolve to runs
    of the source vector: a run of leading codes (below ``lead``) stays below it.

    >>> first, whole = _tile_rows(np.array([[[4, 5], [-1, -1]], [[4, 6], [0, 1]], [[7, 8], [0, 1]]]), 8)
    >>> first.tolist(), whole.tolist()
    ([[4, -1], [4, 0], [7, 0]], [True, False, False])
    """
    n, t = len(tiles), tiles.shape[-1]
    first = tiles[:, :, 0]
    return first, _run_steps(tiles).reshape(n, -1).all(1) & _rows_all((first >= lead) | (first + t <= lead))


class _Span:
    """Value numbers ``start, start + 1, ...`` laid out as ``shape``: indexes the values
    as a view."""

    __slots__ = ("start", "stop", "shape")

    def __init__(self, start: int, shape: tuple) -> None:
        self.start, self.shape = start, shape
        self.stop = start + math.prod(shape)

    @property
    def size(self) -> int:
        return self.stop - self.start

    def of(self, values: np.ndarray) -> np.ndarray:
        return values[self.start:self.stop].reshape(self.shape)


class _View:
    """Elements ``start + sum(i[k] * strides[k])`` for every multi-index ``i`` of ``shape``:
    indexes an array as a strided view (no copy; a zero or negative stride reads repeats or
    backwards, so only :func:`_views` makes these, and writes go through distinct elements).

    >>> _View(1, (2, 3), (4, 1)).of(np.arange(10)).tolist()
    [[1, 2, 3], [5, 6, 7]]
    """

    __slots__ = ("start", "shape", "strides", "size")

    def __init__(self, start: int, shape: tuple, strides: tuple) -> None:
        self.start, self.shape, self.strides = start, shape, strides
        self.size = math.prod(shape)

    def of(self, values: np.ndarray) -> np.ndarray:
        item = values.itemsize
        return np.ndarray(self.shape, values.dtype, buffer=values, offset=self.start * item,
                          strides=tuple(s * item for s in self.strides))


# More dimensions than this make numpy's strided loops slower than a gather of tile rows.
_VIEW_DIMS = 6


def _affine(indices: Sequence[np.ndarray]) -> Optional[tuple[tuple, list]]:
    """A shape and, per index array, ``(start, strides)`` such that each flattened array is
    ``start + sum(i[k] * strides[k])`` over the multi-indices ``i`` of the shape in order, or
    None. The innermost axis is the longest run of constant steps common to all arrays, the
    next one the same over those runs' starts, and so on.

    >>> _affine([np.array([0, 1, 16, 17, 32, 33]), np.array([5, 6, 7, 8, 9, 10])])
    ((3, 2), [(0, (16, 1)), (5, (2, 1))])
    >>> _affine([np.array([0, 1, 3])]) is None
    True
    """
    flats = [np.asarray(i).reshape(-1) for i in indices]
    n = flats[0].size
    if not n:
        return None
    shape: list[int] = []
    strides: list[list[int]] = [[] for _ in flats]
    while n > 1:
        if len(shape) == _VIEW_DIMS:
            return None
        steps = [int(f[1]) - int(f[0]) for f in flats]
        run = _leading_run(flats, steps, n)       # at least 2: two points make a step
        if n % run:
            return None
        rows = [f.reshape(-1, run) for f in flats]
        if run < n and any((r != r[:, :1] + step * np.arange(run)).any() for r, step in zip(rows, steps)):
            return None
        shape.insert(0, run)
        for st, step in zip(strides, steps):
            st.insert(0, step)
        flats = [r[:, 0] for r in rows]
        n //= run
    return tuple(shape), [(int(f[0]), tuple(st)) for f, st in zip(flats, strides)]


# A first break of the steps is usually within a few tiles: looked for in this many elements
# first, then in 16 times as many at a time (the rows check of _affine then reads the whole
# arrays once)
_PREFIX = 1024


def _leading_run(flats: list[np.ndarray], steps: list[int], n: int) -> int:
    """How many leading elements of the arrays (all ``n`` long) go in their constant
    ``steps``: ``n`` when none breaks.

    >>> _leading_run([np.array([0, 1, 2, 5]), np.array([3, 3, 3, 3])], [1, 0], 4)
    3
    """
    lo, m = 0, min(n, _PREFIX)
    while True:     # the steps from ``lo`` to ``m`` (16 times as many each time: a run of a few
        # rows of a large array is not compared to its end)
        broken = np.zeros(m - 1 - lo, bool)
        for f, step in zip(flats, steps):
            broken |= (f[lo + 1:m] - f[lo:m - 1]) != step
        k = int(broken.argmax())
        if broken[k]:
            return lo + k + 1
        if m == n:
            return n
        lo, m = m - 1, min(n, 16 * m)


def _views(*indices: np.ndarray) -> Optional[list]:
    """The index arrays as views of one common shape (:class:`_Span` where one is a run in
    order, :class:`_View` otherwise), or None when they are not all affine in one shape."""
    flats = [np.asarray(i).reshape(-1) for i in indices]
    n = flats[0].size
    if n > 1 and all(f.size == n and _is_run(f) for f in flats):
        return [_Span(int(f[0]), (n,)) for f in flats]      # (what _affine finds, in one pass each)
    found = _affine(flats)
    if found is None:
        return None
    shape, placed = found
    contiguous = tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))
    return [_Span(start, shape) if strides == contiguous else _View(start, shape, strides)
            for start, strides in placed]


def _cares(alus: list, count: int, roots: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per ALU batch (in level order), which of its results are needed: read by a later
    batch where that one's result is needed, or among ``roots`` (what STOREs read and ACC
    ends with), of ``count`` values. A batch reads lower levels only, so one pass over the
    batches backwards settles it.

    >>> add = ((np.add, AluOp.ADD, 1),)
    >>> [c.tolist() for c in _cares([(add, np.array([4, 5]), np.array([2, 3]), None),
    ...                              (add, np.array([6, 7]), np.array([4, 5]), None)], 8, [np.array([7])])]
    [[False, True], [False, True]]
    """
    live = np.zeros(count, bool)
    for root in roots:
        live[root] = True
    cares = []
    for _, new, old, src in reversed(alus):
        care = live[new]
        cares.append(care)
        every = care.all()      # most batches: no mask to apply
        for read in (old, src):
            if read is not None and (every or care.any()):
                live[read if every else read[care]] = True
    return cares[::-1]


def _fill(index: np.ndarray, care: np.ndarray, tile: int, bound: int) -> np.ndarray:
    """``index`` (flattened, ``tile`` entries a row) with the entries not cared for set so
    that each row is the run of values its cared-for entries are in, where that run lies in
    ``[0, bound)``; a row with none cared for stays if it is a run, else copies the row
    before it (keeping a run a run, and a broadcast row a broadcast).

    >>> _fill(np.array([9, 3, 20, 21, 9, 9, 4, 5]), np.array([True, False, True, True, False, False, False, False]),
    ...       2, 30).tolist()
    [9, 10, 20, 21, 20, 21, 4, 5]
    """
    if index.size % tile or care.all():
        return index
    rows, cared = index.reshape(-1, tile), care.reshape(-1, tile)
    first = cared.argmax(1)
    start = rows[np.arange(len(rows)), first] - first
    some = cared.any(1)
    ok = some & (start >= 0) & (start <= bound - tile)
    if not ok.any():
        return index
    before = np.where(ok, np.arange(len(rows)), -1)
    np.maximum.accumulate(before, out=before)
    before[before < 0] = np.flatnonzero(ok)[0]
    filled = start[before][:, None] + np.arange(tile)
    whole = _rows_all(rows == rows[:, :1] + np.arange(tile))
    change = ok | ~(some | whole)
    return np.where(cared | ~change[:, None], rows, filled).reshape(index.shape)


def _operands(new, old: np.ndarray, src: Optional[np.ndarray], tile: int,
              care: Optional[np.ndarray] = None, bound: int = 0) -> tuple:
    """An ALU batch's ``(new, old, src)`` value numbers (``new`` an index, or a flat
    :class:`_Span` when known to be a run) as it reads and writes them: when
    ``new`` is a run, the operands as views of one shape where they are affine in one, else
    the first affine operand's shape for all (the other gathered into it); otherwise a run or
    an index for ``new`` and reads for the operands. Where ``care`` (per result) is False the
    operands may read any of the ``bound`` values (see :func:`_fill`).

    >>> new, old, src = _operands(np.arange(100, 104), np.array([7, 8, 7, 8]), np.array([3, 0, 9, 1]), 2)
    >>> new.shape, type(old).__name__, old.strides, src.read(_Vector(np.arange(10), 2)).tolist()
    ((2, 2), '_View', (0, 1), [[3, 0], [9, 1]])
    """
    run = new if isinstance(new, _Span) else _run_of(new)
    operands = [old] if src is None else [old, src]
    views = None
    if care is not None and not care.all():
        # filled where they may read anything: whole rows, views of whole rows; but views
        # the operands already were stay (a row filled as a copy of the one before, where
        # nothing is read, may break them)
        filled = [m if isinstance(_run_of(m), _Span) else _fill(m, care, tile, bound) for m in operands]  # a run stays
        views = _views(*filled) if isinstance(run, _Span) else None
        if views is None and isinstance(run, _Span):
            views = _views(*operands)
        operands = filled
    elif isinstance(run, _Span):
        views = _views(*operands)
    if isinstance(run, _Span):
        if views is None and src is not None:
            alone = [_views(m) for m in operands]
            shape = next((v[0].shape for v in alone if v is not None), None)
            if shape is not None:
                views = [v[0] if v is not None and v[0].shape == shape else _Gather(m.reshape(shape), tile)
                         for m, v in zip(operands, alone)]
        if views is not None:
            return (_Span(run.start, views[0].shape), *views, *([None] if src is None else []))
    return run, *(_reads(m, tile) for m in operands), *([None] if src is None else [])


def _run_of(index: np.ndarray):
    """``index`` as a :class:`_Span` when it numbers consecutive values in order, else itself."""
    index = np.asarray(index, np.intp)
    flat = index.reshape(-1)
    if flat.size and _is_run(flat):
        return _Span(int(flat[0]), index.shape)
    return index


def _is_run(flat: np.ndarray) -> bool:
    """Whether the (non-empty, flat) ``flat`` numbers consecutive values in order.

    >>> _is_run(np.array([3, 4, 5])), _is_run(np.array([3, 5, 4, 5]))
    (True, False)
    """
    # n strictly increasing integers from a to a + n - 1 are consecutive: one comparison of
    # neighbours (a bool per element) instead of np.diff's int64 differences
    return bool(flat[0] + flat.size - 1 == flat[-1] and (flat.size == 1 or (flat[1:] > flat[:-1]).all()))


def _reads(index: np.ndarray, tile: int):
    """How to read ``values[index]``: a :class:`_Span` when ``index`` numbers consecutive
    values in order, else a :class:`_Gather`."""
    run = _run_of(index)
    return run if isinstance(run, _Span) else _Gather(run, tile)


def _at(values: _Vector, index) -> np.ndarray:
    """``values[index]``: a view for a :class:`_Span` or :class:`_View`, a gather otherwise."""
    return index.of(values.data) if isinstance(index, (_Span, _View)) else index.read(values)


def _layout(acc_n: int, count: int, products: list, alus: list, acc_loads, made: np.ndarray,
            kept: np.ndarray, into: np.ndarray) -> tuple:
    """New value numbers (``renumber[old] = new``): the scratchpad's ``acc_n`` values from
    before the stream keep theirs; then the values products add into, each product's
    targets in the order it adds them; then the other values that start at zero (resets
    nothing adds into); then the values that are written before they are read (ACC LOADs,
    in the order the ALU groups first read them, and ALU results). Each ALU group, element
    by element independent, is put in the order of the values it reads, and writes its
    results in that order (a product's accumulators are read as the product wrote them, not
    tile by tile as the instructions did). An ALU group whose
    operand ``old`` is a run that nothing else reads (no other ALU, nor ``kept``: what the
    STOREs read and ACC ends with) writes its results over it, in place (``made`` marks the
    values the ALU groups write; the loaded ones are marked in it too, as written): a chain of ALU
    batches (a requantisation's chain, then a lookup) then works on one stretch of memory, in
    cache, instead of a fresh one per operation. Returns ``(renumber, zeroed,
    runs, in_place)``: values ``[acc_n, zeroed)`` start at zero, ``[zeroed, count)`` are
    written before they are read; per ALU group, the first of the run its ``new`` is
    renumbered to (None when it is no run), and whether its ``old`` is that run too (in
    place). ``renumber`` is the first ``count`` elements of ``into`` (intp, its contents
    ignored): a large stream's are tens of MB, which memory fresh from the system costs
    several times more to write than memory written before (a simulator's workspace keeps
    one while a call builds its plans, see :func:`drop_building`)."""
    renumber = into[:count]
    renumber.fill(-1)
    renumber[:acc_n] = np.arange(acc_n)
    nxt = acc_n

    def claim(index: np.ndarray, distinct: bool = False) -> Optional[int]:
        # the first of the run ``index`` is numbered with, or None when it is not (``distinct``:
        # no value is twice in ``index``, known without looking)
        nonlocal nxt
        flat = np.asarray(index).reshape(-1)
        if not flat.size or (renumber[flat] >= 0).any():
            return None
        run = np.arange(nxt, nxt + flat.size)
        renumber[flat] = run
        if distinct or (renumber[flat] == run).all():
            nxt += flat.size
            return int(run[0])
        renumber[flat] = -1     # a value twice in ``index``: it cannot be a run (O(n), unlike np.unique)
        return None

    for p in products:
        claim(p.grid if p.grid is not None else p.targets, getattr(p, "unique", False))
    written = made              # (the caller's, made for this) one pass, not a scatter of every ALU result
    if acc_loads is not None:
        written[acc_loads[0]] = True
    written[:acc_n] = False
    rest = np.flatnonzero((renumber < 0) & ~written)
    renumber[rest] = np.arange(nxt, nxt + rest.size)
    nxt += rest.size
    zeroed = nxt
    waiting = None          # loaded values still without a number (none loaded: most streams)
    left = 0                # how many: once none, the batches after look up nothing
    if acc_loads is not None:
        waiting = np.zeros(count, bool)
        # each loaded value's place among them (a few thousand: where a batch first reads each is
        # found in an array of those alone, in cache, not in one of every value)
        place = np.zeros(count, np.int32)
        place[acc_loads[0]] = np.arange(acc_loads[0].size)
        unnumbered = renumber[acc_loads[0]] < 0     # (the loaded values alone: not every value's test)
        waiting[acc_loads[0]] = unnumbered
        left = int(np.count_nonzero(unnumbered))

    def claim_loaded(read: np.ndarray) -> None:
        # loaded values in the order an ALU batch first reads them (an element-wise add reads
        # the tiles of two loads that alternate in the stream): runs for the ALUs, while the
        # load itself reads its host rows in any order (see FusedPlan's acc_loads)
        nonlocal left
        if not left:
            return      # nothing loaded (most streams), or all of it claimed
        read = read[waiting[read]]
        if read.size:
            # values no one claimed: taken as they come when none repeats (an ALU's ``old`` never
            # does), else in the order of their first reads (a bias row broadcast), then distinct;
            # more reads than values waiting repeat some (no claim tried: a pass over them saved)
            if read.size > left or claim(read) is None:
                # where each value is first read: the least of its positions (no sort of the reads)
                first = np.full(acc_loads[0].size, read.size)
                np.minimum.at(first, place[read], np.arange(read.size))
                read = read[np.sort(first[first < read.size])]
                claim(read)
            waiting[read] = False
            left -= read.size

    # the values read other than as an ALU group's ``old``: a value is the ``old`` of one ALU
    # (or LUT) instruction at most (ACC maps elements to distinct values, and an instruction
    # that reads a destination vector writes new values over all of it, while no two of its
    # vectors overlap), so an ``old`` read by nothing else is one no other array names
    # (a mark per value, not a count: the groups read tens of millions of values)
    shared = np.zeros(count, bool)
    shared[kept.reshape(-1)] = True
    for a in alus:
        if a[3] is not None:
            shared[a[3].reshape(-1)] = True
    runs: list[Optional[int]] = [None] * len(alus)
    in_place = [False] * len(alus)
    for k, (program, new, old, src) in enumerate(alus):
        # in execution order: ``old`` has its numbers (made before, or loaded), ``new`` does not yet
        new, old = new.reshape(-1), old.reshape(-1)
        claim_loaded(old)
        at = renumber[old]
        # a batch is independent element by element: in the order of the values it reads, a
        # run where it reads all of one (a product's accumulators in the product's order).
        # Most batches read values in increasing order: one comparison tells, for both tests
        increasing = at.size <= 1 or bool((at[1:] > at[:-1]).all())
        if not increasing and not (at[1:] >= at[:-1]).all():
            order = np.argsort(at, kind="stable")
            new, old, at = new[order], old[order], at[order]
            src = None if src is None else src.reshape(-1)[order]
            alus[k] = (program, new, old, src)
        if src is not None:
            claim_loaded(src.reshape(-1))
        # in place: ``old`` a run (from the cheap tests to the gathers)
        if new.size == old.size and at.size and at[0] >= acc_n and at[-1] - at[0] == at.size - 1 and \
                (increasing or bool((at[1:] > at[:-1]).all())) and not shared[old].any() and \
                (renumber[new] < 0).all():
            renumber[new] = at
            runs[k], in_place[k] = int(at[0]), True
        else:
            runs[k] = claim(new, True)     # (an ALU batch's results are fresh values, each once)
    if acc_loads is not None:
        claim_loaded(acc_loads[0])
    rest = np.flatnonzero(renumber < 0)     # written values a claim did not take (repeats)
    renumber[rest] = np.arange(nxt, nxt + rest.size)
    return renumber, zeroed, runs, in_place


def _range_below(indices: Sequence[np.ndarray], bound: int) -> tuple[int, int]:
    """``(lo, hi)``: the smallest and one past the largest of the indices below ``bound``
    in the arrays, ``(0, 0)`` when there are none. Array by array, without concatenating
    them (millions of indices), and most arrays have none: a ``min`` tells.

    >>> _range_below([np.array([9, 3, 12]), np.array([], np.intp), np.array([5, 1])], 8)
    (1, 6)
    """
    lo, hi = bound, -1
    for index in indices:
        if index.size and int(index.min()) < bound:
            below = index[index < bound]
            lo, hi = min(lo, int(below.min())), max(hi, int(below.max()))
    return (lo, hi + 1) if hi >= 0 else (0, 0)


def _first_writes(products: list, acc_n: int, zeroed: int,
                  loaded: Optional[np.ndarray] = None) -> list[tuple[int, int]]:
    """Let the products that alone add into a run of values that start at zero (``[acc_n,
    zeroed)``) write their results there instead (``assign``): 0 + x is x, and those values
    need no zeroing. Returns the ranges of values that still do. The values an ACC LOAD
    brings (``loaded``) are no zeros: a product adds into them (a bias loaded, then
    accumulated onto), as into the values a product that adds there too. Only the values
    ``[acc_n, zeroed)`` are looked at (a stream's ALU results are most of its ``count``)."""
    size = zeroed - acc_n
    hits = np.zeros(size, np.int32)

    def window(index) -> np.ndarray:
        index = np.asarray(index).reshape(-1)
        return index[(index >= acc_n) & (index < zeroed)] - acc_n

    if loaded is not None:
        hits[window(loaded)] = 1
    for p in products:
        at = p.grid if p.grid is not None else p.targets
        if isinstance(at, _Span):
            hits[max(at.start - acc_n, 0):max(min(at.stop, zeroed) - acc_n, 0)] += 1
        else:
            np.add.at(hits, window(at), 1)
    zero = np.ones(size + 2, bool)      # a False either side: every run of True has two edges
    zero[0] = zero[-1] = False
    for p in products:
        at = p.grid if p.grid is not None else p.targets
        if isinstance(at, _Span) and acc_n <= at.start and at.stop <= zeroed and \
                (hits[at.start - acc_n:at.stop - acc_n] == 1).all():
            p.assign = True
            zero[at.start - acc_n + 1:at.stop - acc_n + 1] = False
    edges = acc_n + np.flatnonzero(zero[1:] != zero[:-1])
    return [(int(lo), int(hi)) for lo, hi in zip(edges[::2], edges[1::2])]


# The host buffers a plan stores into: those :func:`~accel.hw.kernels.copy_runs` writes.
_HOST_DTYPES = (np.dtype(np.int8), np.dtype(np.int32))


class _Copies:
    """``target[dst] = source[src]`` for two index arrays (a STORE's host elements and values,
    an ACC LOAD's values and sources, a scratchpad's elements and what they end with) that are
    no views, as runs (:func:`~accel.hw.kernels.copy_runs`): where ``src`` goes up by one (a tile
    row of values) or repeats (a pad) while ``dst`` goes up by the most common step (a STORE's
    ``dram_step``), one run; a compiled pass casts (and saturates) on the way, instead of a
    gather into a temporary, a cast and a scatter, each with an index per element.

    >>> copies = _Copies(np.r_[0:4, 8:12] * 2, np.r_[10:14, 3, 3, 3, 3], 16)
    >>> copies.step, copies.arrays[3].tolist()      # host step 2: two runs, the second a repeat
    (2, [4, 4])
    >>> target = np.zeros(24, np.int8); copies.bound(np.arange(20, dtype=np.int32) * 20, target, saturate=True)()
    >>> target[::2].tolist()
    [127, 127, 127, 127, 0, 0, 0, 0, 60, 60, 60, 60]
    """

    __slots__ = ("step", "arrays", "tile", "_tensors")

    def __init__(self, dst: np.ndarray, src: np.ndarray, tile: int) -> None:
        dst, src = (np.asarray(a, np.int64).reshape(-1) for a in (dst, src))
        gaps, moves = np.diff(dst), np.diff(src)
        self.step = 1
        if gaps.size:
            steps, counts = np.unique(gaps[:_STEP_SAMPLE], return_counts=True)
            self.step = int(steps[counts.argmax()])
        # each neighbour pair's source step when it may be inside a run (0 or 1), else -1; an
        # element continues the run of the one before when their pair may, and the pair before
        # (inside the run too, unless -1: the run starts there) has the same step
        kind = np.where((gaps == self.step) & ((moves == 0) | (moves == 1)), moves, -1)
        same = np.ones(kind.size, bool)
        same[1:] = (kind[1:] == kind[:-1]) | (kind[:-1] == -1)
        begins = np.ones(dst.size, bool)
        begins[1:] = (kind == -1) | ~same
        starts = np.flatnonzero(begins)
        lengths = np.diff(np.append(starts, dst.size))
        steps = np.ones(starts.size, np.int64)
        inside = lengths > 1
        steps[inside] = kind[starts[inside]]
        self.arrays = (src[starts], steps, dst[starts], lengths)
        self.tile = tile        # (the compiled module it is in: see kernels.copy_runs)
        self._tensors: tuple = ()   # the arrays as the kernel's tensors, made at the first bound

    def then(self, other: "_Copies", shift: int) -> Optional["_Copies"]:
        """These copies, then ``other``'s ``shift`` elements further in the target, as one (None
        when their host steps differ): INP's and WGT's final contents, into the array they are
        both views of.

        >>> both = _Copies(np.arange(4), np.arange(4), 4).then(_Copies(np.arange(2), np.arange(2) + 8, 4), 6)
        >>> target = np.zeros(8, np.int32); both.bound(np.arange(10, dtype=np.int32), target)(); target.tolist()
        [0, 1, 2, 3, 0, 0, 8, 9]
        """
        if self.step != other.step:
            return None
        copies = _Copies(np.zeros(0, np.int64), np.zeros(0, np.int64), self.tile)
        copies.step = self.step
        copies.arrays = tuple(np.concatenate([mine, theirs + (shift if k == 2 else 0)])
                              for k, (mine, theirs) in enumerate(zip(self.arrays, other.arrays)))
        return copies

    def bound(self, source: np.ndarray, target: np.ndarray, saturate: bool = False) -> Callable[[], None]:
        """``target[dst] = source[src]`` (clipped to int8's range first when ``saturate``) as a
        call without arguments: a plan copies between the same arrays run after run (its
        workspace's vectors, the simulator's scratchpads, a session's host buffers), so their
        tensors and the kernel's lookup are made once (~15 us a call otherwise, for copies of a few us)."""
        import tvm_ffi

        kernel = kernels.copy_runs(self.tile, source.dtype.name, target.dtype.name)
        if not self._tensors:       # the same runs for every tuple of host buffers a plan binds
            self._tensors = tuple(tvm_ffi.from_dlpack(a) for a in self.arrays)
        frm, steps, to, lengths = self._tensors
        return partial(kernel, tvm_ffi.from_dlpack(source), frm, steps, to, lengths, tvm_ffi.from_dlpack(target),
                       self.step, int(saturate))


# The most common of this many leading steps of a copy's target is its host step.
_STEP_SAMPLE = 4096


def _distinct(index: np.ndarray, bound: int) -> bool:
    """Whether the indices (all below ``bound``) are pairwise different, in O(bound)."""
    seen = np.zeros(bound, bool)
    seen[index.reshape(-1)] = True
    return int(np.count_nonzero(seen)) == index.size


def _rows_of(codes: np.ndarray) -> tuple[np.ndarray, bool]:
    """Source codes whose last axis is ``tile`` lanes, as ``(first code of each row, True)``
    when every row is a run (consecutive codes from a non-negative first one) or one pad
    (the same negative code throughout): what :func:`_codes` gives back, and what a
    :class:`_Gather` reads as whole rows from their resolved starts. Else ``(codes, False)``.

    >>> first, rows = _rows_of(np.array([[4, 5, 6], [-2, -2, -2]])); first.tolist(), rows
    ([4, -2], True)
    >>> _rows_of(np.array([[4, 6, 5]]))[1]
    False
    """
    # (one answer for all rows: no reduction row by row, which numpy makes a loop of short rows)
    if bool(_run_steps(codes).all()):
        return codes[..., 0].copy(), True       # a copy: the codes are not kept alive
    return codes, False


def _rows_all(marks: np.ndarray) -> np.ndarray:
    """Per row of the boolean matrix ``marks``, whether all of it is True: rows of 8k elements
    (a tile's lanes) as k 64-bit words, each compared at once for the whole column (numpy's
    reduction along a short last axis costs a loop per row: 30 times as much for 16 lanes).

    >>> _rows_all(np.array([[True] * 16, [True] * 15 + [False]])).tolist(), _rows_all(np.ones((1, 3), bool)).tolist()
    ([True, False], [True])
    """
    words = marks.shape[1] // 8
    if not words or marks.shape[1] % 8 or not marks.flags.c_contiguous:
        return marks.all(1)
    columns = marks.view(np.uint64)     # (numpy's True is the byte 1)
    every = columns[:, 0] == _TRUE_BYTES
    for k in range(1, words):
        every &= columns[:, k] == _TRUE_BYTES
    return every


_TRUE_BYTES = np.uint64(0x0101010101010101)


def _run_steps(codes: np.ndarray) -> np.ndarray:
    """Whether each code of ``codes`` continues its row (the last axis) to the next code as a run
    (consecutive codes from a non-negative first one) or as one pad (the same negative code),
    True at each row's last code: a row is either where all of its are True.

    >>> _run_steps(np.array([[4, 5, 6], [-2, -2, -2], [4, 6, 5], [-2, -1, 0]])).tolist()
    [[True, True, True], [True, True, True], [False, False, True], [False, False, True]]
    """
    # a step of 1 along a run, of 0 along a pad: the steps of the flat codes (one pass over
    # contiguous memory, not rows of a few steps each), each row's last one (to the next row)
    # set to what the row's are to be
    t = codes.shape[-1]
    flat = codes.reshape(-1)
    steps = np.empty(flat.size, flat.dtype)
    np.subtract(flat[1:], flat[:-1], out=steps[:-1])
    rows = steps.reshape(-1, t)
    expected = flat[::t, None] >= 0
    rows[:, -1:] = expected
    return (rows == expected).reshape(codes.shape)


def _codes(rows: tuple[np.ndarray, bool], tile: int) -> np.ndarray:
    """The codes :func:`_rows_of` was given, from what it returned.

    >>> _codes((np.array([4, -2]), True), 3).tolist()
    [[4, 5, 6], [-2, -2, -2]]
    """
    first, whole = rows
    if not whole:
        return first
    first = first[..., None]
    return np.where(first >= 0, first + np.arange(tile), first)


def _leading_codes(rows: tuple[np.ndarray, bool], tile: int, lead: int) -> np.ndarray:
    """Of the codes :func:`_rows_of` returned ``rows`` for, those of the rows that may hold a
    leading code (below ``lead``: see :meth:`_Sources.keep`): the rest are pads or host data.

    >>> _leading_codes((np.array([3, -1, 900]), True), 2, 100).tolist()
    [[3, 4]]
    """
    first, whole = rows
    if not whole:
        return first
    return _codes((first[(first >= 0) & (first < lead)], True), tile)


def _keys(tiles: np.ndarray) -> list[bytes]:
    """Each of ``tiles`` (along the first axis) as the bytes of its contents, in one call.

    >>> _keys(np.arange(4, dtype=np.int8).reshape(2, 2))
    [b'\\x00\\x01', b'\\x02\\x03']
    """
    rows = np.ascontiguousarray(tiles).reshape(len(tiles), -1)
    return rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).reshape(-1).tolist()


def _intern(ids: dict, tiles: list, block: np.ndarray) -> list[int]:
    """The numbers of the tiles of ``block`` (along its first axis) among ``tiles`` by their
    contents, those new added (views of one copy of them).

    >>> ids, tiles = {}, []
    >>> _intern(ids, tiles, np.array([[1, 2], [3, 4], [1, 2]])), len(tiles)
    ([0, 1, 0], 2)
    """
    numbers = []
    new = []
    for k, key in enumerate(_keys(block)):
        n = ids.get(key)
        if n is None:
            n = ids[key] = len(tiles) + len(new)
            new.append(k)
        numbers.append(n)
    if new:
        tiles.extend(block[new])
    return numbers


class _Vector:
    """A vector a plan reads from (its sources, or its accumulator values), and a view of it
    whose items are the ``tile`` consecutive elements that start at each element (what
    :class:`_Gather` reads rows from)."""

    __slots__ = ("data", "rows")

    def __init__(self, data: np.ndarray, tile: int) -> None:
        self.data = data
        self.rows = None
        if data.size >= tile:
            self.rows = np.ndarray((data.size - tile + 1,), np.dtype((np.void, tile * data.itemsize)),
                                   buffer=data, strides=(data.itemsize,))


class _Gather:
    """``source[index]`` for one index array: the indices of a ``tile``-long chunk of the
    flattened array are usually consecutive elements (a tile row of host data a LOAD brought,
    or of one pad; a vector of accumulator values), and such a chunk is read as one item of
    :attr:`_Vector.rows` (one copy of ``tile`` elements instead of ``tile`` lookups, and an
    index ``tile`` times smaller). The other chunks are read element by element, or, given
    ``extra`` (the :class:`_Sources` of the vector), from copies of them that each run
    appends to the vector (:meth:`_Sources.extra_rows`), so that every chunk is a row.

    >>> source = _Vector(np.arange(40, dtype=np.float32), 4)
    >>> g = _Gather(np.array([[8, 9, 10, 11, 0, 0, 3, 1, 5]]), 4)
    >>> g.read(source).tolist(), g.starts.tolist()
    ([[8.0, 9.0, 10.0, 11.0, 0.0, 0.0, 3.0, 1.0, 5.0]], [8])
    """

    __slots__ = ("shape", "size", "index", "starts", "rows_at", "at", "elements", "by_rows", "strided")

    def __init__(self, index: np.ndarray, tile: int, extra: Optional[_Sources] = None,
                 care: Optional[np.ndarray] = None) -> None:
        self.shape, self.index = index.shape, None
        self.size = flat_size = index.size
        self.strided = None
        # every last-axis row of the index array is whole rows (then :meth:`part` reads any
        # entries of the first axis alone)
        self.by_rows = False
        flat = index.reshape(-1)
        if not flat_size:
            self.index = index
            return
        if extra is not None and flat_size % tile:     # the last chunk, completed by repeats
            flat = np.concatenate([flat, np.full(tile - flat_size % tile, flat[-1], flat.dtype)])
        n = flat.size // tile
        rows = flat[:n * tile].reshape(n, tile)
        starts = rows[:, 0].copy()
        whole = _rows_all(rows == starts[:, None] + np.arange(tile))
        if care is not None and extra is not None and not whole.all():
            # a row is the run its cared-for elements are in (the others read whatever the
            # run holds there), when that run lies inside the vector
            other = np.flatnonzero(~whole)
            at = other[:, None] * tile + np.arange(tile)
            cared = np.ones(at.shape, bool)
            inside = at < flat_size
            cared[inside] = care.reshape(-1)[at[inside]]
            first = cared.argmax(1)
            start = rows[other, first] - first
            run = _rows_all((rows[other] == start[:, None] + np.arange(tile)) | ~cared) & \
                (start >= 0) & (start <= extra.base - tile)
            starts[other[run]] = start[run]
            whole[other[run]] = True
        if not whole.any() and extra is None:
            self.index = index
            return
        self.starts = starts
        self.rows_at = self.at = self.elements = None
        if extra is not None:
            if not whole.all():
                self.starts[~whole] = extra.extra_rows(rows[~whole])
        elif n * tile < flat_size or not whole.all():
            self.starts = self.starts[whole]
            self.rows_at = np.flatnonzero(whole)
            self.at = np.concatenate([(np.flatnonzero(~whole)[:, None] * tile + np.arange(tile)).reshape(-1),
                                      np.arange(n * tile, flat_size)])
            self.elements = flat[self.at]
        self.by_rows = self.rows_at is None and index.ndim > 1 and index.shape[-1] % tile == 0
        if self.rows_at is None and flat_size == self.starts.size * tile:
            self.strided = _strided_rows(self.starts, self.shape, tile)

    @classmethod
    def of_starts(cls, starts: np.ndarray, shape: tuple, tile: int) -> "_Gather":
        """The gather of ``shape`` (last axis ``tile``) whose rows are the runs of the vector
        that start at ``starts`` (``shape`` but the last axis): what the gather of those runs'
        index array makes, without the array.

        >>> g = _Gather.of_starts(np.array([[8, 0]]), (1, 2, 4), 4)
        >>> g.read(_Vector(np.arange(12), 4)).tolist(), g.by_rows
        ([[[8, 9, 10, 11], [0, 1, 2, 3]]], True)
        """
        gather = cls.__new__(cls)
        gather.shape, gather.size, gather.index = tuple(shape), starts.size * tile, None
        gather.starts = starts.reshape(-1)
        gather.rows_at = gather.at = gather.elements = None
        gather.by_rows = len(shape) > 1 and shape[-1] % tile == 0
        gather.strided = _strided_rows(gather.starts, gather.shape, tile) if shape[-1] % tile == 0 else None
        return gather

    def part(self, source: _Vector, lo: int, hi: int) -> np.ndarray:
        """``read(source)[lo:hi]``, reading only those (:attr:`by_rows` gathers)."""
        starts = self.starts.reshape(self.shape[0], -1)[lo:hi]
        return source.rows[starts].view(source.data.dtype).reshape((len(starts),) + self.shape[1:])

    def read(self, source: _Vector) -> np.ndarray:
        """The gathered elements, shaped as the index array (a view of ``source`` where the
        rows are :attr:`strided`: read it before writing over it)."""
        if self.strided is not None:
            start, ld = self.strided
            data = source.data
            rows = self.size // self.shape[-1]
            return np.ndarray((rows, self.shape[-1]), data.dtype, buffer=data, offset=start * data.itemsize,
                              strides=(ld * data.itemsize, data.itemsize)).reshape(self.shape)
        if self.index is not None:
            return np.take(source.data, self.index)
        if self.rows_at is None:
            out = source.rows[self.starts].view(source.data.dtype)
            return (out if out.size == self.size else out[:self.size]).reshape(self.shape)
        tile = source.rows.itemsize // source.data.itemsize
        out = np.empty(-(-self.size // tile) * tile, source.data.dtype)     # whole chunks, for the row view
        out.view(source.rows.dtype)[self.rows_at] = source.rows[self.starts]
        out[self.at] = np.take(source.data, self.elements)
        return out[:self.size].reshape(self.shape)


def _strided_rows(starts: np.ndarray, shape: tuple, tile: int) -> Optional[tuple[int, int]]:
    """``(start, ld)`` when the runs of ``tile`` elements that start at ``starts`` make the
    array of ``shape`` whose last axis rows are ``ld`` (at least a row) elements apart in the vector, each a run
    (an input the host laid out as a matrix: a 1x1 convolution's pixels by channels, an
    im2col), else None: then read as a strided view of the vector, not gathered.

    >>> _strided_rows(np.array([5, 7, 12, 14]), (2, 4), 2), _strided_rows(np.array([5, 7, 12, 15]), (2, 4), 2)
    ((5, 7), None)
    """
    if not starts.size or len(shape) < 1 or shape[-1] % tile:
        return None
    runs = starts.reshape(-1, shape[-1] // tile)
    first = runs[:, 0]
    ld = int(first[1] - first[0]) if first.size > 1 else shape[-1]
    if ld < shape[-1] or (runs[:, 1:] != runs[:, :-1] + tile).any() or (first[1:] != first[:-1] + ld).any():
        return None     # (rows closer than their length would overlap in a view: gathered instead)
    return int(first[0]), ld


class _Product:
    """One block matrix product: gather, multiply exactly, add into accumulator values."""

    __slots__ = ("x", "w", "grid", "sel_r", "sel_c", "targets", "unique", "tile", "assign")

    def __init__(self, x, w, grid, sel_r, sel_c, targets, unique, tile) -> None:
        self.assign = False     # write into ``grid`` (zero before, and no other product adds there)
        self.x, self.w, self.grid = x, w, grid
        self.sel_r, self.sel_c, self.targets, self.unique, self.tile = sel_r, sel_c, targets, unique, tile

    def renumbered(self, renumber: np.ndarray) -> "_Product":
        """This product adding into the values ``renumber`` maps its targets to."""
        grid = None if self.grid is None else _run_of(renumber[self.grid])
        targets = renumber[self.targets]
        return _Product(self.x, self.w, grid, self.sel_r, self.sel_c,
                        _run_of(targets) if self.unique else targets, self.unique, self.tile)

    def packs(self) -> int:
        """The int16 scratch elements its compiled product packs the operands into."""
        return kernels.gemm(self.tile, self.assign).scratch(*self._starts())

    def _starts(self) -> tuple[np.ndarray, np.ndarray]:
        """The row starts of the input's and the weight's rows, ``[rows, J]`` and ``[cols, J]``."""
        return self.x.starts.reshape(self.x.shape[0], -1), self.w.starts.reshape(self.w.shape[0], -1)

    def call(self, source: _Vector, values: np.ndarray, scratch: np.ndarray) -> Callable[[], object]:
        """The product as a call without arguments over these vectors (``scratch``: int16, at
        least :meth:`packs` elements, for the kernel alone while it runs)."""
        if isinstance(self.grid, _Span):        # straight into the values it adds into (or sets)
            # compiled, exact in int32 (see accel.hw.kernels.gemm): the operands' rows read where
            # they are in the source vector, not gathered into copies, the tensors made once
            xs, ws = self._starts()
            distinct = _distinct_rows(xs)
            if 2 * distinct.size <= len(xs) and (len(xs) - distinct.size) * ws.size * self.tile >= _SPREAD_MACS:
                return self._spread(source, values, scratch, xs, ws, distinct)
            return kernels.gemm(self.tile, self.assign).bind(source.data, xs, ws, values, self.grid.start,
                                                             ws.shape[0], scratch)
        return partial(self.run, source, values)

    def _spread(self, source: _Vector, values: np.ndarray, scratch: np.ndarray, xs: np.ndarray, ws: np.ndarray,
                distinct: np.ndarray) -> Callable[[], None]:
        """The product into its run of rows as a call, where most of the input's rows repeat the
        row before (a LOAD's pad rows: a classifier's last layer at one image multiplies 1 row
        of a tile's 16): each distinct row multiplied once (``distinct``: the first of each
        repeat), then every row of the run set to (or increased by) its row's result. The
        device's cycles still count every row; the run's values end as the whole product's."""
        t, (channels, j) = self.tile, ws.shape
        which = np.zeros(len(xs), np.intp)      # each row's place among the distinct ones
        which[distinct[1:]] = 1
        np.cumsum(which, out=which)
        grid = self.grid.of(values)
        if distinct.size <= _FEW_ROWS:
            # the weight read where it is, each of its rows times each distinct input row lane by
            # lane (exact in int32: a tile's lanes sum ``j`` products each), then the lanes summed
            # (wrapping as the whole sum truncated does): the compiled product packs the whole
            # weight into int16 pairs first, for a few rows most of its work
            lanes = np.empty((channels, distinct.size, t), np.int32)
            per_row = np.ascontiguousarray(np.broadcast_to(xs[distinct].T, (channels, j, distinct.size)))
            product = kernels.tap_sum(t, True).bind(source.data, per_row, ws, lanes.reshape(-1), 0)
            rows = np.empty((channels, distinct.size), np.int32).T

            def multiply() -> None:
                product()
                np.sum(lanes, axis=2, dtype=np.int32, out=rows.T)
        else:
            rows = np.empty((distinct.size, channels), np.int32)
            multiply = kernels.gemm(t, True).bind(source.data, np.ascontiguousarray(xs[distinct]), ws,
                                                  rows.reshape(-1), 0, channels, scratch)

        def run() -> None:
            multiply()
            if self.assign:
                np.take(rows, which, axis=0, out=grid)
            else:
                np.add(grid, rows[which], out=grid)
        return run

    def run(self, source: _Vector, values: np.ndarray) -> None:
        """The product into a new array, then added into (or copied to) the values (that are no
        run of rows: :meth:`call` multiplies into a run in place)."""
        xs, ws = self._starts()
        product = np.empty((xs.shape[0], ws.shape[0]), np.int32)
        kernels.gemm(self.tile, True)(source.data, xs, ws, product.reshape(-1), 0, ws.shape[0])
        if self.grid is not None:
            if self.assign:
                np.copyto(self.grid.of(values), product)
            else:
                values[self.grid] += product
            return
        t = self.tile
        blocks = product.reshape(product.shape[0] // t, t, product.shape[1] // t, t)[self.sel_r, :, self.sel_c, :]
        if self.assign:
            np.copyto(self.targets.of(values), blocks)
        elif isinstance(self.targets, _Span):
            target = self.targets.of(values)
            target += blocks
        elif self.unique:
            values[self.targets] += blocks
        else:
            np.add.at(values, self.targets, blocks)


# products spared, at least, for which a product repeating its rows multiplies each once: below,
# the extra calls (a copy of each row's results, the lanes' sum) cost more than a small
# weight's rows (a classifier's squeeze-and-excite layers at one image, 16 x 208 x 64 MACs)
_SPREAD_MACS = 2**20
# distinct input rows up to which a product repeating its rows multiplies the weight where it
# is, without packing it (see _Product._spread)
_FEW_ROWS = 4


def _distinct_rows(rows: np.ndarray) -> np.ndarray:
    """The indices of the rows of ``rows`` (2-D, non-empty) unlike the row before them.

    >>> _distinct_rows(np.array([[3, 4], [0, 0], [0, 0], [3, 4]])).tolist()
    [0, 1, 3]
    """
    return np.flatnonzero(np.concatenate([[True], (rows[1:] != rows[:-1]).any(1)]))


class _PerChannel:
    """Every DWMAC product of the stream outside a tap sum: ``targets[k] += x[k] * w[k]``
    (``x``, ``w`` read from the source vector). When no value gets two products (a widening
    by a ones weight, say), they are added as they come (``w`` one index when every product
    has the same weight element); otherwise summed exactly per value (``inverse`` numbers each
    product's value among the distinct ``targets``)."""

    __slots__ = ("targets", "inverse", "x", "w", "assign")
    grid = None     # no block of a matrix product: the values it adds into are ``targets``

    def __init__(self, targets, x, w, inverse: np.ndarray | None) -> None:
        self.targets, self.inverse, self.x, self.w = targets, inverse, x, w
        self.assign = False     # write into ``targets`` (a run that starts at zero, no other product there)

    @classmethod
    def of(cls, targets: np.ndarray, x: np.ndarray, w: np.ndarray, bound: int, sources: _Sources) -> "_PerChannel":
        """The products ``targets[k] += x[k] * w[k]`` (value numbers below ``bound``, the
        operands' codes in ``sources``)."""
        if not _distinct(targets, bound):
            targets, inverse = np.unique(targets, return_inverse=True)
            return cls(targets, sources.resolve(x), sources.resolve(w), inverse)
        w = int(sources.resolve(w[:1])[0]) if w.size and (w == w[0]).all() else sources.gather(w)
        return cls(targets, sources.gather(x), w, None)

    def renumbered(self, renumber: np.ndarray) -> "_PerChannel":
        """These products adding into the values ``renumber`` maps their targets to."""
        targets = renumber[self.targets]
        return _PerChannel(targets if self.inverse is not None else _run_of(targets), self.x, self.w, self.inverse)

    def call(self, source: _Vector, values: np.ndarray, scratch: np.ndarray) -> Callable[[], object]:
        """The products as a call without arguments over these vectors (``scratch`` unused)."""
        x = self.x
        if self.inverse is None and isinstance(self.w, int) and isinstance(self.targets, _Span) and \
                x.index is None and x.rows_at is None and x.size == x.starts.size * _tile(source):
            # whole rows times one weight element: compiled, one pass without a gathered copy
            return kernels.scaled_rows(_tile(source), self.assign).bind(source.data, x.starts, self.w, values,
                                                                        self.targets.start)
        return partial(self.run, source, values)

    def run(self, source: _Vector, values: np.ndarray) -> None:
        """The products in numpy (:meth:`call` binds the compiled pass where it applies)."""
        if self.inverse is not None:
            products = np.multiply(source.data[self.x], source.data[self.w], dtype=np.int32)   # exact
            # float64 sums are exact below 2**53, i.e. for up to 2**39 products per value
            sums = np.bincount(self.inverse, weights=products, minlength=self.targets.size)
            values[self.targets] += sums.astype(np.int64).astype(np.int32)     # modulo 2**32, as int32 wraps
            return
        x = self.x
        w = source.data[self.w] if isinstance(self.w, int) else self.w.read(source)
        products = np.multiply(x.read(source), w, dtype=np.int32)     # exact: at most 2**14
        if self.assign:
            np.copyto(self.targets.of(values), products)
            return
        if isinstance(self.targets, _Span):
            target = self.targets.of(values)
            target += products
        else:
            values[self.targets] += products                           # distinct: no two add into one


class _TapSum:
    """DWMACs that each add all their steps into one tile (a depthwise kernel's taps):
    ``targets[d] += sum_s x[d, s] * w[d, s][None, :]``, ``x`` ``[D, steps, t, t]`` and ``w``
    ``[D, steps, t]`` indices into the source vector, one multiply and one sum for all of them."""

    __slots__ = ("targets", "x", "w", "ftype", "unique", "assign")
    grid = None     # the values it adds into are ``targets``

    def __init__(self, targets, x: np.ndarray, w: np.ndarray, ftype, unique: bool) -> None:
        self.targets, self.x, self.w, self.ftype, self.unique = targets, x, w, ftype, unique
        self.assign = False     # write into ``targets`` (a run that starts at zero, no other product there)

    def renumbered(self, renumber: np.ndarray) -> "_TapSum":
        """These products adding into the values ``renumber`` maps their targets to."""
        targets = renumber[self.targets]
        return _TapSum(_run_of(targets) if self.unique else targets, self.x, self.w, self.ftype, self.unique)

    def call(self, source: _Vector, values: np.ndarray, scratch: np.ndarray) -> Callable[[], object]:
        """The tap sums as a call without arguments over these vectors (``scratch`` unused)."""
        # int8 x int8 products are exact in the kernel's int32 sums, and in numpy's float32 sums
        # of up to 1024 of them (below 2**24); more are summed in float64 (exact below 2**53), then reduced modulo
        # 2**32 as int32 wraps
        if self.ftype is np.float32 and self.x.by_rows and self.w.by_rows and isinstance(self.targets, _Span):
            # compiled: each output vector summed in registers from the source's rows (numpy
            # would gather every tap's rows first: 9-49 copies of the input)
            d, steps, p, t = self.x.shape
            return kernels.tap_sum(t, self.assign).bind(source.data, self.x.starts.reshape(d, steps, p),
                                                        self.w.starts.reshape(d, steps), values, self.targets.start)
        return partial(self.run, source, values)

    def run(self, source: _Vector, values: np.ndarray) -> None:
        """The tap sums in numpy (:meth:`call` binds the compiled pass where it applies)."""
        w = self.w.read(source)
        if self.ftype is np.float32 and self.x.by_rows:
            # a few tiles' taps at a time: gathered into cache and summed there (the taps of a
            # depthwise kernel read each input element 9-49 times: all at once is 10-100x the
            # input in memory)
            d, steps, p, c = self.x.shape
            sums = np.empty((d, p, c), np.float32)
            chunk = max(1, _TAPS_AT_ONCE // (steps * p * c))
            for lo in range(0, d, chunk):
                np.einsum("dspc,dsc->dpc", self.x.part(source, lo, lo + chunk), w[lo:lo + chunk],
                          out=sums[lo:lo + chunk], dtype=np.float32)
            if self.assign:
                np.copyto(self.targets.of(values), sums, casting="unsafe")
                return
            sums = sums.astype(np.int32)
        elif self.ftype is np.float32:
            sums = np.einsum("dspc,dsc->dpc", self.x.read(source), w, dtype=np.float32).astype(np.int32)
        else:
            x = self.x.read(source)
            sums = np.einsum("dspc,dsc->dpc", x, w, dtype=np.float64).astype(np.int64).astype(np.int32)
        if self.assign:
            np.copyto(self.targets.of(values), sums)
        elif isinstance(self.targets, _Span):
            target = self.targets.of(values)
            target += sums
        elif self.unique:
            values[self.targets] += sums
        else:                                   # several DWMACs add into one tile
            np.add.at(values, self.targets, sums)


class FusedPlan:
    """The batched execution of one stream (see the module doc); built by :func:`fuse`."""

    def __init__(self, b: _Builder, products, alus, stores, acc_loads, inp_final, wgt_final, acc_final) -> None:
        self.inp_n, self.wgt_n, self.acc_n, self.values, self.tile = b.inp_n, b.wgt_n, b.acc_n, b.values, b.tile
        self.f_slots, self.i_slots = dict(b.f.slots), dict(b.i.slots)
        kept = b.f.kept
        self.inp_kept, self.wgt_kept = kept[kept < b.inp_n], kept[kept >= b.inp_n] - b.inp_n
        self.f_pads, self.i_pads = b.f.pad_values(np.int8), b.i.pad_values(np.int32)
        self.f_base = b.f.base
        self.f_extra = np.concatenate(b.f.extra) if b.f.extra else None
        self.sizes = {slot: b.buffers[slot].size for slot in (*b.f.slots, *b.i.slots, *(s[0] for s in b.stores))}
        self.products, self.alus, self.stores, self.acc_loads = products, alus, stores, acc_loads
        # what each scratchpad ends with (the elements the stream changed), None for nothing
        self.inp_final, self.wgt_final, self.acc_final = inp_final, wgt_final, acc_final
        # both scratchpads' kept elements as one take, and what they end with as one copy, where
        # the simulator has them in one array (_scratchpads): a call each, not two
        self.kept = np.concatenate([self.inp_kept, self.wgt_kept + self.inp_n])
        self.pads_final = inp_final[0].then(wgt_final[0], self.inp_n) \
            if all(final is not None and isinstance(final[0], _Copies) for final in (inp_final, wgt_final)) else None
        # the host buffers written: a STORE's copy is compiled for the dtype it was made for
        self.dtypes = {s[0]: b.buffers[s[0]].dtype for s in b.stores}
        self.matmuls = len(products)
        self.i_base = sum(self.sizes[slot] for slot in self.i_slots) + self.i_pads.size
        self.f_size = self.f_base + (0 if self.f_extra is None else self.f_extra.size)
        written = dict.fromkeys(s[0] for s in stores)
        self._apart = [(r, w) for r in (*self.f_slots, *self.i_slots) for w in written if r != w]
        self._unbound()

    def _unbound(self) -> None:
        """No vectors, calls nor tuples of buffers yet (a plan's own: what :meth:`_bind` and
        :meth:`prepare` make)."""
        # the vectors a run works in, over its simulator's workspace (see _bind): the source
        # vector, the value vector, the int32 sources of ACC LOADs, and the ALU batches as
        # calls bound to views of them; remade when the workspace arrays are other ones
        self._on: tuple = ()
        self._source = self._scratch = self._ints = self._packed = None
        self._product_steps: list = []
        self._alu_steps: list = []
        self._passes: dict[int, list[_Chain]] = {}      # passes of chains a STORE may join (_alu_steps)
        # by id, the last few tuples of buffers found laid out as assumed: (the tuple, the run's calls on it)
        self._steps: dict[int, tuple] = {}

    def with_operands(self, operands: dict, sim) -> "FusedPlan":
        """This plan for a stream of its stream's shape (see :class:`Shapes`) on ``sim``: each
        ALU step's operand ``(op, operand)`` of this one's replaced by ``operands[op, operand]``.
        Shares all but the ALU batches' programs and what binding makes (the index arrays, views
        and gathers are read-only)."""
        plan = copy.copy(self)
        plan._unbound()
        plan.alus = [(tuple(step if step[1] is None or step[2] is None else (*step[:2], operands[step[1:]])
                            for step in program), *rest) for program, *rest in self.alus]
        plan._sim = sim
        return plan

    def run(self, buffers: Buffers, sim=None) -> bool:
        """Execute on ``buffers`` (and ``sim``'s scratchpads; the builder's by default).
        False, with nothing done, when the host buffers are not laid out as the plan
        assumes (other sizes, or a buffer read that shares memory with one written)."""
        steps = self.prepare(buffers, sim)
        if steps is None:
            return False
        for step in steps:
            step()
        return True

    def prepare(self, buffers: Buffers, sim=None) -> Optional[list]:
        """The calls a run on ``buffers`` makes (see :meth:`run`), or None when the host
        buffers are not laid out as the plan assumes; made once for a tuple of buffers,
        which is remembered (a session's replay gives the same tuple again)."""
        sim = sim or self._sim
        self._bind(sim)
        steps = self._steps.get(id(buffers))
        if steps is None or steps[0] is not buffers:
            for slot, size in self.sizes.items():
                if buffers[slot].size != size:
                    return None
            if any(buffers[slot].dtype != dtype for slot, dtype in self.dtypes.items()):
                return None
            # Every read happens before every write here: a buffer read must not share memory
            # with another one written (the same slot was checked when the plan was made).
            if any(np.may_share_memory(buffers[r], buffers[w]) for r, w in self._apart):
                return None
            steps = (buffers, self._calls(buffers, sim))
            if type(buffers) is tuple:      # the same tuple again (a session's replay) runs these calls again
                remember(self._steps, buffers, steps)
        return steps[1]

    def _calls(self, buffers: Buffers, sim) -> list[Callable[[], object]]:
        """The run on ``buffers`` as calls without arguments, in order, each one numpy call
        (or compiled kernel) over views made here: a replayed stream runs the same tuple of
        buffers call after call, and a hundred streams a model call each making their views,
        index objects and checks again cost more than the small ones' arithmetic. Only the
        contents of the arrays change from one run to the next, never which memory a call reads
        or writes (the workspace's arrays are bound in :meth:`_bind`, which drops these calls
        when they are replaced)."""
        source, vector = self._source, self._scratch
        values = vector.data
        calls: list[Callable[[], object]] = []
        # the source vector, refilled each run: the scratchpads' kept elements, the host data
        # and pads, then its extra rows (copies of what is there before)
        at = 0
        both = _scratchpads(sim, self.inp_n)
        # (indices within the scratchpads: "clip" takes them as they are, unbuffered)
        if both is not None and self.inp_kept.size and self.wgt_kept.size:
            calls.append(partial(both.take, self.kept, out=source.data[:self.kept.size], mode="clip"))
            at = self.kept.size
        for pad, kept in ((sim.inp, self.inp_kept), (sim.wgt, self.wgt_kept)) if not at else ():
            if kept.size:
                calls.append(partial(pad.take, kept, out=source.data[at:at + kept.size], mode="clip"))
                at += kept.size
        calls += _concatenated(source.data[at:self.f_base], [buffers[s] for s in self.f_slots] + [self.f_pads])
        if self.f_extra is not None:
            calls.append(partial(source.data.take, self.f_extra, out=source.data[self.f_base:], mode="clip"))
        # values written before they are read (see _layout) need no zeroing, the others are
        # set here: nothing is kept in the vector from one run to the next
        lo, hi = self.live
        if lo < hi:
            calls.append(partial(_copyto, values[lo:hi], sim.acc[lo:hi]))
        calls += [partial(values[lo:hi].fill, 0) for lo, hi in self.zero]
        if self.acc_loads is not None:
            ints, parts = self._ints, [buffers[s] for s in self.i_slots] + [self.i_pads]
            whole = [part for part in parts if part.size]
            if len(whole) == 1 and whole[0].size == ints.data.size and whole[0].dtype == np.int32 \
                    and whole[0].ndim == 1 and whole[0].flags.c_contiguous:
                # one int32 host buffer and no pads (a bias, a residual): read where it is, not
                # copied into the workspace's int32 vector first (this tuple's calls only)
                ints = _Vector(whole[0], self.tile)
            else:
                calls += _concatenated(ints.data, parts)
            calls.append(_copied(values, self.acc_loads[0], ints, self.acc_loads[1]))
        calls += self._product_steps
        alu_steps, stored = self._stored_in_passes(buffers)
        calls += alu_steps
        for k, (slot, mode, dst, src) in enumerate(self.stores):
            if k not in stored:
                calls.append(_stored(buffers[slot], mode, dst, vector, src))
        finals = ((sim.inp, self.inp_final, source), (sim.wgt, self.wgt_final, source),
                  (sim.acc, self.acc_final, vector))
        if both is not None and self.pads_final is not None:
            calls.append(self.pads_final.bound(source.data, both))
            finals = finals[2:]
        for pad, final, read in finals:
            if final is not None:
                calls.append(_copied(pad, final[0], read, final[1]))
        return calls

    def _stored_in_passes(self, buffers: Buffers) -> tuple[list[Callable[[], object]], set[int]]:
        """The ALU steps for ``buffers``, and the STOREs (by index) that are steps of their passes
        instead of calls of their own: a STORE to an int8 buffer no other one writes, of the
        first lanes of every row a pass of chains makes last (no later step writes over them)
        into rows one after the other there, is written by the pass while it has them at hand
        (a pass over the values and a call fewer). All reads of host buffers happen before, and
        nothing reads a buffer written, so it may be written before the other STOREs."""
        steps, stored = self._alu_steps, set()
        slots = [slot for slot, *_ in self.stores]
        passes = dict(self._passes)
        for k, (slot, mode, dst, src) in enumerate(self.stores):
            target = buffers[slot]
            if mode is StoreMode.INT32 or slots.count(slot) > 1 or target.dtype != np.int8 \
                    or not target.flags.c_contiguous:
                continue
            for index, chains in passes.items():
                rows = _rows_stored(dst, src, chains[-1], target.size)
                if rows is not None:
                    steps = list(steps) if steps is self._alu_steps else steps
                    steps[index] = _chains_call(chains, self._scratch, self._source,
                                                (target.reshape(-1), mode, *rows))
                    stored.add(k)
                    del passes[index]
                    break
        return steps, stored

    def _bind(self, sim) -> None:
        """Work in ``sim``'s workspace: one source, value and int32 vector for all the plans of
        a simulator, which runs one stream at a time. A model's plans each with their own
        vectors touch tens of MB per call (76 MB of values for the PaddleOCR classifier's 107
        streams), fetched from memory every call; shared, the largest plan's fit in L2.
        Binding anew makes the calls of the tuples of buffers remembered again, in the new
        arrays (those made before worked in the arrays the workspace had, and kept them alive):
        a tuple a session's replay gives next call runs at once."""
        space = sim.workspace
        on = self._on
        # still the workspace's arrays (one is only ever replaced by a larger one) and the
        # scratchpads of the same simulator: bound
        if on and on[0] is space.get("source") and on[1] is space.get("values") and on[2] is space.get("ints") \
                and on[3] is sim and on[4] is space.get("packed"):
            return
        packs = max((p.packs() for p in self.products if isinstance(p, _Product)), default=0)
        spill = _Spill.need(self.alus, self.tile)
        on = (_workspace(space, "source", np.int8, self.f_size),
              _workspace(space, "values", np.int32, self.values + spill),
              _workspace(space, "ints", np.int32, self.i_base), sim, _workspace(space, "packed", np.int16, packs))
        self._source = _Vector(on[0][:self.f_size], self.tile)
        self._scratch = _Vector(on[1][:self.values + spill], self.tile)
        self._ints = _Vector(on[2][:self.i_base], self.tile)
        self._packed = on[4]
        # the products and ALU batches work in the workspace alone: bound here, once, not
        # again for each tuple of host buffers (a model's tensors move during its first calls)
        self._product_steps = [product.call(self._source, self._scratch.data, self._packed) for product in self.products]
        self._alu_steps, self._passes = _alu_steps(self._scratch, self._source, self.alus,
                                                   _Spill(self.values, spill))
        self._on = on
        kept = [buffers for buffers, _ in self._steps.values()]
        self._steps.clear()
        for buffers in kept:
            remember(self._steps, buffers, (buffers, self._calls(buffers, sim)))
        sim.plans.add(self)


def _scratchpads(sim, inp_n: int) -> Optional[np.ndarray]:
    """The array ``sim``'s INP (``inp_n`` elements) and WGT are views of, one after the other,
    as a :class:`~accel.hw.sim.Simulator` makes them; None when they are not."""
    inp, wgt = sim.inp, sim.wgt
    base = inp.base
    if base is None or wgt.base is not base or base.ndim != 1 or inp.size != inp_n or \
            inp.size + wgt.size != base.size or inp.ctypes.data != base.ctypes.data or \
            wgt.ctypes.data != base.ctypes.data + inp.nbytes:
        return None
    return base


def _concatenated(out: np.ndarray, parts: list) -> list[Callable[[], object]]:
    """``out[:] = concatenate(parts)`` as calls (none for empty parts; one copy for one part).

    >>> out = np.zeros(3)
    >>> calls = _concatenated(out, [np.ones(2, np.int8), np.zeros(0), np.full(1, 5)]); _ = [call() for call in calls]
    >>> out.tolist()
    [1.0, 1.0, 5.0]
    """
    parts = [part for part in parts if part.size]
    if len(parts) > 1:
        return [partial(_concatenate, parts, out=out)]
    return [partial(_copyto, out, parts[0], casting="same_kind")] if parts else []


def _copied(target: np.ndarray, index, vector: _Vector, src) -> Callable[[], object]:
    """``target[index] = vector[src]`` as a call: where ``index`` is a view (a :class:`_Span` or
    :class:`_View`), one copy from a view of ``vector`` (:func:`_view_of`) or of a gather of
    its whole rows, over views made once; a :class:`_Copies` ``index`` copies run by run (``src``
    None).

    >>> v = _Vector(np.arange(10, dtype=np.int32), 2); target = np.zeros(4, np.int32)
    >>> _ = _copied(target, _Span(0, (2, 2)), v, _Gather.of_starts(np.array([6, 1]), (2, 2), 2))(); target.tolist()
    [6, 7, 1, 2]
    """
    if isinstance(index, _Copies):
        return index.bound(vector.data, target)
    if isinstance(index, (_Span, _View)):
        into = index.of(target)
        read = _view_of(vector, src)
        if read is not None:
            return partial(_copyto, into, read, casting="unsafe")
        if isinstance(src, _Gather) and src.index is None and src.rows_at is None and into.flags.c_contiguous \
                and into.dtype == vector.data.dtype and into.size == src.size == src.starts.size * _tile(vector):
            # whole rows of the vector, gathered as items of its row view (np.take copies such
            # items one by one, ten times slower than indexing)
            rows, starts, into_rows = vector.rows, src.starts, into.reshape(-1).view(vector.rows.dtype)

            def gather_rows() -> None:
                into_rows[...] = rows[starts]
            return gather_rows
    return lambda: _copyto(index.of(target), _at(vector, src), casting="unsafe")


def _view_of(vector: _Vector, index) -> Optional[np.ndarray]:
    """``vector[index]`` as a view of its data, made once (a :class:`_Span`, a :class:`_View`,
    a :class:`_Gather` of rows laid out as a matrix), or None: a gather to make at each run.

    >>> _view_of(_Vector(np.arange(8), 2), _Span(2, (2, 2))).tolist(), _view_of(_Vector(np.arange(8), 2), np.array([1]))
    ([[2, 3], [4, 5]], None)
    """
    if isinstance(index, (_Span, _View)):
        return index.of(vector.data)
    if isinstance(index, _Gather) and index.strided is not None:
        return index.read(vector)
    return None


def _tile(vector: _Vector) -> int:
    """The elements of one of ``vector``'s rows (0 for a vector shorter than a row)."""
    return vector.rows.itemsize // vector.data.itemsize if vector.rows is not None else 0


def _stored(target: np.ndarray, mode: StoreMode, dst, vector: _Vector, src) -> Callable[[], object]:
    """A plan's STOREs into one host buffer ``target`` of one mode as a call: ``target[dst] =
    vector[src]``, clipped to int8's range first when they saturate, cast as assignment casts
    (an int keeps its low bytes); over views made once where ``dst`` and ``src`` are views.

    >>> v = _Vector(np.arange(250, 254, dtype=np.int32), 2); out = np.zeros(4, np.int8)
    >>> _ = _stored(out, StoreMode.SATURATE, _Span(0, (4,)), v, _Span(0, (4,)))(); out.tolist()
    [127, 127, 127, 127]
    >>> _ = _stored(out, StoreMode.WRAP, _Span(0, (4,)), v, _Span(0, (4,)))(); out.tolist()
    [-6, -5, -4, -3]
    """
    if isinstance(dst, (_Span, _View)):     # straight into the host buffer (int8: keeps the low byte)
        into = dst.of(target)
        out = _view_of(vector, src)
        if out is not None:
            if mode is StoreMode.SATURATE:  # clipped to int8's range, then exact in int8: one pass
                return partial(_clip, out, -128, 127, out=into, casting="unsafe")
            return partial(_copyto, into, out, casting="unsafe")
        if mode is StoreMode.SATURATE:
            return lambda: _clip(src.read(vector), -128, 127, out=into, casting="unsafe")
        return lambda: _copyto(into, src.read(vector), casting="unsafe")
    return dst.bound(vector.data, target, mode is StoreMode.SATURATE)     # a _Copies


def _rows_stored(dst, src, chain: "_Chain", size: int) -> Optional[tuple[int, int]]:
    """``(at, lanes)`` when a STORE of ``src`` to ``dst`` (views of the values and of a host
    buffer of ``size`` elements) copies the first ``lanes`` of every row ``chain`` writes, in
    order, into the host elements from ``at`` on; else None.

    >>> chain = _Chain((kernels.RUN, 0, (0, 8)), (8, 16), 4)
    >>> _rows_stored(_Span(3, (2, 2)), _View(8, (2, 2), (4, 1)), chain, 9)      # two lanes of each row
    (3, 2)
    >>> _rows_stored(_Span(3, (4,)), _Span(8, (4,)), chain, 9) is None       # the first row, then the second
    True
    """
    rows = chain.rows()
    if not isinstance(src, (_Span, _View)) or not isinstance(dst, (_Span, _View)) or src.size != dst.size \
            or not src.size or src.size % rows or src.size // rows > chain.tile:
        return None
    lanes = src.size // rows
    read = (chain.writes[0] + np.arange(rows)[:, None] * chain.tile + np.arange(lanes)).reshape(-1)
    if not np.array_equal(src.of(np.arange(_hull(src, chain.tile)[1])).reshape(-1), read):
        return None
    at = _hull(dst, 1)[0]
    if _hull(dst, 1)[1] > size or not np.array_equal(dst.of(np.arange(_hull(dst, 1)[1])).reshape(-1),
                                                     at + np.arange(src.size)):
        return None
    return at, lanes


def remember(seen: dict, buffers: tuple, entry: object = None) -> None:
    """Add ``buffers`` to ``seen`` (by id; held there, in ``entry`` when given, so no other tuple
    takes its id), the oldest going first beyond :data:`_REMEMBERED`: what a plan (or a
    Program) found fit to run on, which a session's replay gives again, one tuple of views
    per group that runs the stream and place its hosts take in turn.

    >>> seen = {}
    >>> for n in range(_REMEMBERED + 2): remember(seen, (n,))
    >>> len(seen) == _REMEMBERED, (0,) in seen.values(), (_REMEMBERED + 1,) in seen.values()
    (True, False, True)
    """
    if len(seen) >= _REMEMBERED:
        del seen[next(iter(seen))]
    seen[id(buffers)] = buffers if entry is None else entry


# A session keeps the views of a few layouts of its hosts (4) per place a group runs at in a
# call (a grouped convolution's, once per group: RegNet's 25), and groups whose streams are the
# same share one Program and plan (one of the PaddleOCR classifier's runs at 9 places, each with
# its own tuple): fewer than they give in turn, and each run would miss
_REMEMBERED = 64


#: The workspace role of the array building a plan renumbers values in (see _layout).
_RENUMBER = "building: renumber"
_OPERANDS = "building: ALU operands"


def drop_building(space: dict) -> None:
    """Let go of the arrays that building plans keeps in a simulator's workspace ``space``
    from one stream to the next (:attr:`accel.hw.sim.Simulator.workspace`): called when a
    model's call ends, so that a model whose plans are all built keeps only what runs them.

    >>> space = {}; _ = _workspace(space, _RENUMBER, np.intp, 8), _workspace(space, _OPERANDS, np.intp, 8)
    >>> drop_building(space); space
    {}
    """
    space.pop(_RENUMBER, None)
    space.pop(_OPERANDS, None)


def settle(sim) -> None:
    """Bind every plan of ``sim`` to its workspace's arrays as they are now: called when a
    model's call ends. A first call builds its plans one by one, the workspace growing for
    the larger ones; the plans built before the last growth would otherwise bind again at
    the next call, which then pays for a hundred plans' binding (~50 ms for the PaddleOCR
    classifier), not the first one that builds them (seconds). Nothing to do, and nothing
    done, when no workspace array was replaced since the last time (every later call)."""
    arrays = tuple(sim.workspace.values())
    if len(arrays) == len(sim.settled) and all(a is b for a, b in zip(arrays, sim.settled)):
        return
    for plan in list(sim.plans):
        plan._bind(sim)
    sim.settled = arrays


def _workspace(space: dict, role: str, dtype, size: int) -> np.ndarray:
    """An array of at least ``size`` elements of ``dtype`` for ``role`` in a simulator's
    workspace, grown by half again at least when too small (a model's first streams, each
    larger, do not each leave an array behind).

    >>> space = {}; a = _workspace(space, "values", np.int32, 10); _workspace(space, "values", np.int32, 8) is a
    True
    >>> _workspace(space, "values", np.int32, 11).size
    15
    """
    array = space.get(role)
    if array is None or array.size < size:
        array = space[role] = np.empty(max(size, 0 if array is None else array.size * 3 // 2), dtype)
    return array


def _alu_steps(vector: _Vector, source: _Vector, alus: list, spill: Optional["_Spill"] = None
               ) -> tuple[list[Callable[[], object]], dict[int, list["_Chain"]]]:
    """A plan's ALU and LUT batches as calls, in an order that gives every batch what it reads,
    and by their index, the passes of chains (see :func:`_chains_call`) whose results no later
    call writes over: a STORE of them may be a step of their pass (:meth:`FusedPlan._calls`).

    A batch's steps (an ALU chain instruction's), and those of a batch written over the run of
    values the batch before it made, in place (a requantisation's chain, then a lookup),
    continue that batch's chain: a chain is one call of the compiled
    :func:`~accel.hw.kernels.alu_chain`, a few tile rows at a time through all its steps in
    registers, instead of one numpy pass over memory per step. A chain runs when a later batch
    touches what it writes, or writes what it reads (or at the end): nothing else reads a
    chain's values between its steps (a batch works in place only over values no other batch or
    STORE reads, see :func:`_layout`), and a batch reads only what batches of lower levels made,
    all before it in ``alus``. An operand the
    kernel cannot read as rows (some of its rows gathered element by element, rows not ``tile``
    wide) is copied into whole rows past the plan's values (``spill``, see :class:`_Spill`) just
    before its chain runs; without room there, such a batch is numpy calls (:func:`_alu_calls`).
    Chains next to each other that may share a pass (a requantisation's over the rows of one
    product: its bias, zero point and scale) run in one."""
    tile = _tile(vector)
    steps: list = []        # chains, and numpy calls with the values they write
    chains: dict[tuple[int, int], _Chain] = {}     # the open chains by the run they write

    def flush(keep: Optional[_Chain], reads: list, writes: tuple) -> None:
        # run, in the order they began, the open chains the next batch depends on: those that
        # write what it reads or writes, or read what it writes
        for key, chain in list(chains.items()):
            touched = (chain.writes, *(hull for _, _, hull in chain.reads))
            if chain is not keep and (any(_overlap(chain.writes, r) for r in reads) or
                                      any(_overlap(w, writes) for w in touched)):
                steps.append(chain)
                del chains[key]

    for alu in alus:
        program, new, old, src = alu
        rows = _chain_rows(alu, tile, spill) if tile else None
        copies = spill.taken() if spill is not None else []
        if rows is None:
            flush(None, [_hull(m, tile) for m in (old, src) if m is not None], _hull(new, tile))
            steps += [(call, _hull(new, tile)) for call in _alu_calls(vector, source, *alu)]
            continue
        writes = (new.start, new.stop)
        start, src_rows, codes = rows
        chain = chains.get(writes)
        reads = [] if src_rows is None else [src_rows[2]]
        if chain is not None and isinstance(old, _Span) and (old.start, old.stop) == writes:
            flush(chain, reads, writes)     # the next steps of ``chain``, over what its last step made
        else:
            flush(None, [start[2], *reads], writes)
            chains[writes] = chain = _Chain(start, writes, tile)
        for code, operand in codes:
            chain.add(code, operand)
        chain.copies += copies
    flush(None, [(0, vector.data.size)], (0, 0))
    passes: list = []       # lists of chains, and numpy calls with the values they write
    for step in steps:
        if isinstance(step, _Chain) and passes and isinstance(passes[-1], list) and step.follows(passes[-1]):
            passes[-1].append(step)
        else:
            passes.append([step] if isinstance(step, _Chain) else step)
    calls: list[Callable[[], object]] = []
    last: dict[int, list[_Chain]] = {}
    for index, step in enumerate(passes):
        if isinstance(step, tuple):
            calls.append(step[0])
            continue
        calls.append(_chains_call(step, vector, source))
        made = step[-1].writes
        if not any(_overlap(made, writes) for later in passes[index + 1:]
                   for writes in ([later[1]] if isinstance(later, tuple) else [chain.writes for chain in later])):
            last[index] = step
    return calls, last


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _hull(index, tile: int) -> tuple[int, int]:
    """``(lo, hi)``: a range of value numbers that holds every value ``index`` reads or writes
    (a :class:`_Span`, :class:`_View`, :class:`_Gather` or index array).

    >>> _hull(_View(10, (2, 3), (-4, 1)), 2), _hull(np.array([7, 3]), 2)
    ((6, 13), (3, 8))
    """
    if isinstance(index, _Span):
        return index.start, index.stop
    if isinstance(index, _View):
        lo = index.start + sum(min(0, (n - 1) * s) for n, s in zip(index.shape, index.strides))
        hi = index.start + sum(max(0, (n - 1) * s) for n, s in zip(index.shape, index.strides))
        return lo, hi + 1
    if isinstance(index, _Gather):
        if index.index is not None:
            return _hull(index.index, tile)
        bounds = [(int(index.starts.min()), int(index.starts.max()) + tile)] if index.starts.size else []
        if index.elements is not None and index.elements.size:
            bounds.append(_hull(index.elements, tile))
        return (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else (0, 0)
    index = np.asarray(index)
    return (int(index.min()), int(index.max()) + 1) if index.size else (0, 0)


def _chain_rows(alu: tuple, tile: int, spill: Optional["_Spill"] = None) -> Optional[tuple]:
    """An ALU batch (its steps, or a LUT's lookup) as :func:`~accel.hw.kernels.alu_chain`
    takes it: ``(start, src, [(code, operand), ...])``, its first operand, its ``src`` (None
    when no step reads it) and each step's code and operand, operands as :func:`_row_operand`
    gives them (``src`` the same rows for every step that reads it; for a lookup ``operand`` is
    its table's indices in the source vector; an operand that is no rows copied into rows of
    ``spill`` when given), or None when the kernel cannot read them, or the results are not a
    run of whole rows.

    >>> steps = ((np.add, AluOp.ADD, None), (np.maximum, AluOp.MAX, 0))
    >>> start, src, codes = _chain_rows((steps, _Span(8, (4,)), _Span(8, (4,)), _Span(0, (4,))), 2)
    >>> start, src, [(AluOp(code).name, operand) for code, operand in codes]
    ((1, 8, (8, 12)), (1, 0, (0, 4)), [('ADD', (1, 0, (0, 4))), ('MAX', (0, 0, None))])
    """
    program, new, old, src = alu
    if not isinstance(new, _Span) or new.size % tile:
        return None
    start = _row_operand(old, tile) or (spill and spill.rows(old, tile))
    if start is None:
        return None
    rows = None
    if src is not None:
        rows = _row_operand(src, tile) or (spill and spill.rows(src, tile))
        if rows is None:
            return None
    return start, rows, [(kernels.LOOKUP, imm) if ufunc is None else
                         (int(op), rows if imm is None else (kernels.IMM, imm, None))
                         for ufunc, op, imm in program]


class _Spill:
    """Value numbers past a plan's own, from ``at`` on, ``size`` of them: where an ALU
    operand that :func:`~accel.hw.kernels.alu_chain` cannot read as rows of the value vector
    (an element-wise add's operand with some of its tile rows gathered element by element, a
    view whose rows are not ``tile`` wide) has those rows copied, at each run, just before its
    chain, so that the chain reads it as whole rows (one compiled pass instead of numpy's gather
    into a new array and a pass per step).

    >>> spill = _Spill(8, 4); g = _Gather(np.array([0, 1, 5, 2]), 2)      # a row, then two elements
    >>> kind, starts, hull = spill.rows(g, 2); starts.tolist(), hull, [(e.tolist(), at) for e, at in spill.taken()]
    ([0, 8], (0, 6), [([5, 2], 8)])
    """

    __slots__ = ("at", "end", "copies")

    def __init__(self, at: int, size: int) -> None:
        self.at, self.end = at, at + size
        self.copies: list[tuple[np.ndarray, int]] = []      # (elements, where their copies start)

    @staticmethod
    def need(alus: list, tile: int) -> int:
        """Room for every operand of ``alus`` that would be copied (at most: some batches do not chain)."""
        return sum(_spilled(index, tile)[2].size for alu in alus for index in alu[2:]
                   if index is not None and _row_operand(index, tile) is None and _spilled(index, tile) is not None)

    def rows(self, index, tile: int) -> Optional[tuple]:
        """``index`` as a ROWS operand of :func:`_row_operand`'s form, its rows that are no
        run of the value vector read from copies here (made by :meth:`taken`'s copies), or None."""
        spilled = _spilled(index, tile)
        if spilled is None or self.at + spilled[2].size > self.end:
            return None
        starts, rows, elements = spilled
        starts[rows] = self.at + np.arange(rows.size) * tile
        self.copies.append((elements, self.at))
        self.at += elements.size
        return kernels.ROWS, starts, _hull(index, tile)

    def taken(self) -> list[tuple[np.ndarray, int]]:
        """The copies the operands given out since the last call need, ``(elements, start)``."""
        copies, self.copies = self.copies, []
        return copies


def _spilled(index, tile: int) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(starts, rows, elements)`` of an operand read as ``size // tile`` rows: each row's
    start in the value vector (int64, those of ``rows`` to be set), the rows that are no run of
    it and their elements in order (intp); None when ``index`` is no whole number of rows.

    >>> _spilled(_View(0, (2, 2), (1, 2)), 2)[1:]
    (array([0, 1]), array([0, 2, 1, 3]))
    """
    size = index.size
    if size % tile or not size:
        return None
    starts = np.zeros(size // tile, np.int64)
    if isinstance(index, _Gather) and index.index is None:
        if index.rows_at is None or index.elements.size != (starts.size - index.rows_at.size) * tile:
            return None
        starts[index.rows_at] = index.starts
        rows = np.ones(starts.size, bool)
        rows[index.rows_at] = False
        return starts, np.flatnonzero(rows), index.elements.astype(np.intp)
    if isinstance(index, _Gather):
        elements = index.index
    elif isinstance(index, _View):
        elements = index.of(np.arange(_hull(index, tile)[1]))
    elif isinstance(index, np.ndarray):
        elements = index
    else:
        return None
    return starts, np.arange(starts.size), np.asarray(elements, np.intp).reshape(-1)


def _row_operand(index, tile: int) -> Optional[tuple]:
    """``(kind, value or row starts, hull)``: the values ``index`` reads as
    :func:`~accel.hw.kernels.alu_chain` reads an operand, a row of ``tile`` at a time: a run
    (RUN), rows that each start anywhere (ROWS: a view whose last axis holds whole rows, a
    gather of whole rows) or rows of one value (SPLAT: a view broadcast along its last axis),
    else None.

    >>> kind, starts, hull = _row_operand(_View(3, (2, 4), (10, 1)), 2)
    >>> kind == kernels.ROWS, starts.tolist(), hull
    (True, [3, 5, 13, 15], (3, 17))
    """
    if isinstance(index, _Span):
        return (kernels.RUN, index.start, (index.start, index.stop)) if index.size % tile == 0 else None
    if isinstance(index, _View):
        *outer, last = index.shape
        if last % tile or index.strides[-1] not in (0, 1):
            return None
        at = np.full((), index.start, np.int64)
        for n, stride in zip(outer, index.strides[:-1]):
            at = at[..., None] + np.arange(n, dtype=np.int64) * stride
        starts = (at[..., None] + np.arange(0, last, tile, dtype=np.int64) * index.strides[-1]).reshape(-1)
        return (kernels.ROWS if index.strides[-1] else kernels.SPLAT), starts, _hull(index, tile)
    if isinstance(index, _Gather) and index.index is None and index.rows_at is None and \
            index.size == index.starts.size * tile:
        return kernels.ROWS, index.starts.astype(np.int64), _hull(index, tile)
    return None


class _Chain:
    """The steps of ALU and LUT batches that each work in place on what the one before made,
    from the first one's operand ``start`` (see :func:`_alu_steps`), as one kernel call."""

    __slots__ = ("start", "writes", "tile", "steps", "reads", "copies")

    def __init__(self, start: tuple, writes: tuple[int, int], tile: int) -> None:
        self.start, self.writes, self.tile = start, writes, tile
        self.steps: list[tuple[int, object]] = []
        self.reads = [start]        # the operands of rows it reads, (kind, value or row starts, hull)
        self.copies: list[tuple[np.ndarray, int]] = []      # operands' rows copied before it runs (_Spill)

    def add(self, code: int, operand) -> None:
        self.steps.append((code, operand))
        if code != kernels.LOOKUP and operand[0] != kernels.IMM:
            self.reads.append(operand)

    def rows(self) -> int:
        return (self.writes[1] - self.writes[0]) // self.tile

    def follows(self, chains: list["_Chain"]) -> bool:
        """Whether this chain, run after ``chains`` (one after the other), may run in their
        pass instead, block of rows by block: over as many rows, reading what they write only
        as the same run (the same rows, written earlier in the block), writing nothing they
        read but a run they read as the same rows, nor what they write but the same run, and
        its copies (made before the pass) of nothing they write."""
        def apart(reads: list, writes: tuple[int, int]) -> bool:
            return all(not _overlap(hull, writes) or (kind == kernels.RUN and value == writes[0]) or
                       (kind != kernels.RUN and
                        not _rows_meet(value, 1 if kind == kernels.SPLAT else self.tile, writes))
                       for kind, value, hull in reads)
        return all(self.rows() == chain.rows() and apart(self.reads, chain.writes) and
                   apart(chain.reads, self.writes) and
                   (self.writes == chain.writes or not _overlap(self.writes, chain.writes)) and
                   not any(_overlap(_hull(elements, self.tile), chain.writes) for elements, _ in self.copies)
                   for chain in chains)


# Two steps by immediates that :func:`~accel.hw.kernels.alu_chain` runs as one (a requantisation's
# scale, rounding and clamp: a pass over the block each fewer).
_TWO_STEPS = {(int(AluOp.MUL), int(AluOp.SHR)): kernels.SCALE, (int(AluOp.ADD), int(AluOp.SHR)): kernels.ROUND,
              (int(AluOp.MIN), int(AluOp.MAX)): kernels.MIN_MAX, (int(AluOp.MAX), int(AluOp.MIN)): kernels.MAX_MIN}


def _rows_meet(starts: np.ndarray, width: int, writes: tuple[int, int]) -> bool:
    """Whether any of the rows of ``width`` values from ``starts`` on is in ``writes`` (a run
    whose hull holds it may still miss every row: a bias row, and rows copied far past it)."""
    return bool(((starts < writes[1]) & (starts + width > writes[0])).any())


def _chains_call(chains: list[_Chain], vector: _Vector, source: _Vector,
                 store: Optional[tuple[np.ndarray, StoreMode, int, int]] = None) -> Callable[[], object]:
    """Chains (one after the other, each :meth:`_Chain.follows` those before it) as one call of
    :func:`~accel.hw.kernels.alu_chain` without arguments over the value vector (which stays put
    between runs; LUT tables are read where the source vector holds them, or gathered from it at
    each run when one is no run there): one pass over their rows instead of one each. With
    ``store`` ``(target, mode, at, lanes)``, the pass also writes the first ``lanes`` of each of the
    last chain's rows into the int8 ``target`` from ``at`` on, one row after the other, narrowed
    as a STORE of ``mode`` narrows them (:func:`_stored`)."""
    import tvm_ffi

    bases: list[np.ndarray] = []
    tables = [operand for chain in chains for code, operand in chain.steps if code == kernels.LOOKUP]
    # the tables in place when each is a run of the source vector (a table a LOAD brought
    # whole), else copies of their entries (int8, like the source vector)
    in_place = bool(tables) and all(isinstance(_run_of(entries), _Span) for entries in tables)
    table = source.data if in_place else np.zeros(max(1, len(tables) * LUT_ENTRIES), np.int8)
    at = 0

    def encode(kind: int, value) -> tuple[int, int]:
        nonlocal at
        if kind in (kernels.ROWS, kernels.SPLAT):
            bases.append(value)
            at += value.size
            return kind, at - value.size
        return kind, int(value)
    program = []
    looked = 0
    for chain in chains:
        if program:     # the chain before written, this one begun
            program += [(kernels.WRITE, kernels.IMM, program_out), (kernels.START, *encode(*chain.start[:2]))]
        else:
            program.append((0, *encode(*chain.start[:2])))
        for code, operand in chain.steps:
            if code == kernels.LOOKUP:
                program.append((code, kernels.IMM, int(operand[0]) if in_place else looked * LUT_ENTRIES))
                looked += 1
            else:
                row = (code, *encode(*operand[:2]))
                two = _TWO_STEPS.get((program[-1][0], code)) if row[1] == kernels.IMM == program[-1][1] else None
                program[-1:] = [(two, program[-1][2], row[2])] if two is not None else [program[-1], row]
        program_out = chain.writes[0]
    target = np.zeros(1, np.int8)
    if store is not None:
        target, mode, to, lanes = store
        program.append((kernels.SATURATED if mode is StoreMode.SATURATE else kernels.WRAPPED, lanes, to))
    arrays = (vector.data, np.concatenate(bases) if bases else np.zeros(1, np.int64), table,
              np.array(program, np.int64), target)
    kernel = partial(kernels.alu_chain(chains[0].tile), *(tvm_ffi.from_dlpack(a) for a in arrays),
                     chains[0].rows(), program_out)
    # (into value numbers past every element they copy: "clip" takes them unbuffered)
    before = [partial(vector.data.take, elements, out=vector.data[start:start + elements.size], mode="clip")
              for chain in chains for elements, start in chain.copies]
    if tables and not in_place:
        before.append(partial(source.data.take, np.concatenate(tables), out=table, mode="clip"))
    if not before:
        return kernel

    def copied() -> None:
        for copy in before:
            copy()
        kernel()
    return copied


try:    # the ufunc np.clip wraps: its Python layer costs ~3 us a call, and a model call makes hundreds
    from numpy._core.umath import clip as _clip
except ImportError:     # pragma: no cover - numpy before 2
    _clip = np.clip
# (a run's calls are bound methods and ufuncs, not numpy's Python wrappers: np.take's costs ~2 us a
# call over the array's own method, np.concatenate's __array_function__ dispatch ~1 us)
_concatenate = getattr(np.concatenate, "_implementation", np.concatenate)
# (np.copyto's dispatch costs ~0.2 us of a ~0.5 us call over a small run, a model call ~170 of them)
_copyto = getattr(np.copyto, "_implementation", np.copyto)


def _alu_calls(vector: _Vector, source: _Vector, program: tuple, new, old, src) -> list[Callable[[], object]]:
    """An ALU batch of a plan that :func:`~accel.hw.kernels.alu_chain` cannot take, as numpy
    calls (:func:`_alu_step`): its first step from ``old`` into ``new``, the others in place over
    ``new`` (element by element: each reads only what it writes over, and ``src``)."""
    again = new if isinstance(new, _Span) else _Gather(np.asarray(new), _tile(vector) or 1)
    return [_alu_step(vector, source, *step, new, old if k == 0 else again, src) for k, step in enumerate(program)]


def _alu_step(vector: _Vector, source: _Vector, ufunc, op, imm, new, old, src) -> Callable[[], object]:
    """One step of an ALU batch (or a LUT's lookup) of a plan as a call without arguments over
    views of its value vector (which stays put between runs): the views and the immediate are
    made once."""
    values = vector.data
    if ufunc is None:       # a LUT, ``imm`` its table's entries in ``source``
        table = np.empty(LUT_ENTRIES, np.int32)
        entry = np.empty(new.shape, np.intp)
        out = new.of(values) if isinstance(new, _Span) else None

        def lookup() -> None:
            table[:] = source.data[imm]     # int8 values
            _clip(_at(vector, old), -128, 127, out=entry)
            np.add(entry, 128, out=entry)
            if out is None:
                values[new] = table[entry]
            else:       # after ``entry`` is made: ``new`` may be ``old``, in place
                np.take(table, entry, out=out, mode="clip")     # in range: clipping changes nothing
        return lookup
    if isinstance(new, _Span) and (imm is not None or op not in OPERAND_RANGE):
        out = new.of(values)
        # the new values never overlap an operand, unless written over ``old`` in place,
        # element by element (see _layout)
        a = _view_of(vector, old)
        b = np.int32(imm) if imm is not None else _view_of(vector, src)
        if a is not None and b is not None:
            return partial(ufunc, a, b, out=out)
        read_a = (lambda: a) if a is not None else partial(old.read, vector)
        read_b = (lambda: b) if b is not None else partial(src.read, vector)
        return lambda: ufunc(read_a(), read_b(), out=out)

    def general() -> None:
        rhs = np.int32(imm) if imm is not None else alu_operand(op, _at(vector, src))
        if isinstance(new, _Span):
            ufunc(_at(vector, old), rhs, out=new.of(values))
        else:
            values[new] = ufunc(_at(vector, old), rhs)
    return general


# What the cycle model and fuse read of an instruction but its immediates: every field but those
_UNSHAPED = frozenset(("imm", *CHAIN_IMM_FIELDS))
_SHAPE_FIELDS: dict[type, Callable] = {}
# A product by the immediate 0 in a shape: the steps before it are dropped (see _Program), so it
# is kept as itself, not ranked with the other immediates
_TIMES_ZERO = -1
_BY_IMMEDIATE = 0       # (any other step by an immediate: the immediate is in Shape.ranks)


class Shape(NamedTuple):
    """What the cycle model and :func:`fuse` read of a stream but its immediates (``key``: one
    number per instruction, see :class:`Shapes`); per step by an immediate (of an ALU or ALU chain
    instruction), in stream order, the rank of its ``(op, operand)`` among the distinct ones of the
    stream in the order they first come (``ranks``), and those pairs in rank order."""

    key: bytes
    ranks: np.ndarray
    pairs: list


class Shapes:
    """The schedules and plans made on one simulator, by the :class:`Shape` of their streams. The
    cycle model reads no immediate, and all a plan's structure depends on is the shape, the order
    the stream runs in and the host buffers' sizes and dtypes, and which steps by immediates have
    equal ``(op, operand)`` pairs (a batch's steps are its pairs: equal ones are one batch). A plan
    serves a stream of its shape whose steps are equal wherever the plan's are (its ranks a function
    of the plan's: batches the plan keeps apart whose steps are equal here compute the same), as a
    copy with the stream's operands where the plan's were (:meth:`FusedPlan.with_operands`). A step
    multiplying by the immediate 0 drops the steps before it: it is kept as itself in the key. A
    model's layers of one shape with other requantisation constants (a fifth of the PaddleOCR
    detector's instructions) then cost a copy instead of a schedule and a pass each.

    The last :data:`_SHAPES` schedules are held, and as many plans weakly (their Programs hold
    them); the shapes of instructions are numbered (a stream's is one number per instruction)
    until there are :data:`_SHAPE_IDS`, then forgotten with the schedules and plans."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}         # shape of an instruction -> its number
        self.timings: dict[bytes, Timing] = {}  # a stream's shape's key -> its schedule
        # plan key -> (a weak reference to the plan, or None for a stream fuse does not cover;
        # the shape of the plan's stream)
        self.plans: dict[tuple, tuple[Optional[Callable], Shape]] = {}

    def of(self, stream: Sequence[Instruction]) -> Shape:
        """The shape of ``stream``."""
        ids = self.ids
        if len(ids) > _SHAPE_IDS:
            # (numbers given again: the keys made of them go too)
            ids.clear()
            self.timings.clear()
            self.plans.clear()
        pairs: dict[tuple, int] = {}
        seen: dict[int, tuple[int, tuple]] = {}     # id of an instruction -> its shape's number, ranks
        numbers, ranks = [], []
        for ins in stream:
            known = seen.get(id(ins))
            if known is None:
                shape, mine = _shape(ins, pairs)
                n = ids.get(shape)
                if n is None:
                    n = ids[shape] = len(ids)
                known = seen[id(ins)] = (n, mine)
            numbers.append(known[0])
            if known[1]:
                ranks += known[1]
        return Shape(np.array(numbers, np.int32).tobytes(), np.array(ranks, np.int64), list(pairs))

    def timing(self, shape: Shape, make: Callable[[], Timing]) -> Timing:
        """The schedule of a stream of ``shape``: ``make()``'s, or the one made for its shape."""
        timing = self.timings.get(shape.key)
        if timing is None:
            timing = self.timings[shape.key] = make()
            if len(self.timings) > _SHAPES:
                del self.timings[next(iter(self.timings))]
        return timing

    def find(self, key: tuple, shape: Shape, sim) -> Optional[FusedPlan | bool]:
        """The plan of a stream of ``shape`` (and plan ``key``: :func:`fuse`'s) made from the one
        kept for ``key`` when it serves it, False when fuse does not cover such streams, None
        when none is known."""
        known = self.plans.get(key)
        if known is None:
            return None
        ref, theirs = known
        if ref is None:
            return False
        template = ref()
        if template is None:
            return None
        # each of the plan's ranks to the stream's rank at the same steps: one, or it does not serve
        mine = np.zeros(len(theirs.pairs), np.int64)
        mine[theirs.ranks] = shape.ranks
        if not np.array_equal(mine[theirs.ranks], shape.ranks):
            return None
        return template.with_operands({pair: shape.pairs[k][1] for pair, k in zip(theirs.pairs, mine.tolist())}, sim)

    def remember(self, key: tuple, plan: Optional[FusedPlan], shape: Shape) -> None:
        """Keep ``plan`` (None: not covered) as the one of streams of plan ``key``."""
        if len(self.plans) >= _SHAPES:
            del self.plans[next(iter(self.plans))]
        self.plans[key] = (None if plan is None else weakref.ref(plan), shape)


# A model's first call makes about a hundred streams of a few thousand distinct instruction shapes.
_SHAPES = 256
_SHAPE_IDS = 1 << 18       # (numbers in int32)


def _shape(ins: Instruction, pairs: dict[tuple, int]) -> tuple[tuple, tuple]:
    """What the cycle model and :func:`fuse` read of ``ins`` but its immediates, and the ranks in
    ``pairs`` (``(op, operand)`` -> rank, a new pair taking the next one) of its steps by one."""
    getter = _SHAPE_FIELDS.get(type(ins))
    if getter is None:
        names = [f.name for f in dataclasses.fields(ins) if f.name not in _UNSHAPED]
        getter = _SHAPE_FIELDS[type(ins)] = operator.itemgetter(*names) if names else lambda fields: ()
    fields = (type(ins), getter(ins.__dict__))
    op = ins.opcode
    if op is not _ALU and op is not _ALU_CHAIN:
        return fields, ()
    kinds, ranks = [], []
    for step, imm in (ins.steps if op is _ALU_CHAIN else [(ins.op, ins.imm if ins.use_imm else None)]):
        if isinstance(imm, ChainVector):
            kinds.append(imm)       # where it reads is the shape's, not an operand to substitute
        elif imm is None or (step is _MUL and imm == 0):
            kinds.append(None if imm is None else _TIMES_ZERO)
        else:
            kinds.append(_BY_IMMEDIATE)
            ranks.append(pairs.setdefault((step, alu_operand(step, imm)), len(pairs)))
    return (fields, tuple(kinds)), tuple(ranks)


def fuse(sim, stream: Sequence[Instruction], order: Sequence[int], buffers: Buffers,
         shape: Optional[Shape] = None) -> Optional[FusedPlan]:
    """The fused plan of a checked stream executed in ``order`` on ``sim`` with these host
    buffers, or None when the stream does something it does not cover (module doc). A stream
    of the :class:`Shape` (``shape``, made here when None) of one fused before on ``sim`` in the
    same order on buffers of the same sizes and dtypes (a model's layers of one shape, with other
    requantisation constants) gets a copy of that one's plan with its own immediates, not a pass
    of its own."""
    shapes = sim.shapes
    shape = shape or shapes.of(stream)
    key = (shape.key, np.array(order, np.int64).tobytes(),
           tuple(None if b is None else (b.size, b.dtype) for b in buffers))
    known = shapes.find(key, shape, sim)
    if known is not None:
        return known or None
    builder = _Builder(sim, buffers)
    plan = None
    for i in order:
        if not builder.add(stream[i]):
            break
    else:
        plan = builder.plan()
        plan._sim = sim
    shapes.remember(key, plan, shape)
    return plan
