"""accel's scratchpads and instructions, each declared once (:mod:`tirpat.device`).

The three scratchpads are :class:`tirpat.device.Memory` objects: :data:`INP` and
:data:`WGT` hold int8, :data:`ACC` int32; each holds ``<name>_bytes`` of the
:class:`~accel.hw.config.Config` (its options), allocates whole tiles and double-buffers
what a loop allocates. :class:`Mem` (LOAD's memory id) is read off them.

Every instruction is the TIR program it computes on flat scratchpads and host buffers
(:func:`tirpat.device.instr`); the program's parameters are the runtime function's
arguments, in order. Instructions that share a runtime function differ in a fixed argument:

- ``accel.load``: :data:`LOAD`, one per memory (``mem`` fixed): a 2-D strided DMA from
  host memory with padding, ``rows x cols`` elements at ``elem_offset + r*dram_ld + c``
  into a ``(pad_top+rows+pad_bottom) x (pad_left+cols+pad_right)`` block at
  ``sram_addr + r*sram_ld + c``, the border ``pad_value``;
- ``accel.store``: :data:`STORE`, one per :class:`StoreMode` (``mode`` fixed): ``rows x
  cols`` ACC elements to host memory at ``elem_offset + r*dram_ld + c*dram_step`` (an element
  stride for upsampled layouts), as int32, wrapped to int8, or saturated to int8;
- ``accel.gemm``: :data:`GEMM` (``reset=0``) ``acc += inp @ wgt.T`` on ``tile x tile``
  tiles at ``X_addr + o*X_stride_out + i*X_stride_in`` (row stride ``X_ld``) for each step
  ``(o, i)`` of two loop levels, and :data:`GEMM_RESET` (``reset=1``) ``acc = 0`` there;
- ``accel.alu``: :data:`ALU`, one per :class:`AluOp` and operand kind (``op``, ``use_imm``
  fixed): ``dst = op(dst, imm or src)`` on ``tile``-lane int32 ACC vectors over two loop
  levels, every read before any write, wrapping like int32 arithmetic; a shift amount is
  clipped to :data:`OPERAND_RANGE`;
- ``accel.dwmac``: :data:`DWMAC` ``acc[p, c] += inp[p, c] * wgt[c]`` on ``tile x tile``
  tiles of pixels x channels and a weight row per step ``(o, i)`` of two loop levels (a
  depthwise convolution's kernel taps), declared in the last section;
- ``accel.lut``: :data:`LUT` ``acc[d] = table[clip(acc[d], -128, 127) + 128]`` lane-wise on
  ``tile``-lane ACC vectors over two loop levels, the 256-entry int8 table read from WGT
  (loaded there by DMA like a weight): a table activation after a requantise, declared
  after DWMAC.

Every call also takes ``deps`` last: compiled code passes :data:`AUTO` (the driver adds
the dependency tokens), which is fixed in the declarations. From these come the
runtime's argument order (:mod:`accel.hw.runtime`), the compiler's calls
(:mod:`accel.compiler.rules`), the planner's scratchpad operands and roles, ISA.md
section 7's table (:func:`markdown_table`), and the reference semantics the simulator's
fast paths are tested against (:data:`ALU_UFUNCS` is their one table of ALU arithmetic).

>>> LOAD[Mem.ACC].arguments[:4]
('host', 'elem_offset', 'mem', 'sram_addr')
>>> [(o.name, o.role) for o in GEMM_RESET.memory_operands]
[('acc_addr', 'write'), ('inp_addr', 'unused'), ('wgt_addr', 'unused')]
>>> import numpy as np
>>> ALU[AluOp.SHR, True].reference(dst_addr=np.array([-64, 64], "int32"), src_addr=np.zeros(2, "int32"), imm=40,
...     ext_out=1, ext_in=1, dst_stride_out=0, dst_stride_in=0, src_stride_out=0, src_stride_in=0,
...     tile=2)["dst_addr"].tolist()
[-1, 0]
"""

from __future__ import annotations

import enum
import inspect
import math
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
from tvm import ir, tirx

from tirpat import device

__all__ = ["INP", "WGT", "ACC", "MEMORIES", "SCOPES", "Mem", "StoreMode", "AluOp", "AUTO", "OPERAND_RANGE",
           "ALU_UFUNCS", "alu_operand", "LOAD", "STORE", "GEMM", "GEMM_RESET", "ALU", "LOAD_HOST_DTYPE", "STORE_HOST_DTYPE", "INSTRUCTIONS", "FUNCTIONS", "OTHER_FUNCTIONS",
           "FIELD_OF", "capacity_option", "distinct_starts", "instruction_of", "markdown_table"]

#: The tile width a declaration's program is built for when none is given (Config's default).
TILE = 16
#: ``deps`` of compiled code's calls: let the driver add the dependency tokens.
AUTO = -1


def capacity_option(memory: device.Memory) -> str:
    """The Config field (a backend option) that sizes ``memory``, in bytes.

    >>> capacity_option(ACC)
    'acc_bytes'
    """
    return f"{memory.name.lower()}_bytes"


def _scratchpad(name: str, dtype: str) -> device.Memory:
    memory = device.Memory(name, f"local.accel_{name.lower()}", dtype,
                           capacity=lambda options: options[capacity_option(memory)] // memory.itemsize,
                           align="tile", double_buffer=True)
    return memory


