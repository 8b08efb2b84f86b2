"""accel's scratchpad planning: tirpat's generic planner plus accel's in-place checks.

:class:`tirpat.device.ScratchpadPlanner` does the generic part for accel's three scopes
(INP, WGT, ACC, in tile-aligned allocations): addresses, double buffering in loops,
``access_ptr`` operands replaced, overflow and unmatched-access errors, ``accel.sync()``
insertion. accel adds the checks of its in-place epilogues: an accumulator that an
epilogue overwrote in place for its store must not be read again (later on, or in the
next iteration of an enclosing loop) before it is written anew. The memories, and which call
arguments are scratchpad addresses with which roles, come from the declarations
(:mod:`accel.hw.instructions`).

>>> mod = plan_pass(accel.Config())(mod)        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import itertools

import tvm
import tvm_ffi
from tvm import ir, tirx

from tirpat.device import PlanError, ScratchpadOverflow, ScratchpadPlanner
from tirpat.device.planner import access_ptr_buffer, describe
from tirpat.model.partition import origin_of
from accel.hw import instructions
from accel.hw.config import Config
from accel.compiler.rules import IN_PLACE

__all__ = ["PlanError", "ScratchpadOverflow", "AccelPlanner", "plan", "plan_pass"]

_ANALYZER = tvm.sym.Analyzer()


class AccelPlanner(ScratchpadPlanner):
    """The planner for one :class:`Config`: its scratchpads, and the in-place checks."""

    def __init__(self, config: Config) -> None:
        super().__init__("accel", list(instructions.MEMORIES.values()), dataclasses.asdict(config),
                         instructions=instructions.INSTRUCTIONS.values())
        self.tile = config.tile

    def plan(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """Plan one PrimFunc; a refusal says first, in a model's terms, what cannot run."""
        try:
            return super().plan(func)
        except PlanError as err:
            raise type(err)(_for_users(func, str(err))) from None

    def check_sequence(self, stmts: list, func_name: str) -> None:
        _check_in_place(stmts, func_name, self.tile)

    def check_loop(self, loop, func_name: str) -> None:
        _check_loop_carried(loop, func_name, self.tile)


def _scratch_uses(stmt) -> list:
    """``(buffer, reads, writes, offset)`` for every scratchpad operand of the accel calls in
    ``stmt``, in program order (``offset``: the element offset into the buffer), with the
    operand roles of the declared instructions."""
    uses = []

    def on_call(c):
        ins = instructions.instruction_of(c)
        if ins is None:
            return
        args = ins.arguments_of(c)
        fresh = _overwritten(ins, args)
        for op in ins.memory_operands:
            buf = access_ptr_buffer(args[op.name])
            if buf is not None:
                uses.append((buf, op.reads and op.name != fresh, op.writes, args[op.name].args[2]))
        if ins is instructions.ALU_CHAIN:
            # a chain's vectors besides src: each an offset from src or dst, the difference of
            # the vector's address and theirs (accel.compiler.chains)
            for name in instructions.CHAIN_IMM_FIELDS:
                word = args[name]
                buf = access_ptr_buffer(word.a) if isinstance(word, tirx.Sub) else None
                if buf is not None:
                    uses.append((buf, True, False, word.a.args[2]))

    tvm_ffi.structural_walk(stmt, (ir.Call, on_call))
    return uses


def _overwritten(ins, args) -> str | None:
    """The operand an ALU chain writes without its old values mattering: its destination, when
    the first step multiplies by the immediate 0 (how a temporary is zeroed before the copy of
    the accumulator), else None."""
    if ins is not instructions.ALU_CHAIN:
        return None
    length, code, imm0 = (args[n] for n in ("length", "code", "imm0"))
    zeroes = all(isinstance(a, tirx.IntImm) for a in (length, code, imm0)) and length.value >= 1 and \
        instructions.chain_steps(1, code.value & 0xF, [imm0.value]) == [(instructions.AluOp.MUL, 0)]
    return "dst_addr" if zeroes else None


def _is_accel_call(node) -> bool:
    return (isinstance(node, ir.Call) and node.op.name == "tirx.tvm_call_packed"
            and isinstance(node.args[0], ir.StringImm) and node.args[0].value.startswith("accel."))


