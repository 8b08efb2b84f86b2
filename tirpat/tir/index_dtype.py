"""The integer type of a function's index arithmetic, and converting a function to another.

TVM writes indices in ``int32`` or ``int64``: a TensorIntrin's desc is usually ``int32``,
while Relax-legalized operators and int64-shaped ``te`` functions index in ``int64``. Before
``tensorize`` compares a desc with a block, TVM rewrites the intrinsic to the block's index
type (``IndexDataTypeNormalizer``, not reachable from Python). :func:`with_index_dtype` is
that step for a PrimFunc: loop variables and bounds, buffer indices, buffer shapes, strides
and offsets, and every integer scalar they use (through ``Bind`` too) take the new type;
where such a value meets an unconverted one, constants are retyped and anything else is
cast, as TVM's own operators do. Element types and other values are left alone.

>>> from tvm import tirx
>>> i = tirx.Var("i", "int32")
>>> A = tirx.decl_buffer((8,), "int32", "A")
>>> func = tirx.PrimFunc([A], tirx.For(i, 0, 4, tirx.ForKind.SERIAL, tirx.BufferStore(A, i, [i * 2])))
>>> f64 = with_index_dtype(func, "int64")
>>> index_dtype_of(func.body), index_dtype_of(f64.body)
('int32', 'int64')
"""

from __future__ import annotations

from typing import Sequence

import tvm_ffi
from tvm import ir, tirx

from .analysis import dtype_of, has_blocks, key, vars_used

_BUFFER_TYPE = tvm_ffi.get_global_func("tirx.BufferType")
_BUFFER_VAR = tvm_ffi.get_global_func("tirx.BufferVar")
_INDEX_TYPES = ("int32", "int64")
_LIMITS = {"int32": (-(2 ** 31), 2 ** 31 - 1), "int64": (-(2 ** 63), 2 ** 63 - 1)}
_BINARY = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max,
           tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE)


def index_dtype_of(node) -> str:
    """The index type of a statement: that of its first loop variable or store index, in
    program order; ``"int32"`` when it has neither.

    >>> A = tvm.tirx.decl_buffer((8,), "int32", "A")
    >>> index_dtype_of(tvm.tirx.BufferStore(A, 0, [tvm.tirx.IntImm("int64", 3)]))
    'int64'
    """
    return _first_index_dtype(node) or "int32"


def _first_index_dtype(node) -> str | None:
    kind = type(node)
    if kind is tirx.For:
        return dtype_of(node.loop_var)
    if kind is tirx.BufferStore:
        for index in node.indices:
            found = dtype_of(index)
            if found in _INDEX_TYPES:
                return found
        return None
    if kind is tirx.SeqStmt:
        children = node.seq
    elif kind is tirx.IfThenElse:
        children = [node.then_case] if node.else_case is None else [node.then_case, node.else_case]
    else:
        body = getattr(node, "body", None)
        children = [body] if isinstance(body, tirx.Stmt) else []
    for child in children:
        found = _first_index_dtype(child)
        if found is not None:
            return found
    return None


