"""vecunit's runtime: the session compiled code drives, and the functions ``vecunit.*``.

Each ``vecunit.<instruction>`` call checks its operands (host ranges, registers, the
vector length) and queues the instruction on the current :class:`VecUnit` session; the
session runs the queue at ``vecunit.sync``. Everything else (the host buffer table,
sessions per thread, error relay, atomic calls) is tirpat's device kit.

>>> import numpy as np
>>> x, out = np.arange(-3, 3, dtype=np.int8), np.zeros(6, np.int8)
>>> with VecUnit(lanes=8) as s:
...     RUNTIME.functions["vld"](0, x, 0, 1, 6, 0, 0, 0)         # r0 <- x
...     RUNTIME.functions["vmaxi"](8, 0, 0, 6)                   # r1 <- max(r0, 0)
...     RUNTIME.functions["vst"](out, 0, 1, 8, 6)                # out <- r1
>>> out.tolist(), dict(s.stats.instructions)
([0, 0, 0, 0, 1, 2], {'vld': 1, 'vmaxi': 1, 'vst': 1})
"""

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import tvm_ffi

from tirpat import device

from . import isa

__all__ = ["VecUnit", "VecUnitError", "Stats", "RUNTIME"]


class VecUnitError(ValueError):
    """A malformed instruction; the message names it and the operand."""


@dataclass
class Stats:
    """What a session ran: instructions by name, lanes they used and could have used, bytes moved."""

    instructions: Counter = field(default_factory=Counter)
    active_lanes: int = 0
    issued_lanes: int = 0
    bytes: Counter = field(default_factory=Counter)

    @property
    def utilization(self) -> float:
        """The share of the lanes issued that did work."""
        return self.active_lanes / self.issued_lanes if self.issued_lanes else 0.0


class VecUnit(device.Session):
    """One vector unit: ``regs`` registers of ``lanes`` int8 lanes, and its :class:`Stats`."""

    def __init__(self, lanes: int = 16, regs: int = 32) -> None:
        super().__init__()
        self.options = {"lanes": lanes, "regs": regs}     # code built for other options refuses to run here
        self.lanes = lanes
        self.vrf = np.zeros(regs * lanes, np.int8)
        self.stats = Stats()

    def begin_run(self) -> None:
        """A compiled model's next call on this session counts its own statistics."""
        self.stats = Stats()

    def issue(self, what: str, n: int, *addresses: int) -> list:
        """Count instruction ``what`` of vector length ``n``; its registers at ``addresses``, checked."""
        if not 0 <= n <= self.lanes:
            raise VecUnitError(f"{what}: vector length {n} is outside [0, {self.lanes}]")
        for address in addresses:
            if address % self.lanes:
                raise VecUnitError(f"{what}: register address {address} is not a multiple of {self.lanes}")
        views = [device.strided_view(self.vrf, a, (self.lanes,), what="the vector register file") for a in addresses]
        self.stats.instructions[what] += 1
        self.stats.active_lanes += n
        self.stats.issued_lanes += self.lanes
        return views


RUNTIME = device.Runtime("vecunit", VecUnit)


@RUNTIME.implement(isa.vld)
def vld(s: VecUnit, d, host, offset, stride, n, front, back, pad):
    """Lanes ``[front, n - back)`` of register ``d`` from ``host``, the others ``pad``."""
    reg, = s.issue("vld", n, d)
    if not 0 <= front <= n - back <= n:
        raise VecUnitError(f"vld: lanes [{front}, {n - back}) are not inside the vector length {n}")
    src = s.buffers.view(s.buffers.slot(host), offset + front * stride, (n - back - front,), (stride,))
    s.stats.bytes["load"] += src.nbytes

    def run():
        reg[:n] = pad
        reg[front:n - back] = src
    s.enqueue(run)


@RUNTIME.implement(isa.vst)
def vst(s: VecUnit, host, offset, stride, src, n):
    """Lanes ``[0, n)`` of register ``src`` to ``host``."""
    reg, = s.issue("vst", n, src)
    dst = s.buffers.view(s.buffers.slot(host), offset, (n,), (stride,), write=True)
    s.stats.bytes["store"] += dst.nbytes
    s.enqueue(lambda: dst.__setitem__(Ellipsis, reg[:n]))


def _alu(ins: device.Instruction) -> None:
    """Run ALU instruction ``ins`` as its declared program, compiled for the host."""
    regs = [o.name for o in ins.memory_operands]

    @RUNTIME.implement(ins)
    def run(s: VecUnit, **operands):
        views = dict(zip(regs, s.issue(ins.name, operands["n"], *(operands[r] for r in regs))))
        args = [tvm_ffi.from_dlpack(views[o.name]) if o.name in views else operands[o.name] for o in ins.operands]
        program = ins.executable(lanes=s.lanes)
        s.enqueue(lambda: program(*args))


for _ins in isa.ALU.values():
    _alu(_ins)
