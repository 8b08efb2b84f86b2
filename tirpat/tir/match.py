"""The matcher: unification of patterns against canonical TIR.

Matching is a backtracking search written as generators: each ``_m_*`` method yields
every environment (capture bindings) under which a pattern matches a node. Commutative
operators and alternation simply yield more than one candidate; the first candidate
whose deferred ``where`` predicates hold wins.

>>> i, j = tp.is_var("i"), tp.is_var("j")
>>> m = tp.is_nest([i, j], tp.is_store(tp.is_buffer("B"), [i, j], tp.wildcard("v"))).match(nest)  # doctest: +SKIP
>>> m["v"], m.loops, m.region("B")     # doctest: +SKIP
"""

from __future__ import annotations

from typing import Iterator

import tvm_ffi
from tvm import ir, tirx

from . import pattern as P
from .analysis import const_int, dtype_of, key, linear_form, simplify, substitute, uses_any
from .canonical import canonicalize
from .region import CopyRegion, Region, RegionError, access_region, padding

_LOOPS = "__loops__"
_PREDS = "__preds__"
_SPAN = "__span__"


class Match:
    """A successful match: captures by pattern object or name, the root, loops, regions.

    >>> m = pattern.match(stmt)        # doctest: +SKIP
    >>> m["C"], m[some_pattern], m.node, m.loops, m.region("A")   # doctest: +SKIP
    """

    def __init__(self, node, env: dict, context: tuple = ()):
        self.node = node
        self._env = env
        self.context = context  #: the For loops enclosing the match, outermost first

    def __getitem__(self, item):
        k = item if isinstance(item, str) else _key_of(item) if isinstance(item, P.Pattern) else None
        if k is None:
            raise TypeError(f"index a Match with a pattern or a capture name, got {item!r}")
        if k not in self._env:
            names = sorted(x for x in self._env if isinstance(x, str) and not x.startswith("__"))
            raise KeyError(f"{item!r} is not bound in this match (named captures: {names})")
        return self._env[k]

    def __contains__(self, item) -> bool:
        k = item if isinstance(item, str) else _key_of(item)
        return k in self._env

    def get(self, item, default=None):
        """``m[item]`` or ``default`` when it is not bound."""
        return self[item] if item in self else default

    @property
    def captures(self) -> dict:
        """The named captures, ``{name: node}``."""
        return {k: v for k, v in self._env.items() if isinstance(k, str) and not k.startswith("__")}

    @property
    def loops(self) -> tuple:
        """The For nodes matched by nest patterns (``is_nest``/``is_for``/``is_copy``), outermost first."""
        return self._env.get(_LOOPS, ())

    @property
    def span(self) -> tuple | None:
        """For an ``is_seq`` match, the ``(start, stop)`` of the matched run in ``node.seq``."""
        return self._env.get(_SPAN)

    def at_origin(self, expr):
        """``expr`` with the matched loops at their first iteration (e.g. an init guard).

        >>> m.at_origin(m["first"])        # k_0 * 16 + k_1 == 0  ->  k_0 == 0   # doctest: +SKIP
        """
        return simplify(substitute(expr, [(l.loop_var, l.min) for l in self.loops]))

    def region(self, buffer) -> Region:
        """The :class:`Region` of a buffer's accesses in the matched nest.

        ``buffer`` is a buffer pattern, a capture name or the buffer itself. With a pattern
        or name, the accesses that pattern matched are used (two patterns may bind one
        buffer at different indices, as in ``A[i, j] + A[j, i]``). A Region describes one
        access pattern: accesses at different indices (a stencil) raise :class:`RegionError`.
        """
        accesses = None
        if isinstance(buffer, (str, P.Pattern)):
            buf = self[buffer]
            accesses = self._env.get(("__access__", buffer if isinstance(buffer, str) else _key_of(buffer)))
        else:
            buf = buffer
        if not tirx.is_buffer_var(buf):
            raise TypeError(f"region() needs a buffer, but {buffer!r} is bound to {buf!r}")
        if accesses is None:
            accesses = _accesses(self.node, buf)
        if not accesses:
            raise KeyError(f"buffer {buf.name} is not accessed in the matched node")
        first = accesses[0]
        for other in accesses[1:]:
            if len(other) != len(first) or not all(tvm_ffi.structural_equal(x, y) for x, y in zip(first, other)):
                raise RegionError(f"{buf.name} is accessed at different indices in the match "
                                  f"({list(first)} and {list(other)}); a Region describes one access pattern")
        return access_region(buf, first, self.loops)

    def __repr__(self):
        caps = ", ".join(f"{k}={_short(v)}" for k, v in self.captures.items())
        return f"<Match {type(self.node).__name__} loops={[l.loop_var.name for l in self.loops]} {caps}>"