def with_index_dtype(func: tirx.PrimFunc, dtype: str, also: Sequence = ()) -> tirx.PrimFunc:
    """``func`` (lowered TIR) with its index arithmetic in ``dtype`` (``"int32"`` or ``"int64"``);
    the integer scalar parameters in ``also`` take ``dtype`` too, wherever they are used.

    Raises ValueError when a constant index does not fit in ``dtype``, or when ``func``
    still has ``T.sblock`` blocks. Narrowing to int32 assumes that every index value fits
    (as TVM's ``ForceNarrowIndexToInt32`` does); a value computed from a narrowed index is
    then computed in int32 too, so module rules only ever widen.

    >>> A = tvm.tirx.decl_buffer((8,), "int32", "A")
    >>> with_index_dtype(tvm.tirx.PrimFunc([A], tvm.tirx.Evaluate(0)), "int64").params[0].shape
    (T.int64(8),)
    """
    if dtype not in _INDEX_TYPES:
        raise ValueError(f"index dtype must be one of {_INDEX_TYPES}, got {dtype!r}")
    if has_blocks(func.body):
        raise ValueError("with_index_dtype converts lowered TIR, and this function still has T.sblock blocks "
                         "(their iteration variables would keep their type): tp.lower(func) first")
    converted = {**_index_vars(func, dtype), **{key(v): v for v in also if _is_index(v) and dtype_of(v) != dtype}}
    mapping = {k: tirx.Var(v.name, dtype) for k, v in converted.items()}
    callbacks = _callbacks(mapping, dtype)
    buffers = [p for p in func.params if tirx.is_buffer_var(p)]
    tvm_ffi.structural_walk(func.body, [((tirx.DeclBuffer, tirx.AllocBuffer), lambda s: buffers.append(s.buffer))])
    for b in buffers:
        if key(b) in mapping:
            continue
        ty = b.ty

        def index(e):
            return as_index(dtype, tvm_ffi.structural_map(e, callbacks))

        shape = [index(e) for e in ty.shape]
        strides = [index(e) for e in ty.strides]
        offset = index(ty.elem_offset)
        # the layout spells the shape out again (a symbolic extent is the shape's variable):
        # kept as it was, it would hold the unconverted variable, which no parameter defines
        layout = None if ty.layout is None else tvm_ffi.structural_map(ty.layout, callbacks)
        mapping[key(b)] = _BUFFER_VAR(b.name, _BUFFER_TYPE(ty.storage_scope, ty.dtype, shape, strides, offset,
                                                           ty.data_alignment, ty.offset_factor, layout,
                                                           ty.allocated_addr, None), None)
    params = [mapping.get(key(p), p) for p in func.params]
    body = tvm_ffi.structural_map(func.body, callbacks)
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs)


def _is_index(node) -> bool:
    return dtype_of(node) in _INDEX_TYPES


def _index_vars(func, dtype) -> dict:
    """The integer scalars of ``func`` that take part in index arithmetic (by key): loop
    variables, the variables of loop bounds, indices and buffer fields, and what ``Bind``
    ties to them. Thread variables keep their type (a use of one is cast instead)."""
    found: dict = {}
    threads: set = set()
    binds: list = []

    def add(expr):
        for v in vars_used(expr):
            if not tirx.is_buffer_var(v) and _is_index(v):
                found[key(v)] = v

    def add_buffer(b):
        for e in [*b.shape, *b.strides, b.elem_offset]:
            add(e)

    def on_for(loop):
        add(loop.loop_var)
        add(loop.min)
        add(loop.extent)

    def on_access(node):
        for i in node.indices:
            add(i)

    def on_iter_var(iv):
        threads.add(key(iv.var))

    for p in func.params:
        if tirx.is_buffer_var(p):
            add_buffer(p)
    tvm_ffi.structural_walk(func.body, [
        (tirx.For, on_for), ((tirx.BufferStore, ir.TensorLoad), on_access),
        ((tirx.DeclBuffer, tirx.AllocBuffer), lambda s: add_buffer(s.buffer)),
        (tirx.Bind, lambda b: binds.append((b.var, b.value))), (tirx.IterVar, on_iter_var)])
    changed = True
    while changed:  # a Bind's variable and its value are in the same type
        changed = False
        for var, value in binds:
            if not _is_index(var):
                continue
            if key(var) in found:
                before = len(found)
                add(value)
                changed |= len(found) != before
            elif any(key(v) in found for v in vars_used(value)):
                found[key(var)] = var
                changed = True
    return {k: v for k, v in found.items() if k not in threads and dtype_of(v) != dtype}