#: The scratchpads: capacity the Config's ``<name>_bytes``, whole tiles, double-buffered in loops.
INP, WGT, ACC = _scratchpad("INP", "int8"), _scratchpad("WGT", "int8"), _scratchpad("ACC", "int32")
#: Scratchpad ids (LOAD's ``func`` byte), in the order of :data:`MEMORIES`, from 1.
Mem = enum.IntEnum("Mem", [(m.name, k) for k, m in enumerate((INP, WGT, ACC), start=1)], module=__name__)
Mem.__doc__ = "Scratchpad ids (LOAD's ``func`` byte): INP and WGT hold int8, ACC int32."
#: Each scratchpad's declaration by id.
MEMORIES: dict = {Mem[m.name]: m for m in (INP, WGT, ACC)}
#: Each scratchpad's id by storage scope.
SCOPES: dict = {m.scope: mem for mem, m in MEMORIES.items()}


class StoreMode(enum.IntEnum):
    """How STORE writes int32 ACC values: as int32, or narrowed to int8."""

    INT32 = 0
    WRAP = 1  # keep the low 8 bits, as a TIR Cast / numpy astype does
    SATURATE = 2  # clip to [-128, 127] first


class AluOp(enum.IntEnum):
    """ALU operations on int32 ACC vectors (wrap-around arithmetic)."""

    ADD = 0
    MAX = 1
    MIN = 2
    SHR = 3  # arithmetic shift right; amounts are clipped to OPERAND_RANGE[SHR]
    MUL = 4


#: The range an ALU op's second operand is clipped to before use (a shift of an int32 by 0 to 31).
OPERAND_RANGE = {AluOp.SHR: (0, 31)}
#: Each ALU op as a numpy ufunc on int32 (what the simulator's fast paths run; the operand
#: clipped to :data:`OPERAND_RANGE` first): tests compare it with the declared programs.
ALU_UFUNCS = {AluOp.ADD: np.add, AluOp.MAX: np.maximum, AluOp.MIN: np.minimum, AluOp.SHR: np.right_shift,
              AluOp.MUL: np.multiply}


def alu_operand(op: AluOp, value: int | np.ndarray) -> int | np.ndarray:
    """The second operand of ALU ``op`` as the op uses it: clipped to its
    :data:`OPERAND_RANGE`, if it has one (an int, or an int32 array).

    >>> alu_operand(AluOp.SHR, 40), alu_operand(AluOp.ADD, 40), alu_operand(AluOp.SHR, np.array([-1, 3])).tolist()
    (31, 40, [0, 3])
    """
    bounds = OPERAND_RANGE.get(op)
    if bounds is None:
        return value
    return np.clip(value, *bounds) if isinstance(value, np.ndarray) else min(max(value, bounds[0]), bounds[1])


_ALU_TIR: dict[AluOp, Callable] = {AluOp.ADD: lambda a, b: a + b, AluOp.MAX: tirx.max, AluOp.MIN: tirx.min,
                                   AluOp.SHR: tirx.shift_right, AluOp.MUL: lambda a, b: a * b}

#: The instruction field a runtime argument sets, where their names differ (the others
#: set the field of their name; ``deps`` sets the dependency flags).
FIELD_OF = {"host": "slot", "elem_offset": "dram_offset"}


# -- building the programs ------------------------------------------------------------------
def _scalars(names: str) -> list:
    return [tirx.Var(n, "int32") for n in names.split()]


def _flat(name: str, dtype: str, memory: Optional[device.Memory] = None) -> tirx.Buffer:
    """A flat buffer ``name`` of any size: a scratchpad region from its address, or a host buffer."""
    return tirx.decl_buffer((tirx.Var(f"{name}_size", "int32"),), dtype, name,
                            scope=memory.scope if memory else "")


def _grid(names: str, extents: Sequence, body: Callable) -> tirx.Stmt:
    """``for a in range(e0): for b ...: body(a, b, ...)``, the loop variables ``names``."""
    loop_vars = [tirx.Var(n, "int32") for n in names.split()[:len(extents)]]
    stmt = body(*loop_vars)
    for v, e in reversed(list(zip(loop_vars, extents))):
        stmt = tirx.For(v, tirx.const(0, "int32"), e, tirx.ForKind.SERIAL, stmt)
    return stmt


def _between(x, lo, n):
    return tirx.all(lo <= x, x < lo + n)


def _fits(value, dtype: str) -> bool:
    info = np.iinfo(dtype)
    return info.min <= value <= info.max


def _aligned(*names: str) -> tuple:
    """The precondition that every one of the ``names`` is a multiple of ``tile``."""
    def check(**values) -> bool:
        return all(values[n] % values["tile"] == 0 for n in names)

    # the device kit reads a precondition's operands off its signature
    check.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY)
                                             for n in (*names, "tile")])
    return check, ", ".join(f"{n}={{{n}}}" for n in names) + " must be multiples of the tile {tile}"


