"""Patterns compiled to plain closures that find the first match without generators.

The matcher in :mod:`tirpat.tir.match` enumerates every match with a generator per pattern
node, which is what alternation and ``explain`` need, and which costs a few microseconds
per node. Most patterns are deterministic but for a few choice points: the operand order
of a commutative operator, the start of a run in a sequence. A compiled pattern takes the
first option that works at each choice point and fills one environment dict in place. If
it then fails after having skipped an untried option, it answers "undecided" and the
caller runs the full search; so both always agree on the first match.

>>> first = Compiled(tp.is_var("i") + 1)
>>> env = {}
>>> first(i + 1, env), env["i"]          # doctest: +SKIP
(True, i)
"""

from __future__ import annotations

from typing import Callable

from tvm import ir, tirx

from . import pattern as P
from .analysis import dtype_is, dtype_of
from .match import _LOOPS, _SPAN, _key_of, _stepped, same_binding

#: ``fn(node, env, nest) -> bool``; fills ``env`` in place (callers restore it on failure)
Matcher = Callable[[object, dict, tuple], bool]


class NotCompilable(Exception):
    """The pattern uses a construct only the generator matcher handles (``|``, ``where``, ...)."""


def bind(env: dict, k, node) -> bool:
    """Bind ``k`` to ``node`` in place; False when it is already bound to something else."""
    old = env.get(k)
    if old is None:
        env[k] = node
        return True
    return same_binding(old, node)


class Compiled:
    """A pattern compiled for first-match search; ``self(node, env)`` is True (``env`` holds
    the first match), False (no match) or None (undecided: run the generator matcher).

    ``skipped`` tells whether an option was left untried in the last call, so that a caller
    whose own precondition rejects the match knows whether a later match could exist.
    """

    def __init__(self, pattern: P.Pattern):
        self.skipped = False
        self._root = self.compile(pattern, root=True)

    def __call__(self, node, env: dict) -> bool | None:
        self.skipped = False
        if self._root(node, env, ()):
            return True
        return None if self.skipped else False

    # -- compilation ---------------------------------------------------------------------
    def compile(self, p: P.Pattern, root: bool = False) -> Matcher:
        """The closure for ``p`` (sub-patterns compiled recursively)."""
        if p.predicates:
            raise NotCompilable(f"{p!r} has where() predicates")
        build = _BUILDERS.get(type(p))
        if build is not None:
            fn = build(self, p, root)
        else:
            hook = getattr(p, "compile_with", None)
            if hook is None:
                raise NotCompilable(f"no compiled form for {type(p).__name__}")
            fn = hook(self)
        want = p.dtype
        if want is None or isinstance(p, P.BufferPattern):
            return fn

        def typed(node, env, nest):
            return dtype_is(node, want) and fn(node, env, nest)

        return typed


def first_of(compiled: Compiled, env: dict, attempts) -> bool:
    """Run the attempts (thunks over ``env``) in order until one succeeds, restoring ``env``
    after each failure; a success with attempts left marks ``compiled.skipped``."""
    for n, attempt in enumerate(attempts):
        last = n == len(attempts) - 1
        saved = None if last else dict(env)
        if attempt():
            if not last:
                compiled.skipped = True
            return True
        if saved is not None:
            env.clear()
            env.update(saved)
    return False


def _wildcard(cc, p, root):
    k = _key_of(p)

    def fn(node, env, nest):
        return bind(env, k, node)

    return fn


def _var(cc, p, root):
    k, hint = _key_of(p), p.name_hint

    def fn(node, env, nest):
        if not isinstance(node, tirx.Var) or tirx.is_buffer_var(node):
            return False
        if hint is not None and node.name != hint:
            return False
        return bind(env, k, node)

    return fn


def _const(cc, p, root):
    k, value = _key_of(p), p.value

    def fn(node, env, nest):
        if not isinstance(node, (tirx.IntImm, tirx.FloatImm)):
            return False
        if value is not None and node.value != value:
            return False
        return bind(env, k, node)

    return fn


