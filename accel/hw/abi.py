"""The runtime ABI, declared once: every ``accel.*`` function, its arguments and their roles.

Everything that depends on argument positions is derived from this table: the runtime's
registration (:mod:`accel.hw.runtime`), the compiler's call builder (``accel.compiler.rules.call``),
the scratchpad planner's operand roles, and the table in ``accel/ISA.md`` section 7 (a test
compares it with :func:`markdown_table`).

Roles:

- ``host``: a host buffer (a DLTensor); the runtime maps it to a buffer-table slot;
- ``scratch``: a scratchpad address, in elements; ``mem`` says which scratchpad (a
  :class:`~accel.hw.isa.Mem`, or the name of the argument that holds it), ``reads`` /
  ``writes`` what the instruction does there, ``unless`` an argument that, when nonzero,
  cancels the read;
- ``int``: any other integer field;
- ``deps``: the dependency flags (a 4-bit mask, or ``AUTO``), always last.

>>> LOAD.names[:3]
('host', 'elem_offset', 'mem')
>>> [a.name for a in GEMM.scratch]
['acc_addr', 'inp_addr', 'wgt_addr']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from accel.hw.isa import Alu, Gemm, Instruction, Load, Mem, Store

__all__ = ["Arg", "Function", "FUNCTIONS", "LOAD", "STORE", "GEMM", "ALU", "DEP_PUSH", "DEP_POP",
           "SYNC", "markdown_table"]


@dataclass(frozen=True)
class Arg:
    """One argument of a runtime function (see the module doc for the roles)."""

    name: str
    role: str = "int"
    field: Optional[str] = None             # the instruction field it sets, if not ``name``
    mem: Union[Mem, str, None] = None       # scratch: the scratchpad, or the argument naming it
    reads: bool = False
    writes: bool = False
    unless: Optional[str] = None            # scratch: no read when this argument is nonzero

    def __post_init__(self):
        if self.role not in ("host", "scratch", "int", "deps"):
            raise ValueError(f"Arg {self.name}: unknown role {self.role!r}")


@dataclass(frozen=True)
class Function:
    """A runtime function: its TVM global name, arguments, the instruction it emits (if
    any) and a one-line description of what it does."""

    name: str
    args: tuple[Arg, ...]
    doc: str
    instruction: Optional[type[Instruction]] = None

    @property
    def short(self) -> str:
        """The name without the ``accel.`` prefix."""
        return self.name.split(".", 1)[1]

    @property
    def names(self) -> tuple[str, ...]:
        """The argument names in call order."""
        return tuple(a.name for a in self.args)

    @property
    def fields(self) -> tuple[str, ...]:
        """The instruction field each argument but ``deps`` sets, in call order."""
        return tuple(a.field or a.name for a in self.args if a.role != "deps")

    @property
    def scratch(self) -> tuple[Arg, ...]:
        """The scratchpad-address arguments."""
        return tuple(a for a in self.args if a.role == "scratch")

    @property
    def host(self) -> Optional[Arg]:
        """The host-buffer argument, if any."""
        return next((a for a in self.args if a.role == "host"), None)

    def index(self, name: str) -> int:
        """The position of argument ``name`` (0-based, after the function name).

        >>> ALU.index("use_imm")
        1
        """
        return self.names.index(name)


_DEPS = Arg("deps", "deps")

LOAD = Function("accel.load", (
    Arg("host", "host", field="slot", reads=True), Arg("elem_offset", field="dram_offset"), Arg("mem"),
    Arg("sram_addr", "scratch", mem="mem", writes=True), Arg("sram_ld"), Arg("rows"), Arg("cols"),
    Arg("dram_ld"), Arg("pad_top"), Arg("pad_bottom"), Arg("pad_left"), Arg("pad_right"), Arg("pad_value"),
    _DEPS), "LOAD: a 2-D strided DMA from host memory into a scratchpad, with padding", Load)

STORE = Function("accel.store", (
    Arg("host", "host", field="slot", writes=True), Arg("elem_offset", field="dram_offset"),
    Arg("sram_addr", "scratch", mem=Mem.ACC, reads=True), Arg("sram_ld"), Arg("rows"), Arg("cols"),
    Arg("dram_ld"), Arg("mode"), _DEPS), "STORE: ACC to host memory, narrowing per `mode`", Store)

GEMM = Function("accel.gemm", (
    Arg("reset"), Arg("acc_addr", "scratch", mem=Mem.ACC, reads=True, writes=True, unless="reset"),
    Arg("inp_addr", "scratch", mem=Mem.INP, reads=True, unless="reset"),
    Arg("wgt_addr", "scratch", mem=Mem.WGT, reads=True, unless="reset"),
    Arg("acc_ld"), Arg("inp_ld"), Arg("wgt_ld"), Arg("ext_out"), Arg("ext_in"),
    Arg("acc_stride_out"), Arg("acc_stride_in"), Arg("inp_stride_out"), Arg("inp_stride_in"),
    Arg("wgt_stride_out"), Arg("wgt_stride_in"), _DEPS),
    "GEMM: acc += inp x wgt^T on a block of tiles (`reset`: acc = 0)", Gemm)

ALU = Function("accel.alu", (
    Arg("op"), Arg("use_imm"), Arg("dst_addr", "scratch", mem=Mem.ACC, reads=True, writes=True),
    Arg("src_addr", "scratch", mem=Mem.ACC, reads=True, unless="use_imm"), Arg("imm"),
    Arg("ext_out"), Arg("ext_in"), Arg("dst_stride_out"), Arg("dst_stride_in"), Arg("src_stride_out"),
    Arg("src_stride_in"), _DEPS), "ALU: dst = op(dst, src or imm) on ACC vectors", Alu)

DEP_PUSH = Function("accel.dep_push", (Arg("src_queue"), Arg("dst_queue")),
                    "the latest instruction of `src_queue` pushes a token to its neighbour `dst_queue` "
                    "(a NOP carries it if there is none, or if its flag is taken)")
DEP_POP = Function("accel.dep_pop", (Arg("src_queue"), Arg("dst_queue")),
                   "the next instruction of `dst_queue` pops a token from `src_queue` (pending pops "
                   "left at sync go on FINISH or on NOPs)")
SYNC = Function("accel.sync", (), "append FINISH, verify tokens, run the stream, release borrowed slots")

#: Every runtime function by TVM global name, in the order ISA.md lists them.
FUNCTIONS: dict[str, Function] = {f.name: f for f in (LOAD, STORE, GEMM, ALU, DEP_PUSH, DEP_POP, SYNC)}


def markdown_table() -> str:
    """ISA.md section 7's table of the runtime functions, as this module declares them.

    >>> print(markdown_table().splitlines()[2])
    | `accel.load` | `(host, elem_offset, mem, sram_addr, sram_ld, rows, cols, dram_ld, pad_top, pad_bottom, pad_left, pad_right, pad_value, deps)` |
    """
    rows = ["| function | arguments |", "|---|---|"]
    for f in FUNCTIONS.values():
        args = f"`({', '.join(f.names)})`"
        rows.append(f"| `{f.name}` | {args} |" if f.instruction else f"| `{f.name}` | {args}: {f.doc} |")
    return "\n".join(rows)
