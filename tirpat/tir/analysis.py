"""Small IR utilities shared by the matcher, regions and the rewriter.

Affine analysis is delegated to ``tvm.sym``; traversal and substitution to
``tvm_ffi.structural_*``. Nothing here knows about patterns.

>>> from tvm import tirx
>>> i, j, n = (tirx.Var(name, "int32") for name in "ijn")
>>> linear_form(i * 16 + j + n, [i, j])
([16, 1], n)
"""

from __future__ import annotations

from typing import Iterable, Sequence

import tvm_ffi
from tvm import ir, sym, tirx
from tvm_ffi import DefRegionKind

_ANALYZER = sym.Analyzer()


def key(obj) -> int:
    """A dict key for an IR object by identity (``==`` on PrimExprs builds an EQ node)."""
    return obj.__chandle__()


def simplify(expr):
    """Simplify an expression with TVM's arithmetic analyzer (no loop bounds assumed)."""
    return _ANALYZER.simplify(expr)


def const_int(expr) -> int | None:
    """The Python int of an ``IntImm`` (after simplification), else None."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    expr = simplify(expr)
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def vars_used(node) -> list:
    """Every free-standing variable used in ``node`` (loop vars, params, buffers)."""
    found = []
    tvm_ffi.structural_walk(node, (ir.Var, found.append))
    return found


def uses_any(node, variables: Iterable) -> bool:
    """True when ``node`` uses one of ``variables``."""
    if isinstance(node, (tirx.IntImm, tirx.FloatImm)):
        return False
    variables = list(variables)
    if not variables:
        return False
    if type(node) in _ARITH:  # the usual index: answered in Python, without the checks below
        small = _uses_in_arith(node, variables)
        if small is not None:
            return small
    if isinstance(node, ir.Expr) and not isinstance(node, tirx.Stmt) and not tirx.is_buffer_var(node):
        if isinstance(node, tirx.Var):
            return any(node.same_as(v) for v in variables)
        # An expression's free variables, found in C++ (much faster than a Python walk):
        # it uses one of ``variables`` iff declaring them defined leaves fewer free.
        undefined = tirx.analysis.undefined_vars
        return len(undefined(node, variables)) < len(undefined(node, []))
    wanted = {key(v) for v in variables}
    return any(key(v) in wanted for v in vars_used(node))


_ARITH = (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod)


def _uses_in_arith(expr, variables: Sequence, budget: int = 16) -> bool | None:
    """``uses_any`` for a small tree of integer arithmetic on variables and constants (the
    usual index), answered in Python; None for anything else (left to the C++ analysis)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        kind = type(e)
        if kind is tirx.IntImm:
            continue
        if kind is tirx.Var:
            for v in variables:
                if e.same_as(v):
                    return True
            continue
        budget -= 1
        if kind not in _ARITH or budget < 0:
            return None
        stack.append(e.a)
        stack.append(e.b)
    return False


def linear_form(expr, variables: Sequence):
    """``(coefficients, base)`` with ``expr == sum(c*v) + base``, or None if not affine.

    Coefficients and base may be symbolic but are free of ``variables``.

    >>> i, j, n = (tirx.Var(name, "int32") for name in "ijn")
    >>> linear_form(i * j, [i, j]) is None
    True
    """
    if not variables:
        return [], expr
    terms = sym.detect_linear_equation(expr, list(variables))
    if len(terms) != len(variables) + 1:
        return None
    coeffs = [simplify(c) for c in terms[:-1]]
    return coeffs, simplify(terms[-1])


_MUTATE = tvm_ffi.get_global_func("ffi.StructuralMutate")


