"""A pattern function written in TVMScript, as a :class:`~tirpat.tir.pattern.Pattern`.

The statements and expressions of a rule's ``pattern`` PrimFunc (lowered and canonical)
become the pattern kinds of :mod:`tirpat.tir.pattern` and :mod:`tirpat.tir.statement`: a loop
becomes a loop pattern binding its variable, a load or store of a buffer parameter a
:class:`~tirpat.tir.binding.ParamAccess` (which binds the parameter to a region), a scalar
parameter a wildcard, a comparison a guard matched relative to the tile, and any other node
a pattern of the same type whose fields match.

>>> i = tirx.Var("i", "int32")
>>> loop = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.Evaluate(i + 1))
>>> pattern_of(loop, "r", {}, {}, {})
is_for(evaluate((is_var() + is_const(1).has_dtype('int32')).has_dtype('int32')),
       loop(is_var(), extent=is_const(8).has_dtype('int32')))
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, tirx

from . import pattern as P
from .analysis import const_int, dtype_of, key, linear_form, simplify
from .binding import ParamAccess
from .statement import ForPattern, IfPattern, SeqPattern, StmtPattern


def pattern_of(body: tirx.Stmt, rule: str, buffers: dict, infos: dict, scalars: dict) -> P.Pattern:
    """The pattern of a pattern function's (canonical) ``body`` for the rule named ``rule``:
    ``buffers`` maps ``key(param)`` to each buffer parameter and ``infos`` to its
    :class:`~tirpat.tir.binding.ParamInfo`, ``scalars`` each scalar parameter's key to its
    wildcard. Only the loop variables and parameters bind (a rule reads nothing else).
    A node with no pattern form raises ``ValueError`` naming it."""
    pattern = _Converter(rule, buffers, infos, scalars).stmt(body)
    _bind_only_what_is_read(pattern)
    return pattern


class _Converter:
    def __init__(self, rule: str, buffers: dict, infos: dict, scalars: dict):
        self.rule, self._buffers, self._infos, self._scalars = rule, buffers, infos, scalars
        self._loop_vars: dict = {}

    def stmt(self, s):
        if isinstance(s, tirx.For):
            var = P.VarPattern()
            self._loop_vars[key(s.loop_var)] = var
            return ForPattern(self.stmt(s.body), var=var, extent=self.expr(s.extent))
        if isinstance(s, tirx.SeqStmt):
            return SeqPattern([self.stmt(x) for x in s.seq])
        if isinstance(s, tirx.IfThenElse):
            return IfPattern(self.expr(s.condition), self.stmt(s.then_case),
                             None if s.else_case is None else self.stmt(s.else_case))
        if isinstance(s, tirx.BufferStore):
            param = self._buffers.get(key(s.buffer))
            if param is None:
                raise ValueError(f"rule {self.rule!r}: the pattern stores to {s.buffer.name}, which is not a parameter")
            return ParamAccess(param, self._infos[key(param)], tuple(self.expr(i) for i in s.indices),
                               self.expr(s.value))
        if isinstance(s, tirx.Evaluate):
            return _EvaluatePattern(self.expr(s.value))
        raise ValueError(f"rule {self.rule!r}: a {type(s).__name__} in a pattern function is not supported")

    def expr(self, e):
        if isinstance(e, tirx.Var) and not tirx.is_buffer_var(e):
            k = key(e)
            if k in self._loop_vars:
                return self._loop_vars[k]
            if k in self._scalars:
                return self._scalars[k]
            raise ValueError(f"rule {self.rule!r}: the pattern uses {e.name}, which is neither a loop variable nor a parameter")
        if isinstance(e, (tirx.IntImm, tirx.FloatImm)):
            return P.ConstPattern(e.value).has_dtype(dtype_of(e))
        if isinstance(e, ir.TensorLoad):
            param = self._buffers.get(key(e.source))
            if param is None:
                raise ValueError(f"rule {self.rule!r}: the pattern loads {e.source.name}, which is not a parameter")
            return ParamAccess(param, self._infos[key(param)], tuple(self.expr(i) for i in e.indices))
        if isinstance(e, tirx.Cast):
            return P.CastPattern(self.expr(e.value), dtype_of(e))
        if isinstance(e, _COMPARISONS):
            return _Compare(type(e), self.expr(e.a), self.expr(e.b))
        op = P.binop_of(e)
        if op is not None:
            return P.BinOpPattern(op, self.expr(e.a), self.expr(e.b)).has_dtype(dtype_of(e))
        if isinstance(e, ir.Call):
            return P.CallPattern(e.op.name, tuple(self.expr(a) for a in e.args)).has_dtype(dtype_of(e))
        return _Shape(e, self.expr)


def _bind_only_what_is_read(p) -> None:
    """A rule reads the bindings of its loop variables and scalar parameters (and binds its
    buffer parameters itself): the other nodes of its pattern need not bind, which makes
    matching cheaper."""
    if p.name is None and not isinstance(p, P.VarPattern):
        p.__dict__["binds_node"] = False
    for child in p.children():
        _bind_only_what_is_read(child)


class _Shape(P.Pattern):
    """Any other expression node: same type and dtype, fields matched recursively."""

    def __init__(self, node, convert):
        self.node_type = type(node)
        self.root_types = (self.node_type,)
        self.dtype = dtype_of(node)
        fields = [f.name for f in self.node_type.__tvm_ffi_type_info__.fields]
        self.fields = tuple((f, convert(getattr(node, f))) if isinstance(getattr(node, f), ir.Expr)
                            else (f, getattr(node, f)) for f in fields if f != "ty")

    def children(self):
        return tuple(v for _, v in self.fields if isinstance(v, P.Pattern))

    def _body_repr(self):
        return f"{self.node_type.__name__}(...)"

    def compile(self, cc):
        kind, fail = self.node_type, cc.failure(self)
        fields = [(name, cc.compile(want, name) if isinstance(want, P.Pattern) else None, want)
                  for name, want in self.fields]
        n = len(fields)

        def match(node, b, nest, k):
            if type(node) is not kind:
                return fail and fail(b, node, nest, f"expected a {kind.__name__}, found {type(node).__name__}")
            for name, compiled, want in fields:
                found = getattr(node, name)
                if compiled is None and not (want is found or want == found if not isinstance(want, tvm_ffi.Object)
                                             else tvm_ffi.structural_equal(want, found)):
                    return fail and fail(b, node, nest, f"{kind.__name__}.{name} differs")

            def at(j):
                while j < n and fields[j][1] is None:
                    j += 1
                if j == n:
                    return k()
                name, compiled, _ = fields[j]
                return compiled(getattr(node, name), b, nest, lambda: at(j + 1))

            return at(0)

        return match


_COMPARISONS = (tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.EQ, tirx.NE)


class _Compare(P.Pattern):
    """A comparison in a pattern function (a guard), with the tile base semantics of
    indices: inside a matched nest, a side that matches ``base + x`` in the target, ``base``
    free of the nest's loops, matches as ``x``, the base moved to the other side (the truth
    of the comparison is the same). So ``i < n`` matches ``16*o + i < 50``, binding ``n`` to
    ``50 - 16*o``: the guard relative to the tile."""

    def __init__(self, kind, a, b):
        self.kind, self.a, self.b = kind, a, b
        self.root_types = (kind,)

    def children(self):
        return (self.a, self.b)

    def _body_repr(self):
        return f"{self.kind.__name__}({self.a!r}, {self.b!r})"

    def compile(self, cc):
        kind, fail = self.kind, cc.failure(self)
        lhs, rhs = cc.compile(self.a, "lhs"), cc.compile(self.b, "rhs")

        def match(node, b, nest, k):
            if type(node) is not kind:
                return fail and fail(b, node, nest, f"expected a {kind.__name__}, found {type(node).__name__}")
            mark = b.mark()
            if lhs(node.a, b, nest, lambda: rhs(node.b, b, nest, k)):
                return True
            for side in (node.a, node.b) if nest else ():
                form = linear_form(side, nest)
                if form is None or const_int(form[1]) == 0:
                    continue
                b.undo(mark)
                x, y = simplify(node.a - form[1]), simplify(node.b - form[1])
                if lhs(x, b, nest, lambda: rhs(y, b, nest, k)):
                    return True
            return False

        return match


class _EvaluatePattern(StmtPattern):
    """``T.evaluate(expr)`` in a pattern function."""

    root_types = (tirx.Evaluate,)

    def __init__(self, value):
        self.value = value

    def children(self):
        return (self.value,)

    def _body_repr(self):
        return f"evaluate({self.value!r})"

    def compile(self, cc):
        value, fail = cc.compile(self.value, "value"), cc.failure(self)

        def match(node, b, nest, k):
            if type(node) is not tirx.Evaluate:
                return fail and fail(b, node, nest, f"expected an evaluate, found {type(node).__name__}")
            return value(node.value, b, nest, k)

        return match