# -- LOAD -----------------------------------------------------------------------------------
def _load(mem: Mem) -> device.Instruction:
    memory = MEMORIES[mem]
    requires = [(lambda rows, cols, pad_top, pad_bottom, pad_left, pad_right, sram_ld:
                 pad_top + rows + pad_bottom <= 1 or sram_ld >= pad_left + cols + pad_right,
                 "sram_ld {sram_ld} is smaller than the block width: rows would overlap")]
    if memory.dtype != "int32":
        requires.append((lambda pad_value: _fits(pad_value, memory.dtype), "pad_value {pad_value} does not fit int8"))

    @device.instr("accel.load", memories=[memory], fixed={"mem": int(mem), "deps": AUTO}, requires=requires,
                  name=f"load_{memory.name.lower()}")
    def program(tile: int = TILE) -> tirx.PrimFunc:
        host, sram = _flat("host", memory.dtype), _flat("sram_addr", memory.dtype, memory)
        (elem_offset, mem_, sram_ld, rows, cols, dram_ld, pad_top, pad_bottom, pad_left, pad_right, pad_value,
         deps) = _scalars("elem_offset mem sram_ld rows cols dram_ld pad_top pad_bottom pad_left pad_right "
                          "pad_value deps")

        def element(r, c):
            inside = tirx.all(_between(r, pad_top, rows), _between(c, pad_left, cols))
            value = tirx.if_then_else(inside, host[elem_offset + (r - pad_top) * dram_ld + c - pad_left],
                                      tirx.Cast(memory.dtype, pad_value))
            return tirx.BufferStore(sram, value, [r * sram_ld + c])

        body = _grid("r c", [pad_top + rows + pad_bottom, pad_left + cols + pad_right], element)
        return tirx.PrimFunc([host, elem_offset, mem_, sram, sram_ld, rows, cols, dram_ld, pad_top, pad_bottom,
                              pad_left, pad_right, pad_value, deps], body)

    return program


#: LOAD into each scratchpad, by :class:`Mem`.
LOAD: dict = {mem: _load(mem) for mem in Mem}


# -- STORE ----------------------------------------------------------------------------------
_NARROW = {StoreMode.INT32: ("int32", lambda v: v), StoreMode.WRAP: ("int8", lambda v: tirx.Cast("int8", v)),
           StoreMode.SATURATE: ("int8", lambda v: tirx.Cast("int8", tirx.max(tirx.min(v, 127), -128)))}


def _store(mode: StoreMode) -> device.Instruction:
    dtype, narrow = _NARROW[mode]

    # no two elements to one place: rows apart (dram_ld beyond a row's span), or interleaved
    # (a column's span within dram_step: a transposing store); distinct_starts decides it exactly
    # dram_step came after the first STORE: code compiled before it stores rows contiguously
    @device.instr("accel.store", memories=[ACC], fixed={"mode": int(mode), "deps": AUTO}, added={"dram_step": 1},
                  requires=[(lambda dram_step: dram_step >= 1, "dram_step {dram_step} must be at least 1"),
                            (lambda rows, cols, dram_ld, dram_step: not (rows and cols)
                             or distinct_starts(rows, dram_ld, cols, dram_step),
                             "dram_ld {dram_ld} and dram_step {dram_step} write two of the {rows} x {cols} elements "
                             "to one place: they would overwrite each other")],
                  name=f"store_{mode.name.lower()}")
    def program(tile: int = TILE) -> tirx.PrimFunc:
        host, sram = _flat("host", dtype), _flat("sram_addr", "int32", ACC)
        elem_offset, sram_ld, rows, cols, dram_ld, dram_step, mode_, deps = _scalars(
            "elem_offset sram_ld rows cols dram_ld dram_step mode deps")
        body = _grid("r c", [rows, cols], lambda r, c: tirx.BufferStore(
            host, narrow(sram[r * sram_ld + c]), [elem_offset + r * dram_ld + c * dram_step]))
        return tirx.PrimFunc([host, elem_offset, sram, sram_ld, rows, cols, dram_ld, dram_step, mode_, deps], body)

    return program


#: STORE in each mode, by :class:`StoreMode`.
STORE: dict = {mode: _store(mode) for mode in StoreMode}


# -- GEMM -----------------------------------------------------------------------------------
def _gemm(reset: int) -> device.Instruction:
    operands = ("acc",) if reset else ("acc", "inp", "wgt")
    requires = [_aligned(*(f"{p}_{f}" for p in operands for f in ("addr", "ld", "stride_out", "stride_in")))]
    requires.append((lambda acc_ld, tile: acc_ld >= tile, "acc_ld={acc_ld} is smaller than the tile width {tile}"))
    if not reset:
        requires += [(lambda inp_ld, tile: inp_ld >= tile, "inp_ld={inp_ld} is smaller than the tile width {tile}"),
                     (lambda wgt_ld, tile: wgt_ld >= tile, "wgt_ld={wgt_ld} is smaller than the tile width {tile}")]

    @device.instr("accel.gemm", memories=[INP, WGT, ACC], fixed={"reset": reset, "deps": AUTO}, requires=requires,
                  name="gemm_reset" if reset else "gemm")
    def program(tile: int = TILE) -> tirx.PrimFunc:
        acc, inp, wgt = _flat("acc_addr", "int32", ACC), _flat("inp_addr", "int8", INP), _flat("wgt_addr", "int8", WGT)
        (reset_, acc_ld, inp_ld, wgt_ld, ext_out, ext_in, acc_so, acc_si, inp_so, inp_si, wgt_so, wgt_si,
         deps) = _scalars("reset acc_ld inp_ld wgt_ld ext_out ext_in acc_stride_out acc_stride_in inp_stride_out "
                          "inp_stride_in wgt_stride_out wgt_stride_in deps")

        def step(o, i, r, c, k=None):
            at = acc_so * o + acc_si * i + r * acc_ld + c
            if reset:
                return tirx.BufferStore(acc, tirx.const(0, "int32"), [at])
            product = (tirx.Cast("int32", inp[inp_so * o + inp_si * i + r * inp_ld + k])
                       * tirx.Cast("int32", wgt[wgt_so * o + wgt_si * i + c * wgt_ld + k]))
            return tirx.BufferStore(acc, acc[at] + product, [at])

        body = _grid("o i r c k", [ext_out, ext_in, tile, tile] + ([] if reset else [tile]), step)
        return tirx.PrimFunc([reset_, acc, inp, wgt, acc_ld, inp_ld, wgt_ld, ext_out, ext_in, acc_so, acc_si, inp_so,
                              inp_si, wgt_so, wgt_si, deps], body)

    return program


