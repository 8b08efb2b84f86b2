"""vecunit's memory and instructions, each declared once (:func:`tirpat.device.instr`).

vecunit is an int8 vector unit. Its register file, :data:`VRF` (storage scope
``local.vecunit`` in TIR), holds ``regs`` registers of ``lanes`` int8 lanes; a register's
address is its first element. Every instruction carries a vector length ``n``
(``0 <= n <= lanes``, RISC-V V's ``vl``): it acts on lanes ``[0, n)`` and leaves the others.
Each is the TIR program it computes; from it come the compiler's rule and call, the
runtime's argument order and the simulator's arithmetic, so they cannot disagree:

- ``vld``: lanes ``[front, n - back)`` of register ``d`` from host memory, lane ``i`` from
  element ``offset + i * stride`` (a row, a column, a pooling window's row); the lanes
  before and after get ``pad``;
- ``vst``: lanes ``[0, n)`` of register ``src`` to host memory, lane ``i`` to element
  ``offset + i * stride``;
- the ALU instructions of :data:`ALU`, lane-wise on int8 with wrap-around, as TIR's int8
  arithmetic. Each is written as what lane ``i`` of its destination ``d`` gets from its
  operands' lanes (parameters annotated :class:`Reg`, registers) and int8 immediates
  (:class:`Imm`); :func:`alu` makes that the program ``for i in range(n): d[i] = ...``.

>>> print(INSTRUCTIONS["vclip"].program(lanes=4).script())   # doctest: +ELLIPSIS
# from tvm.script import tirx as T
...
def vclip(d: T.Buffer((4,), "int8", scope="local.vecunit"), a: T.Buffer((4,), "int8", scope="local.vecunit"), lo: T.int8, hi: T.int8, n: T.int32):
    for i in range(n):
        d[i] = T.max(T.min(a[i], hi), lo)
>>> INSTRUCTIONS["vld"].arguments
('d', 'host', 'offset', 'stride', 'n', 'front', 'back', 'pad')
"""

import inspect
from typing import Callable

from tvm import tirx

from tirpat import device

__all__ = ["VRF", "Reg", "Imm", "alu", "ALU", "INSTRUCTIONS"]

#: The vector register file: ``regs`` registers of ``lanes`` lanes, register-aligned, one copy
#: of each buffer (the unit runs in order: double buffering would overlap nothing).
VRF = device.Memory("VRF", "local.vecunit", "int8", capacity=lambda o: o["regs"] * o["lanes"], align="lanes",
                    double_buffer=False)


def _loop(n, body: Callable) -> tirx.For:
    i = tirx.Var("i", "int32")
    return tirx.For(i, tirx.const(0, "int32"), n, tirx.ForKind.SERIAL, body(i))


@device.instr("vecunit.vld", memories=[VRF])
def vld(lanes: int = 16) -> tirx.PrimFunc:
    d, host = VRF.buffer((lanes,), "d"), tirx.decl_buffer((tirx.Var("size", "int32"),), "int8", "host")
    offset, stride, n, front, back = (tirx.Var(v, "int32") for v in ("offset", "stride", "n", "front", "back"))
    pad = tirx.Var("pad", "int8")
    lane = lambda i: tirx.if_then_else(tirx.all(front <= i, i < n - back), host[offset + i * stride], pad)
    return tirx.PrimFunc([d, host, offset, stride, n, front, back, pad],
                         _loop(n, lambda i: tirx.BufferStore(d, lane(i), [i])))


@device.instr("vecunit.vst", memories=[VRF])
def vst(lanes: int = 16) -> tirx.PrimFunc:
    host, src = tirx.decl_buffer((tirx.Var("size", "int32"),), "int8", "host"), VRF.buffer((lanes,), "src")
    offset, stride, n = (tirx.Var(v, "int32") for v in ("offset", "stride", "n"))
    return tirx.PrimFunc([host, offset, stride, src, n],
                         _loop(n, lambda i: tirx.BufferStore(host, src[i], [offset + i * stride])))


class Reg:
    """Annotates a register operand of an ALU instruction (its lane value)."""


class Imm:
    """Annotates an int8 immediate operand of an ALU instruction."""


#: The ALU instructions, by name.
ALU: dict[str, device.Instruction] = {}


def alu(semantics: Callable) -> device.Instruction:
    """Declare the ALU instruction named after ``semantics`` (see the module doc)."""
    kinds = {p.name: p.annotation for p in inspect.signature(semantics).parameters.values()}
    if any(k not in (Reg, Imm) for k in kinds.values()):
        raise TypeError(f"{semantics.__name__}: annotate every operand with Reg or Imm")

    def program(lanes: int = 16) -> tirx.PrimFunc:
        d, *srcs = (VRF.buffer((lanes,), r) for r in ("d", *(n for n, k in kinds.items() if k is Reg)))
        imms, n = [tirx.Var(n, "int8") for n, k in kinds.items() if k is Imm], tirx.Var("n", "int32")
        store = lambda i: tirx.BufferStore(d, semantics(*(s[i] for s in srcs), *imms), [i])
        return tirx.PrimFunc([d, *srcs, *imms, n], _loop(n, store))

    name = semantics.__name__
    ALU[name] = device.instr(f"vecunit.{name}", memories=[VRF], name=name)(program)
    return ALU[name]


@alu
def vmov(a: Reg):                 # what x + 0 and clip(x, -128, 127) simplify to
    return a


@alu
def vadd(a: Reg, b: Reg):
    return a + b


@alu
def vsub(a: Reg, b: Reg):
    return a - b


@alu
def vmax(a: Reg, b: Reg):
    return tirx.max(a, b)


@alu
def vmin(a: Reg, b: Reg):
    return tirx.min(a, b)


@alu
def vaddi(a: Reg, imm: Imm):
    return a + imm


@alu
def vsubi(a: Reg, imm: Imm):
    return a - imm


@alu
def vmaxi(a: Reg, imm: Imm):      # ReLU is vmaxi d, a, 0
    return tirx.max(a, imm)


@alu
def vmini(a: Reg, imm: Imm):
    return tirx.min(a, imm)


@alu
def vclip(a: Reg, lo: Imm, hi: Imm):
    return tirx.max(tirx.min(a, hi), lo)


@alu
def vfill(imm: Imm):              # a max-pool's accumulator starts at -128
    return imm


#: Every instruction, by name.
INSTRUCTIONS: dict[str, device.Instruction] = {"vld": vld, "vst": vst, **ALU}