def _short(v) -> str:
    if tirx.is_buffer_var(v):
        return v.name
    text = str(v).strip().splitlines()
    return text[0] if len(text) == 1 else f"{type(v).__name__}(...)"


def _stepped(loop) -> bool:
    """A loop whose step is not 1 (canonical form leaves only symbolic steps)."""
    return loop.step is not None and const_int(loop.step) != 1


def _accesses(node, buf) -> list:
    """The index lists of every store to and load of ``buf`` in ``node``."""
    found = []

    def on_store(s):
        if s.buffer.same_as(buf):
            found.append(s.indices)

    def on_load(l):
        if l.source.same_as(buf):
            found.append(l.indices)

    tvm_ffi.structural_walk(node, [(tirx.BufferStore, on_store), (ir.TensorLoad, on_load)])
    return found


def same_binding(old, node) -> bool:
    """Whether a capture bound to ``old`` may bind ``node`` too: the same node, or an equal expression."""
    if old.same_as(node):
        return True
    return (not tirx.is_buffer_var(old) and not isinstance(old, CopyRegion) and not tirx.is_buffer_var(node)
            and tvm_ffi.structural_equal(old, node, map_free_vars=False))


def _key_of(p: P.Pattern):
    return p.name if p.name is not None else p


class Failure:
    """Where a match failed: the path of steps from the root, and expected vs found."""

    def __init__(self, path: tuple, pattern, node, reason: str, final: bool = False):
        self.path, self.pattern, self.node, self.reason = path, pattern, node, reason
        self.final = final  #: the whole structure matched and a precondition failed

    @property
    def depth(self) -> tuple:
        """How close the match came: a failed precondition beats any structural mismatch."""
        return (self.final, len(self.path))

    def __repr__(self):
        where = " > ".join(self.path) or "<root>"
        return f"at {where}: {self.reason}"