#: GEMM accumulating, and in reset form.
GEMM, GEMM_RESET = _gemm(0), _gemm(1)


# -- ALU ------------------------------------------------------------------------------------
def distinct_starts(ext_out: int, stride_out: int, ext_in: int, stride_in: int) -> bool:
    """Whether ``o*stride_out + i*stride_in`` differ for all ``o < ext_out``, ``i < ext_in``
    (strides >= 0), in O(1): no enumeration, whatever the extents (ALU's destination
    vectors must, and the simulator checks it with this function).

    Two steps collide iff ``do*stride_out == di*stride_in`` for some ``0 < do < ext_out``,
    ``0 < di < ext_in``; the smallest such pair is ``(stride_in/g, stride_out/g)`` with
    ``g = gcd(stride_out, stride_in)``.

    >>> distinct_starts(4, 16, 4, 64), distinct_starts(4, 64, 8, 16), distinct_starts(2**32 - 1, 0, 1, 0)
    (True, False, False)
    """
    if ext_out <= 1 or ext_in <= 1:
        return (ext_in <= 1 or stride_in != 0) and (ext_out <= 1 or stride_out != 0)
    if stride_out == 0 or stride_in == 0:
        return False
    g = math.gcd(stride_out, stride_in)
    return stride_in // g >= ext_out or stride_out // g >= ext_in


def _alu(op: AluOp, use_imm: bool) -> device.Instruction:
    requires = [_aligned("dst_addr", "dst_stride_out", "dst_stride_in") if use_imm else
                _aligned("dst_addr", "dst_stride_out", "dst_stride_in", "src_addr", "src_stride_out", "src_stride_in"),
                (lambda ext_out, dst_stride_out, ext_in, dst_stride_in:
                 not (ext_out and ext_in) or distinct_starts(ext_out, dst_stride_out, ext_in, dst_stride_in),
                 "ALU destination vectors overlap each other")]
    lo_hi = OPERAND_RANGE.get(op)

    @device.instr("accel.alu", memories=[ACC], fixed={"op": int(op), "use_imm": int(use_imm), "deps": AUTO},
                  requires=requires, name=f"alu_{op.name.lower()}{'_imm' if use_imm else ''}")
    def program(tile: int = TILE) -> tirx.PrimFunc:
        dst, src = _flat("dst_addr", "int32", ACC), _flat("src_addr", "int32", ACC)
        op_, use_imm_, imm, ext_out, ext_in, dso, dsi, sso, ssi, deps = _scalars(
            "op use_imm imm ext_out ext_in dst_stride_out dst_stride_in src_stride_out src_stride_in deps")
        # every result is computed before any is written (a source vector may be another step's destination)
        before = tirx.decl_buffer((ext_out, ext_in, tile), "int32", "before")

        def compute(o, i, lane):
            b = imm if use_imm else src[sso * o + ssi * i + lane]
            if lo_hi:
                b = tirx.max(tirx.min(b, lo_hi[1]), lo_hi[0])
            return tirx.BufferStore(before, _ALU_TIR[op](dst[dso * o + dsi * i + lane], b), [o, i, lane])

        write = _grid("o i lane", [ext_out, ext_in, tile], lambda o, i, lane: tirx.BufferStore(
            dst, before[o, i, lane], [dso * o + dsi * i + lane]))
        body = tirx.SeqStmt([tirx.AllocBuffer(before), _grid("o i lane", [ext_out, ext_in, tile], compute), write])
        return tirx.PrimFunc([op_, use_imm_, dst, src, imm, ext_out, ext_in, dso, dsi, sso, ssi, deps], body)

    return program


#: The ALU instructions by ``(op, use_imm)``.
ALU: dict = {(op, use_imm): _alu(op, use_imm) for op in AluOp for use_imm in (False, True)}

#: The host buffer's dtype of each LOAD (by :class:`Mem`) and STORE (by :class:`StoreMode`):
#: what the DMA moves, as the declarations say (the simulator's dtype checks, the cycle model's bytes).
LOAD_HOST_DTYPE = {mem: np.dtype(ins.operand("host").dtype) for mem, ins in LOAD.items()}
STORE_HOST_DTYPE = {mode: np.dtype(ins.operand("host").dtype) for mode, ins in STORE.items()}

#: Every instruction by name.
INSTRUCTIONS: dict = {i.name: i for i in (*LOAD.values(), *STORE.values(), GEMM, GEMM_RESET, *ALU.values())}
#: The instructions each runtime function backs, by its TVM global name (in ISA.md's order).
FUNCTIONS: dict = {}
for _ins in INSTRUCTIONS.values():
    FUNCTIONS.setdefault(_ins.runtime_name, []).append(_ins)
