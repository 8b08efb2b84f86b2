"""Merging consecutive ALU instructions on one block into ALU chains, at compile time.

An epilogue runs as ALU instructions over the same block of accumulator vectors, one after
the other (a bias ADD, the clamp's MAX and MIN, a requantise's MUL, ADD and SHR): each
costs a pass over the block. :data:`~accel.hw.instructions.ALU_CHAIN` applies up to
:data:`~accel.hw.instructions.CHAIN_STEPS` of them in one pass. :func:`merge_chains` rewrites a
lowered PrimFunc (after the rules made its ``accel.alu`` calls, before the scratchpad planner
places them) so that each run of consecutive ``accel.alu`` calls in one statement sequence
that share their destination (the same region, extents and strides) is one
``accel.alu_chain`` call, which is what the stream a first call records holds too.

A step joins a chain when the chain still has room (eight steps, six of them with a word:
an immediate, or the offset of a vector operand other than ``src``) and, if it reads a
vector: the chain's vectors are of one kind at most, all with the same strides (a
per-channel requantise's bias, clamp bounds and multipliers, staged as rows: the first of
them is ``src``, the others :class:`~accel.hw.instructions.ChainVector` offsets from it),
the others laid out like the block (a temporary: offsets from the destination), and the
chain does not write the vector before the step reads it. One ALU instruction reads its
operand after the earlier ones wrote the destination, a chain reads every operand before it
writes, so the two agree when the vector lies in another buffer than the destination
(distinct scratchpad buffers live at the same time never overlap), or when the step is the
chain's first. A run of one stays an ``accel.alu`` call.

>>> func = merge_chains(func)       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Optional

import tvm
import tvm_ffi
from tvm import ir, tirx

from tirpat.device.planner import access_ptr_buffer
from accel.hw.instructions import ALU, ALU_CHAIN, CHAIN_IMMEDIATES, CHAIN_STEPS, AluOp, ChainVector, chain_code

__all__ = ["merge_chains", "merge_chains_pass"]

#: The ALU instructions by declaration, to the (op, takes an immediate) they are.
_ALU_FORMS = {ins.name: key for key, ins in ALU.items()}
#: What the steps of one chain must share.
_BLOCK = ("dst_addr", "ext_out", "ext_in", "dst_stride_out", "dst_stride_in")
_SOURCE = ("src_addr", "src_stride_out", "src_stride_in")
#: (destination, source) stride fields: a vector whose source strides are the destination's is
#: laid out like the block.
_STRIDES = (("dst_stride_out", "src_stride_out"), ("dst_stride_in", "src_stride_in"))


def _same(a, b) -> bool:
    return a.same_as(b) or tvm_ffi.structural_equal(a, b, map_free_vars=False)


def _offset(ptr, base) -> tirx.PrimExpr:
    """The element offset of the ACC address ``ptr`` from ``base`` (both ``access_ptr``
    operands): their difference as int32 ``access_ptr`` calls, each of which the scratchpad
    planner replaces by its address, as it does the handles."""
    address = lambda p: tirx.call_intrin("int32", p.op, *p.args)  # noqa: E731
    return tirx.Sub(address(ptr), address(base))


def _alu_step(stmt) -> Optional[tuple]:
    """``(op, use_imm, arguments by name)`` of an ``accel.alu`` call statement, else None."""
    if not (isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, ir.Call)):
        return None
    call = stmt.value
    if not (call.op.name == "tirx.tvm_call_packed" and isinstance(call.args[0], ir.StringImm)
            and call.args[0].value == ALU[AluOp.ADD, True].runtime_name):
        return None
    ins = next((i for i in ALU.values() if i.is_call(call)), None)
    if ins is None:
        return None
    op, use_imm = _ALU_FORMS[ins.name]
    return op, use_imm, ins.arguments_of(call)


class _Chain:
    """Consecutive ALU steps on one block, growing while the next one may join."""

    def __init__(self, stmt, step: tuple) -> None:
        self.stmts = [stmt]
        self.steps = [step]

    def _operands(self, steps: list) -> Optional[tuple[list, Optional[dict]]]:
        """What each of ``steps`` takes in one chain (an immediate, None for ``src``, a
        :class:`ChainVector`) and the arguments of ``src`` (None where no step reads it), or
        None when they cannot be one chain: their vectors must all lie like the block (the
        destination's strides) but those of one operand, ``src``, and its kind (a per-channel
        vector staged beside the others)."""
        first = steps[0][2]
        block = lambda args: all(_same(first[d], args[s]) for d, s in _STRIDES)  # noqa: E731
        vectors = [args for _, use_imm, args in steps if not use_imm]
        strided = [args for args in vectors if not block(args)]
        if any(not all(_same(strided[0][s], args[s]) for _, s in _STRIDES) for args in strided):
            return None
        source = (strided or vectors or [None])[0]
        operands = []
        for op, use_imm, args in steps:
            if use_imm:
                operands.append(args["imm"])
            elif all(_same(source[n], args[n]) for n in _SOURCE):
                operands.append(None)
            elif all(_same(source[s], args[s]) for _, s in _STRIDES):
                operands.append(ChainVector(_offset(args["src_addr"], source["src_addr"])))
            else:
                operands.append(ChainVector(_offset(args["src_addr"], first["dst_addr"]), of_dst=True))
        if sum(o is not None for o in operands) > CHAIN_IMMEDIATES:
            return None
        return operands, source

    def admits(self, step: tuple) -> bool:
        op, use_imm, args = step
        first = self.steps[0][2]
        if len(self.steps) == CHAIN_STEPS or any(not _same(first[n], args[n]) for n in _BLOCK):
            return False
        if self._operands(self.steps + [step]) is None:
            return False
        if use_imm:
            return True
        # the chain reads its vectors before it writes its block: none may be the block's buffer
        # (one ALU instruction after another would read what the earlier ones wrote)
        src, dst = access_ptr_buffer(args["src_addr"]), access_ptr_buffer(first["dst_addr"])
        return src is not None and dst is not None and not src.same_as(dst)

    def add(self, stmt, step: tuple) -> None:
        self.stmts.append(stmt)
        self.steps.append(step)

    def statement(self) -> tirx.Stmt:
        if len(self.steps) == 1:
            return self.stmts[0]
        first = self.steps[0][2]
        operands, source = self._operands(self.steps)
        fields = chain_code([(op, operand) for (op, _, _), operand in zip(self.steps, operands)])
        source = {n: source[n] for n in _SOURCE} if source is not None else dict.fromkeys(_SOURCE, 0)
        return ALU_CHAIN.call(**fields, **{n: first[n] for n in _BLOCK}, **source)


def _merged(seq: tirx.SeqStmt) -> tirx.Stmt:
    out: list = []
    chain: Optional[_Chain] = None
    for stmt in seq.seq:
        step = _alu_step(stmt)
        if chain is not None and step is not None and chain.admits(step):
            chain.add(stmt, step)
            continue
        if chain is not None:
            out.append(chain.statement())
            chain = None
        if step is not None:
            chain = _Chain(stmt, step)
        else:
            out.append(stmt)
    if chain is not None:
        out.append(chain.statement())
    if len(out) == len(seq.seq):
        return seq
    return out[0] if len(out) == 1 else tirx.SeqStmt(out)


def merge_chains(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each run of consecutive ``accel.alu`` calls on one block that may run as
    one ALU chain replaced by an ``accel.alu_chain`` call (see the module doc).

    >>> from accel.hw.instructions import ACC
    >>> acc = tirx.decl_buffer((256,), "int32", "acc", scope=ACC.scope)
    >>> step = lambda op, imm: ALU[op, True].call(dst_addr=acc.access_ptr("rw"), src_addr=0, imm=imm, ext_out=16,
    ...     ext_in=1, dst_stride_out=16, dst_stride_in=0, src_stride_out=0, src_stride_in=0)
    >>> f = tirx.PrimFunc([], tirx.SeqStmt([step(AluOp.MUL, 3), step(AluOp.SHR, 2)]))
    >>> merge_chains(f).body.value.args[:3]
    ["accel.alu_chain", 2, 188]
    """
    body = tvm_ffi.structural_map(func.body, (tirx.SeqStmt, _merged))
    return func if body.same_as(func.body) else func.with_body(body)


def merge_chains_pass() -> tvm.transform.Pass:
    """:func:`merge_chains` as a PrimFunc pass (before the scratchpad planner).

    >>> merge_chains_pass().info.name
    'accel.MergeAluChains'
    """
    return tirx.transform.prim_func_pass(lambda f, mod, ctx: merge_chains(f), opt_level=0,
                                         name="accel.MergeAluChains")
