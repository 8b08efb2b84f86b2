"""The cycle model: what each instruction costs and when it runs (accel/ISA.md section 6).

Busy cycles come from the :class:`~accel.hw.config.Config`; an event simulation advances
the load, compute and store queues in parallel. The head of a queue starts when the queue
is idle, its pops have tokens (a token exists from the end of the instruction that pushed
it) and, for LOAD/STORE, the single DMA engine is free; among several heads that could
start at once, the earliest in program order wins. FINISH starts once the load and store
queues have drained.

Functional execution is not needed to know the timing: :func:`schedule` alone is what a
timing-only run (``Session(timing_only=True)``) costs.

>>> from accel.hw.isa import Finish, Gemm
>>> t = schedule([Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16),
...               Finish()], Config())
>>> t.cycles, t.start, t.end, t.busy["gemm"], t.macs
(24, [0, 20], [20, 24], 20, 4096)
"""

from __future__ import annotations

from typing import Sequence

from accel.hw.config import Config
from accel.hw.emitter import POPS, PUSHES, verify
from accel.hw.errors import DeadlockError
from accel.hw.instructions import LOAD_HOST_DTYPE, STORE_HOST_DTYPE
from accel.hw.isa import Instruction, Mem, Opcode
from accel.hw.timing import UNIT_OF, UNITS, Timing

__all__ = ["cost", "Timing", "schedule"]

# the opcodes as module globals: cost() and _dram_bytes() run per instruction, and an enum
# member found through its class costs more than a global
_LOAD, _STORE, _GEMM, _ALU, _LUT, _DWMAC = Opcode.LOAD, Opcode.STORE, Opcode.GEMM, Opcode.ALU, Opcode.LUT, Opcode.DWMAC
_ALU_CHAIN = Opcode.ALU_CHAIN


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
    tile_macs = config.tile ** 3
    queues: list[list[int]] = [[], [], []]
    costs, pops, pushes, dma, finish = [0] * n, [()] * n, [()] * n, [False] * n, [False] * n
    busy = dict.fromkeys(UNITS, 0)
    per_opcode = dict.fromkeys(Opcode, 0)      # by member: an enum's .name is a property, slow per instruction
    traffic = {"dram_to_sram": 0, "sram_to_dram": 0}
    macs = 0
    opcodes = [ins.opcode for ins in stream]
    # the members and tables as locals: this loop runs once per instruction of every stream
    load, store, finish_op, gemm, dwmac, acc = _LOAD, _STORE, Opcode.FINISH, _GEMM, _DWMAC, Mem.ACC
    pops_of, pushes_of, unit_of = POPS, PUSHES, UNIT_OF
    for i, ins in enumerate(stream):
        op = opcodes[i]
        if op is load:
            q = 1 if ins.mem is acc else 0
            traffic["dram_to_sram"] += _dram_bytes(ins)
            dma[i] = True
        elif op is store:
            q = 2
            traffic["sram_to_dram"] += _dram_bytes(ins)
            dma[i] = True
        else:
            q = 1
            if op is finish_op:
                finish[i] = True
            elif op is gemm and not ins.reset:
                macs += ins.ext_out * ins.ext_in * tile_macs
            elif op is dwmac:
                macs += ins.ext_out * ins.ext_in * config.tile ** 2
        c = costs[i] = cost(ins, config)
        per_opcode[op] += 1
        if op is not finish_op:
            busy[unit_of[op]] += c
        flags = ins.flags
        pops[i] = pops_of[q][flags]
        pushes[i] = pushes_of[q][flags]
        queues[q].append(i)

    start, end = [0] * n, [0] * n
    pos = [0, 0, 0]
    size = [len(qs) for qs in queues]
    running = [-1, -1, -1]      # the instruction each queue runs, -1 when idle
    ends = [0, 0, 0]
    tokens = [0, 0, 0, 0]
    dma_free_at = now = done = 0
    while done < n:
        while True:                 # start what can start now, earliest in program order first
            best = best_q = -1
            for q in (0, 1, 2):
                if running[q] >= 0 or pos[q] == size[q]:
                    continue
                i = queues[q][pos[q]]
                if best >= 0 and i > best:
                    continue
                if finish[i] and (pos[0] < size[0] or pos[2] < size[2]
                                  or running[0] >= 0 or running[2] >= 0):
                    continue
                if dma[i] and dma_free_at > now:
                    continue
                ok = True
                for ch in pops[i]:
                    if not tokens[ch]:
                        ok = False
                if ok:
                    best, best_q = i, q
            if best < 0:
                break
            for ch in pops[best]:
                tokens[ch] -= 1
            start[best] = now
            end[best] = ends[best_q] = now + costs[best]
            if dma[best]:
                dma_free_at = end[best]
            running[best_q] = best
            pos[best_q] += 1
        now = -1                    # the next end of a running instruction
        for q in (0, 1, 2):
            if running[q] >= 0 and (now < 0 or ends[q] < now):
                now = ends[q]
        if now < 0:
            _stalled(stream)
        for q in (0, 1, 2):
            if running[q] >= 0 and ends[q] == now:
                for ch in pushes[running[q]]:
                    tokens[ch] += 1
                running[q] = -1
                done += 1
    if any(tokens):
        _stalled(stream)
    counts = {op.name: n for op, n in per_opcode.items()}
    return Timing(start, end, opcodes, max(end, default=0), busy, counts, traffic, macs)


def _stalled(stream: Sequence[Instruction]) -> None:
    """Raise the verifier's error for a stream the event simulation cannot finish."""
    verify(stream)
    raise DeadlockError(len(stream) - 1, "the cycle model stalled on a stream that passed verify()")
