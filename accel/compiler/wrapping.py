"""An inlined epilogue computes what its unfused operations compute, int32 overflow included.

Relax lowers each epilogue operation (bias add, ReLU, requantise multiply, ...) to a block of
its own, and TVM's llvm code computes each of them, one loop apiece, in wrapping int32
arithmetic, as accel's ALU does (LLVM's "no signed wrap" flags matter only where it sees
several operations at once, or a sum with -2**31, which accel's patterns decline). The
scheduler inlines the blocks of a chain the ALU runs into one expression, which TVM's
simplifier then rewrites assuming, as it does for every signed type, that no sum or product
overflows: it drops ``max(max(x, 0) * 861094, -772)``'s outer ``max`` (the product "is"
non-negative, yet wraps to a negative number), and folds ``(x + c1) * c2`` into
``x * c2 + c1 * c2`` even where ``c1 * c2`` is not an int32 (the build then fails).

:func:`keep` wraps the result of every int32 operation of an inlined epilogue in a
same-type ``reinterpret``, an identity the simplifier neither folds nor bounds, so that it
can no longer reason across the operations (nor fold ``max(min(x, -5), 0)`` to ``0`` from
bounds, which leaves no accumulator to run the ALU on); the llvm code of a reinterpret to
the same type is the value itself. What it still folds within one operation (``x * 0``,
``min(x, -2**31)``, ``max(x, 2**31 - 1)``: constants whatever the accumulator) accel's
pattern check declines. :func:`strip` takes the wrappers off again where the rules read
the epilogue as ALU steps.

>>> from tvm import sym
>>> x = tirx.Var("x", "int32")
>>> epilogue = tirx.Max(tirx.Max(x, 0) * 861094, -772)
>>> sym.Analyzer().simplify(epilogue)                   # wrong once the product wraps
T.max(x, 0) * 861094
>>> kept = keep(epilogue)
>>> sym.Analyzer().simplify(kept)                       # unchanged
T.reinterpret("int32", T.max(T.reinterpret("int32", T.reinterpret("int32", T.max(x, 0)) * 861094), -772))
>>> strip(kept)
T.max(T.max(x, 0) * 861094, -772)
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, tirx

__all__ = ["keep", "keep_in_block", "strip", "is_kept"]

_REINTERPRET = ir.Op.get("tirx.reinterpret")
#: The int32 operations of an epilogue: each one's result is kept.
_OPERATIONS = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Max, tirx.Min, tirx.RShift, tirx.LShift)


def is_kept(e) -> bool:
    """Whether ``e`` is a wrapper :func:`keep` made (a reinterpret of an int32 to int32)."""
    return isinstance(e, ir.Call) and e.op.same_as(_REINTERPRET) and len(e.args) == 1 and \
        str(e.ty.dtype) == "int32" and str(e.args[0].ty.dtype) == "int32"


def keep(value):
    """``value`` (an epilogue's stored value) with each int32 operation's result wrapped,
    except in the indices of the loads it reads (addresses, not values of the epilogue);
    wrappers already there are not doubled."""
    def wrap(e):
        return tirx.call_intrin("int32", "tirx.reinterpret", e) if str(e.ty.dtype) == "int32" else e

    def plain_indices(load):
        indices = [strip(i) for i in load.indices]
        if all(a.same_as(b) for a, b in zip(indices, load.indices)):
            return load
        return tirx.BufferLoad(load.source, indices)

    return tvm_ffi.structural_map(strip(value), [(t, wrap) for t in _OPERATIONS] + [(ir.TensorLoad, plain_indices)])


def strip(value):
    """``value`` without the wrappers :func:`keep` put in."""
    return tvm_ffi.structural_map(value, (ir.Call, lambda c: c.args[0] if is_kept(c) else c))


def keep_in_block(sch, block_rv) -> None:
    """Wrap, in place, the int32 arithmetic of the block ``block_rv`` of the schedule ``sch``
    (an epilogue whose blocks were inlined into it) with :func:`keep`, so that each operation
    computes what its own block did, whether the ALU or the CPU runs it."""
    block = sch.get(block_rv)
    store = block.body
    value = keep(store.value)
    if value.same_as(store.value):
        return
    kept = tvm_ffi.structural_map(block, (tirx.BufferStore, lambda s: tirx.BufferStore(s.buffer, value, s.indices)
                                          if s.same_as(store) else s))
    sch.state.replace(sch.get_sref(block_rv), kept, {block: kept})