def _binop(cc, p, root):
    k, kind = _key_of(p), P._BINOPS[p.op][0]
    fa, fb = cc.compile(p.a), cc.compile(p.b)
    commutative = p.op in P.COMMUTATIVE

    def fn(node, env, nest):
        if not isinstance(node, kind):
            return False
        a, b = node.a, node.b
        if not commutative:
            return fa(a, env, nest) and fb(b, env, nest) and bind(env, k, node)
        # first_of, unrolled: the commonest choice point, so without its lambdas
        saved = dict(env)
        if fa(a, env, nest) and fb(b, env, nest) and bind(env, k, node):
            cc.skipped = True
            return True
        env.clear()
        env.update(saved)
        return fa(b, env, nest) and fb(a, env, nest) and bind(env, k, node)

    return fn


def _cast(cc, p, root):
    k, to = _key_of(p), p.to_dtype
    fv = cc.compile(p.value)

    def fn(node, env, nest):
        if not isinstance(node, tirx.Cast) or dtype_of(node) != to:
            return False
        return fv(node.value, env, nest) and bind(env, k, node)

    return fn


def _call(cc, p, root):
    k, name = _key_of(p), p.op_name
    fargs = [cc.compile(a) for a in p.args]

    def fn(node, env, nest):
        if not isinstance(node, ir.Call):
            return False
        op = getattr(node.op, "name", str(node.op))
        if op != name and op.split(".", 1)[-1] != name:
            return False
        args = node.args
        if len(args) != len(fargs):
            return False
        for f, arg in zip(fargs, args):
            if not f(arg, env, nest):
                return False
        return bind(env, k, node)

    return fn


def _for(cc, p, root):
    k, spec = _key_of(p), p.spec
    fvar = None if spec.var is None else cc.compile(spec.var)
    fext = None if spec.extent is None else cc.compile(spec.extent)
    fbody = cc.compile(p.body)

    def fn(node, env, nest):
        if type(node) is not tirx.For:
            return False
        # Canonical loops count from 0 in steps of 1; on raw TIR anything else is left to
        # the caller's canonical retry, so that an offset is never dropped.
        start = node.min
        if _stepped(node) or type(start) is not tirx.IntImm or start.value != 0:
            return False
        if spec.kind is not None and int(node.kind) != spec.kind:
            return False
        if fvar is not None and not fvar(node.loop_var, env, nest):
            return False
        if fext is not None and not fext(node.extent, env, nest):
            return False
        bind(env, k, node)
        env[_LOOPS] = env.get(_LOOPS, ()) + (node,)
        return fbody(node.body, env, nest + (node.loop_var,))

    return fn


def _seq(cc, p, root):
    k = _key_of(p)
    parts = [cc.compile(s) for s in p.stmts]
    n = len(parts)

    def run(node, stmts, start, env, nest):
        for f, s in zip(parts, stmts[start:start + n]):
            if not f(s, env, nest):
                return False
        bind(env, k, node)  # as the generator matcher: a conflicting binding is ignored here
        env[_SPAN] = (start, start + n)
        return True

    def fn(node, env, nest):
        stmts = list(node.seq) if isinstance(node, tirx.SeqStmt) else [node]
        # As in the generator matcher: a run inside a longer sequence only at the root.
        if len(stmts) < n or (not root and len(stmts) != n):
            return False
        return first_of(cc, env, [lambda s=s: run(node, stmts, s, env, nest) for s in range(len(stmts) - n + 1)])

    return fn


def _if(cc, p, root):
    fcond, fthen = cc.compile(p.cond), cc.compile(p.then_case)
    felse = None if p.else_case is None else cc.compile(p.else_case)

    def fn(node, env, nest):
        if not isinstance(node, tirx.IfThenElse) or (felse is None) != (node.else_case is None):
            return False
        return (fcond(node.condition, env, nest) and fthen(node.then_case, env, nest)
                and (felse is None or felse(node.else_case, env, nest)))

    return fn


_BUILDERS = {
    P.Wildcard: _wildcard, P.VarPattern: _var, P.ConstPattern: _const, P.BinOpPattern: _binop,
    P.CastPattern: _cast, P.CallPattern: _call, P.ForPattern: _for, P.SeqPattern: _seq, P.IfPattern: _if,
}