class _Matcher:
    """One matching run: fixed context loops, optional failure tracing."""

    def __init__(self, context: tuple = (), trace: bool = False):
        self.context = context
        self.deepest: Failure | None = None
        self.trace = trace

    # -- failure tracing ---------------------------------------------------------------
    def fail(self, path, p, node, reason, final=False):
        if not self.trace:
            return
        failure = Failure(path, p, node, reason, final)
        if self.deepest is None or failure.depth > self.deepest.depth:
            self.deepest = failure

    # -- entry -------------------------------------------------------------------------
    def run(self, p: P.Pattern, node) -> Match | None:
        for env in self.m(p, node, {}, (), ()):
            if self._predicates_hold(env, node):
                return Match(node, env, self.context)
        return None

    def _predicates_hold(self, env, root) -> bool:
        for p, node, path in env.get(_PREDS, ()):
            sub = Match(node, env, self.context)
            for pred in p.predicates:
                if not pred(sub):
                    self.trace and self.fail(path, p, node, f"the where() predicate {getattr(pred, '__name__', pred)} is false",
                                             final=True)
                    return False
        return True

    def m(self, p, node, env, nest, path) -> Iterator[dict]:
        if not isinstance(p, P.Pattern):
            raise TypeError(f"expected a tirpat pattern, got {type(p).__name__} {p!r}")
        if p.dtype is not None and not isinstance(p, P.BufferPattern):
            found = dtype_of(node)
            if found != p.dtype:
                self.trace and self.fail(path, p, node, f"expected dtype {p.dtype}, found {found} in {_short(node)}")
                return
        handler = _DISPATCH.get(type(p))
        candidates = handler(self, p, node, env, nest, path) if handler else p.match_with(self, node, env, nest, path)
        for env2 in candidates:
            if p.predicates:
                env2 = dict(env2)
                env2[_PREDS] = env2.get(_PREDS, ()) + ((p, node, path),)
            yield env2

    def bind(self, env, p, node, path):
        """Bind ``p``'s key to ``node``; an existing binding must be equal."""
        k = _key_of(p)
        old = env.get(k)
        if old is not None:
            if same_binding(old, node):
                return env
            self.trace and self.fail(path, p, node, f"{_label(p)} is already bound to {_short(old)}, found {_short(node)}")
            return None
        env = dict(env)
        env[k] = node
        return env

    def bound(self, envs, p, node, path):
        """Each environment of ``envs`` with ``p`` bound to ``node`` (where that is consistent)."""
        for e in envs:
            e = self.bind(e, p, node, path)
            if e is not None:
                yield e

    # -- expressions -------------------------------------------------------------------
    def _wildcard(self, p, node, env, nest, path):
        env = self.bind(env, p, node, path)
        if env is not None:
            yield env

    def _var(self, p, node, env, nest, path):
        if not isinstance(node, tirx.Var) or tirx.is_buffer_var(node):
            self.trace and self.fail(path, p, node, f"expected a variable, found {type(node).__name__} {_short(node)}")
            return
        if p.name_hint is not None and node.name != p.name_hint:
            self.trace and self.fail(path, p, node, f"expected a variable named {p.name_hint!r}, found {node.name!r}")
            return
        yield from self._wildcard(p, node, env, nest, path)

    def _const(self, p, node, env, nest, path):
        if not isinstance(node, (tirx.IntImm, tirx.FloatImm)):
            self.trace and self.fail(path, p, node, f"expected a constant, found {type(node).__name__} {_short(node)}")
            return
        if p.value is not None and node.value != p.value:
            self.trace and self.fail(path, p, node, f"expected the constant {p.value}, found {node.value}")
            return
        yield from self._wildcard(p, node, env, nest, path)

    def _buffer(self, p, node, env, nest, path):
        if not tirx.is_buffer_var(node):
            self.trace and self.fail(path, p, node, f"expected a buffer, found {type(node).__name__} {_short(node)}")
            return
        checks = (("name_hint", p.name_hint, node.name), ("dtype", p.dtype, str(node.dtype)),
                  ("scope", p.scope, node.scope()), ("ndim", p.ndim, len(node.shape)))
        for what, want, found in checks:
            if want is not None and want != found:
                self.trace and self.fail(path, p, node, f"expected a buffer with {what} {want!r}, found {node.name} with {what} {found!r}")
                return
        k = _key_of(p)
        old = env.get(k)
        if old is not None and not old.same_as(node):
            self.trace and self.fail(path, p, node, f"{_label(p)} is already bound to buffer {_short(old)}, found buffer {node.name}")
            return
        yield from self._wildcard(p, node, env, nest, path)

    def _load(self, p, node, env, nest, path):
        if not isinstance(node, ir.TensorLoad):
            self.trace and self.fail(path, p, node, f"expected a buffer load, found {type(node).__name__} {_short(node)}")
            return
        yield from self._access(p, node, node.source, node.indices, env, nest, path)

    def _access(self, p, node, buf, indices, env, nest, path):
        for e in self._access_indices(p, node, buf, indices, env, nest, path):
            e = dict(e)
            k = ("__access__", _key_of(p.buffer))
            e[k] = e.get(k, ()) + (indices,)   # for Match.region: the accesses this pattern bound
            yield e

    def _access_indices(self, p, node, buf, indices, env, nest, path):
        if p.indices is None:
            yield from self.bound(self.m(p.buffer, buf, env, nest, path + ("buffer",)), p, node, path)
            return
        if len(indices) != len(p.indices):
            self.trace and self.fail(path, p, node, f"expected {len(p.indices)} indices, found {len(indices)} in {_short(node)}")
            return
        for env1 in self.m(p.buffer, buf, env, nest, path + ("buffer",)):
            envs = [env1]
            for d, (ip, idx) in enumerate(zip(p.indices, indices)):
                envs = [e2 for e in envs for e2 in self._index(ip, idx, buf, d, e, nest, path + (f"index {d}",))]
                if not envs:
                    break
            yield from self.bound(envs, p, node, path)

    def _index(self, p, idx, buf, dim, env, nest, path):
        """An index matches after affine normalisation, and inside a nest also as
        ``base + pattern`` where ``base`` does not use the nest's loop variables."""
        if isinstance(p, (P.Wildcard, P.AffinePattern)):
            yield from self.m(p, idx, env, nest, path)
            return
        expected = instantiate(p, env)
        if expected is not None:
            diff = simplify(idx - expected)
            if const_int(diff) == 0:
                yield env
                return
            if nest and not uses_any(diff, nest):
                env = self._bind_base(env, buf, dim, p, diff, path, idx)
                if env is not None:
                    yield env
                return
            self.trace and self.fail(path, p, idx, f"expected index {expected}, found {idx}")
            return
        matched = False
        for e in self.m(p, idx, env, nest, path):
            matched = True
            yield e
        if matched or not nest:
            return
        form = linear_form(idx, nest)
        if form is None or const_int(form[1]) == 0:
            return
        coeffs, base = form
        rest = 0
        for c, v in zip(coeffs, nest):
            if const_int(c) != 0:
                rest = v * c + rest if not isinstance(rest, int) else (v if const_int(c) == 1 else v * c)
        if isinstance(rest, int):
            return
        for e in self.m(p, simplify(rest), env, nest, path):
            e = self._bind_base(e, buf, dim, p, base, path, idx)
            if e is not None:
                yield e

    def _bind_base(self, env, buf, dim, p, base, path, idx):
        k = ("__base__", key(buf), dim, _key_of(p))
        old = env.get(k)
        if old is not None:
            if const_int(simplify(old - base)) == 0:
                return env
            self.trace and self.fail(path, p, idx, f"{buf.name} is accessed at two different offsets: {old} and {base}")
            return None
        env = dict(env)
        env[k] = base
        return env

    def _binop(self, p, node, env, nest, path):
        if not isinstance(node, p.root_types):
            sym = P._BINOPS[p.op][1]
            self.trace and self.fail(path, p, node, f"expected {sym!r}, found {type(node).__name__} {_short(node)}")
            return
        orders = [(node.a, node.b)]
        if p.op in P.COMMUTATIVE:
            orders.append((node.b, node.a))
        for a, b in orders:
            for e1 in self.m(p.a, a, env, nest, path + ("lhs",)):
                for e2 in self.m(p.b, b, e1, nest, path + ("rhs",)):
                    e3 = self.bind(e2, p, node, path)
                    if e3 is not None:
                        yield e3

    def _cast(self, p, node, env, nest, path):
        if not isinstance(node, tirx.Cast):
            self.trace and self.fail(path, p, node, f"expected a cast to {p.to_dtype}, found {type(node).__name__} {_short(node)}")
            return
        if dtype_of(node) != p.to_dtype:
            self.trace and self.fail(path, p, node, f"expected a cast to {p.to_dtype}, found a cast to {dtype_of(node)}")
            return
        yield from self.bound(self.m(p.value, node.value, env, nest, path + ("cast value",)), p, node, path)

    def _call(self, p, node, env, nest, path):
        if not isinstance(node, ir.Call):
            self.trace and self.fail(path, p, node, f"expected a call of {p.op_name}, found {type(node).__name__} {_short(node)}")
            return
        op = getattr(node.op, "name", str(node.op))
        if op != p.op_name and op.split(".", 1)[-1] != p.op_name:
            self.trace and self.fail(path, p, node, f"expected a call of {p.op_name}, found a call of {op}")
            return
        if len(node.args) != len(p.args):
            self.trace and self.fail(path, p, node, f"expected {len(p.args)} arguments to {op}, found {len(node.args)}")
            return
        envs = [env]
        for n, (ap, arg) in enumerate(zip(p.args, node.args)):
            envs = [e2 for e in envs for e2 in self.m(ap, arg, e, nest, path + (f"arg {n}",))]
        yield from self.bound(envs, p, node, path)

    def _affine(self, p, node, env, nest, path):
        if isinstance(node, tirx.Stmt) or tirx.is_buffer_var(node) or not (dtype_of(node) or "").startswith(("int", "uint")):
            self.trace and self.fail(path, p, node, f"expected an integer affine expression, found {_short(node)}")
            return
        loop_vars = [l.loop_var for l in self.context] + list(nest)
        if linear_form(node, loop_vars) is None:
            self.trace and self.fail(path, p, node, f"expected an expression affine in the loop variables, found {node}")
            return
        yield from self._wildcard(p, node, env, nest, path)

    def _alt(self, p, node, env, nest, path):
        matched = False
        for side, sub in (("left of |", p.left), ("right of |", p.right)):
            for e in self.m(sub, node, env, nest, path + (side,)):
                e = self.bind(e, p, node, path) if p.name is not None else e
                if e is not None:
                    matched = True
                    yield e
        if not matched:
            self.trace and self.fail(path, p, node, f"neither alternative of {p!r} matches {_short(node)}")

    # -- statements --------------------------------------------------------------------
    def _store(self, p, node, env, nest, path):
        if not isinstance(node, tirx.BufferStore):
            self.trace and self.fail(path, p, node, f"expected a buffer store, found {type(node).__name__}")
            return
        for e in self._access(p, node, node.buffer, node.indices, env, nest, path):
            yield from self.m(p.value, node.value, e, nest, path + ("value",))

    def _loop(self, spec, loop, env, nest, path):
        if spec.kind is not None and int(loop.kind) != spec.kind:
            self.trace and self.fail(path, spec, loop, f"expected a loop of kind {spec.kind}, found kind {int(loop.kind)}")
            return
        envs = [env]
        if spec.var is not None:
            envs = [e for e in self.m(spec.var, loop.loop_var, env, nest, path + ("var",))]
        if spec.extent is not None:
            envs = [e2 for e in envs for e2 in self.m(spec.extent, loop.extent, e, nest, path + ("extent",))]
        yield from envs

    def _push_loops(self, env, loops):
        env = dict(env)
        env[_LOOPS] = env.get(_LOOPS, ()) + tuple(loops)
        return env

    def _for(self, p, node, env, nest, path):
        if not isinstance(node, tirx.For):
            self.trace and self.fail(path, p, node, f"expected a for loop, found {type(node).__name__}")
            return
        if _stepped(node):
            self.trace and self.fail(path, p, node, f"loop {node.loop_var.name} has the symbolic step {node.step}")
            return
        for e in self._loop(p.spec, node, env, nest, path + (f"loop {node.loop_var.name}",)):
            e = self._push_loops(self.bind(e, p, node, path) or e, [node])
            yield from self.m(p.body, node.body, e, nest + (node.loop_var,), path + (f"for {node.loop_var.name}", "body"))

    def _nest(self, p, node, env, nest, path):
        chain = []
        cur = node
        while isinstance(cur, tirx.For) and not _stepped(cur) and (p.depth is None or len(chain) < p.depth):
            chain.append(cur)
            cur = cur.body
        if not chain:
            self.trace and self.fail(path, p, node, f"expected a loop nest, found {type(node).__name__}")
            return
        if p.depth is not None and len(chain) < p.depth:
            self.trace and self.fail(path, p, chain[-1].body,
                      f"expected a perfect nest of {p.depth} loops, found {len(chain)} "
                      f"({', '.join(l.loop_var.name for l in chain)}) then a {type(chain[-1].body).__name__}")
            return
        depths = [p.depth] if p.depth is not None else range(len(chain), 0, -1)
        for depth in depths:
            loops = chain[:depth]
            envs = [env]
            lpath = path
            for n, loop in enumerate(loops):
                lpath = path + tuple(f"for {l.loop_var.name}" for l in loops[:n])
                if p.specs is not None:
                    envs = [e2 for e in envs for e2 in self._loop(p.specs[n], loop, e, nest, lpath + (f"loop {loop.loop_var.name}",))]
            inner = nest + tuple(l.loop_var for l in loops)
            bpath = path + tuple(f"for {l.loop_var.name}" for l in loops) + ("body",)
            for e in envs:
                e = self.bind(e, p, node, path) or e
                yield from self.m(p.body, loops[-1].body, self._push_loops(e, loops), inner, bpath)

    def _seq(self, p, node, env, nest, path):
        stmts = list(node.seq) if isinstance(node, tirx.SeqStmt) else [node]
        n = len(p.stmts)
        # At the root a run inside a longer sequence matches (the rewriter splices it);
        # nested, the run must be the whole body, or a rewrite would drop statements.
        if len(stmts) < n or (path and len(stmts) != n):
            self.trace and self.fail(path, p, node, f"expected a sequence of {n} statements, found {len(stmts)}")
            return
        for start in range(len(stmts) - n + 1):
            envs = [env]
            for k, sp in enumerate(p.stmts):
                envs = [e2 for e in envs for e2 in self.m(sp, stmts[start + k], e, nest, path + (f"stmt {start + k}",))]
                if not envs:
                    break
            for e in envs:
                e = dict(self.bind(e, p, node, path) or e)
                e[_SPAN] = (start, start + n)
                yield e

    def _if(self, p, node, env, nest, path):
        if not isinstance(node, tirx.IfThenElse):
            self.trace and self.fail(path, p, node, f"expected an if statement, found {type(node).__name__}")
            return
        if (p.else_case is None) != (node.else_case is None):
            self.trace and self.fail(path, p, node, "expected an if " + ("without" if p.else_case is None else "with") + " an else branch")
            return
        for e in self.m(p.cond, node.condition, env, nest, path + ("condition",)):
            for e2 in self.m(p.then_case, node.then_case, e, nest, path + ("then",)):
                if p.else_case is None:
                    yield e2
                else:
                    yield from self.m(p.else_case, node.else_case, e2, nest, path + ("else",))

    def _copy(self, p, node, env, nest, path):
        loops = []
        cur = node
        while isinstance(cur, tirx.For):
            if _stepped(cur):
                self.fail(path, p, cur, f"loop {cur.loop_var.name} has the symbolic step {cur.step}")
                return
            loops.append(cur)
            cur = cur.body
        lpath = path + tuple(f"for {l.loop_var.name}" for l in loops)
        parsed = _parse_copy_body(cur)
        if isinstance(parsed, str):
            self.trace and self.fail(lpath + ("body",), p, cur, parsed)
            return
        store, src_load, cast, predicate, pad_value = parsed
        dst, src = store.buffer, src_load.source
        if dst.same_as(src):
            self.trace and self.fail(lpath, p, cur, f"{dst.name} is both read and written: an in-place update, not a copy")
            return
        try:
            dst_region = access_region(dst, store.indices, loops)
            src_region = access_region(src, src_load.indices, loops)
        except RegionError as err:
            self.trace and self.fail(lpath + ("body",), p, cur, f"not a copy region: {err}")
            return
        pad = None if predicate is None else padding(predicate, loops)
        region = CopyRegion(dst_region, src_region, dst_region.extents, cast, pad_value, predicate, pad)
        for e in self.m(p.dst, dst, env, nest, lpath + ("dst",)):
            for e2 in self.m(p.src, src, e, nest, lpath + ("src",)):
                e3 = self.bind(e2, p, region, path)
                if e3 is not None:
                    yield self._push_loops(e3, loops)