def as_index(dtype: str, e):
    """``e`` as a ``dtype`` index: constants retyped (when they fit), other integers cast.

    >>> as_index("int64", tvm.tirx.IntImm("int32", 4))
    T.int64(4)
    """
    have = dtype_of(e)
    if have == dtype or have not in _INDEX_TYPES:
        return e
    if type(e) is tirx.Cast and have == "int64" and dtype_of(e.value) == dtype:  # an exact widening, undone
        return e.value
    if type(e) is tirx.IntImm:
        lo, hi = _LIMITS[dtype]
        if not lo <= e.value <= hi:
            raise ValueError(f"the index constant {e.value} does not fit in {dtype}")
        return tirx.IntImm(dtype, e.value)
    return tirx.Cast(dtype, e)


def _same_type(a, b):
    """Operands of one integer type: a constant takes the other side's, else the wider wins
    (vectors of the same width too)."""
    da, db = dtype_of(a), dtype_of(b)
    if da != db and _vector_of_index(da) and _vector_of_index(db) and _lanes(da) == _lanes(db):
        wide = f"int64x{_lanes(da)}"
        return (a if da == wide else tirx.Cast(wide, a)), (b if db == wide else tirx.Cast(wide, b))
    if da == db or da not in _INDEX_TYPES or db not in _INDEX_TYPES:
        return a, b
    if type(a) is tirx.IntImm:
        return as_index(db, a), b
    if type(b) is tirx.IntImm:
        return a, as_index(da, b)
    wide = "int64"
    return as_index(wide, a), as_index(wide, b)


def _vector_of_index(dtype) -> bool:
    return dtype is not None and "x" in dtype and dtype.split("x")[0] in _INDEX_TYPES


def _lanes(dtype) -> int:
    return int(dtype.split("x")[1])


def _callbacks(mapping, dtype):
    """structural_map callbacks (post-order): swap the variables, then rebuild each node
    whose operands no longer agree, through its typed constructor."""

    def on_var(v):
        return mapping.get(key(v), v)

    def on_binary(e):
        a, b = _same_type(e.a, e.b)
        if a.same_as(e.a) and b.same_as(e.b) and dtype_of(a) == dtype_of(b) and _result_fits(e, a):
            return e
        return type(e)(a, b)

    def on_select(e):
        t, f = _same_type(e.true_value, e.false_value)
        return tirx.Select(e.condition, t, f)

    def on_broadcast(e):
        return e if dtype_of(e).split("x")[0] == dtype_of(e.value) else tirx.Broadcast(e.value, e.lanes)

    def on_ramp(e):
        base, stride = _same_type(e.base, e.stride)
        return tirx.Ramp(base, stride, e.lanes)

    def on_load(e):
        return tirx.BufferLoad(e.source, [_index_of(i) for i in e.indices])

    def on_store(s):
        value = s.value
        want = dtype_of(s.buffer)
        if dtype_of(value) != want and _is_index(value) and want in _INDEX_TYPES:
            value = tirx.Cast(want, value)
        return tirx.BufferStore(s.buffer, value, [_index_of(i) for i in s.indices])

    def on_for(loop):
        want = dtype_of(loop.loop_var)
        return tirx.For(loop.loop_var, as_index(want, loop.min), as_index(want, loop.extent), loop.kind, loop.body,
                        loop.thread_binding, loop.annotations,
                        None if loop.step is None else as_index(want, loop.step))

    def on_bind(b):
        return tirx.Bind(b.var, as_index(dtype_of(b.var), b.value))

    def _index_of(i):
        return as_index(dtype, i) if _is_index(i) else i

    return [(ir.Var, on_var), (_BINARY, on_binary), (tirx.Select, on_select), (tirx.Ramp, on_ramp), (tirx.Broadcast, on_broadcast),
            (ir.TensorLoad, on_load), (tirx.BufferStore, on_store), (tirx.For, on_for), (tirx.Bind, on_bind)]


def _result_fits(e, a) -> bool:
    """False when the node's stored type is stale (its operands changed type under it)."""
    return isinstance(e, (tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE)) or dtype_of(e) == dtype_of(a)