def _uses_in_order(stmt, buf, tile, inner=(), conditional=False):
    """``(reads, written, stmt)`` for each accel call using ``buf`` in ``stmt``, in program
    order (loops inside ``stmt`` taken at their first iteration; ``inner``: the ``(var, min,
    extent)`` of those entered so far). ``written``: the elements of ``buf`` the call surely
    writes without reading, over all iterations of those loops (empty under an ``if`` the
    first iteration leaves open, or in a loop that may not run)."""
    kind = type(stmt)
    if kind is tirx.SeqStmt:
        for s in stmt.seq:
            yield from _uses_in_order(s, buf, tile, inner, conditional)
    elif kind is tirx.For:
        runs = isinstance(stmt.extent, tirx.IntImm) and stmt.extent.value > 0
        yield from _uses_in_order(stmt.body, buf, tile, inner + ((stmt.loop_var, stmt.min, stmt.extent),),
                                  conditional or not runs)
    elif kind is tirx.AttrStmt:
        yield from _uses_in_order(stmt.body, buf, tile, inner, conditional)
    elif kind is tirx.IfThenElse:
        cond = _at(stmt.condition, [(v, m) for v, m, _ in inner])
        known = cond.value if isinstance(cond, tirx.IntImm) else None
        if known != 0:
            yield from _uses_in_order(stmt.then_case, buf, tile, inner, conditional or known is None)
        if known != 1 and stmt.else_case is not None:
            yield from _uses_in_order(stmt.else_case, buf, tile, inner, conditional or known is None)
    else:
        certain = not conditional and kind is tirx.Evaluate
        for c in _accel_calls(stmt):
            uses = [reads for b, reads, _, _ in _scratch_uses(c) if b.same_as(buf)]
            if uses:
                reads = any(uses)
                written = _written(c, buf, tile, inner) if certain and not reads else set()
                yield reads, written, stmt


def _at(expr, values):
    """``expr`` with each ``(var, value)`` substituted, simplified."""
    at = {v.__chandle__(): m for v, m in values}
    return _ANALYZER.simplify(tvm_ffi.structural_map(expr, (ir.Var, lambda v: at.get(v.__chandle__(), v))))


def _int_at(arg, values) -> int | None:
    if isinstance(arg, tirx.IntImm):
        return arg.value
    if not str(getattr(getattr(arg, "ty", None), "dtype", "")).startswith("int"):
        return None
    value = _at(arg, values)
    return value.value if isinstance(value, tirx.IntImm) else None


def _accel_calls(stmt) -> list:
    found = []
    tvm_ffi.structural_walk(stmt, (ir.Call, lambda c: found.append(c) if _is_accel_call(c) else None))
    return found


def _written(c, buf, tile, inner) -> set:
    """The elements of ``buf`` that call ``c`` writes without reading (its operand of role
    ``write`` there: a LOAD's destination, a GEMM reset's accumulator; or an ALU chain's
    destination when it starts by multiplying by 0, see :func:`_overwritten`), over every iteration
    of the ``inner`` loops around it, as the instruction's declaration says
    (:meth:`~tirpat.device.Instruction.elements_written`); empty when they are not constant.

    Only the loops whose variables the call uses are enumerated: the others repeat the same
    call, however many times (a reset of one accumulator tile inside a loop over the 525
    column blocks of an 8400-pixel image row writes the same tile each time)."""
    ins = instructions.instruction_of(c)
    args = ins.arguments_of(c) if ins is not None else {}
    fresh = _overwritten(ins, args) if ins is not None else None
    op = next((o for o in (ins.memory_operands if ins is not None else ()) if (o.role == "write" or o.name == fresh)
               and access_ptr_buffer(args[o.name]) is not None and access_ptr_buffer(args[o.name]).same_as(buf)), None)
    if op is None:
        return set()
    offset = args[op.name].args[2]
    used = _var_handles(c)
    inner = [loop for loop in inner if loop[0].__chandle__() in used]
    extents = [_int_at(e, []) for _, _, e in inner]
    if None in extents or any(e > 64 for e in extents):
        return set()
    scalars = [o.name for o in ins.operands if o.kind == "scalar"]
    out: set = set()
    for point in itertools.product(*(range(e) for e in extents)):
        values = [(v, m + p) for (v, m, _), p in zip(inner, point)]
        known = {n: v for n in scalars for v in [_int_at(args[n], values)] if v is not None}
        base = _int_at(offset, values)
        if base is None:
            return set()
        try:
            elements = ins.elements_written(op.name, **known, tile=tile)
        except ValueError:      # it depends on an argument that is not constant here
            return set()
        out.update((elements + base).tolist())
    return out