_DISPATCH = {
    P.Wildcard: _Matcher._wildcard, P.VarPattern: _Matcher._var, P.ConstPattern: _Matcher._const,
    P.BufferPattern: _Matcher._buffer, P.LoadPattern: _Matcher._load, P.BinOpPattern: _Matcher._binop,
    P.CastPattern: _Matcher._cast, P.CallPattern: _Matcher._call, P.AffinePattern: _Matcher._affine,
    P.AltPattern: _Matcher._alt, P.StorePattern: _Matcher._store, P.ForPattern: _Matcher._for,
    P.NestPattern: _Matcher._nest, P.SeqPattern: _Matcher._seq, P.IfPattern: _Matcher._if,
    P.CopyPattern: _Matcher._copy,
}


def _parse_copy_body(stmt):
    """Split a copy body into (store, load, cast, predicate, pad_value), or explain why not."""
    predicate = pad_value = None
    if isinstance(stmt, tirx.IfThenElse):
        then, other = stmt.then_case, stmt.else_case
        if other is None:
            # A partial copy (the tile at a ragged edge): only the guarded elements are written.
            if not isinstance(then, tirx.BufferStore):
                return f"expected a buffer store under the guard, found {type(then).__name__}"
            predicate, stmt, value = stmt.condition, then, then.value
            guarded = _guarded(value)
            if guarded is not None:
                return "a copy guarded twice"
            cast = None
            if isinstance(value, tirx.Cast):
                cast, value = dtype_of(value), value.value
            if not isinstance(value, ir.TensorLoad):
                return f"expected the stored value to be a buffer load (optionally cast), found {_short(value)}"
            if cast is not None and cast == str(stmt.buffer.dtype) and cast == str(value.source.dtype):
                cast = None
            return stmt, value, cast, predicate, None
        if not (isinstance(then, tirx.BufferStore) and isinstance(other, tirx.BufferStore)
                and then.buffer.same_as(other.buffer)
                and all(tvm_ffi.structural_equal(a, b) for a, b in zip(then.indices, other.indices))
                and isinstance(other.value, (tirx.IntImm, tirx.FloatImm))):
            return "an if/else that is not 'dst = src' else 'dst = constant'"
        predicate, pad_value, stmt, value = stmt.condition, other.value, then, then.value
    elif isinstance(stmt, tirx.BufferStore):
        value = stmt.value
    else:
        return f"expected the innermost statement of a copy to be a buffer store, found {type(stmt).__name__}"
    cast = None
    if isinstance(value, tirx.Cast):
        cast, value = dtype_of(value), value.value
    guarded = _guarded(value)
    if guarded is not None:
        if predicate is not None:
            return "a copy guarded twice"
        predicate, value, pad_value = guarded
        if isinstance(value, tirx.Cast):
            if cast is not None:
                return "a value cast twice"
            cast, value = dtype_of(value), value.value
    if not isinstance(value, ir.TensorLoad):
        return f"expected the stored value to be a buffer load (optionally cast or padded), found {_short(value)}"
    if cast is not None and cast == str(stmt.buffer.dtype) and cast == str(value.source.dtype):
        cast = None
    return stmt, value, cast, predicate, pad_value


