"""``is_copy``: a loop nest that copies one buffer region into another, seen as a DMA.

The nest is every loop from the matched ``For`` down to the store ``dst[affine] =
src[affine]``; the value may be cast, and padded (``if_then_else``/``Select`` with a
constant, or an ``if``/``else`` storing a constant) or partial (an ``if`` with no
``else``). A padded copy in the partial tile a ``split`` leaves (``if 8*o + i < 9:
dst[i] = if_then_else(...)``) is guarded twice: the tile's guard becomes the loops'
extents (``range(min(8, 9 - 8*o))``) and the padding stays the copy's. The match binds a
:class:`~tirpat.tir.region.CopyRegion`.

A store whose value is a load of the same buffer is an in-place update, not a copy. And a
copy is refused where the order of its elements matters, so that a DMA doing all of it at
once computes what the loops compute: when the destination and the source are views of one
buffer's memory and the elements written may be among those read (``V2[i + 1] = V1[i]``).
Vector (``Ramp``-indexed) stores are not copy nests.

>>> A = tvm.tirx.decl_buffer((8,), "int8", "A")
>>> B = tvm.tirx.decl_buffer((8,), "int8", "B")
>>> i = tvm.tirx.Var("i", "int32")
>>> nest = tvm.tirx.For(i, 0, 8, tvm.tirx.ForKind.SERIAL, tvm.tirx.BufferStore(B, tvm.tirx.BufferLoad(A, [i]), [i]))
>>> tp.is_copy(name="c").match(nest)["c"]
CopyRegion(dst=Region(B[0], strides=[1], extents=[8]), src=Region(A[0], strides=[1], extents=[8]), extents=[8])
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, tirx

from .analysis import dtype_of, lanes, simplify
from .engine import short
from .pattern import BUFFER, COPY, AltPattern, BufferPattern, Pattern, check_name
from .region import Aliases, CopyRegion, RegionError, access_region, guards_in_extents, padding
from .statement import StmtPattern, loop_failure

_NO_VIEWS = Aliases()  # outside a scan: no views known, a buffer shares memory only with itself


class CopyPattern(StmtPattern):
    """A copy nest ``dst[affine] = src[affine]`` (possibly cast, possibly padded)."""

    root_types = (tirx.For, tirx.BufferStore)
    category = COPY
    binds_node = False  # binds the CopyRegion instead

    def __init__(self, dst=None, src=None, name=None):
        for what, b in (("dst", dst), ("src", src)):
            if b is not None and not isinstance(b, (BufferPattern, AltPattern)):
                raise TypeError(f"is_copy: {what} must be a buffer pattern (tp.is_buffer), got {b!r}")
        self.dst = dst or BufferPattern()
        self.src = src or BufferPattern()
        self.name = check_name(name, "is_copy")
        self._collect_names((self.dst, BUFFER), (self.src, BUFFER))

    def children(self):
        return (self.dst, self.src)

    def _body_repr(self):
        return f"is_copy(dst={self.dst!r}, src={self.src!r}{'' if self.name is None else f', name={self.name!r}'})"

    def compile(self, cc):
        dst, src, fail, key = cc.compile(self.dst, "dst"), cc.compile(self.src, "src"), cc.failure(self), self.key

        def match(node, b, nest, k, folded=False):
            loops = []
            cur = node
            while type(cur) is tirx.For:
                why = loop_failure(cur)
                if why is not None:
                    return fail and fail(b, cur, nest, why)
                loops.append(cur)
                cur = cur.body
            steps = tuple(f"for {l.loop_var.name}" for l in loops)
            parsed = parse_copy_body(cur)
            if isinstance(parsed, str):
                if loops and not folded and type(cur) is tirx.IfThenElse and cur.else_case is None:
                    unguarded = guards_in_extents(node, range(len(loops)), b.context + tuple(b.loops))
                    if unguarded is not None and match(unguarded, b, nest, k, folded=True):
                        return True
                return fail and fail(b, cur, nest, parsed, steps + ("body",))
            store, load, cast, predicate, pad_value = parsed
            if store.buffer.same_as(load.source):
                return fail and fail(b, cur, nest, f"{store.buffer.name} is both read and written: an in-place "
                                                   f"update, not a copy", steps + ("body",))
            try:
                dst_region = access_region(store.buffer, store.indices, loops)
                src_region = access_region(load.source, load.indices, loops)
            except RegionError as err:
                return fail and fail(b, cur, nest, f"not a copy region: {err}", steps + ("body",))
            overlap = (b.aliases or _NO_VIEWS).overlap(dst_region, src_region)
            if overlap is not None:
                return fail and fail(b, cur, nest, f"not a plain copy: {overlap}", steps + ("body",))
            region = CopyRegion(dst_region, src_region, dst_region.extents, cast, pad_value, predicate,
                                None if predicate is None else padding(predicate, loops))
            mark = b.mark()
            for loop in loops:
                b.push(b.loops, loop)
            if dst(store.buffer, b, nest, lambda: src(load.source, b, nest, lambda: b.bind(key, region) and k())):
                return True
            b.undo(mark)
            return False

        return match


def parse_copy_body(stmt):
    """Split a copy body into ``(store, load, cast, predicate, pad_value)``, or say why not."""
    predicate = pad_value = None
    if isinstance(stmt, tirx.IfThenElse):
        then, other = stmt.then_case, stmt.else_case
        if other is None:
            # A partial copy (the tile at a ragged edge): only the guarded elements are written.
            if not isinstance(then, tirx.BufferStore):
                return f"expected a buffer store under the guard, found {type(then).__name__}"
            predicate, stmt, value = stmt.condition, then, then.value
            if _guarded(value) is not None:
                return "a copy guarded twice"
            return _split(stmt, value, predicate, None)
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
    return _split(stmt, value, predicate, pad_value)


def _split(store, value, predicate, pad_value):
    vector = [lanes(e) for e in (value, *store.indices) if lanes(e) != 1]
    if vector:
        return (f"a vector store ({vector[0]} lanes) to {store.buffer.name}: is_copy matches a nest of scalar "
                f"stores (match it before vectorisation)")
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
        what = "(optionally cast or padded)" if pad_value is not None or predicate is None else "(optionally cast)"
        return f"expected the stored value to be a buffer load {what}, found {short(value)}"
    if cast is not None and cast == str(store.buffer.dtype) and cast == str(value.source.dtype):
        cast = None
    return store, value, cast, predicate, pad_value


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


def is_copy(dst: Pattern | None = None, src: Pattern | None = None, name: str | None = None) -> Pattern:
    """A copy nest ``dst[affine] = src[affine]``, bound as a :class:`CopyRegion` under ``name``.

    The nest is every loop from the matched ``For`` down to the store. A single store also
    matches (no loops, one element): inside a nest that is not a copy (say ``B[i // 2] =
    A[i]``) each element is then a copy of its own, so a DMA rule may want to decline
    ``extents == ()``.

    >>> tp.is_copy(dst=tp.is_buffer(scope="local.accel_inp"), name="load")
    is_copy(dst=is_buffer(scope='local.accel_inp'), src=is_buffer(), name='load')
    """
    return CopyPattern(dst, src, name)
