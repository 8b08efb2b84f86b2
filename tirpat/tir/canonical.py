"""Canonical form of lowered TIR, so that cosmetic differences never make a match fail.

- extent-1 loops are removed (their variable becomes the loop's ``min``), and every loop
  with a constant step counts its iterations from 0 with step 1 (the old ``min`` and step
  move into the body's indices, so a match never drops an offset);
- index expressions and loop bounds are simplified (``i*4*4 + 0`` becomes ``i*16``);
- constant sub-expressions of values are folded;
- nested ``SeqStmt``s are flattened;
- an opaque block that only groups statements (after ``ConvertBlocksToOpaque``: no block
  variables, always executed, nothing allocated, matched or initialised in it) is replaced
  by its body, so that a nest matched before ``LowerOpaqueBlock`` reads like lowered TIR.

The result is equivalent to the input; the input is never mutated.

>>> from tvm import tirx
>>> i, u = tirx.Var("i", "int32"), tirx.Var("u", "int32")
>>> A = tirx.decl_buffer((16,), "int32", "A")
>>> store = tirx.BufferStore(A, tirx.BufferLoad(A, [i + u * 4]), [i * 1 + 0])
>>> messy = tirx.For(i, 0, tirx.IntImm("int32", 4) * 4, tirx.ForKind.SERIAL,
...                  tirx.For(u, 0, 1, tirx.ForKind.SERIAL, store))
>>> print(canonicalize(messy))
for i in range(16):
    A = T.Buffer((16,), "int32")
    A[i] = A[i]
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, s_tir, tirx

from .analysis import const_int, simplify, substitute

_CONST = (tirx.IntImm, tirx.FloatImm)
_FOLDABLE = (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Max, tirx.Min)


def _simple(e) -> bool:
    return isinstance(e, (tirx.Var,) + _CONST)


def _outer_times_tile_plus_inner(e) -> bool:
    """``a * c + b`` (distinct Vars, one dtype, an integer constant c >= 2): the commonest
    tiled index, and already in the simplifier's form, so it is kept without a call."""
    if type(e) is not tirx.Add or type(e.b) is not tirx.Var or type(e.a) is not tirx.Mul:
        return False
    a, c, b = e.a.a, e.a.b, e.b
    if type(a) is not tirx.Var or type(c) is not tirx.IntImm or c.value < 2 or a.same_as(b):
        return False
    return str(a.ty.dtype) == str(b.ty.dtype) == str(c.ty.dtype)


def _index(e):
    return e if _simple(e) or _outer_times_tile_plus_inner(e) else simplify(e)


def _indices(indices):
    new = [_index(i) for i in indices]
    changed = any(not a.same_as(b) for a, b in zip(new, indices))
    return new if changed else None


def is_canonical_loop(loop) -> bool:
    """True for a loop in canonical form: from the constant 0 in steps of 1. (A loop with a
    symbolic step stays as it is; patterns do not match it.)"""
    start, step = loop.min, loop.step
    return (type(start) is tirx.IntImm and start.value == 0
            and (step is None or (type(step) is tirx.IntImm and step.value == 1)))


def stepped(loop) -> bool:
    """True for a loop whose step is not 1 (canonical form leaves only symbolic steps)."""
    return loop.step is not None and const_int(loop.step) != 1


def _on_for(loop):
    step = None if loop.step is None else const_int(loop.step)
    if loop.step is not None and (step is None or step <= 0):
        return loop   # a symbolic step: patterns do not match the loop (is_canonical_loop)
    start = const_int(loop.min)
    if (step or 1) != 1 or start != 0:
        # for v in range(min, min + extent, step)  ->  for v' in range(ceil(extent / step)): v = min + v' * step
        step = step or 1
        fresh = tirx.Var(loop.loop_var.name, loop.loop_var.ty)
        value = fresh if step == 1 else fresh * step
        body = substitute(loop.body, [(loop.loop_var, value if start == 0 else loop.min + value)])
        count = _index(loop.extent) if step == 1 else simplify(tirx.floordiv(loop.extent + (step - 1), step))
        loop = tirx.For(fresh, tirx.IntImm(str(loop.min.ty.dtype), 0), count, loop.kind, canonicalize(body),
                        loop.thread_binding, loop.annotations)
    extent = const_int(loop.extent)
    if extent == 1:
        body = substitute(loop.body, [(loop.loop_var, loop.min)])
        return canonicalize(body)
    new_extent = _index(loop.extent)
    if new_extent.same_as(loop.extent):
        return loop
    return tirx.For(loop.loop_var, loop.min, new_extent, loop.kind, loop.body,
                    loop.thread_binding, loop.annotations, loop.step)


def _on_seq(seq):
    flat = []
    nested = False
    for s in seq.seq:
        if isinstance(s, tirx.SeqStmt):
            flat.extend(s.seq)
            nested = True
        else:
            flat.append(s)
    if not nested:
        return seq
    return flat[0] if len(flat) == 1 else tirx.SeqStmt(flat)


def _on_store(store):
    new = _indices(store.indices)
    return store if new is None else tirx.BufferStore(store.buffer, store.value, new)


def _on_load(load):
    new = _indices(load.indices)
    return load if new is None else tirx.BufferLoad(load.source, new)


def _on_block(realize):
    block = realize.block
    if len(realize.iter_values) or const_int(realize.predicate) != 1 or len(block.iter_vars) \
            or len(block.alloc_buffers) or len(block.match_buffers) or block.init is not None:
        return realize
    return block.body


def _on_binop(e):
    if isinstance(e.a, _CONST) and isinstance(e.b, _CONST):
        return simplify(e)
    return e


def _on_cast(e):
    return simplify(e) if isinstance(e.value, _CONST) else e


_CALLBACKS = [
    (s_tir.SBlockRealize, _on_block),
    (tirx.For, _on_for),
    (tirx.SeqStmt, _on_seq),
    (tirx.BufferStore, _on_store),
    (ir.TensorLoad, _on_load),
    (_FOLDABLE, _on_binop),
    (tirx.Cast, _on_cast),
]


def canonicalize(node):
    """The canonical form of a Stmt, PrimExpr or PrimFunc body (see module docstring)."""
    if tirx.is_buffer_var(node):
        return node
    return tvm_ffi.structural_map(node, _CALLBACKS)