def _guarded(value):
    """``if_then_else(pred, x, c)``/``Select`` with a constant pad value -> (pred, x, c)."""
    if isinstance(value, ir.Call) and getattr(value.op, "name", "").endswith("if_then_else"):
        cond, then, other = value.args
    elif isinstance(value, tirx.Select):
        cond, then, other = value.condition, value.true_value, value.false_value
    else:
        return None
    if isinstance(other, tirx.Cast) and isinstance(other.value, (tirx.IntImm, tirx.FloatImm)):
        other = simplify(other)
    if not isinstance(other, (tirx.IntImm, tirx.FloatImm)):
        return None
    return cond, then, other


def _label(p) -> str:
    return repr(p.name) if p.name is not None else repr(p)


def instantiate(p, env):
    """The expression a pattern denotes once all its variables are bound, else None."""
    if isinstance(p, P.ConstPattern):
        if p.value is None:
            return env.get(p)
        return p.value
    if isinstance(p, (P.VarPattern, P.Wildcard, P.AffinePattern, P.BufferPattern, P.AltPattern)):
        return env.get(_key_of(p))
    if isinstance(p, P.BinOpPattern):
        a, b = instantiate(p.a, env), instantiate(p.b, env)
        if a is None or b is None:
            return None
        if isinstance(a, int) and isinstance(b, int):
            return None
        if isinstance(a, int):
            a = tirx.IntImm(dtype_of(b), a) if isinstance(p.a.value, int) else tirx.FloatImm(dtype_of(b), a)
        if isinstance(b, int):
            b = tirx.IntImm(dtype_of(a), b) if isinstance(p.b.value, int) else tirx.FloatImm(dtype_of(a), b)
        ops = {"add": tirx.Add, "sub": tirx.Sub, "mul": tirx.Mul, "floordiv": tirx.FloorDiv,
               "floormod": tirx.FloorMod, "max": tirx.Max, "min": tirx.Min}
        if dtype_of(a) != dtype_of(b):
            return None
        return ops[p.op](a, b)
    return None