#: The runtime functions that emit no instruction: ``(arguments, what it does)`` by name.
OTHER_FUNCTIONS = {
    "accel.dep_push": (("src_queue", "dst_queue"), "the latest instruction of `src_queue` pushes a token to its "
                       "neighbour `dst_queue` (a NOP carries it if there is none, or if its flag is taken)"),
    "accel.dep_pop": (("src_queue", "dst_queue"), "the next instruction of `dst_queue` pops a token from "
                      "`src_queue` (pending pops left at sync go on FINISH or on NOPs)"),
    "accel.sync": ((), "append FINISH, verify tokens, run the stream, release borrowed slots"),
    "accel.replay": (("key", "*hosts"), "returns 1 after running the stream stored for the static group `key` "
                     "on this call's `hosts`, else 0: the group's calls and its sync follow (which store it)"),
}


def instruction_of(call: ir.Expr) -> Optional[device.Instruction]:
    """The declared instruction a ``T.call_packed`` calls (by runtime name and fixed
    arguments), or None for anything else.

    >>> instruction_of(GEMM_RESET.call(**{o.name: 0 for o in GEMM_RESET.operands}).value).name
    'gemm_reset'
    """
    if not (isinstance(call, ir.Call) and call.op.name == "tirx.tvm_call_packed"
            and isinstance(call.args[0], ir.StringImm)):
        return None
    return next((i for i in FUNCTIONS.get(call.args[0].value, ()) if i.is_call(call)), None)


def markdown_table() -> str:
    """ISA.md section 7's table of the runtime functions, as declared here.

    >>> print(markdown_table().splitlines()[2])
    | `accel.load` | `(host, elem_offset, mem, sram_addr, sram_ld, rows, cols, dram_ld, pad_top, pad_bottom, pad_left, pad_right, pad_value, deps)` |
    """
    rows = ["| function | arguments |", "|---|---|"]
    rows += [f"| `{name}` | `({', '.join(forms[0].arguments)})`" + "".join(
        f"; a call without `{n}` (compiled before it was added) gets {v}" for n, v in forms[0].added.items()) + " |"
        for name, forms in FUNCTIONS.items()]
    rows += [f"| `{name}` | `({', '.join(args)})`: {doc} |" for name, (args, doc) in OTHER_FUNCTIONS.items()]
    return "\n".join(rows)


# -- DWMAC: the per-channel multiply-accumulate (depthwise convolution) -------------------------
def _dwmac() -> device.Instruction:
    requires = [_aligned(*(f"{p}_{f}" for p in ("acc", "inp") for f in ("addr", "ld", "stride_out", "stride_in")),
                         "wgt_addr", "wgt_stride_out", "wgt_stride_in"),
                (lambda acc_ld, tile: acc_ld >= tile, "acc_ld={acc_ld} is smaller than the tile width {tile}"),
                (lambda inp_ld, tile: inp_ld >= tile, "inp_ld={inp_ld} is smaller than the tile width {tile}")]

    @device.instr("accel.dwmac", memories=[INP, WGT, ACC], fixed={"deps": AUTO}, requires=requires, name="dwmac")
    def program(tile: int = TILE) -> tirx.PrimFunc:
        acc, inp, wgt = _flat("acc_addr", "int32", ACC), _flat("inp_addr", "int8", INP), _flat("wgt_addr", "int8", WGT)
        (acc_ld, inp_ld, ext_out, ext_in, acc_so, acc_si, inp_so, inp_si, wgt_so, wgt_si, deps) = _scalars(
            "acc_ld inp_ld ext_out ext_in acc_stride_out acc_stride_in inp_stride_out inp_stride_in wgt_stride_out "
            "wgt_stride_in deps")

        def step(o, i, p, c):
            # pixel p, channel c: one lane per channel, the weight row broadcast over the pixels
            at = acc_so * o + acc_si * i + p * acc_ld + c
            product = (tirx.Cast("int32", inp[inp_so * o + inp_si * i + p * inp_ld + c])
                       * tirx.Cast("int32", wgt[wgt_so * o + wgt_si * i + c]))
            return tirx.BufferStore(acc, acc[at] + product, [at])

        body = _grid("o i p c", [ext_out, ext_in, tile, tile], step)
        return tirx.PrimFunc([acc, inp, wgt, acc_ld, inp_ld, ext_out, ext_in, acc_so, acc_si, inp_so, inp_si,
                              wgt_so, wgt_si, deps], body)

    return program


#: ``acc[p, c] += inp[p, c] * wgt[c]`` on a ``tile x tile`` tile of pixels x channels per step
#: ``(o, i)`` of two loop levels (e.g. the kernel's rows and columns): a depthwise convolution.
DWMAC = _dwmac()
INSTRUCTIONS[DWMAC.name] = DWMAC
FUNCTIONS[DWMAC.runtime_name] = [DWMAC]
__all__ += ["DWMAC"]


# -- LUT: a 256-entry int8 table applied lane-wise to ACC vectors (table activations) ------------
#: Entries of a LUT table: one per int8 value, the value ``v`` at index ``v + 128``.
LUT_ENTRIES = 256


