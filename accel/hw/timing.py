"""One stream's timing as the cycle model gives it, and the units it keeps busy: what
:mod:`accel.hw.cycles` produces and :mod:`accel.hw.stats` accumulates (here, so that
neither of the two imports the other).

>>> t = Timing([0, 20], [20, 24], [Opcode.GEMM, Opcode.FINISH], 24, dict.fromkeys(UNITS, 0), {}, {}, 0)
>>> list(t.events(base=100))
[Event(index=0, unit='gemm', opcode='GEMM', start=100, end=120)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np

from accel.hw.isa import Opcode

__all__ = ["UNITS", "UNIT_OF", "Event", "Timing"]

#: the units, in the order charts and traces show them
UNITS = ("load", "gemm", "alu", "store")


class Event(NamedTuple):
    """One instruction's execution: stream ``index``, the unit it kept busy, [start, end)."""

    index: int
    unit: str
    opcode: str
    start: int
    end: int


#: the unit each opcode keeps busy (FINISH keeps none; DWMAC runs on the GEMM array,
#: LUT and ALU_CHAIN on the ALU)
UNIT_OF = {Opcode.LOAD: "load", Opcode.STORE: "store", Opcode.GEMM: "gemm", Opcode.ALU: "alu", Opcode.DWMAC: "gemm",
           Opcode.LUT: "alu", Opcode.ALU_CHAIN: "alu"}


@dataclass(frozen=True)
class Timing:
    """The cycle model's account of one stream: every instruction's ``[start, end)`` cycle
    and the totals :class:`~accel.hw.stats.Stats` accumulates (busy cycles per unit,
    instructions per opcode, DMA bytes per direction, MACs)."""

    start: list[int]
    end: list[int]
    opcodes: list[Opcode]
    cycles: int
    busy: dict[str, int]
    instructions: dict[str, int]
    bytes: dict[str, int]
    macs: int

    def order(self) -> list[int]:
        """Stream indices in the order the instructions take effect: by start cycle, then
        program order (each instruction is atomic when it starts)."""
        # a stable sort by start cycle keeps program order among equal starts (numpy's, not a
        # key of a tuple per instruction: a stream has up to a million)
        return np.argsort(np.asarray(self.start, np.int64), kind="stable").tolist()

    def events(self, base: int = 0) -> Iterator[Event]:
        """Timeline events of every instruction but FINISH, ``base`` cycles later."""
        for i, op in enumerate(self.opcodes):
            if op is not Opcode.FINISH:
                yield Event(i, UNIT_OF[op], op.name, base + self.start[i], base + self.end[i])