def substitute(node, pairs: Sequence):
    """``node`` with free variables replaced, ``pairs`` being ``[(var, value), ...]``.

    The replacements are handed to the structural mutator's own variable remap, so the
    walk and every substitution run in C++, with no call back into Python per use. The
    variables must not be defined inside ``node``.

    >>> i, j, n = (tirx.Var(name, "int32") for name in "ijn")
    >>> A = tirx.decl_buffer((8,), "int32", "A")
    >>> print(substitute(tirx.BufferStore(A, n, [n]), [(n, tirx.IntImm("int32", 3))]))
    A = T.Buffer((8,), "int32")
    A[3] = 3
    """
    if isinstance(pairs, dict):
        raise TypeError("substitute takes [(var, value), ...] pairs, not a dict")
    if not pairs:
        return node
    seeded = []

    def at_root(value, mut):
        if not seeded:
            seeded.append(True)
            for var, new in pairs:
                mut.var_remap_set(var, new)
        return mut.default_mutate(value)

    try:
        return _MUTATE(node, [(type(node).__tvm_ffi_type_info__.type_index, at_root, False)])
    except TypeError as err:  # the remap also met a definition of one of the variables
        names = ", ".join(str(v.name) for v, _ in pairs)
        raise ValueError(f"substitute: one of the variables {names} is also defined inside the node "
                         f"({str(err).strip().splitlines()[-1]})") from None


def with_children(node, replacements: dict):
    """``node`` with direct Stmt children replaced, ``replacements`` mapping ``key(old)`` to
    the new child, without the O(size) checks of the node's constructor (a PrimFunc's walks
    its whole body).

    >>> i, j, n = (tirx.Var(name, "int32") for name in "ijn")
    >>> A = tirx.decl_buffer((8,), "int32", "A")
    >>> func = tirx.PrimFunc([A], tirx.BufferStore(A, n, [n]))
    >>> print(with_children(func, {key(func.body): tirx.Evaluate(0)}).body)
    T.evaluate(0)
    """
    def swap(value, mut):
        return replacements.get(key(value), value)

    def at_root(value, mut):
        return mut.default_mutate(value) if value.same_as(node) else swap(value, mut)

    return _MUTATE(node, [(type(node).__tvm_ffi_type_info__.type_index, at_root, False),
                          (tirx.Stmt.__tvm_ffi_type_info__.type_index, swap, False)])


def rename_defs(node, mapping: dict):
    """Replace variables everywhere, definitions included (keys are ``key(var)``)."""
    if not mapping:
        return node
    return tvm_ffi.structural_map(
        node, with_def_region_kind=(ir.Var, lambda var, kind: mapping.get(key(var), var)))


def defined_vars(stmt) -> list:
    """Variables a statement defines: loop vars, ``Bind`` vars, allocated/declared buffers."""
    found = {}

    def on(var, kind):
        if kind != DefRegionKind.NONE:
            found.setdefault(key(var), var)

    tvm_ffi.structural_walk(stmt, with_def_region_kind=(ir.Var, on))
    return list(found.values())


def fresh_var(var):
    """A new variable with the same name and type as ``var``."""
    if tirx.is_buffer_var(var):
        b = var
        layout = b.layout
        return tirx.decl_buffer(b.shape, b.dtype, b.name, strides=list(b.strides) or None,
                                elem_offset=b.elem_offset, scope=b.scope(),
                                data_alignment=b.data_alignment, offset_factor=b.offset_factor,
                                layout="default" if layout is None else layout)
    return tirx.Var(var.name, var.ty)


_TIR_TYPES = (ir.PrimType, ir.PointerType, tirx.BufferType)


def is_tir(node) -> bool:
    """True for a TIR statement or expression (a buffer included); False for a TE tensor, a
    Relax expression or anything else."""
    if isinstance(node, tirx.Stmt):
        return True
    return isinstance(node, ir.Expr) and isinstance(getattr(node, "ty", None), _TIR_TYPES)


def dtype_of(node) -> str | None:
    """The dtype string of a PrimExpr or buffer (a buffer's type carries its element dtype), or None."""
    ty = getattr(node, "ty", None)
    dt = getattr(ty, "dtype", None)
    return None if dt is None else str(dt)


_PRIM_TYPES: dict = {}


def dtype_is(node, dtype: str) -> bool:
    """``dtype_of(node) == dtype``; TVM shares one PrimType per dtype, so mostly a pointer test."""
    ref = _PRIM_TYPES.get(dtype)
    if ref is None:
        ref = _PRIM_TYPES.setdefault(dtype, ir.PrimType(dtype))
    ty = getattr(node, "ty", None)
    if ty is not None and ty.same_as(ref):
        return True
    return dtype_of(node) == dtype


