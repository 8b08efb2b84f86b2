"""Signed integer arithmetic that wraps, whatever LLVM may assume.

TVM's llvm code marks every signed sum, difference and product of 32 bits or more "no signed
wrap" (``add nsw``, ``mul nsw``): LLVM may then assume none overflows. Where a value is
computed by one operator per loop nest and stored, as ``tvm.compile(mod, "llvm")`` leaves a
Relax model, the stored result is the two's complement one. Once several operators share a
function (``FuseTIR``, a schedule that keeps an epilogue on the CPU) and LLVM unrolls the
loops and forwards the stores, it sees the chain at once and folds it as if nothing wrapped:
``min(max(x, 0) * 231919, 146733)`` becomes ``x > 0 ? 146733 : 0``, where the product of a
large ``x`` wraps to a negative number.

:func:`wrapping_arithmetic` computes each int32 sum, difference and product of a stored value
in int64, where it is exact, and casts it back to int32: a truncation, which wraps (TVM's
llvm code of the same operation on uint32, reinterpreted, gave other bits for some
products and indices); indices, loop bounds and the arguments of calls are left as they are
(addresses, which benefit from the flags and do not overflow).

>>> from tvm.script import tirx as T
>>> @T.prim_func
... def f(a: T.Buffer((4,), "int32"), b: T.Buffer((4,), "int32")):
...     for i in range(4):
...         b[i] = T.min(T.max(a[i], 0) * 231919, 146733)
>>> out = wrapping_arithmetic()(tvm.IRModule({"main": f}))
>>> "int64" in out["main"].script()
True
>>> ex = tvm.compile(out, "llvm")
>>> a = tvm.runtime.tensor(np.array([0, 1, 10000, 20000], "int32")); b = tvm.runtime.tensor(np.zeros(4, "int32"))
>>> ex["main"](a, b); b.numpy()
array([          0,      146733, -1975777296,      146733], dtype=int32)
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, tirx

__all__ = ["wrapping_arithmetic"]

_OPERATIONS = (tirx.Add, tirx.Sub, tirx.Mul)


def _wrapping_value(value):
    """``value`` with each int32 sum, difference and product computed in int64 and truncated
    back; buffer loads (their indices) and calls of addresses are left as they are."""
    def operation(node, m):
        node = m.default_mutate(node)
        dtype = str(node.ty.dtype)
        if not dtype.startswith("int32") or _int_min_sum(node):
            return node
        wide = dtype.replace("int32", "int64")
        return tirx.Cast(dtype, type(node)(tirx.Cast(wide, node.a), tirx.Cast(wide, node.b)))

    return tvm_ffi.structural_mutate(value, [(t, operation) for t in _OPERATIONS] +
                                     [(ir.TensorLoad, lambda node, m: node),
                                      (ir.Call, lambda node, m: node if _is_address(node) else m.default_mutate(node))])


def _int_min_sum(node) -> bool:
    """A sum or difference with the constant -2**31: the one operation LLVM rewrites even alone
    (``x + -2**31`` as ``x | -2**31``), so ``tvm.compile``'s one loop nest per operator does
    not wrap it either; left as it is, the host computes what that code computes."""
    return not isinstance(node, tirx.Mul) and any(
        isinstance(x, tirx.IntImm) and int(x.value) == -2**31 for x in (node.a, node.b))


def _is_address(call) -> bool:
    """A call whose arguments are addresses or sizes (a packed call, an address_of)."""
    name = call.op.name if hasattr(call.op, "name") else ""
    return name in ("tirx.tvm_call_packed", "tirx.address_of", "tirx.tvm_access_ptr")


def wrapping_arithmetic() -> tvm.transform.Pass:
    """A module pass: in every PrimFunc, the signed sums, differences and products of the
    values stored to buffers wrap as two's complement arithmetic does (see the module
    docstring). Lowered (flattened or not) TIR in, the same TIR out where nothing applies."""
    @tvm.transform.module_pass(opt_level=0, name="tirpat.WrappingArithmetic")
    def run(mod, ctx):
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc):
                continue
            body = tvm_ffi.structural_map(func.body, (tirx.BufferStore, lambda s: _stored(s)))
            if not body.same_as(func.body):
                mod[gv] = func.with_body(body)
        return mod

    return run


def _stored(store):
    value = _wrapping_value(store.value)
    return store if value.same_as(store.value) else tirx.BufferStore(store.buffer, value, store.indices)
