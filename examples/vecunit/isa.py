"""vecunit's instructions, each written once as the program it replaces (Exo's ``@instr``).

vecunit is an int8 vector unit. Its register file (the VRF, storage scope :data:`VRF` in TIR)
holds ``regs`` registers of ``lanes`` int8 lanes; a register's address is its first
element. Every instruction carries a vector length ``n`` (``0 <= n <= lanes``, RISC-V V's
``vl``): it acts on lanes ``[0, n)`` and leaves the others as they are.

- ``vld d, host, offset, stride, n, front, back, pad``: lanes ``[front, n - back)`` of
  register ``d`` from host memory, lane ``i`` from element ``offset + i * stride`` (a strided
  DMA: a row, a column, a pooling window's row); the lanes before and after get ``pad``.
- ``vst host, offset, stride, s, n``: lanes ``[0, n)`` of register ``s`` to host memory.
- the ALU instructions of :data:`INSTRUCTIONS`, all lane-wise on int8 with wrap-around, as
  TIR's int8 arithmetic.

An ALU instruction is a function from its operands' lane values to the value of lane ``i``
of its destination, decorated with :func:`instr`: parameters annotated :class:`Reg` are
registers, :class:`Imm` int8 immediates. :meth:`Instruction.program` turns it into the
program it stands for,

    for i in range(n):
        d[i] = semantics(a[i], b[i], ..., imm, ...)

which is both the pattern of its tirpat rule (the compiler replaces every such loop by the
instruction) and what the simulator runs, compiled once for the host: the meaning is
written once, so the rule and the simulator cannot disagree.

>>> print(INSTRUCTIONS["vclip"].program(lanes=4, scope="").script())   # doctest: +ELLIPSIS
# from tvm.script import tirx as T
...
def vclip(d: T.Buffer((4,), "int8", align=1), a: T.Buffer((4,), "int8", align=1), lo: T.int8, hi: T.int8, n: T.int32):
    for i in range(n):
        d[i] = T.max(T.min(a[i], hi), lo)
"""

import inspect
from dataclasses import dataclass
from typing import Callable

from tvm import tirx

__all__ = ["VRF", "Reg", "Imm", "Instruction", "instr", "INSTRUCTIONS"]

#: The storage scope of the vector register file in TIR.
VRF = "local.vecunit"


class Reg:
    """Annotates a register operand of an instruction (its lane value)."""


class Imm:
    """Annotates an int8 immediate operand of an instruction."""


@dataclass(frozen=True)
class Instruction:
    """One ALU instruction: its ``name``, ``semantics`` and operand names (destination ``d`` first)."""

    name: str
    semantics: Callable
    regs: tuple
    imms: tuple

    def program(self, lanes: int, scope: str = VRF) -> tirx.PrimFunc:
        """The instruction as a TIR program on ``(lanes,)`` registers in ``scope``: its
        parameters are the registers, the immediates, then the vector length ``n``."""
        d, *srcs = (tirx.decl_buffer((lanes,), "int8", r, scope=scope, data_alignment=1) for r in ("d", *self.regs))
        imms = [tirx.Var(name, "int8") for name in self.imms]
        n, i = tirx.Var("n", "int32"), tirx.Var("i", "int32")
        store = tirx.BufferStore(d, self.semantics(*(s[i] for s in srcs), *imms), [i])
        loop = tirx.For(i, tirx.const(0, "int32"), n, tirx.ForKind.SERIAL, store)
        return tirx.PrimFunc([d, *srcs, *imms, n], loop).with_attr("global_symbol", self.name)


#: Every ALU instruction, by name.
INSTRUCTIONS: dict[str, Instruction] = {}


def instr(semantics: Callable) -> Instruction:
    """Declare the ALU instruction named after ``semantics`` (see the module docstring)."""
    kinds = {p.name: p.annotation for p in inspect.signature(semantics).parameters.values()}
    if any(k not in (Reg, Imm) for k in kinds.values()):
        raise TypeError(f"{semantics.__name__}: annotate every operand with Reg or Imm")
    found = INSTRUCTIONS[semantics.__name__] = Instruction(
        semantics.__name__, semantics, tuple(n for n, k in kinds.items() if k is Reg),
        tuple(n for n, k in kinds.items() if k is Imm))
    return found


@instr
def vmov(a: Reg):                 # what x + 0 and clip(x, -128, 127) simplify to
    return a


@instr
def vadd(a: Reg, b: Reg):
    return a + b


@instr
def vsub(a: Reg, b: Reg):
    return a - b


@instr
def vmax(a: Reg, b: Reg):
    return tirx.max(a, b)


@instr
def vmin(a: Reg, b: Reg):
    return tirx.min(a, b)


@instr
def vaddi(a: Reg, imm: Imm):
    return a + imm


@instr
def vsubi(a: Reg, imm: Imm):
    return a - imm


@instr
def vmaxi(a: Reg, imm: Imm):      # ReLU is vmaxi d, a, 0
    return tirx.max(a, imm)


@instr
def vmini(a: Reg, imm: Imm):
    return tirx.min(a, imm)


@instr
def vclip(a: Reg, lo: Imm, hi: Imm):
    return tirx.max(tirx.min(a, hi), lo)


@instr
def vfill(imm: Imm):              # a max-pool's accumulator starts at -128
    return imm