def _lut() -> device.Instruction:
    requires = [_aligned("dst_addr", "dst_stride_out", "dst_stride_in", "lut_addr"),
                (lambda ext_out, dst_stride_out, ext_in, dst_stride_in:
                 not (ext_out and ext_in) or distinct_starts(ext_out, dst_stride_out, ext_in, dst_stride_in),
                 "LUT destination vectors overlap each other")]

    @device.instr("accel.lut", memories=[WGT, ACC], fixed={"deps": AUTO}, requires=requires, name="lut")
    def program(tile: int = TILE) -> tirx.PrimFunc:
        dst, table = _flat("dst_addr", "int32", ACC), _flat("lut_addr", "int8", WGT)
        ext_out, ext_in, dso, dsi, deps = _scalars("ext_out ext_in dst_stride_out dst_stride_in deps")

        def step(o, i, lane):
            at = dso * o + dsi * i + lane
            # The table covers int8 inputs; a value outside [-128, 127] reads the entry of the
            # end it passes (the index is clamped), so no value reads outside the table.
            index = tirx.max(tirx.min(dst[at], 127), -128) + 128
            return tirx.BufferStore(dst, tirx.Cast("int32", table[index]), [at])

        body = _grid("o i lane", [ext_out, ext_in, tile], step)
        return tirx.PrimFunc([dst, table, ext_out, ext_in, dso, dsi, deps], body)

    return program


#: ``acc[d] = table[clip(acc[d], -128, 127) + 128]`` on each lane of ``tile``-lane ACC vectors at
#: ``dst_addr + o*dst_stride_out + i*dst_stride_in``, the 256 int8 entries at WGT ``lut_addr``.
LUT = _lut()
INSTRUCTIONS[LUT.name] = LUT
FUNCTIONS[LUT.runtime_name] = [LUT]
__all__ += ["LUT", "LUT_ENTRIES"]


# -- ALU_CHAIN: a short chain of ALU operations in one pass over a block (an output pipeline) -----
#: The most steps an ALU chain holds, and the most of them that take an immediate: what the
#: 64-byte format has room for (a 4-bit code per step in one word, six immediate words).
CHAIN_STEPS, CHAIN_IMMEDIATES = 8, 6
#: The chain's immediate fields (arguments and instruction fields), in step order.
CHAIN_IMM_FIELDS = tuple(f"imm{j}" for j in range(CHAIN_IMMEDIATES))
#: A step's code: bits 0-2 its :class:`AluOp`, bit 3 set when it takes an immediate.
_STEP_BITS, _STEP_IMM = 4, 8


def _step_codes(length: int, code: int):
    """``(op bits, takes an immediate)`` of each of the chain's ``length`` steps, in order."""
    for k in range(length):
        nibble = code >> (_STEP_BITS * k) & 0xF
        yield nibble & 7, bool(nibble & _STEP_IMM)


class ChainVector(NamedTuple):
    """A chain step's vector operand besides ``src``, given by its step's word: the vector
    ``offset`` elements from ``src_addr``, read with src's strides (a per-channel vector
    staged beside ``src``), or, ``of_dst``, from ``dst_addr`` with the destination's strides
    (a block like the destination: a temporary).

    >>> ChainVector(-32, of_dst=True)
    ChainVector(offset=-32, of_dst=True)
    """

    offset: object
    of_dst: bool = False

    def place(self, chain) -> tuple:
        """``(start, stride_out, stride_in)`` of this vector in ``chain``'s ACC (an ALU chain
        instruction's fields): where the simulator, the plans and the dependency tokens read it.

        >>> from types import SimpleNamespace
        >>> c = SimpleNamespace(dst_addr=64, dst_stride_out=32, dst_stride_in=16, src_addr=0,
        ...                     src_stride_out=0, src_stride_in=16)
        >>> ChainVector(-32, of_dst=True).place(c), ChainVector(16).place(c)
        ((32, 32, 16), (16, 0, 16))
        """
        if self.of_dst:
            return chain.dst_addr + self.offset, chain.dst_stride_out, chain.dst_stride_in
        return chain.src_addr + self.offset, chain.src_stride_out, chain.src_stride_in


#: The bit of ``vectors`` that makes step ``k``'s word a :class:`ChainVector`'s offset, and the
#: one (``k`` + this) that takes it from the destination.
_VECTOR_OF_DST = 8


def chain_code(steps: Sequence[tuple]) -> dict:
    """The chain fields (``length``, ``code``, ``imm0`` .. ``imm5``, ``vectors``) of ``steps``,
    each ``(op, operand)`` with ``operand`` an immediate (an int, or the expression a compiled
    call passes), None for the vector operand ``src``, or a :class:`ChainVector`: step ``k``'s
    code in bits ``4k .. 4k+3`` of ``code``, the words (immediates and vectors' offsets) in
    the order of their steps, bit ``k`` of ``vectors`` set where step ``k``'s word is a
    vector's offset and bit ``8 + k`` where it is the destination's (ValueError for a chain
    the format cannot hold).

    >>> fields = chain_code([(AluOp.ADD, None), (AluOp.MUL, 3), (AluOp.SHR, 2)])
    >>> fields["length"], hex(fields["code"]), [fields[n] for n in CHAIN_IMM_FIELDS], fields["vectors"]
    (3, '0xbc0', [3, 2, 0, 0, 0, 0], 0)
    >>> hex(chain_code([(AluOp.MUL, None), (AluOp.ADD, ChainVector(-48, of_dst=True))])["vectors"])
    '0x202'
    """
    steps = list(steps)
    words = [imm for _, imm in steps if imm is not None]     # ints, a compiler's expressions, vectors
    if not 1 <= len(steps) <= CHAIN_STEPS or len(words) > CHAIN_IMMEDIATES:
        raise ValueError(f"an ALU chain holds 1 to {CHAIN_STEPS} steps, at most {CHAIN_IMMEDIATES} of them with "
                         f"a word (an immediate or a vector's offset); got {len(steps)} steps with {len(words)}")
    code = vectors = 0
    for k, (op, imm) in enumerate(steps):
        code |= (int(AluOp(op)) | (_STEP_IMM if imm is not None else 0)) << (_STEP_BITS * k)
        if isinstance(imm, ChainVector):
            vectors |= (1 << k) | (int(imm.of_dst) << (_VECTOR_OF_DST + k))
    words = [w.offset if isinstance(w, ChainVector) else w for w in words]
    return {"length": len(steps), "code": code,
            **{name: words[j] if j < len(words) else 0 for j, name in enumerate(CHAIN_IMM_FIELDS)},
            "vectors": vectors}