def _var_handles(expr) -> set:
    """The handles of the variables ``expr`` uses."""
    found: set = set()
    tvm_ffi.structural_walk(expr, (ir.Var, lambda v: found.add(v.__chandle__())))
    return found


def _elements(buf) -> set | None:
    size = 1
    for d in buf.shape:
        if not isinstance(d, tirx.IntImm):
            return None
        size *= d.value
    return set(range(size))


def _first_unsafe_read(stmt, buf, tile):
    """The statement that reads ``buf`` in ``stmt`` before all of it has been written anew, or None."""
    everything = _elements(buf)
    written: set = set()
    for reads, new, at in _uses_in_order(stmt, buf, tile):
        if reads:
            return at
        written |= new
        if everything is not None and written >= everything:
            return None
    return None


def _clobbered(stmt) -> list:
    """The accumulators an in-place epilogue in ``stmt`` overwrites."""
    found = []
    tvm_ffi.structural_walk(stmt, (tirx.AttrStmt, lambda a: found.append(a.node) if a.attr_key == IN_PLACE else None))
    return found


def _check_in_place(stmts, name, tile):
    """An epilogue that overwrote an accumulator in place must be its last reader, until the
    whole accumulator is written anew."""
    for n, stmt in enumerate(stmts):
        for buf in _clobbered(stmt):
            rest = stmts[n + 1:]
            later = None if not rest else _first_unsafe_read(rest[0] if len(rest) == 1 else tirx.SeqStmt(rest),
                                                             buf, tile)
            if later is not None:
                raise PlanError(f"{name}: an epilogue computed {buf.name} in place for its store, but "
                                f"{buf.name} is read again afterwards: {describe(later)}")


def _check_loop_carried(loop, name, tile):
    """An epilogue that overwrote an accumulator in place inside ``loop``: the loop's next
    iteration must write the whole accumulator anew (GEMMs in reset form, LOADs) before
    anything reads any part of it (conservative: the regions read are not compared)."""
    if isinstance(loop.extent, tirx.IntImm) and loop.extent.value == 1:
        return
    for buf in _clobbered(loop.body):
        stmt = _first_unsafe_read(loop.body, buf, tile)
        if stmt is not None:
            raise PlanError(f"{name}: an epilogue computed {buf.name} in place for its store inside loop "
                            f"'{loop.loop_var.name}', but the loop's next iteration reads {buf.name} before "
                            f"writing it anew: {describe(stmt)} (store the result after the loop that "
                            f"accumulates instead, e.g. reverse_compute_at an outer loop)")


def _for_users(func: tirx.PrimFunc, detail: str) -> str:
    """A planner refusal as its user reads it: which part of the model (the operators of a
    ``tp.build`` partition) accel cannot run and what to do, then the technical ``detail``."""
    origin = origin_of(func)        # what tp.build says the PrimFunc computes
    if origin is not None and origin.ops:
        what = " + ".join(origin.ops) + f" (partition {origin.name})"
    elif origin is not None:
        what = f"the partition {origin.name}"
    else:
        attrs = func.attrs
        name = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
        what = f"the function {name!r}"
    why = ("its scratchpad buffers do not fit the accel Config of the target" if "overflows" in detail
           else "accel's compiler produced code for it that the device cannot run")
    return (f"accel cannot run {what}: {why}. This is a limit of accel's compiler, not an error in the model: "
            f"tp.build runs this partition on the host instead; please report it to accel's developers with "
            f"this message. Detail: {detail}")


def plan(func: tirx.PrimFunc, config: Config) -> tirx.PrimFunc:
    """Plan one PrimFunc (see the module docstring)."""
    return AccelPlanner(config).plan(func)


def plan_pass(config: Config) -> tvm.transform.Pass:
    """:func:`plan` as a PrimFunc pass."""
    return AccelPlanner(config).as_pass("accel.PlanScratchpads")
