"""Automatic dependency tokens: the driver orders conflicting accesses across queues.

Compiled code emits instructions without flags (``deps = AUTO``); for each one the
tracker finds the earlier instructions of *other* queues that touch the same scratchpad
or host memory in a conflicting way (read-after-write, write-after-read, write-after-
write) and adds the fewest tokens that order them:

- the pushing side is the *conflicting* instruction itself (or the next one of its queue
  whose flag is free), not simply the latest one. That is what lets the LOAD of tile n+1
  into the other half of a double buffer wait only for the GEMM of tile n-1;
- a consumer queue remembers up to which instruction of each neighbour it is already
  ordered after, so a token is added only when needed;
- LOAD and STORE are not neighbours: their conflicts (through host memory) go through a
  compute-queue NOP that takes a token from one and gives one to the other.

Tokens are counted per channel, so pushes on a channel must come in the order of the
pops that take them; choosing a pusher at or after every earlier one keeps that order.

>>> from accel.hw.emitter import Emitter
>>> from accel.hw.isa import Load, Gemm, Mem, Queue
>>> em, deps = Emitter(), DependencyTracker(16)
>>> load = Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16,
...             rows=16, cols=16)
>>> deps.record(load, em.emit(deps.order(em, load)))
>>> g = deps.order(em, Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16))
>>> g.pop_prev, em.instructions[0].push_next
(True, True)
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort

from accel.hw.emitter import nop
from accel.hw.instructions import LUT_ENTRIES, ChainVector, chain_problem
from accel.hw.isa import Alu, AluChain, Instruction, Load, Lut, Mem, Opcode, Queue, Store, queue_of

_PUSH = {(Queue.LOAD, Queue.COMPUTE): "push_next", (Queue.COMPUTE, Queue.LOAD): "push_prev",
         (Queue.COMPUTE, Queue.STORE): "push_next", (Queue.STORE, Queue.COMPUTE): "push_prev"}
_POP = {(Queue.LOAD, Queue.COMPUTE): "pop_prev", (Queue.COMPUTE, Queue.LOAD): "pop_next",
        (Queue.COMPUTE, Queue.STORE): "pop_prev", (Queue.STORE, Queue.COMPUTE): "pop_next"}
# each flag's bit in Instruction.flags, and per set of bits the fields they set
_BIT = {"pop_prev": 1, "pop_next": 2, "push_prev": 4, "push_next": 8}
_SET = [{name: True for name, bit in _BIT.items() if bits & bit} for bits in range(16)]
# _PUSH and _POP's flags and their bits, by [source queue][destination queue] (None off the
# neighbours): read per token added, where a tuple key would be made for each lookup
_PUSH_OF = tuple(tuple(_PUSH.get((src, dst)) for dst in Queue) for src in Queue)
_POP_BIT = tuple(tuple(_BIT[_POP[(src, dst)]] if (src, dst) in _POP else 0 for dst in Queue) for src in Queue)


def _span(addr: int, ld: int, rows: int, cols: int, loops=()) -> tuple[int, int]:
    """[lo, hi) of a block of ``rows x cols`` at ``addr`` (row stride ``ld``), over loops."""
    lo = hi = addr
    for ext, stride in loops:
        if ext > 1:
            if stride >= 0:
                hi += (ext - 1) * stride
            else:
                lo += (ext - 1) * stride
    return lo, hi + (rows - 1) * ld + cols


def footprint(ins: Instruction, tile: int, host=None) -> tuple[tuple[tuple, int, int, bool], ...]:
    """``(space, lo, hi, is_write)`` per memory range an instruction touches.

    ``space`` is ``("sram", the Mem's number)`` or ``("dram", slot)`` with element ranges, or,
    given ``host(slot, lo, hi) -> (start, end)`` (the buffer table's byte ranges), ``("host",)``
    with address ranges (:func:`on_host`), so that slots viewing the same memory are ordered.
    Ranges are conservative hulls. Plain numbers, in tuples: a driver keeps the footprints of
    the instructions it emits, and the garbage collector stops tracking such tuples (a million
    of them, tracked, would be walked by every full collection).

    >>> from accel.hw.isa import AluOp
    >>> alu = Alu(op=AluOp.ADD, dst_addr=32, src_addr=0, ext_out=2, dst_stride_out=16)
    >>> [(Mem(space[1]).name, lo, hi, write) for space, lo, hi, write in footprint(alu, 16)]
    [('ACC', 32, 64, True), ('ACC', 0, 16, False)]
    """
    accesses = _FOOTPRINTS[ins.opcode](ins, tile)
    return accesses if host is None else on_host(accesses, host)


def on_host(accesses: tuple, host) -> tuple[tuple[tuple, int, int, bool], ...]:
    """A :func:`footprint` without ``host`` as it is with it: each ``("dram", slot)`` element
    range as the ``("host",)`` address range ``host(slot, lo, hi)`` (the rest as it is). A
    driver keeps the former, which holds whatever memory the slots view, and makes the latter
    for each stream.

    >>> store = Store(sram_addr=0, sram_ld=16, slot=3, dram_offset=8, dram_ld=16, rows=2, cols=16)
    >>> on_host(footprint(store, 16), lambda slot, lo, hi: (1000 + 4 * lo, 1000 + 4 * hi))[1]
    (('host',), 1032, 1160, True)
    """
    out = []
    for access in accesses:
        space = access[0]
        if space[0] == "dram":
            access = (_HOST, *host(space[1], access[1], access[2]), access[3])
        out.append(access)
    return tuple(out)


def _load_footprint(ins: Load, tile: int) -> tuple:
    rows, cols = ins.rows, ins.cols
    h = ins.pad_top + rows + ins.pad_bottom
    w = ins.pad_left + cols + ins.pad_right
    if h * w == 0:
        return ()
    lo = ins.sram_addr
    written = (_SRAM[ins.mem], lo, lo + (h - 1) * ins.sram_ld + w, True)
    if rows * cols == 0:
        return (written,)
    lo = ins.dram_offset
    return written, (("dram", ins.slot), lo, lo + (rows - 1) * ins.dram_ld + ins.dram_width, False)


def _store_footprint(ins: Store, tile: int) -> tuple:
    rows, cols = ins.rows, ins.cols
    if rows * cols == 0:
        return ()
    lo, dram = ins.sram_addr, ins.dram_offset
    return ((_ACC, lo, lo + (rows - 1) * ins.sram_ld + cols, False),
            (("dram", ins.slot), dram, dram + (rows - 1) * ins.dram_ld + ins.dram_width, True))


def _mac_footprint(ins, tile: int) -> tuple:
    """GEMM and DWMAC: ACC written, INP and WGT read (not by a GEMM reset)."""
    if ins.ext_out * ins.ext_in == 0:
        return ()
    loops = lambda a, b: ((ins.ext_out, a), (ins.ext_in, b))  # noqa: E731
    out = [(_ACC, *_span(ins.acc_addr, ins.acc_ld, tile, tile,
                                   loops(ins.acc_stride_out, ins.acc_stride_in)), True)]
    dwmac = ins.opcode is _DWMAC
    if dwmac or not ins.reset:
        out.append((_INP, *_span(ins.inp_addr, ins.inp_ld, tile, tile,
                                           loops(ins.inp_stride_out, ins.inp_stride_in)), False))
        # a GEMM reads a tile x tile weight tile, a DWMAC one weight row (a weight per channel)
        rows, ld = (1, 0) if dwmac else (tile, ins.wgt_ld)
        out.append((_WGT, *_span(ins.wgt_addr, ld, rows, tile,
                                           loops(ins.wgt_stride_out, ins.wgt_stride_in)), False))
    return tuple(out)


def _lut_footprint(ins: Lut, tile: int) -> tuple:
    if ins.ext_out * ins.ext_in == 0:
        return ()
    return ((_ACC, *_span(ins.dst_addr, 0, 1, tile,
                          ((ins.ext_out, ins.dst_stride_out), (ins.ext_in, ins.dst_stride_in))), True),
            (_WGT, ins.lut_addr, ins.lut_addr + LUT_ENTRIES, False))


def _alu_footprint(ins: Alu, tile: int) -> tuple:
    if ins.ext_out * ins.ext_in == 0:
        return ()
    out = [(_ACC, *_span(ins.dst_addr, 0, 1, tile,
                                   ((ins.ext_out, ins.dst_stride_out), (ins.ext_in, ins.dst_stride_in))), True)]
    if not ins.use_imm:
        out.append((_ACC, *_span(ins.src_addr, 0, 1, tile,
                                           ((ins.ext_out, ins.src_stride_out), (ins.ext_in, ins.src_stride_in))),
                    False))
    return tuple(out)


def _alu_chain_footprint(ins: AluChain, tile: int) -> tuple:
    if ins.ext_out * ins.ext_in == 0:
        return ()
    # the chain reads all it reads (its src and vectors included) before it writes: one
    # instruction, like ALU; a vector lies beside src (its strides) or like the destination (its)
    loops = lambda so, si: ((ins.ext_out, so), (ins.ext_in, si))  # noqa: E731
    out = [(_ACC, *_span(ins.dst_addr, 0, 1, tile, loops(ins.dst_stride_out, ins.dst_stride_in)), True)]
    # (a malformed chain, which the simulator's check refuses, as reading src)
    steps = ins.steps if chain_problem(ins.length, ins.code, ins.immediates, ins.vectors) is None else [(None, None)]
    if any(imm is None for _, imm in steps):
        out.append((_ACC, *_span(ins.src_addr, 0, 1, tile, loops(ins.src_stride_out, ins.src_stride_in)), False))
    for _, imm in steps:
        if isinstance(imm, ChainVector):
            start, so, si = imm.place(ins)
            out.append((_ACC, *_span(start, 0, 1, tile, loops(so, si)), False))
    return tuple(out)


_SRAM = {mem: ("sram", int(mem)) for mem in Mem}
_HOST = ("host",)
# the spaces and the opcode the per-instruction footprints name, as globals (an enum member
# found through its class costs ~200 ns on Python 3.11)
_ACC, _INP, _WGT, _DWMAC = _SRAM[Mem.ACC], _SRAM[Mem.INP], _SRAM[Mem.WGT], Opcode.DWMAC
# LOAD <-> STORE: each queue's far queue, reached through a compute NOP
_FAR = {Queue.LOAD: Queue.STORE, Queue.STORE: Queue.LOAD}
_FOOTPRINTS = {Opcode.LOAD: _load_footprint, Opcode.STORE: _store_footprint, Opcode.GEMM: _mac_footprint,
               Opcode.DWMAC: _mac_footprint, Opcode.LUT: _lut_footprint, Opcode.ALU: _alu_footprint,
               Opcode.ALU_CHAIN: _alu_chain_footprint,
               Opcode.FINISH: lambda ins, tile: ()}


class _Ranges:
    """Ranges ``[lo, hi)`` of one memory space with a value each, found by overlap.

    Kept sorted by ``lo``; every range is at most ``widest`` long, so the ranges that
    overlap ``[lo, hi)`` start in ``[lo - widest, hi)``: two bisections, not a scan of all
    of them (a stream's host reads are thousands of distinct ranges).

    >>> r = _Ranges(); r.put(0, 16, "a"); r.put(32, 48, "b"); r.put(8, 40, "c")
    >>> sorted(r.values_overlapping(20, 33)), r.remove_inside(0, 40), len(r.keys)
    (['b', 'c'], None, 1)
    """

    __slots__ = ("keys", "values", "widest")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.values: dict[tuple[int, int], object] = {}
        self.widest = 0

    def values_overlapping(self, lo: int, hi: int) -> list:
        """The values of the ranges that overlap ``[lo, hi)``."""
        keys = self.keys
        first = bisect_left(keys, (lo - self.widest,))
        last = bisect_left(keys, (hi,), first)
        if first == last:           # (most searches: no list made)
            return ()
        values = self.values
        if last == first + 1:       # (most of the others; a comprehension would cost a frame)
            key = keys[first]
            return (values[key],) if key[1] > lo else ()
        found = []
        for key in keys[first:last]:
            if key[1] > lo:
                found.append(values[key])
        return found

    def put(self, lo: int, hi: int, value) -> None:
        key, values = (lo, hi), self.values
        if key not in values:
            insort(self.keys, key)
            if hi - lo > self.widest:
                self.widest = hi - lo
        values[key] = value

    def remove_inside(self, lo: int, hi: int) -> None:
        """Drop every range that lies within ``[lo, hi)``."""
        keys = self.keys
        first = bisect_left(keys, (lo,))
        if first == len(keys) or keys[first][0] >= hi:     # none starts inside (the common case)
            return
        last = bisect_left(keys, (hi,), first)
        if last == first + 1:       # one starts inside (most of the others): no lists made
            key = keys[first]
            if key[1] <= hi:
                del keys[first]
                del self.values[key]
            return
        window = keys[first:last]
        inside = [key for key in window if key[1] <= hi]
        if inside:
            keys[first:last] = [key for key in window if key[1] > hi]
            for key in inside:
                del self.values[key]

    def overwrite(self, lo: int, hi: int, value) -> None:
        """:meth:`remove_inside` then :meth:`put`: ``[lo, hi)`` stands for every range within it.

        >>> r = _Ranges(); r.put(0, 8, "a"); r.put(4, 12, "b"); r.put(8, 16, "c")
        >>> r.overwrite(4, 16, "d"); r.keys, r.values[(4, 16)]
        ([(0, 8), (4, 16)], 'd')
        """
        keys, values = self.keys, self.values
        key = (lo, hi)
        first = bisect_left(keys, (lo,))
        # the two common cases, told apart by the ranges at first and after it (one bisection)
        count = len(keys)
        if first == count or keys[first][0] >= hi:             # none starts inside: a new range
            keys.insert(first, key)
            values[key] = value
            if hi - lo > self.widest:
                self.widest = hi - lo
            return
        if keys[first] == key and (first + 1 == count or keys[first + 1][0] >= hi):
            values[key] = value                                 # the range alone, written again
            return
        last = bisect_left(keys, (hi,), first)
        # what stays of the window starts inside and ends beyond hi: after (lo, hi) in order
        window = keys[first:last]
        for key in window:
            if key[1] <= hi:
                del values[key]
        keys[first:last] = [(lo, hi), *(key for key in window if key[1] > hi)]
        values[(lo, hi)] = value
        if hi - lo > self.widest:
            self.widest = hi - lo


class _Space:
    """What a stream did in one memory space: per written range its last writer ``(queue,
    index)``, per read range its last reader per queue ``{queue: index}`` (numbers, so that
    the garbage collector tracks none of the entries, one per instruction); and per queue
    the summary ``[highest index, lowest lo, highest hi]`` of its writes (``wrote``) and
    reads (``read``) there, ``[-1, inf, -inf]`` for none: a search is needed only where
    another queue's accesses may both be later than what the instruction already waits for
    and overlap it (not for a compute instruction reading ACC, which only the compute queue
    writes, nor for a LOAD of an input the stream's STOREs never write). ``writers[queue]``
    and ``readers[queue]`` list ``(other queue, summary)`` for the other queues that accessed
    the space, the only summaries an instruction of ``queue`` looks at (most spaces are
    written by one queue: its own accesses there look at none)."""

    __slots__ = ("writes", "reads", "wrote", "read", "writers", "readers")

    def __init__(self) -> None:
        self.writes, self.reads = _Ranges(), _Ranges()
        self.wrote = tuple([-1, math.inf, -math.inf] for _ in Queue)
        self.read = tuple([-1, math.inf, -math.inf] for _ in Queue)
        self.writers: tuple[list[tuple[int, list]], ...] = tuple([] for _ in Queue)
        self.readers: tuple[list[tuple[int, list]], ...] = tuple([] for _ in Queue)


def _add_other(lists: tuple[list, ...], queue: int, summary: list) -> None:
    """``queue``'s first access of a space: each other queue's list (``_Space.writers`` or
    ``readers``) gets its summary."""
    for other, listed in enumerate(lists):
        if other != queue:
            listed.append((queue, summary))


class DependencyTracker:
    """Adds the dependency tokens a stream needs, one instruction at a time (see module doc).

    Per memory space it keeps the last writer of each distinct written range and, per
    queue, the last reader of each distinct read range, as ``(queue, index)``; a read only
    has to look at writes, so read-only host inputs cost nothing to track.
    """

    def __init__(self, tile: int, host=None) -> None:
        self.tile = tile
        self.host = host    # slot ranges -> host addresses (see footprint)
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new stream starts)."""
        # per memory space, what was written and read there (see _Space): one lookup per access
        self._spaces: dict[tuple, _Space] = {}
        # ordered[consumer][producer]: highest producer index the consumer already waits for
        self._ordered = ([-1, -1, -1], [-1, -1, -1], [-1, -1, -1])
        self._last: tuple = (None, None, ())         # (instruction, its queue, its footprint) for record()
        # the flagged copies made of instructions: (id, flags) -> copy; a loop flags the same
        # instruction alike again and again, and the copies share one object. The originals
        # are kept, so that no other instruction gets their ids
        self._copies: dict[tuple[int, int], Instruction] = {}
        self._originals: list[Instruction] = []

    def order(self, em, ins: Instruction) -> Instruction:
        """Add tokens so that ``ins`` runs after every conflicting earlier instruction;
        returns ``ins`` with its pop flags set (the pushes go onto earlier instructions)."""
        queue, accesses = int(queue_of(ins)), footprint(ins, self.tile, self.host)
        self._last = (ins, queue, accesses)
        return self._order(em, ins, queue, accesses)

    def record(self, ins: Instruction, index: int) -> None:
        """Remember what the instruction at stream position ``index`` touched."""
        last, queue, accesses = self._last
        if last is not ins:
            queue, accesses = int(queue_of(ins)), footprint(ins, self.tile, self.host)
        self._record(queue, accesses, index)

    def emit(self, em, ins: Instruction, queue: int, accesses: tuple) -> int:
        """:meth:`order` ``ins``, append it to ``em`` (already checked) and :meth:`record` it, given
        its queue's number and :func:`footprint` (which a caller emitting the same instruction
        again keeps: compiled loops repeat instructions); returns its index.

        >>> from accel.hw.emitter import Emitter
        >>> from accel.hw.isa import AluOp
        >>> em, deps = Emitter(), DependencyTracker(16)
        >>> alu = Alu(op=AluOp.ADD, dst_addr=0, imm=1, use_imm=True)
        >>> deps.emit(em, alu, int(queue_of(alu)), footprint(alu, 16)), len(em)
        (0, 1)
        """
        index = em.emit(self._order(em, ins, queue, accesses), validated=True, queue=queue)
        self._record(queue, accesses, index)
        return index

    def _order(self, em, ins: Instruction, queue: int, accesses: tuple) -> Instruction:
        needs: dict[int, int] = {}
        ordered = self._ordered[queue]
        spaces = self._spaces
        for space, lo, hi, write in accesses:
            state = spaces.get(space)
            if state is None:       # nothing was done here yet
                continue
            # whether another queue's writes (then reads, for a write) here may be later than
            # what the instruction already waits for and overlap it, by the queues' summaries
            # (see _Space): most accesses need no search (a loop's own ACC, read-only inputs)
            # (one search finds every queue's accesses: which queue calls for it does not matter)
            for q, (index, first, last) in state.writers[queue]:
                if index > ordered[q] and first < hi and lo < last and index > needs.get(q, -1):
                    for producer, index in state.writes.values_overlapping(lo, hi):
                        if producer != queue and index > needs.get(producer, -1):
                            needs[producer] = index
                    break
            if write:
                for q, (index, first, last) in state.readers[queue]:
                    if index > ordered[q] and first < hi and lo < last and index > needs.get(q, -1):
                        for readers in state.reads.values_overlapping(lo, hi):
                            for producer, index in readers.items():
                                if producer != queue and index > needs.get(producer, -1):
                                    needs[producer] = index
                        break
        if not needs:
            return ins
        pops = 0
        # LOAD <-> STORE are not neighbours: a compute NOP takes the token and passes one
        # on; the consumer then only depends on that NOP (the latest compute instruction).
        far = _FAR.get(queue)
        if far is not None and far in needs:
            index = needs.pop(far)
            if ordered[far] < index:
                if self._ordered[Queue.COMPUTE][far] < index:
                    self._ordered[Queue.COMPUTE][far] = self._push(em, far, Queue.COMPUTE, index)
                    hop = nop(Queue.COMPUTE).with_flags(**{_POP[(far, Queue.COMPUTE)]: True})
                else:
                    hop = nop(Queue.COMPUTE)
                needs[Queue.COMPUTE] = max(needs.get(Queue.COMPUTE, -1), em.emit(hop))
                ordered[far] = index
        for src, index in needs.items():
            if ordered[src] >= index:
                continue
            ordered[src] = self._push(em, src, queue, index)
            pops |= _POP_BIT[src][queue]
        return self._flagged(ins, pops) if pops else ins

    def _record(self, queue: int, accesses: tuple, index: int) -> None:
        entry = (queue, index)
        spaces = self._spaces
        for space, lo, hi, write in accesses:
            state = spaces.get(space)
            if state is None:
                state = spaces[space] = _Space()
            if write:
                # Accesses inside the new range are ordered before this write, so its
                # record stands for them from now on.
                state.writes.overwrite(lo, hi, entry)
                state.reads.remove_inside(lo, hi)
                summary = state.wrote[queue]
                if summary[0] < 0:
                    _add_other(state.writers, queue, summary)
            else:
                reads = state.reads
                readers = reads.values.get((lo, hi))
                if readers is None:
                    reads.put(lo, hi, {queue: index})
                else:
                    readers[queue] = index
                summary = state.read[queue]
                if summary[0] < 0:
                    _add_other(state.readers, queue, summary)
            # the queue's summary of the space (see _Space) takes in the access
            summary[0] = index
            if lo < summary[1]:
                summary[1] = lo
            if hi > summary[2]:
                summary[2] = hi

    def _push(self, em, src: Queue, dst: Queue, index: int) -> int:
        """Make the first instruction of ``src`` at or after ``index`` with a free push flag
        send a token to ``dst``; a NOP at the end of ``src`` if there is none. Returns it."""
        flag = _PUSH_OF[src][dst]
        stream, queues = em.instructions, em.queues
        for i in range(index, len(stream)):
            if queues[i] == src and not getattr(stream[i], flag):
                stream[i] = self._flagged(stream[i], _BIT[flag])
                return i
        return em.emit(nop(src).with_flags(**{flag: True}))

    def _flagged(self, ins: Instruction, bits: int) -> Instruction:
        """``ins`` with the flags ``bits`` (of :attr:`~accel.hw.isa.Instruction.flags`) set: the
        copy made before for the same instruction and flags, else a new one (the fields
        copied, without :meth:`~accel.hw.isa.Instruction.with_flags`' keyword checks)."""
        key = (id(ins), bits)
        new = self._copies.get(key)
        if new is None:
            new = object.__new__(type(ins))
            fields = new.__dict__
            fields.update(ins.__dict__)
            fields.update(_SET[bits])
            self._copies[key] = new
            self._originals.append(ins)
        return new
