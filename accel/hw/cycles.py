"""The cycle model: what each instruction costs and when it runs (accel/ISA.md section 6).

Busy cycles come from the :class:`~accel.hw.config.Config`; an event simulation advances
the load, compute and store queues in parallel. The load and store queues run one
instruction at a time. The compute queue dispatches in program order to its units, the GEMM
array (GEMM, DWMAC), the ALU (ALU, LUT, ALU_CHAIN) and the DMA engine (a LOAD into ACC),
each running its instructions in order with up to ``Config.unit_queue`` waiting behind the
one it runs, so that a block's epilogue runs beside the next block's GEMMs. Its head goes
when its pops have tokens, its unit is free (or has room for it to wait), and no running or
waiting instruction of another unit writes a scratchpad range it reads or writes, nor reads
one it writes (a scoreboard of :func:`accel.hw.tokens.footprint`'s ACC ranges). A compute
instruction *retires*, and pushes its tokens, once it and every earlier one of the queue
ended; a LOAD/STORE pushes when it ends. LOAD/STORE wait for the single DMA engine; among
several that could take it at once, the earliest in program order wins. FINISH starts once
every earlier instruction retired. ``start``/``end`` are the busy interval of the
instruction's unit.

Functional execution is not needed to know the timing: :func:`schedule` alone is what a
timing-only run (``Session(timing_only=True)``) costs. The functional simulator runs each
instruction whole at its start (:meth:`accel.hw.timing.Timing.order`): two compute
instructions that conflict start in program order, the later after the earlier ended (a
unit runs its own in order; the scoreboard holds back another unit's), and those that do
not conflict commute, so what it computes is what program order computes.

>>> from accel.hw.isa import Alu, AluOp, Finish, Gemm
>>> gemm = Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16)
>>> t = schedule([gemm, Finish()], Config())
>>> t.cycles, t.start, t.end, t.busy["gemm"], t.macs
(24, [0, 20], [20, 24], 20, 4096)

An ALU op on another ACC tile runs beside the GEMM; one on the GEMM's tile waits for it:

>>> elsewhere, onto = (Alu(op=AluOp.ADD, dst_addr=a, use_imm=True, imm=1) for a in (256, 0))
>>> schedule([gemm, elsewhere, Finish()], Config()).start, schedule([gemm, onto, Finish()], Config()).start
([0, 0, 20], [0, 20, 25])
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

from accel.hw.config import Config
from accel.hw.emitter import POPS, PUSHES, verify
from accel.hw.errors import DeadlockError
from accel.hw.instructions import LOAD_HOST_DTYPE, STORE_HOST_DTYPE
from accel.hw.isa import Instruction, Mem, Opcode
from accel.hw.timing import UNIT_OF, UNITS, Timing
from accel.hw.tokens import footprint

__all__ = ["cost", "Timing", "schedule"]

# the opcodes as module globals: cost() and _dram_bytes() run per instruction, and an enum
# member found through its class costs more than a global
_LOAD, _STORE, _GEMM, _ALU, _LUT, _DWMAC = Opcode.LOAD, Opcode.STORE, Opcode.GEMM, Opcode.ALU, Opcode.LUT, Opcode.DWMAC
_ALU_CHAIN = Opcode.ALU_CHAIN

# what a compute-queue instruction holds while it runs: the GEMM array (GEMM, DWMAC and the
# compute NOP, a GEMM of no tiles), the ALU (ALU, LUT, ALU_CHAIN), the DMA engine the other
# queues share (a LOAD into ACC), or nothing (FINISH, which waits for everything instead)
_GEMM_UNIT, _ALU_UNIT, _DMA, _NO_UNIT = 0, 1, 2, 3
_ACC_SPACE = ("sram", int(Mem.ACC))     # the space footprint() names ACC by
_NEVER = 1 << 62                        # the end of a dispatched instruction not started yet
_OTHER_UNITS = ((_ALU_UNIT, _DMA), (_GEMM_UNIT, _DMA), (_GEMM_UNIT, _ALU_UNIT))
# per opcode, the index in UNITS of the unit its busy cycles count for (FINISH: a fifth, unshown)
_UNIT_INDEX = [UNITS.index(UNIT_OF[op]) if op in UNIT_OF else len(UNITS) for op in Opcode]
_UNIT_OF_COMPUTE = {Opcode.GEMM: _GEMM_UNIT, Opcode.DWMAC: _GEMM_UNIT, Opcode.ALU: _ALU_UNIT,
                    Opcode.LUT: _ALU_UNIT, Opcode.ALU_CHAIN: _ALU_UNIT, Opcode.LOAD: _DMA,
                    Opcode.FINISH: _NO_UNIT}


def _dram_bytes(ins: Instruction) -> int:
    if ins.opcode is _LOAD:
        return ins.rows * ins.cols * LOAD_HOST_DTYPE[ins.mem].itemsize
    return ins.rows * ins.cols * STORE_HOST_DTYPE[ins.mode].itemsize


def cost(ins: Instruction, config: Config) -> int:
    """Busy cycles of one instruction, issue overhead included.

    >>> from accel.hw.isa import Gemm
    >>> cost(Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16,
    ...           ext_out=2, ext_in=4), Config())
    132
    """
    op = ins.opcode
    if op is _LOAD:
        busy = -(-_dram_bytes(ins) // config.dma_bytes_per_cycle)
    elif op is _STORE:
        busy = -(-_dram_bytes(ins) // config.dma_bytes_per_cycle)
        if ins.dram_step > 1:
            # a strided row is the cheaper of one burst over the bytes it spans, the skipped
            # ones masked off (AXI write strobes), and one bus beat per element
            span = -(-ins.dram_width * STORE_HOST_DTYPE[ins.mode].itemsize // config.dma_bytes_per_cycle)
            busy = ins.rows * min(span, ins.cols)
    elif op is _GEMM:
        busy = ins.ext_out * ins.ext_in * (config.tile if ins.reset else config.tile_cycles)
    elif op is _ALU or op is _LUT:     # a LUT step reads alu_lanes table entries a cycle
        busy = ins.ext_out * ins.ext_in * -(-config.tile // config.alu_lanes)
    elif op is _ALU_CHAIN:
        # an output pipeline of one stage per step: a vector enters each cycle (as for one
        # op) and the last leaves ``length - 1`` cycles after it would from one stage
        busy = ins.ext_out * ins.ext_in * -(-config.tile // config.alu_lanes) + ins.length - 1
    elif op is _DWMAC:
        busy = ins.ext_out * ins.ext_in * config.dwmac_cycles
    else:
        busy = 0
    return busy + config.issue_overhead


def schedule(stream: Sequence[Instruction], config: Config) -> Timing:
    """Run the event simulation of a FINISH-terminated stream (see the module doc).

    A stream whose tokens deadlock or are left unbalanced raises the error
    :func:`accel.hw.emitter.verify` gives it.

    >>> from accel.hw.isa import Finish
    >>> schedule([Finish()], Config()).end
    [4]
    """
    n = len(stream)
    tile = config.tile
    tile_macs = tile ** 3
    queues: list[list[int]] = [[], [], []]
    costs, pops, pushes = [0] * n, [()] * n, [()] * n
    # what a head waits for before it starts: _UNIT_OF_COMPUTE's unit of a compute instruction,
    # the DMA engine for a LOAD/STORE (the load and store queues run one at a time anyway)
    unit = [_DMA] * n
    # per unit of UNITS, busy cycles; per opcode, instructions; DMA bytes in, out; MACs
    busy = [0] * (len(UNITS) + 1)
    per_opcode = [0] * len(Opcode)
    into = out_of = macs = 0
    # what an instruction costs and does, by its id: compiled loops repeat instruction objects
    known: dict[int, tuple] = {}
    # the scoreboard's ACC ranges of each compute-queue instruction (see _acc_ranges)
    acc_of: list = [None] * n
    # the members and tables as locals: this loop runs once per instruction of every stream
    load, store, finish_op, gemm, dwmac, acc = _LOAD, _STORE, Opcode.FINISH, _GEMM, _DWMAC, Mem.ACC
    pops_of, pushes_of, compute_unit, unit_index = POPS, PUSHES, _UNIT_OF_COMPUTE, _UNIT_INDEX
    for i, ins in enumerate(stream):
        info = known.get(id(ins))
        if info is None:
            op = ins.opcode
            moved_in = moved_out = work = 0
            u = _DMA
            if op is load:
                moved_in = _dram_bytes(ins)
                q = 1 if ins.mem is acc else 0
            elif op is store:
                q = 2
                moved_out = _dram_bytes(ins)
            else:
                q = 1
                u = compute_unit[op]
                if op is gemm:
                    if not ins.reset:
                        work = ins.ext_out * ins.ext_in * tile_macs
                elif op is dwmac:
                    work = ins.ext_out * ins.ext_in * tile * tile
            flags = ins.flags
            info = known[id(ins)] = (q, u, cost(ins, config), pops_of[q][flags], pushes_of[q][flags], op,
                                     unit_index[op], moved_in, moved_out, work,
                                     _acc_ranges(ins, tile) if q == 1 else None)
        q, unit[i], c, pops[i], pushes[i], op, b, moved_in, moved_out, work, acc_of[i] = info
        costs[i] = c
        per_opcode[op] += 1
        busy[b] += c
        into += moved_in
        out_of += moved_out
        macs += work
        queues[q].append(i)

    start, end = [0] * n, [0] * n
    # the load and store queues: one instruction at a time, each pushes when it ends
    loads, stores = queues[0], queues[2]
    lpos = spos = 0
    lsize, ssize = len(loads), len(stores)
    lrun = srun = -1            # the instruction each runs, -1 when idle
    # the compute queue (ISA.md section 6): in-order dispatch to its units, each running its
    # own instructions in order with up to ``depth`` waiting; a scoreboard of the other units'
    # dispatched instructions' ACC ranges; in-order retire (pushes then)
    compute = queues[1]
    cpos, csize = 0, len(compute)
    depth = config.unit_queue
    free_at = [0, 0, 0]         # per unit (_GEMM_UNIT, _ALU_UNIT, _DMA), the DMA engine shared
    crun = [-1, -1, -1]         # per unit, the compute instruction it runs, -1 when none
    waiting: tuple[deque[int], ...] = (deque(), deque(), deque())      # per unit, dispatched and not started
    retired = 0                 # compute[:retired] retired, compute[retired:cpos] dispatched
    others = _OTHER_UNITS
    tokens = [0, 0, 0, 0]
    now = done = 0
    while done < n:
        while True:                 # start (or dispatch) what can start now
            # the compute queue: its heads in order, each to its unit when free, else to wait
            # for it; a LOAD into ACC that would start now needs the DMA engine (below)
            dma_head = -1           # the compute queue's head, a LOAD into ACC clear to take the engine
            while cpos < csize:
                i = compute[cpos]
                u = unit[i]
                if u == _NO_UNIT:
                    # FINISH: once everything before it retired; the last, nothing waits for it
                    if not (retired < cpos or lrun >= 0 or srun >= 0 or lpos < lsize or spos < ssize):
                        for ch in pops[i]:
                            if not tokens[ch]:
                                break
                        else:
                            for ch in pops[i]:
                                tokens[ch] -= 1
                            start[i] = now
                            end[i] = now + costs[i]
                            cpos += 1
                            retired += 1
                            done += 1
                    break
                free = free_at[u] <= now and not waiting[u]
                if not free and len(waiting[u]) >= depth:
                    break
                for ch in pops[i]:
                    if not tokens[ch]:
                        break
                else:
                    # the scoreboard: the other units' instructions, running or waiting (this
                    # unit's run before it, in order), against this one's ACC ranges (what a
                    # later head checks against while this one runs or waits). A running one is
                    # checked here as _hazard checks (the most frequent check: no call)
                    wlo, whi, rlo, rhi, reads = acc_of[i]
                    clash = False
                    for v in others[u]:
                        r = crun[v]
                        if r >= 0 and end[r] > now:
                            lo, hi, their_rlo, their_rhi, their_reads = acc_of[r]
                            if (wlo < hi and lo < whi) or (rlo < hi and lo < rhi and _reads(reads, lo, hi)) or \
                                    (wlo < their_rhi and their_rlo < whi and _reads(their_reads, wlo, whi)):
                                clash = True
                                break
                        if waiting[v] and _hazard(acc_of[i], waiting[v], acc_of):
                            clash = True
                            break
                    if clash:
                        break
                    if free and u == _DMA:      # the DMA engine's choice, below
                        dma_head = i
                        break
                    for ch in pops[i]:
                        tokens[ch] -= 1
                    cpos += 1
                    if free:
                        start[i] = now
                        end[i] = free_at[u] = now + costs[i]
                        crun[u] = i
                    else:
                        waiting[u].append(i)
                        end[i] = _NEVER
                    continue
                break
            if free_at[_DMA] > now:
                break
            # the DMA engine: the earliest in program order of the load queue's head, the
            # compute queue's LOAD into ACC and the store queue's head
            best = -1
            if lrun < 0 and lpos < lsize:
                i = loads[lpos]
                for ch in pops[i]:
                    if not tokens[ch]:
                        break
                else:
                    best, queue = i, 0
            if waiting[_DMA]:
                i = waiting[_DMA][0]
                if best < 0 or i < best:
                    best, queue = i, 3
            elif dma_head >= 0 and (best < 0 or dma_head < best):
                best, queue = dma_head, 1
            if srun < 0 and spos < ssize and (best < 0 or stores[spos] < best):
                i = stores[spos]
                for ch in pops[i]:
                    if not tokens[ch]:
                        break
                else:
                    best, queue = i, 2
            if best < 0:
                break
            start[best] = now
            end[best] = free_at[_DMA] = now + costs[best]
            if queue == 3:
                waiting[_DMA].popleft()
                crun[_DMA] = best
                continue
            for ch in pops[best]:
                tokens[ch] -= 1
            if queue == 1:
                cpos += 1
                crun[_DMA] = best
            elif queue == 0:
                lpos += 1
                lrun = best
            else:
                spos += 1
                srun = best
        if done == n:               # FINISH started
            break
        # the next end of a running instruction
        now = -1
        if lrun >= 0:
            now = end[lrun]
        if srun >= 0 and (now < 0 or end[srun] < now):
            now = end[srun]
        for r in crun:
            if r >= 0 and (now < 0 or end[r] < now):
                now = end[r]
        if now < 0:
            _stalled(stream)
        if lrun >= 0 and end[lrun] == now:
            for ch in pushes[lrun]:
                tokens[ch] += 1
            lrun = -1
            done += 1
        if srun >= 0 and end[srun] == now:
            for ch in pushes[srun]:
                tokens[ch] += 1
            srun = -1
            done += 1
        for u in (0, 1, 2):
            r = crun[u]
            if r >= 0 and end[r] == now:
                crun[u] = -1
                if u != _DMA and waiting[u]:        # the unit's next (a LOAD into ACC waits for the engine)
                    r = crun[u] = waiting[u].popleft()
                    start[r] = now
                    end[r] = free_at[u] = now + costs[r]
                while retired < cpos and end[compute[retired]] <= now:
                    for ch in pushes[compute[retired]]:
                        tokens[ch] += 1
                    retired += 1
                    done += 1
    if any(tokens):
        _stalled(stream)
    return Timing(start, end, [ins.opcode for ins in stream], max(end, default=0),
                  {name: busy[k] for k, name in enumerate(UNITS)},
                  {op.name: per_opcode[op] for op in Opcode}, {"dram_to_sram": into, "sram_to_dram": out_of}, macs)


def _acc_ranges(ins: Instruction, tile: int) -> tuple:
    """``(write lo, write hi, read lo, read hi, reads)`` of a compute instruction: the hulls of
    the ACC ranges it writes and reads (:func:`accel.hw.tokens.footprint`'s; ``0, 0`` for
    none), and ``reads``, the ranges it reads where it reads several (an ALU chain's vectors:
    a temporary and per-channel vectors, a hull that would take in the next block's
    accumulator between them), else None. The scoreboard needs no more: compute instructions
    write ACC alone, INP and WGT they only read (LOADs of the load queue write them, ordered
    by tokens)."""
    wlo = rlo = math.inf
    whi = rhi = -math.inf
    reads = []
    for space, lo, hi, write in footprint(ins, tile):
        if space == _ACC_SPACE:
            if write:
                wlo, whi = min(wlo, lo), max(whi, hi)
            else:
                rlo, rhi = min(rlo, lo), max(rhi, hi)
                reads.append((lo, hi))
    if wlo >= whi:
        wlo = whi = 0
    if rlo >= rhi:
        rlo = rhi = 0
    return wlo, whi, rlo, rhi, tuple(reads) if len(reads) > 1 else None


def _reads(reads, lo: int, hi: int) -> bool:
    """Whether an instruction whose read hull meets ``[lo, hi)`` reads there: its ``reads``
    (:func:`_acc_ranges`) meet it, or it reads one range (its hull)."""
    return reads is None or any(a < hi and lo < b for a, b in reads)


def _hazard(ranges: tuple, others, acc_of: list) -> bool:
    """Whether a compute instruction of these ACC ``ranges`` (:func:`_acc_ranges`) and any of
    the compute instructions at positions ``others`` conflict on ACC (RAW, WAR, WAW)."""
    wlo, whi, rlo, rhi, reads = ranges
    for r in others:
        lo, hi, their_rlo, their_rhi, their_reads = acc_of[r]
        if (wlo < hi and lo < whi) or (rlo < hi and lo < rhi and _reads(reads, lo, hi)) or \
                (wlo < their_rhi and their_rlo < whi and _reads(their_reads, wlo, whi)):
            return True
    return False


def _stalled(stream: Sequence[Instruction]) -> None:
    """Raise the verifier's error for a stream the event simulation cannot finish."""
    verify(stream)
    raise DeadlockError(len(stream) - 1, "the cycle model stalled on a stream that passed verify()")