def chain_problem(length: int, code: int, imms: Sequence[int] = (), vectors: int = 0) -> Optional[str]:
    """Why ``length``, ``code``, the immediate words ``imms`` and ``vectors`` are no chain (a
    step count outside 1..8, an unknown op, code bits past the last step, more than six
    words, a word past the last one used that is not zero, a ``vectors`` bit of a step
    without a word or past the last step, or one of the destination's without the step's
    vector bit), or None for a valid one.

    >>> chain_problem(2, 0xC4), chain_problem(2, 0x5), chain_problem(1, 0x18)
    (None, 'step 0 has no ALU op 5', 'code bits past step 0 are set')
    >>> chain_problem(2, 0x80, vectors=1)
    'vectors bit 0 is set, but step 0 takes no word'
    """
    if not 1 <= length <= CHAIN_STEPS:
        return f"a chain of {length} steps; an ALU chain holds 1 to {CHAIN_STEPS}"
    if code >> (_STEP_BITS * length):
        return f"code bits past step {length - 1} are set"
    used = 0
    for k, (op, takes_imm) in enumerate(_step_codes(length, code)):
        if op not in AluOp._value2member_map_:
            return f"step {k} has no ALU op {op}"
        used += takes_imm
        if vectors >> k & 1 and not takes_imm:
            return f"vectors bit {k} is set, but step {k} takes no word"
        if vectors >> (_VECTOR_OF_DST + k) & 1 and not vectors >> k & 1:
            return f"vectors bit {_VECTOR_OF_DST + k} is set, but step {k}'s word is no vector (bit {k})"
    if used > CHAIN_IMMEDIATES:
        return f"{used} steps take an immediate; a chain has {CHAIN_IMMEDIATES} immediate words"
    if any(imms[used:]):
        return f"immediate words past the {used} the steps use are not zero"
    if vectors & ~((1 << length) - 1) & ~(((1 << length) - 1) << _VECTOR_OF_DST):
        return f"vectors bits past step {length - 1} are set"
    return None


def chain_steps(length: int, code: int, imms: Sequence[int], vectors: int = 0) -> list:
    """The steps ``(op, operand)`` of a chain's fields (see :func:`chain_code`): an immediate,
    None for ``src``, or a :class:`ChainVector`.

    >>> chain_steps(**{k: v for k, v in chain_code([(AluOp.MAX, -128), (AluOp.ADD, None)]).items()
    ...                if k in ("length", "code")}, imms=[-128])
    [(<AluOp.MAX: 1>, -128), (<AluOp.ADD: 0>, None)]
    >>> chain_steps(1, 0x8, [32], vectors=1)
    [(<AluOp.ADD: 0>, ChainVector(offset=32, of_dst=False))]
    """
    steps, used = [], 0
    for k, (op, takes_imm) in enumerate(_step_codes(length, code)):
        imm = None
        if takes_imm:
            imm, used = int(imms[used]), used + 1
            if vectors >> k & 1:
                imm = ChainVector(imm, bool(vectors >> (_VECTOR_OF_DST + k) & 1))
        steps.append((AluOp(op), imm))
    return steps


def chain_uses_src(length: int, code: int, vectors: int = 0) -> bool:
    """Whether a step of the chain reads the vector operand ``src``, or a vector read with
    its strides (a :class:`ChainVector` from ``src_addr``).

    >>> chain_uses_src(2, 0x88), chain_uses_src(2, 0x80), chain_uses_src(1, 0x8, vectors=1)
    (False, True, True)
    """
    return any(not takes_imm or (vectors >> k & 1 and not vectors >> (_VECTOR_OF_DST + k) & 1)
               for k, (_, takes_imm) in enumerate(_step_codes(length, code)))


