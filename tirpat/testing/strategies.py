"""Hypothesis strategies that generate valid PrimFuncs, for testing rules on varied TIR.

Each strategy yields a case object holding the lowered (not flattened) PrimFunc, what a
correct rule must find in it, and a numpy ``reference``:

>>> from hypothesis import given
>>> @given(copy_nests())
... def test_my_dma_rule(case):
...     m = tp.find_all(tp.is_copy(name="c"), case.func)[0]
...     assert m["c"].src.strides == case.src_strides
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from tvm import ir, s_tir, te, tirx

from ..tir.lowering import lower

_INT = "int32"


def _imm(v: int):
    return tirx.IntImm(_INT, v)


def _func(params, body):
    return tirx.PrimFunc(params, body).with_attr("global_symbol", "main")


def _nest(loop_vars, extents, body):
    for v, e in reversed(list(zip(loop_vars, extents))):
        body = tirx.For(v, _imm(0), _imm(e), tirx.ForKind.SERIAL, body)
    return body


def random_array(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Random values spanning the dtype's range (small floats for float dtypes)."""
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


@dataclass
class CopyCase:
    """A copy nest ``dst[...] = src[...]`` and the region facts a matcher must recover.

    ``func`` takes ``(src, dst)``. Offsets and strides are in elements of the row-major
    flattened buffers; ``pad`` is None or one ``(before, after)`` per loop. A ``partial``
    copy writes only inside the pad box (a guarded store with no else) instead of padding.
    """

    func: tirx.PrimFunc
    src_shape: tuple
    dst_shape: tuple
    src_dtype: str
    dst_dtype: str
    partial: bool
    extents: tuple
    src_offset: int
    src_strides: tuple
    dst_offset: int
    dst_strides: tuple
    pad: tuple | None
    pad_value: int

    def inputs(self, rng: np.random.Generator) -> list:
        """Random ``[src, dst]`` arrays for this case."""
        return [random_array(rng, self.src_shape, self.src_dtype),
                random_array(rng, self.dst_shape, self.dst_dtype)]

    def reference(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The destination after the copy, computed with numpy from the facts above."""
        out = dst.copy().reshape(-1)
        flat = src.reshape(-1)
        pad = self.pad or tuple((0, 0) for _ in self.extents)
        for it in np.ndindex(*self.extents):
            d = self.dst_offset + sum(t * s for t, s in zip(it, self.dst_strides))
            inside = all(b <= t < e - a for t, e, (b, a) in zip(it, self.extents, pad))
            if inside:
                s_ = self.src_offset + sum(t * s for t, s in zip(it, self.src_strides))
                out[d] = np.array(flat[s_]).astype(self.dst_dtype)
            elif not self.partial:
                out[d] = np.array(self.pad_value).astype(self.src_dtype).astype(self.dst_dtype)
        return out.reshape(self.dst_shape)


def _row_major(shape):
    out, acc = [], 1
    for e in reversed(shape):
        out.append(acc)
        acc *= e
    return tuple(reversed(out))


@st.composite
def copy_nests(draw, max_loops: int = 3, max_extent: int = 6, padding: bool = True,
               casts: bool = True) -> CopyCase:
    """Copy nests with random extents, offsets, strides, transposes, padding and casts.

    >>> from hypothesis import given
    >>> @given(copy_nests(max_loops=2, padding=False, casts=False))
    ... def test_strides(case):
    ...     (m,) = tp.find_all(tp.is_copy(name="c"), case.func)
    ...     kept = [k for k, e in enumerate(case.extents) if e > 1]   # lowering drops extent-1 loops
    ...     assert m["c"].src.strides == tuple(case.src_strides[k] for k in kept)
    >>> test_strides()
    """
    n = draw(st.integers(1, max_loops))
    extents = draw(st.lists(st.integers(1, max_extent), min_size=n, max_size=n))
    loop_vars = [tirx.Var(f"ax{k}", _INT) for k in range(n)]
    src_dtype, dst_dtype = draw(st.sampled_from(
        [("int8", "int8"), ("int32", "int32"), ("float32", "float32")]
        + ([("int8", "int32"), ("int32", "int8"), ("int8", "float32")] if casts else [])))

    # Destination: a transpose of the loops, each with a stride factor, at an offset.
    perm = draw(st.permutations(range(n)))
    dst_scale = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    dst_off = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    dst_shape = tuple(dst_off[d] + dst_scale[d] * (extents[perm[d]] - 1) + 1 + draw(st.integers(0, 2))
                      for d in range(n))
    dst_index = [_imm(dst_off[d]) + loop_vars[perm[d]] * dst_scale[d] for d in range(n)]

    pad = None
    if padding and draw(st.booleans()):
        pad = tuple((draw(st.integers(0, e - 1)), 0) for e in extents)
        pad = tuple((b, draw(st.integers(0, e - 1 - b))) for (b, _), e in zip(pad, extents))
    shifted = [v - pad[k][0] if pad else v for k, v in enumerate(loop_vars)]
    valid = [e - (pad[k][0] + pad[k][1] if pad else 0) for k, e in enumerate(extents)]

    # Source: every dimension an affine mix of the loops (zero coefficients broadcast).
    src_ndim = draw(st.integers(1, 3))
    coef = [draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)) for _ in range(src_ndim)]
    src_off = draw(st.lists(st.integers(0, 3), min_size=src_ndim, max_size=src_ndim))
    src_shape = tuple(src_off[d] + sum(c * (v - 1) for c, v in zip(coef[d], valid)) + 1 + draw(st.integers(0, 2))
                      for d in range(src_ndim))
    src_index = []
    for d in range(src_ndim):
        e = _imm(src_off[d])
        for c, v in zip(coef[d], shifted):
            if c:
                e = e + v * c
        src_index.append(e)

    src = tirx.decl_buffer(src_shape, src_dtype, "src")
    dst = tirx.decl_buffer(dst_shape, dst_dtype, "dst")
    value = tirx.BufferLoad(src, src_index)
    pad_value = 0
    partial = False
    cond = None
    if pad is not None:
        pad_value = draw(st.integers(-3, 3))
        conds = []
        for v, e, (b, a) in zip(loop_vars, extents, pad):
            if b:
                conds.append(_imm(b) <= v)
            if a:
                conds.append(v < _imm(e - a))
        if conds:
            cond = conds[0]
            for c in conds[1:]:
                cond = tirx.And(cond, c)
            pv = tirx.FloatImm(src_dtype, pad_value) if src_dtype.startswith("float") else tirx.IntImm(src_dtype, pad_value)
            partial = draw(st.booleans())
            if not partial:
                value = tirx.if_then_else(cond, value, pv)
        else:
            pad = None
    if dst_dtype != src_dtype:
        value = tirx.Cast(dst_dtype, value)
    store = tirx.BufferStore(dst, value, dst_index)
    body = _nest(loop_vars, extents, tirx.IfThenElse(cond, store, None) if partial else store)

    src_rm, dst_rm = _row_major(src_shape), _row_major(dst_shape)
    src_strides = tuple(sum(coef[d][k] * src_rm[d] for d in range(src_ndim)) for k in range(n))
    dst_strides = tuple(sum((dst_scale[d] if perm[d] == k else 0) * dst_rm[d] for d in range(n)) for k in range(n))
    src_offset = sum(src_off[d] * src_rm[d] for d in range(src_ndim))
    if pad is not None:
        src_offset -= sum(b * s for (b, _), s in zip(pad, src_strides))
    dst_offset = sum(dst_off[d] * dst_rm[d] for d in range(n))
    return CopyCase(_func([src, dst], body), src_shape, dst_shape, src_dtype, dst_dtype, partial,
                    tuple(extents), src_offset, src_strides, dst_offset, dst_strides, pad, pad_value)


#: the binary operators of :func:`elementwise_nests`, with their numpy reference
ELEMENTWISE_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
_TIR_BINARY = {"add": tirx.Add, "sub": tirx.Sub, "mul": tirx.Mul, "max": tirx.Max, "min": tirx.Min}


@dataclass
class Access:
    """How a nest indexes one buffer: dimension ``d`` is ``offsets[d] + steps[d] * i_d``,
    ``i_d`` the ``d``-th loop (so a step of 2 takes every other element, an offset starts
    inside the buffer); ``shape`` is the buffer's, at least as big as that needs.

    >>> Access(shape=(4, 10), offsets=(1, 2), steps=(1, 2)).region()    # rows 1.., every other column from 2
    (12, (10, 2))
    """

    shape: tuple
    offsets: tuple
    steps: tuple

    def indices(self, loop_vars) -> list:
        return [_imm(o) + v * s if s != 1 else (v if o == 0 else _imm(o) + v)
                for v, o, s in zip(loop_vars, self.offsets, self.steps)]

    def region(self) -> tuple:
        """``(offset, strides)``: the flattened element offset of the first element accessed
        and the element stride of each loop, as :meth:`tirpat.Match.region` gives them."""
        rm = _row_major(self.shape)
        return (sum(o * r for o, r in zip(self.offsets, rm)), tuple(s * r for s, r in zip(self.steps, rm)))

    def window(self, array: np.ndarray, extents) -> np.ndarray:
        """The elements of ``array`` the nest accesses, as a view shaped like the loops."""
        return array[tuple(slice(o, o + s * (e - 1) + 1, s) for o, s, e in zip(self.offsets, self.steps, extents))]


def _draw_access(draw, extents, strided: bool) -> Access:
    offsets = tuple(draw(st.integers(0, 3)) if strided else 0 for _ in extents)
    steps = tuple(draw(st.integers(1, 2)) if strided else 1 for _ in extents)
    slack = tuple(draw(st.integers(0, 2)) if strided else 0 for _ in extents)
    shape = tuple(o + s * (e - 1) + 1 + x for o, s, e, x in zip(offsets, steps, extents, slack))
    return Access(shape, offsets, steps)


@dataclass
class ElementwiseCase:
    """``out[...] = op(a[...], b[...])`` over a nest of loops; ``func`` takes ``(a, b, out)``.

    - ``shape``: the loop extents, outermost first (the iteration space);
    - ``dtype``: the element type of all three buffers;
    - ``op``: a key of :data:`ELEMENTWISE_OPS`;
    - ``accesses``: ``{"a": Access, "b": Access, "out": Access}``, how each buffer is indexed
      (its shape, and per dimension an offset and a step; all 0 and 1 unless ``strided``).

    Elements of ``out`` the nest does not write keep their value.
    """

    func: tirx.PrimFunc
    shape: tuple
    dtype: str
    op: str
    accesses: dict

    def inputs(self, rng: np.random.Generator) -> list:
        """Random ``[a, b, out]`` arrays for this case."""
        return [random_array(rng, self.accesses[n].shape, self.dtype) for n in ("a", "b", "out")]

    def reference(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` after the nest, computed with numpy."""
        out = out.copy()
        x, y = (self.accesses[n].window(v, self.shape) for n, v in (("a", a), ("b", b)))
        with np.errstate(over="ignore"):
            self.accesses["out"].window(out, self.shape)[...] = ELEMENTWISE_OPS[self.op](x, y).astype(self.dtype)
        return out


def _choices(what: str, values, known=None) -> list:
    values = [values] if isinstance(values, str) else list(values or ())
    if not values or (known is not None and not set(values) <= set(known)):
        raise ValueError(f"{what} must be a non-empty list" + (f" of {sorted(known)}" if known else "")
                         + f", got {values!r}")
    return values


def elementwise_nests(max_loops: int = 3, max_extent: int = 8, dtypes=("int8", "int32", "float32"),
                      ops=tuple(ELEMENTWISE_OPS), strided: bool = False) -> st.SearchStrategy:
    """Elementwise binary nests ``out[...] = op(a[...], b[...])`` over 1..``max_loops``
    loops, of the ``dtypes`` and ``ops`` given; ``strided`` draws an offset and a step for
    every dimension of every buffer (tiles of bigger buffers, every other element).

    >>> from hypothesis import given
    >>> @given(elementwise_nests(dtypes=["int8"], ops=["max"], strided=True))
    ... def test_max_nests(case):
    ...     (m,) = tp.find_all(tp.is_nest(None, tp.is_store(tp.is_buffer("out"), None, tp.wildcard())), case.func)
    ...     assert (m.region("out").offset, m.region("out").strides) == case.accesses["out"].region()
    >>> test_max_nests()
    """
    return _elementwise_nests(max_loops, max_extent, _choices("elementwise_nests: dtypes", dtypes),
                              _choices("elementwise_nests: ops", ops, ELEMENTWISE_OPS), strided)


@st.composite
def _elementwise_nests(draw, max_loops, max_extent, dtypes, ops, strided) -> ElementwiseCase:
    n = draw(st.integers(1, max_loops))
    shape = tuple(draw(st.lists(st.integers(2, max_extent), min_size=n, max_size=n)))
    dtype = draw(st.sampled_from(list(dtypes)))
    op = draw(st.sampled_from(list(ops)))
    accesses = {name: _draw_access(draw, shape, strided) for name in ("a", "b", "out")}
    a, b, out = (tirx.decl_buffer(accesses[name].shape, dtype, name) for name in ("a", "b", "out"))
    vs = [tirx.Var(f"i{k}", _INT) for k in range(n)]
    la, lb = (tirx.BufferLoad(buf, accesses[name].indices(vs)) for buf, name in ((a, "a"), (b, "b")))
    body = _nest(vs, shape, tirx.BufferStore(out, _TIR_BINARY[op](la, lb), accesses["out"].indices(vs)))
    return ElementwiseCase(_func([a, b, out], body), shape, dtype, op, accesses)


#: the unary operators of :func:`unary_nests` (``shr`` and ``neg`` on integers only, ``exp`` on floats)
UNARY_OPS = ("relu", "clip", "neg", "shr", "cast", "exp")


@dataclass
class UnaryCase:
    """``out[idx] = op(a[idx])`` over a nest of loops; ``func`` takes ``(a, out)``.

    - ``shape``: the loop extents, also both buffers' shape;
    - ``dtype``: the element type of ``a``; ``out_dtype`` that of ``out`` (they differ for ``cast``);
    - ``op``: one of :data:`UNARY_OPS`: ``relu`` is ``max(x, 0)``, ``clip`` is
      ``min(max(x, lo), hi)``, ``neg`` is ``0 - x``, ``shr`` is ``x >> s``, ``cast`` widens,
      ``exp`` is ``T.exp(x)``;
    - ``params``: the constants of the op (``{"lo": .., "hi": ..}`` for clip, ``{"shift": ..}`` for shr).
    """

    func: tirx.PrimFunc
    shape: tuple
    dtype: str
    out_dtype: str
    op: str
    params: dict

    def inputs(self, rng: np.random.Generator) -> list:
        """Random ``[a, out]`` arrays for this case."""
        return [random_array(rng, self.shape, self.dtype), random_array(rng, self.shape, self.out_dtype)]

    def reference(self, a: np.ndarray) -> np.ndarray:
        """``out`` after the nest, computed with numpy."""
        p, x = self.params, a
        with np.errstate(over="ignore"):
            out = {"relu": lambda: np.maximum(x, 0), "clip": lambda: np.clip(x, p.get("lo"), p.get("hi")),
                   "neg": lambda: np.negative(x), "shr": lambda: np.right_shift(x, p.get("shift")),
                   "cast": lambda: x, "exp": lambda: np.exp(x)}[self.op]()
        return np.asarray(out).astype(self.out_dtype)


_WIDER = {"int8": ("int32", "float32"), "int32": ("float32",), "float32": ("float64",)}


def unary_nests(max_loops: int = 3, max_extent: int = 8, dtypes=("int8", "int32", "float32"),
                ops=UNARY_OPS) -> st.SearchStrategy:
    """Elementwise unary nests ``out[idx] = op(a[idx])`` (an accelerator's activation and
    requantisation steps), of the ``dtypes`` and ``ops`` given; an op that does not apply
    to the dtype drawn (``shr`` on floats) is replaced by ``relu``.

    >>> from hypothesis import given
    >>> @given(unary_nests(ops=["relu"]))
    ... def test_relu(case):
    ...     relu = tp.is_store(tp.is_buffer("out"), None, tp.max(tp.is_load(tp.is_buffer("a"), None), 0))
    ...     assert tp.find_all(tp.is_nest(None, relu), case.func)
    >>> test_relu()
    """
    return _unary_nests(max_loops, max_extent, _choices("unary_nests: dtypes", dtypes, _WIDER),
                        _choices("unary_nests: ops", ops, UNARY_OPS))


@st.composite
def _unary_nests(draw, max_loops, max_extent, dtypes, ops) -> UnaryCase:
    n = draw(st.integers(1, max_loops))
    shape = tuple(draw(st.lists(st.integers(2, max_extent), min_size=n, max_size=n)))
    dtype = draw(st.sampled_from(list(dtypes)))
    op = draw(st.sampled_from(list(ops)))
    is_float = dtype.startswith("float")
    if (op in ("shr", "neg") and is_float) or (op == "exp" and not is_float):
        op = "relu"
    out_dtype = draw(st.sampled_from(_WIDER[dtype])) if op == "cast" else dtype
    a, out = tirx.decl_buffer(shape, dtype, "a"), tirx.decl_buffer(shape, out_dtype, "out")
    vs = [tirx.Var(f"i{k}", _INT) for k in range(n)]
    x = tirx.BufferLoad(a, vs)
    const = (lambda v: tirx.FloatImm(dtype, float(v))) if is_float else (lambda v: tirx.IntImm(dtype, int(v)))
    params: dict = {}
    if op == "relu":
        value = tirx.Max(x, const(0))
    elif op == "clip":
        lo = draw(st.integers(-100, 0))
        params = {"lo": lo, "hi": lo + draw(st.integers(0, 100))}
        value = tirx.Min(tirx.Max(x, const(params["lo"])), const(params["hi"]))
    elif op == "neg":
        value = tirx.Sub(const(0), x)
    elif op == "shr":
        params = {"shift": draw(st.integers(0, int(dtype[3:]) - 1))}
        value = tirx.shift_right(x, const(params["shift"]))
    elif op == "cast":
        value = tirx.Cast(out_dtype, x)
    else:
        value = tirx.exp(x)
    body = _nest(vs, shape, tirx.BufferStore(out, value, vs))
    return UnaryCase(_func([a, out], body), shape, dtype, out_dtype, op, params)


#: the reductions of :func:`reduction_nests`, with their numpy reference
REDUCTIONS = {"sum": np.sum, "max": np.max, "min": np.min}


@dataclass
class ReductionCase:
    """``out[i...] = reduce over k of a[i..., k]``, written with TE (``te.sum``/``te.max``/
    ``te.min`` over a reduce axis) and lowered: the initialisation under ``if k == 0``
    inside the loops, as TVM lowers it. ``func`` takes ``(a, out)``.

    - ``shape``: the shape of ``a`` (the reduced axis last);
    - ``dtype``: the element type of ``a``; ``acc_dtype`` that of ``out`` (int32 for int8 sums);
    - ``op``: a key of :data:`REDUCTIONS`.
    """

    func: tirx.PrimFunc
    shape: tuple
    dtype: str
    acc_dtype: str
    op: str

    def inputs(self, rng: np.random.Generator) -> list:
        """Random ``[a, out]`` arrays for this case."""
        return [random_array(rng, self.shape, self.dtype), random_array(rng, self.shape[:-1], self.acc_dtype)]

    def reference(self, a: np.ndarray) -> np.ndarray:
        """``out`` after the nest, computed with numpy."""
        with np.errstate(over="ignore"):
            return REDUCTIONS[self.op](a.astype(self.acc_dtype), axis=-1).astype(self.acc_dtype)


def reduction_nests(max_loops: int = 3, max_extent: int = 8, dtypes=("int8", "int32", "float32"),
                    ops=tuple(REDUCTIONS)) -> st.SearchStrategy:
    """Reductions over the last axis of a 1..``max_loops``-D buffer (int8 sums accumulate in
    int32), of the ``dtypes`` and ``ops`` given.

    >>> from hypothesis import given
    >>> @given(reduction_nests(ops=["sum"]))
    ... def test_sums(case):
    ...     assert tp.find_all(tp.is_nest(None, tp.wildcard()), case.func)
    >>> test_sums()
    """
    return _reduction_nests(max_loops, max_extent, _choices("reduction_nests: dtypes", dtypes),
                            _choices("reduction_nests: ops", ops, REDUCTIONS))


@st.composite
def _reduction_nests(draw, max_loops, max_extent, dtypes, ops) -> ReductionCase:
    n = draw(st.integers(1, max_loops))
    shape = tuple(draw(st.lists(st.integers(2, max_extent), min_size=n, max_size=n)))
    dtype = draw(st.sampled_from(list(dtypes)))
    op = draw(st.sampled_from(list(ops)))
    acc = "int32" if dtype == "int8" and op == "sum" else dtype
    A = te.placeholder(shape, dtype, name="a")
    k = te.reduce_axis((0, shape[-1]), "k")
    reduce = {"sum": te.sum, "max": te.max, "min": te.min}[op]
    out = te.compute(shape[:-1], lambda *i: reduce(A[(*i, k)].astype(acc), axis=k), name="out")
    func = lower(te.create_prim_func([A, out]))
    return ReductionCase(func, shape, dtype, acc, op)


@dataclass
class TiledReductionCase:
    """A TE matmul ``C = A x B^T`` (int8 in, int32 out) tiled with ``s_tir.Schedule``."""

    func: tirx.PrimFunc
    m: int
    n: int
    k: int
    tile: tuple

    def inputs(self, rng):
        return [random_array(rng, (self.m, self.k), "int8"), random_array(rng, (self.n, self.k), "int8"),
                np.zeros((self.m, self.n), "int32")]

    def reference(self, a, b):
        return a.astype("int32") @ b.astype("int32").T


def tile_gemm(sch, block, tile=(16, 16, 16)) -> tuple:
    """Split the ``i, j, k`` loops of a GEMM block by ``tile`` and order them
    ``io, jo, ko, ii, ji, ki`` (returned), so each tile is one inner nest.

    >>> from tvm import s_tir, te
    >>> A, B = te.placeholder((32, 32), "int8", name="A"), te.placeholder((32, 32), "int8", name="B")
    >>> k = te.reduce_axis((0, 32), "k")
    >>> C = te.compute((32, 32), lambda i, j: te.sum(A[i, k].astype("int32") * B[j, k].astype("int32"), axis=k), name="C")
    >>> sch = s_tir.Schedule(te.create_prim_func([A, B, C]))
    >>> loops = tile_gemm(sch, sch.get_sblock("C"))
    >>> [int(sch.get(l).extent) for l in loops]
    [2, 2, 2, 16, 16, 16]
    """
    i, j, k = sch.get_loops(block)
    io, ii = sch.split(i, [None, tile[0]])
    jo, ji = sch.split(j, [None, tile[1]])
    ko, ki = sch.split(k, [None, tile[2]])
    sch.reorder(io, jo, ko, ii, ji, ki)
    return io, jo, ko, ii, ji, ki


def tiled_matmul(m: int, n: int, k: int, tile=(16, 16, 16), *, decompose_init: bool = False,
                 scopes: tuple | None = None, index_dtype: str = "int32") -> tirx.PrimFunc:
    """A lowered int8 matmul ``C = A x B^T`` (int32 out) tiled ``for io, jo, ko: for ii, ji, ki``.

    ``decompose_init`` moves the zero-init out of the tile nest; ``scopes`` (three storage
    scopes) stages A, B and C through scratch buffers at the tile loops; ``index_dtype``
    is the type of its loops and indices (TVM's ``create_prim_func`` override).

    >>> f = tiled_matmul(64, 64, 64, scopes=("local.accel_inp", "local.accel_wgt", "local.accel_acc"))
    """
    A = te.placeholder((m, k), "int8", name="A")
    B = te.placeholder((n, k), "int8", name="B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("int32") * B[j, r].astype("int32"), axis=r), name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C], index_dtype_override=index_dtype))
    blk = sch.get_sblock("C")
    io, jo, ko, ii, ji, ki = tile_gemm(sch, blk, tile)
    if scopes is not None:
        sch.compute_at(sch.cache_read(blk, 0, scopes[0]), ko)
        sch.compute_at(sch.cache_read(blk, 1, scopes[1]), ko)
        sch.reverse_compute_at(sch.cache_write(blk, 0, scopes[2]), jo)
    if decompose_init:
        sch.decompose_reduction(blk, ko)
    return lower(ir.IRModule({"main": sch.mod["main"]}))["main"]


def legalized_matmul(m: int, n: int, k: int, dtype: str = "int8", out_dtype: str = "int32") -> ir.IRModule:
    """Relax's ``R.matmul(x, w, out_dtype)`` (x: (m, k), w: (k, n)) after ``LegalizeOps``:
    the module holds ``main`` and the private PrimFunc ``matmul``, indexed in int64, in
    s_tir form (what Relax hands to a TIR pipeline).

    >>> f = legalized_matmul(32, 48, 64)["matmul"]
    """
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), dtype))
    w = relax.Var("w", relax.TensorType((k, n), dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w, out_dtype=out_dtype))
        bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get())


@st.composite
def tiled_reductions(draw, max_tiles: int = 3, tiles=(1, 2, 4, 8, 16)) -> TiledReductionCase:
    """Tiled int8 matmuls, lowered: ``for io, jo, ko: for ii, ji, ki: C += A*B``.

    >>> from hypothesis import given
    >>> @given(tiled_reductions(tiles=(4, 8)))
    ... def test_tiles(case):
    ...     assert case.m % case.tile[0] == 0 and case.k % case.tile[2] == 0
    >>> test_tiles()
    """
    tile = tuple(draw(st.sampled_from(tiles)) for _ in range(3))
    mt, nt, kt = (draw(st.integers(1, max_tiles)) for _ in range(3))
    m, n, k = tile[0] * mt, tile[1] * nt, tile[2] * kt
    func = tiled_matmul(m, n, k, tile)
    return TiledReductionCase(func, m, n, k, tile)
