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


def dim_strides(buffer: tirx.Buffer) -> list[ir.Expr]:
    """The element stride of every dimension of ``buffer``, as expressions: its declared
    strides, else row-major ones.

    >>> print(dim_strides(tirx.decl_buffer((4, 8), "int32", "A")))
    [8, 1]
    """
    if len(buffer.strides):
        return list(buffer.strides)
    out, acc = [], tirx.IntImm("int32", 1)
    for extent in reversed(list(buffer.shape)):
        out.append(acc)
        acc = simplify(acc * extent)
    return list(reversed(out))


def int_strides(buffer, dtype: str | None = None, shape=None) -> list | None:
    """The element stride of every dimension of ``buffer`` (a buffer or its type) as Python
    ints (declared, else row-major), or None when one is not a constant.

    Without ``dtype`` each stride is simplified to a constant, and the outermost extent
    (which no stride depends on) may be symbolic. With ``dtype`` the buffer must be indexed
    in that integer type: every stride and extent an ``IntImm`` of it, read without the
    simplifier (the matcher's fast path). ``shape``: the buffer's shape when already at hand.

    >>> n = tirx.Var("n", "int32")
    >>> A = tirx.decl_buffer((n, 8), "int32", "A")
    >>> int_strides(A), int_strides(A, "int32")
    ([8, 1], None)
    """
    declared = buffer.strides[:]
    if declared:
        if dtype is None:
            out = [const_int(s) for s in declared]
            return None if any(s is None for s in out) else out
        out = []
        for st in declared:
            if not isinstance(st, tirx.IntImm) or not dtype_is(st, dtype):
                return None
            out.append(st.value)
        return out
    extents = list(buffer.shape[:] if shape is None else shape)
    out, acc = [], 1
    for n, extent in enumerate(reversed(extents)):
        out.append(acc)
        if dtype is None:
            value = const_int(extent)
            if value is None:  # only the outermost extent may be symbolic
                return out[::-1] if n == len(extents) - 1 else None
        elif not isinstance(extent, tirx.IntImm) or not dtype_is(extent, dtype):
            return None
        else:
            value = extent.value
        acc *= value
    return out[::-1]


_IMMS: dict = {}


def imm(dtype: str, value: int) -> tirx.IntImm:
    """A shared integer constant (IR nodes are immutable, so sharing one is safe).

    >>> imm("int32", 3).same_as(imm("int32", 3))
    True
    """
    found = _IMMS.get((dtype, value))
    if found is None:
        found = _IMMS.setdefault((dtype, value), tirx.IntImm(dtype, value))
    return found


class Affine:
    """``sum(coeff * var) + const`` with Python int coefficients: offsets without the
    simplifier (:func:`linear_form` asks TVM's, for symbolic coefficients too).

    ``Affine.of(start, [(index, stride), ...])`` is ``start + sum(index * stride)``, or None
    when a term is not integer arithmetic on variables and constants, or not of ``start``'s
    dtype (then the simplifier does it).

    >>> i, j, n = (tirx.Var(name, "int32") for name in "ijn")
    >>> a = Affine.of(n * 4, [(i + 1, 8), (j, 1)])
    >>> print(a.expr())
    n * 4 + i * 8 + j + 8
    >>> a.multiple_of(4), Affine.of(n * 4, [(i * 2, 2)]).multiple_of(4)
    (False, True)
    """

    def __init__(self, terms: dict, const: int, dtype: str):
        self.terms, self.const, self.dtype = terms, const, dtype  # terms: key(var) -> [var, coeff]

    @classmethod
    def of(cls, start, scaled) -> "Affine | None":
        terms: dict = {}
        const = 0
        dtype = dtype_of(start)
        for b, _ in scaled:
            if not dtype_is(b, dtype):
                return None
        stack = [(start, 1)] + [(b, st) for b, st in scaled]
        stack.reverse()  # popped in order, so the terms come out outermost dimension first
        while stack:
            e, scale = stack.pop()
            kind = type(e)
            if kind is tirx.IntImm:
                const += scale * e.value
            elif kind is tirx.Var:
                entry = terms.get(key(e))
                if entry is None:
                    terms[key(e)] = [e, scale]
                else:
                    entry[1] += scale
            elif kind is tirx.Add or kind is tirx.Sub:
                stack.append((e.b, scale if kind is tirx.Add else -scale))
                stack.append((e.a, scale))
            elif kind is tirx.Mul and type(e.b) is tirx.IntImm:
                stack.append((e.a, scale * e.b.value))
            elif kind is tirx.Mul and type(e.a) is tirx.IntImm:
                stack.append((e.b, scale * e.a.value))
            else:
                return None
        return cls(terms, const, dtype)

    def multiple_of(self, factor: int) -> bool:
        """True when every value is a multiple of ``factor`` (each coefficient and the constant are)."""
        return self.const % factor == 0 and all(c % factor == 0 for _, c in self.terms.values())

    def expr(self):
        """The sum as a PrimExpr (terms with a zero coefficient left out)."""
        dtype = self.dtype
        out = None
        for var, coeff in self.terms.values():
            if coeff == 0:
                continue
            term = var if coeff == 1 else tirx.Mul(var, imm(dtype, coeff))
            out = term if out is None else tirx.Add(out, term)
        if out is None:
            return imm(dtype, self.const)
        return out if self.const == 0 else tirx.Add(out, imm(dtype, self.const))


def same_value(a: ir.Expr, b: ir.Expr) -> bool:
    """``a == b`` for all values of their variables (structurally equal, or a zero difference).

    >>> i = tirx.Var("i", "int32")
    >>> same_value(i * 2 + i, i * 3), same_value(i, i + 1)
    (True, False)
    """
    if a.same_as(b) or tvm_ffi.structural_equal(a, b, map_free_vars=False):
        return True
    return const_int(simplify(a - b)) == 0


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