def match(pattern: P.Pattern, node, context: tuple = ()) -> Match | None:
    """Match ``pattern`` against ``node`` (canonicalised first); a Match or None.

    >>> tp.match(tp.is_var("i") + 1, i + 1)       # doctest: +SKIP
    <Match Add ...>
    """
    if not isinstance(pattern, P.Pattern):
        raise TypeError(f"match expects a tirpat pattern first, got {type(pattern).__name__} {pattern!r}")
    if not isinstance(node, (tirx.Stmt, ir.Expr)) and not tirx.is_buffer_var(node):
        raise TypeError(f"match expects a PrimExpr or a Stmt, got {type(node).__name__}")
    node = canonicalize(node)
    return _Matcher(tuple(context)).run(pattern, node)


def find_all(pattern: P.Pattern, func_or_stmt) -> list:
    """Every non-overlapping match in pre-order (an outer match wins).

    ``func_or_stmt`` is a PrimFunc, an IRModule (every PrimFunc) or a statement.

    >>> [m.region("A") for m in tp.find_all(tp.is_copy(src=tp.is_buffer("A")), func)]   # doctest: +SKIP
    """
    from .rewrite import Rewriter

    if not isinstance(pattern, P.Pattern):
        raise TypeError(f"find_all expects a tirpat pattern first, got {type(pattern).__name__} {pattern!r}")
    found = []

    def collect(m):
        found.append(m)
        return None

    rw = Rewriter.from_pattern(pattern, collect, name="find_all")
    if isinstance(func_or_stmt, ir.IRModule):
        for func in func_or_stmt.functions.values():
            if isinstance(func, tirx.PrimFunc):
                rw._scan(func, stop_at_match=True)
        return found
    rw._scan(func_or_stmt, stop_at_match=True)
    return found


def explain_failure(pattern: P.Pattern, node, context: tuple = ()) -> tuple[Match | None, Failure | None]:
    """Run a traced match; return the match, or the deepest failure."""
    matcher = _Matcher(tuple(context), trace=True)
    m = matcher.run(pattern, node)
    return m, (None if m is not None else matcher.deepest)