def row_major_strides(buffer) -> list | None:
    """Element strides of each buffer dimension as ints, or None when not constant."""
    if len(buffer.strides):
        out = [const_int(s) for s in buffer.strides]
        return None if any(s is None for s in out) else out
    shape = [const_int(s) for s in buffer.shape]
    out, acc = [], 1
    for extent in reversed(shape):
        out.append(acc)
        if extent is None:
            acc = None
            break
        acc *= extent
    if acc is None and len(out) < len(shape):
        return None
    return list(reversed(out))


def has_blocks(node) -> bool:
    """True when ``node`` still has ``T.sblock`` blocks (s_tir form, not lowered).

    >>> from tvm import te
    >>> X = te.placeholder((4,), name="X")
    >>> f = te.create_prim_func([X, te.compute((4,), lambda k: X[k], name="Y")])
    >>> has_blocks(f.body), has_blocks(tp.lower(f).body)
    (True, False)
    """
    from tvm import s_tir

    found = []
    tvm_ffi.structural_walk(node, (s_tir.SBlockRealize, found.append))
    return bool(found)


def lanes(expr) -> int:
    """The vector width of an expression (1 for a scalar)."""
    dtype = getattr(expr.ty, "dtype", None)
    return int(getattr(dtype, "lanes", 1) or 1)


def visit_accesses(stmt, on_access, on_decl=None) -> None:
    """Call ``on_access(buffer, indices, what, span)`` for every load (``what="a load of"``)
    and store (``"a store to"``) in ``stmt``; ``span(index)`` gives the ``(lo, hi)`` an index
    can take (Ramps and Broadcasts included), or None, from the enclosing loops, thread
    extents and ``Bind``s. ``on_decl(buffer)`` sees every ``DeclBuffer``.

    >>> i, j, n = (tirx.Var(name, "int32") for name in "ijn")
    >>> A = tirx.decl_buffer((8,), "int32", "A")
    >>> nest = tirx.For(i, 0, 4, tirx.ForKind.SERIAL, tirx.BufferStore(A, tirx.BufferLoad(A, [i * 2]), [i + 1]))
    >>> visit_accesses(nest, lambda buf, idx, what, span: print(what, buf.name, [span(x) for x in idx]))
    a store to A [(1, 4)]
    a load of A [(0, 6)]
    """
    ana = sym.Analyzer()

    def span(idx):
        if isinstance(idx, tirx.Ramp):
            ends = [idx.base, idx.base + idx.stride * (int(idx.lanes) - 1)]
        elif isinstance(idx, tirx.Broadcast):
            ends = [idx.value]
        elif lanes(idx) != 1:
            return None
        else:
            ends = [idx]
        bounds = [ana.const_int_bound(e) for e in ends]
        return min(b.min_value for b in bounds), max(b.max_value for b in bounds)

    def on_for(f, vis):
        ana.bind(f.loop_var, ir.Range.from_min_extent(f.min, f.extent))
        return vis.default_visit(f)

    def on_attr(a, vis):
        if a.attr_key in ("thread_extent", "virtual_thread") and hasattr(a.node, "var"):
            ana.bind(a.node.var, ir.Range.from_min_extent(0, a.value))
        return vis.default_visit(a)

    def on_bind(b, vis):
        if lanes(b.var) == 1 and str(getattr(b.var.ty, "dtype", "")).startswith(("int", "uint")):
            ana.bind(b.var, b.value)
        return vis.default_visit(b)

    def on_load(l, vis):
        on_access(l.source, l.indices, "a load of", span)
        return vis.default_visit(l)

    def on_store(s, vis):
        on_access(s.buffer, s.indices, "a store to", span)
        return vis.default_visit(s)

    def on_declare(d, vis):
        if on_decl is not None:
            on_decl(d.buffer)
        return vis.default_visit(d)

    tvm_ffi.structural_visit(stmt, [
        (tirx.For, on_for), (tirx.AttrStmt, on_attr), (tirx.Bind, on_bind), (tirx.DeclBuffer, on_declare),
        (ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])