def _alu_chain() -> device.Instruction:
    def src_aligned(length, code, vectors, src_addr, src_stride_out, src_stride_in, tile):
        return not chain_uses_src(length, code, vectors) or all(
            v % tile == 0 for v in (src_addr, src_stride_out, src_stride_in))

    def valid(length, code, vectors, **imms):
        return chain_problem(length, code, [imms[n] for n in CHAIN_IMM_FIELDS], vectors) is None

    def vectors_aligned(length, code, vectors, tile, **imms):
        steps = chain_steps(length, code, [imms[n] for n in CHAIN_IMM_FIELDS], vectors)
        return all(imm.offset % tile == 0 for _, imm in steps if isinstance(imm, ChainVector))

    for check in (valid, vectors_aligned):
        check.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in (
            "length", "code", "vectors", *CHAIN_IMM_FIELDS, *(("tile",) if check is vectors_aligned else ()))])
    requires = [(valid, "length={length} code={code:#x} vectors={vectors:#x} is no ALU chain "
                        "(see accel.hw.instructions.chain_problem)"),
                _aligned("dst_addr", "dst_stride_out", "dst_stride_in"),
                (src_aligned, "src_addr={src_addr}, src_stride_out={src_stride_out}, src_stride_in={src_stride_in} "
                              "must be multiples of the tile {tile}"),
                (vectors_aligned, "the offsets of the chain's vectors must be multiples of the tile {tile}"),
                (lambda ext_out, dst_stride_out, ext_in, dst_stride_in:
                 not (ext_out and ext_in) or distinct_starts(ext_out, dst_stride_out, ext_in, dst_stride_in),
                 "ALU destination vectors overlap each other")]

    # vectors came after the first chains: code compiled before it reads src alone
    @device.instr("accel.alu_chain", memories=[ACC], fixed={"deps": AUTO}, requires=requires, name="alu_chain",
                  added={"vectors": 0})
    def program(tile: int = TILE) -> tirx.PrimFunc:
        dst, src = _flat("dst_addr", "int32", ACC), _flat("src_addr", "int32", ACC)
        length, code, *imms = _scalars(" ".join(("length", "code", *CHAIN_IMM_FIELDS)))
        ext_out, ext_in, dso, dsi, sso, ssi, vectors, deps = _scalars(
            "ext_out ext_in dst_stride_out dst_stride_in src_stride_out src_stride_in vectors deps")
        # the chain runs on a copy of the destination vectors and writes them at the end: every
        # read (of dst, and of src by any step) happens before any write, as for one ALU op
        cur = tirx.decl_buffer((ext_out, ext_in, tile), "int32", "cur")
        taken = tirx.decl_buffer((1,), "int32", "taken")   # immediates the steps so far used
        k = tirx.Var("k", "int32")
        nibble = tirx.bitwise_and(tirx.shift_right(code, k * _STEP_BITS), 0xF)
        op, use_imm = tirx.bitwise_and(nibble, 7), tirx.bitwise_and(nibble, _STEP_IMM) != 0
        is_vector = tirx.bitwise_and(tirx.shift_right(vectors, k), 1) != 0
        of_dst = tirx.bitwise_and(tirx.shift_right(vectors, k + _VECTOR_OF_DST), 1) != 0
        imm = imms[-1]
        for j in reversed(range(CHAIN_IMMEDIATES - 1)):
            imm = tirx.Select(taken[0] == j, imms[j], imm)

        def step(o, i, lane):
            a = cur[o, i, lane]
            # a word is an immediate, or the offset of a vector from src (its strides) or dst (its)
            word = tirx.if_then_else(is_vector, tirx.if_then_else(
                of_dst, dst[imm + dso * o + dsi * i + lane], src[imm + sso * o + ssi * i + lane]), imm)
            b = tirx.if_then_else(use_imm, word, src[sso * o + ssi * i + lane])
            value = a * b
            for alu_op in (AluOp.SHR, AluOp.MIN, AluOp.MAX, AluOp.ADD):
                operand = tirx.max(tirx.min(b, OPERAND_RANGE[alu_op][1]), OPERAND_RANGE[alu_op][0]) \
                    if alu_op in OPERAND_RANGE else b
                value = tirx.Select(op == int(alu_op), _ALU_TIR[alu_op](a, operand), value)
            return tirx.BufferStore(cur, value, [o, i, lane])

        steps = tirx.For(k, tirx.const(0, "int32"), length, tirx.ForKind.SERIAL, tirx.SeqStmt([
            _grid("o i lane", [ext_out, ext_in, tile], step),
            tirx.BufferStore(taken, taken[0] + tirx.Cast("int32", use_imm), [0])]))
        body = tirx.SeqStmt([
            tirx.AllocBuffer(cur), tirx.AllocBuffer(taken),
            _grid("o i lane", [ext_out, ext_in, tile],
                  lambda o, i, lane: tirx.BufferStore(cur, dst[dso * o + dsi * i + lane], [o, i, lane])),
            tirx.BufferStore(taken, tirx.const(0, "int32"), [0]), steps,
            _grid("o i lane", [ext_out, ext_in, tile],
                  lambda o, i, lane: tirx.BufferStore(dst, cur[o, i, lane], [dso * o + dsi * i + lane]))])
        return tirx.PrimFunc([length, code, dst, src, *imms, ext_out, ext_in, dso, dsi, sso, ssi, vectors, deps],
                             body)

    return program


#: Up to :data:`CHAIN_STEPS` ALU operations applied in turn to every ``tile``-lane ACC vector of
#: a block, each with its immediate, the vector operand ``src`` or a vector of its own (a
#: :class:`ChainVector`, ``vectors``): the program of that many ALU instructions on one block,
#: in one pass (every read before any write).
ALU_CHAIN = _alu_chain()
INSTRUCTIONS[ALU_CHAIN.name] = ALU_CHAIN
FUNCTIONS[ALU_CHAIN.runtime_name] = [ALU_CHAIN]
__all__ += ["ALU_CHAIN", "CHAIN_STEPS", "CHAIN_IMMEDIATES", "CHAIN_IMM_FIELDS", "ChainVector", "chain_code",
            "chain_problem", "chain_steps", "chain_uses_src"]
