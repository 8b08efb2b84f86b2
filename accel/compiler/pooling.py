"""Pooling on accel: max pools on the ALU, average pools' window sums as convolutions with a
weight of ones.

**Max pooling** (the partition core ``accel.pool``, :func:`patterns`): an int8 ``max_pool2d``
(NCHW or NHWC, any window, stride and padding, dilation 1) is scheduled by
:func:`schedule_max_pool` onto ALU ``MAX`` over ACC tiles of 16 pixels x 16 channels, one LOAD
per window row (the -128 border as the LOADs' padding); one the ALU cannot run (float, a
dilation, another layout) stays on the host with the reason (:func:`max_pool_declines`).

**Average pooling**: :func:`tirpat.model.integerize` writes an int8 average pool as int32 window sums and a
fixed-point rescale (a requantise: ``maximum``/``minimum``/``multiply``/``add``/
``right_shift``/``clip``/``astype``):

- a global average pool (``mean`` over H and W, the squeeze-excitation blocks of MobileNet-style
  models) as ``sum(astype(x, "int32"), axis=[2, 3], keepdims=True)``;
- an average pool of disjoint windows as ``sum(reshape(astype(x, "int32"), [n, c, h/kh, kh,
  w/kw, kw]), axis=[3, 5])``;
- an average pool of overlapping windows already as a depthwise convolution with an all-ones
  kernel (accel's DWMAC).

A sum of int8 values is a multiply-accumulate with a weight of ones, which accel's MAC units
compute exactly into int32, as they compute a convolution. :func:`sums_as_convolutions` (a Relax
pass, run after integerize) rewrites the first two forms so that accel's existing partition
cores take them with their epilogue chain (the rescale and the narrowing STORE):

- the global sum of ``x [N, C, H, W]`` becomes a convolution of ``x`` read as a channels-last
  image ``[N, C, H, W]`` (C rows of one pixel, its H values of W channels each, read in place:
  each DMA row is a run of one channel's values) with a ``[1, H, W, 1]`` weight of ones: a GEMM
  with M = C, K = H*W and one output column, whose result ``[N, C, 1, 1]`` is the sum's. With
  H = 1 the kernel would be 1 x 1, whose GEMM takes one pixel a row: ``x`` is then viewed as
  ``[N, 1, C, W]`` (C pixels of one row) with a ``[1, 1, W, 1]`` weight, whose result ``[N, 1,
  C, 1]`` holds the sums in the order of ``[N, C, 1, 1]``; the epilogue chain after the sum moves
  with it (its constant operands re-laid the same way) and one reshape (a view) restores the
  sum's shape after the chain (also for a sum that drops the pooled dimensions);
- the window sums become a depthwise convolution (``groups = C``) with a ``[C, 1, kh, kw]``
  kernel of ones and strides ``(kh, kw)``: DWMAC, one 16 x 16 tile of pixels x channels per
  instruction, its loop levels the window's taps.

Why not the ALU, as for a maximum: accel's ALU adds 16-lane vectors of ACC, but ACC is loaded
from int32 host data only (LOAD into ACC moves int32; an int8 tensor reaches ACC through a
multiply-accumulate, or widened by the CPU, as a max pool's input is), and its lanes never
combine with each other, so a sum along a row of the NCHW tensor (H*W values of one channel)
would need a transposition first. The MAC units read the int8 tensor in place and do both in
one step, at 16 useful additions per cycle for a global sum (one output column of the 16 the
GEMM array computes), the ALU's own rate.

>>> import tvm
>>> from tvm import relax
>>> bb = relax.BlockBuilder()
>>> x = relax.Var("x", relax.TensorType((1, 8, 4, 6), "int8"))
>>> with bb.function("main", [x]):
...     with bb.dataflow():
...         s = bb.emit_output(relax.op.sum(relax.op.astype(x, "int32"), axis=[2, 3], keepdims=True))
...     _ = bb.emit_func_output(s)
>>> mod = sums_as_convolutions()(bb.get())
>>> [str(b.value.op.name) for b in mod["main"].body.blocks[0].bindings]
['relax.nn.conv2d']
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, relax, te, tirx
from tvm.relax.dpl import is_op, wildcard
from tvm.relax.expr_functor import PyExprMutator, mutator

import tirpat as tp
from accel.compiler.blocks import DATA_PAR, REDUCE
from accel.hw import instructions

ACC = instructions.ACC.scope     # the accumulator scratchpad's storage scope

__all__ = ["sums_as_convolutions", "uses_of", "CHAIN_OPS", "MAX_POOL", "patterns", "max_pool_declines", "check_max_pool",
           "MaxPool", "analyse_max_pool", "schedule_max_pool"]

#: Element-wise operations that follow a global sum in its rescale and move with it onto the
#: convolution's result: each keeps the sum's shape, its other operands constants (a scalar,
#: or one value per channel) or ``clip``'s bounds; a cast to int8 ends the chain.
CHAIN_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum",
             "relax.right_shift", "relax.clip", "relax.nn.relu", "relax.astype")


def _op_name(value) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, ir.Op):
        return str(value.op.name)
    return None


def _static_dims(e) -> tuple | None:
    """The tensor's dimensions as ints, or None if any is symbolic (or the rank unknown)."""
    values = getattr(getattr(e.ty, "shape", None), "values", None)
    if values is None or not all(isinstance(d, tirx.IntImm) for d in values):
        return None
    return tuple(int(d) for d in values)


def _dtype(e) -> str:
    return str(getattr(e.ty, "dtype", ""))


def _widened_int8(e, bindings: dict):
    """``x`` if ``e`` is ``astype(x, "int32")`` of an int8 ``x`` (through its binding), else None."""
    call = bindings.get(e, e)
    if _op_name(call) == "relax.astype" and _dtype(call) == "int32" and _dtype(call.args[0]) == "int8":
        return call.args[0]
    return None


def _axes(call, rank: int) -> list[int] | None:
    axis = call.attrs.axis
    return None if axis is None else sorted(int(a) % rank for a in axis)


@dataclass(frozen=True)
class _Global:
    """A global sum of the int8 ``x`` [N, C, H, W] and the chain of element-wise variables
    after it (``chain[-1]`` gets the reshape back to the sum's shape; the sum's own variable
    when the chain is empty)."""

    x: relax.Expr
    dims: tuple
    chain: tuple

    @property
    def result(self) -> tuple:
        """The shape of the convolution's result (see the module docstring)."""
        n, c, h, _ = self.dims
        return (n, c, 1, 1) if h > 1 else (n, 1, c, 1)


@dataclass(frozen=True)
class _Windows:
    """Sums of the int8 ``x`` [N, C, H, W] over disjoint ``kh`` x ``kw`` windows."""

    x: relax.Expr
    channels: int
    window: tuple


def uses_of(func: relax.Function) -> dict:
    """For each variable of ``func``, the variables whose bound values use it (the function's
    result counts as a use by None).

    >>> bb = relax.BlockBuilder(); x = relax.Var("x", relax.TensorType((2,), "int32"))
    >>> with bb.function("f", [x]):
    ...     with bb.dataflow():
    ...         y = bb.emit(relax.op.add(x, x)); z = bb.emit_output(relax.op.multiply(y, x))
    ...     _ = bb.emit_func_output(z)
    >>> [[None if u is None else u.same_as(z) for u in users] for users in uses_of(bb.get()["f"]).values()]
    [[False, False, True], [True], [None]]
    """
    uses: dict = {}

    def args_of(value):
        if isinstance(value, relax.Tuple):
            return list(value.fields)
        return list(value.args) if isinstance(value, relax.Call) else [value]

    for block in func.body.blocks:
        for b in block.bindings:
            for a in args_of(b.value):
                for f in args_of(a) if isinstance(a, relax.Tuple) else [a]:
                    if isinstance(f, relax.Var):
                        uses.setdefault(f, []).append(b.var)
    for a in args_of(func.body.body):
        if isinstance(a, relax.Var):
            uses.setdefault(a, []).append(None)
    return uses


def _chain(start: relax.Var, shape: tuple, bindings: dict, uses: dict) -> tuple:
    """The variables of the element-wise steps after the sum ``start`` (itself first), in the
    program's order, that can move onto the convolution's result: each step keeps the sum's
    shape and reads earlier steps, its other operands constants of at most ``shape``; every
    step but the last is read by later steps only. A chain, or a small DAG (integerize's
    precise requantise reads the clamped sum twice); a cast to int8 ends it."""
    order = list(bindings)
    steps, values = [start], {start}        # values: the int32 steps later ones may read
    for var in order[order.index(start) + 1:]:
        call = bindings[var]
        args = list(call.args) if isinstance(call, relax.Call) else []
        if not any(isinstance(a, relax.Var) and a in values for a in args):
            continue
        if _op_name(call) not in CHAIN_OPS or _static_dims(call) != shape or \
                (_op_name(call) == "relax.astype" and _dtype(call) not in ("int8", "int32")):
            break
        others = [a for a in args if not (isinstance(a, relax.Var) and a in values)]
        if not all(isinstance(a, tirx.IntImm) or (_tensor(a) is not None and _fits(_tensor(a), shape))
                   for a in others):
            break
        steps.append(var)
        if _dtype(call) != "int32":
            break
        values.add(var)
    # the longest run of steps whose values are read inside it only, but the last's
    for n in range(len(steps), 0, -1):
        inside = set(steps[:n])
        if all(isinstance(v, relax.DataflowVar) and all(u is not None and u in inside for u in uses.get(v, []))
               for v in steps[:n - 1]):
            return tuple(steps[:n])
    return (start,)


def _tensor(expr) -> np.ndarray | None:
    """The values of a Relax tensor constant, else None (a scalar ``IntImm``, such as a clip's
    bound, is not one)."""
    if isinstance(expr, ir.Constant) and hasattr(expr.value, "numpy"):
        return expr.value.numpy()
    return None


def _fits(values: np.ndarray, shape: tuple) -> bool:
    """Whether ``values`` broadcast to ``shape`` without growing it."""
    try:
        return np.broadcast_shapes(values.shape, shape) == tuple(shape)
    except ValueError:
        return False


def _plan(value, bindings: dict, uses: dict, var: relax.Var):
    """A :class:`_Global` or :class:`_Windows` if ``value`` (bound to ``var``) is a sum this pass
    rewrites, else None."""
    if _op_name(value) != "relax.sum" or _dtype(value) != "int32":
        return None
    source = bindings.get(value.args[0], value.args[0])
    if _op_name(source) == "relax.reshape":
        x = _widened_int8(source.args[0], bindings)
        dims, split = (None, None) if x is None else (_static_dims(x), _static_dims(source))
        if dims is None or split is None or len(dims) != 4 or _axes(value, 6) != [3, 5] or value.attrs.keepdims:
            return None
        n, c, h, w = dims
        kh, kw = split[3], split[5]
        if split != (n, c, h // kh, kh, w // kw, kw) or h % kh or w % kw or kh * kw == 1:
            return None
        if (kh, kw) == (h, w):      # one window: a global sum (DWMAC needs a tile of output pixels)
            return _global(x, dims, var, _static_dims(value), bindings, uses)
        return _Windows(x, c, (kh, kw))
    x = _widened_int8(value.args[0], bindings)
    dims = None if x is None else _static_dims(x)
    out = _static_dims(value)
    if dims is None or out is None or len(dims) != 4 or _axes(value, 4) != [2, 3] or dims[2] * dims[3] == 1:
        # a sum of one value is only its widening (a product by the one 1 would fold away)
        return None
    return _global(x, dims, var, out, bindings, uses)


def _global(x, dims: tuple, var: relax.Var, out: tuple, bindings: dict, uses: dict) -> _Global:
    """The plan for a global sum of ``x`` bound to ``var`` (of shape ``out``): the chain after it
    moves onto the convolution's result when that has another shape."""
    plan = _Global(x, dims, (var,))
    return plan if plan.result == out else _Global(x, dims, _chain(var, out, bindings, uses))


@mutator
class _SumsMutator(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.plans: dict = {}       # the sum's variable -> its plan
        self.steps: dict = {}       # a chain variable after the sum -> its plan
        self.moved: dict = {}       # a chain variable -> its value moved onto the convolution's result

    def rewrite(self) -> tvm.IRModule:
        sites = {}
        for gv, func in self.mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings
                        if isinstance(b, relax.VarBinding)}
            uses = uses_of(func)
            plans = {var: _plan(value, bindings, uses, var) for var, value in bindings.items()}
            plans = {var: plan for var, plan in plans.items() if plan is not None}
            if plans:
                self.plans.update(plans)
                sites[gv] = func
        if not sites:
            return self.mod
        for gv, func in sites.items():
            # the widening casts only the sums read are left unused: removed
            self.builder_.update_func(gv, relax.analysis.remove_all_unused(self.visit_expr(func)))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        plan = self.plans.get(binding.var)
        if isinstance(plan, _Windows):
            kh, kw = plan.window
            ones = relax.const(np.ones((plan.channels, 1, kh, kw), "int8"))
            value = relax.op.nn.conv2d(self.visit_expr(plan.x), ones, strides=[kh, kw], groups=plan.channels,
                                       out_dtype="int32")
            # the sum's variable keeps its name and type: its users need no change
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))
            return
        if isinstance(plan, _Global):
            n, c, h, w = plan.dims
            image = self.visit_expr(plan.x)
            if h == 1:
                image = self.builder_.emit(relax.op.reshape(image, [n, 1, c, w]))
            ones = relax.const(np.ones((1, h, w, 1) if h > 1 else (1, 1, w, 1), "int8"))
            value = relax.op.nn.conv2d(image, ones, data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32")
            if plan.result == _static_dims(binding.var):
                # the sum's variable keeps its name and type: its users need no change
                self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))
            else:
                self._moved(binding, plan, value)
            return
        if binding.var in self.steps:
            plan = self.steps.pop(binding.var)
            call = binding.value
            shape = [int(d) for d in _static_dims(call)]
            args = [self.moved[a] if isinstance(a, relax.Var) and a in self.moved else
                    _relaid(a, shape, plan.result) for a in call.args]
            self._moved(binding, plan, relax.Call(call.op, args, call.attrs))
            return
        super().visit_var_binding_(binding)

    def _moved(self, binding: relax.VarBinding, plan: _Global, value: relax.Expr) -> None:
        """Emit ``value`` (the chain's step at ``binding``, on the convolution's layout); the
        chain's last step is reshaped back into the variable of ``binding``."""
        if binding.var.same_as(plan.chain[-1]):
            moved = self.builder_.emit(value)
            shape = [int(d) for d in _static_dims(binding.var)]
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(
                relax.op.reshape(moved, shape))))
            return
        if binding.var.same_as(plan.chain[0]):
            self.steps.update(dict.fromkeys(plan.chain[1:], plan))
        self.moved[binding.var] = self.builder_.emit(value)


def _relaid(arg, shape: list, result: tuple):
    """A constant operand of the chain, re-laid from the sum's ``shape`` onto the convolution's
    ``result``: a per-channel constant broadcast to the sum's shape and reshaped (a scalar, or
    clip's bounds, stay as they are)."""
    values = _tensor(arg)
    if values is None or values.size == 1:
        return arg
    return relax.const(np.ascontiguousarray(np.broadcast_to(values, shape).reshape(result)))


def sums_as_convolutions() -> tvm.transform.Pass:
    """A Relax pass: integerize's global and disjoint-window sums of an int8 tensor become
    convolutions with a weight of ones (see the module docstring), which accel's GEMM and
    DWMAC run with the rescale after them.

    >>> sums_as_convolutions().info.name
    'accel.SumsAsConvolutions'
    """

    @tvm.transform.module_pass(opt_level=0, name="accel.SumsAsConvolutions")
    def run(mod, ctx):
        return _SumsMutator(mod).rewrite()

    return run


# -- max pooling: LOADs into ACC, ALU MAX over the window ----------------------------------------
#: The partition pattern's name for a max pool.
MAX_POOL = "accel.pool"


def patterns() -> list:
    """``[(name, pattern, annotations, check)]`` of accel's pooling core: an int8
    ``max_pool2d``, which :func:`schedule_max_pool` runs on the ALU.

    >>> [name for name, *_ in patterns()]
    ['accel.pool']
    """
    core = is_op("relax.nn.max_pool2d")(wildcard())
    return [(MAX_POOL, core, {"core": core}, check_max_pool)]


def max_pool_declines(call: relax.Call) -> str | None:
    """Why accel cannot run the ``max_pool2d`` ``call``, or None when it can.

    >>> x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "float32"))
    >>> max_pool_declines(relax.op.nn.max_pool2d(x, [2, 2], [2, 2]))
    'a max pool of float32; accel pools int8 tensors'
    """
    attrs = call.attrs
    x = call.args[0]
    if _dtype(x) != "int8" or _dtype(call) != "int8":
        return f"a max pool of {_dtype(x)}; accel pools int8 tensors"
    if str(attrs.layout) not in ("NCHW", "NHWC") or str(attrs.out_layout) != str(attrs.layout):
        return f"a max pool in layout {attrs.layout} -> {attrs.out_layout}; accel pools NCHW or NHWC"
    if any(int(d) != 1 for d in attrs.dilation):
        return "a dilated max pool; accel's window is a run of adjacent pixels"
    if _static_dims(x) is None or _static_dims(call) is None:
        return "dynamic shapes; accel needs static shapes"
    return None


def check_max_pool(ctx) -> bool | str:
    """The partition check of :func:`patterns`: True, or the reason accel declines."""
    why = max_pool_declines(ctx.annotated_expr["core"])
    return True if why is None else why


@dataclass(frozen=True)
class MaxPool:
    """A max pool as its legalized PrimFunc computes it: the input's ``layout`` and
    ``dims`` (N, C, H, W), the window, strides and padding (top, left, bottom, right), the
    output's spatial size."""

    layout: str
    dims: tuple
    window: tuple
    strides: tuple
    padding: tuple
    out: tuple


def analyse_max_pool(func: tirx.PrimFunc) -> MaxPool | None:
    """The :class:`MaxPool` that the legalized PrimFunc ``func`` (TOPI's ``pool2d``: an
    optional ``-128`` padding block, then a ``max`` reduction over the window) computes, or
    None if it is not one.

    >>> analyse_max_pool(legalized_max_pool)            # doctest: +SKIP
    MaxPool(layout='NCHW', dims=(1, 24, 10, 10), window=(3, 3), strides=(2, 2), padding=(1, 1, 0, 1), out=(5, 5))
    """
    params = [p for p in func.params if tirx.is_buffer_var(p)]
    if len(params) != 2 or any(str(p.dtype) != "int8" or len(p.shape) != 4 or
                               not all(isinstance(d, tirx.IntImm) for d in p.shape) for p in params):
        return None
    x, out = params
    sch = tp.Schedule(ir.IRModule({"main": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    pool = [b for b in blocks if b.writes and b.writes[0].source.same_as(out)]
    if len(pool) != 1 or not isinstance(pool[0].body, tirx.BufferStore) or \
            not isinstance(pool[0].body.value, tirx.Max):
        return None
    pool = pool[0]
    reduce = [iv.var for iv in pool.iter_vars if int(iv.iter_type) == REDUCE]
    value = pool.body.value
    load = next((e for e in (value.a, value.b) if isinstance(e, ir.TensorLoad) and not e.source.same_as(out)), None)
    if load is None or len(reduce) != 2 or len(load.indices) != 4:
        return None
    spatial, strides, window = [], [], []
    for d, e in enumerate(load.indices):
        red = [r for r in reduce if _uses_var(e, r)]
        if not red:
            continue
        outer = [iv.var for iv in pool.iter_vars if int(iv.iter_type) == DATA_PAR and _uses_var(e, iv.var)]
        coeffs = tvm.sym.detect_linear_equation(e, [*outer, red[0]])
        if len(outer) != 1 or len(red) != 1 or len(coeffs) != 3 or int(coeffs[1]) != 1 or int(coeffs[2]) != 0:
            return None
        spatial.append(d)
        strides.append(int(coeffs[0]))
        extent = next(iv.dom.extent for iv in pool.iter_vars if iv.var.same_as(red[0]))
        window.append(int(extent))
    layout = {(2, 3): "NCHW", (1, 2): "NHWC"}.get(tuple(spatial))
    if layout is None:
        return None
    xd = [int(d) for d in x.shape]
    od = [int(d) for d in out.shape]
    dims = (xd[0], xd[1], xd[2], xd[3]) if layout == "NCHW" else (xd[0], xd[3], xd[1], xd[2])
    before = [0, 0]
    if not load.source.same_as(x):      # TOPI's padding block: pad_temp[..] = if_then_else(.., x[.. - before], -128)
        pad = next((b for b in blocks if b.writes and b.writes[0].source.same_as(load.source)), None)
        reads = [r for r in (pad.reads if pad is not None else []) if r.source.same_as(x)]
        if len(reads) != 1:
            return None
        for k, d in enumerate(spatial):
            e = reads[0].region[d].min
            coeffs = tvm.sym.detect_linear_equation(e, list(_vars(e)))
            if len(coeffs) != 2:
                return None
            before[k] = -int(coeffs[-1])
    padded = [int(load.source.shape[d]) for d in spatial]
    size = dims[2:]
    after = [padded[k] - size[k] - before[k] for k in range(2)]
    return MaxPool(layout, dims, tuple(window), tuple(strides), (before[0], before[1], after[0], after[1]),
                   tuple(od[d] for d in spatial))


def _uses_var(e, var) -> bool:
    return any(v.same_as(var) for v in _vars(e))


def _vars(e) -> list:
    found = []
    tvm_ffi.structural_walk(e, (tirx.Var, lambda v: found.append(v) if not any(v.same_as(f) for f in found) else None))
    return found


def schedule_max_pool(func: tirx.PrimFunc, config) -> tirx.PrimFunc | None:
    """``func`` (a legalized int8 max pool, :func:`analyse_max_pool`) scheduled for accel, or
    None if it is not one.

    The window's maximum is the ALU's ``MAX`` on ACC vectors of 16 channels, one pixel each:

    - the CPU widens the input to int32 channels-last, plus 128 (so every value is at least 0,
      the accumulator's reset value, and the border, which the pool pads with -128, is 0);
    - per output row and tile of 16 pixels x 16 channels, GEMM's reset zeroes the ACC tile; per
      window row a LOAD brings the input pixels the tile's windows cover into ACC (the border and
      the channels beyond the last by the LOAD's padding, a row outside the image as all
      padding), and per window element one ALU ``MAX`` takes the tile's pixels from it (source
      row stride: the stride);
    - the ALU subtracts the 128 again and a STORE writes the tile as int8 (channels-last; an
      NCHW result is transposed on the CPU).

    >>> schedule_max_pool(legalized_max_pool, accel.Config())      # doctest: +SKIP
    """
    pool = analyse_max_pool(func)
    if pool is None:
        return None
    t = config.tile
    n, c, h, w = pool.dims
    kh, kw = pool.window
    sh, sw = pool.strides
    top, left, _, _ = pool.padding
    oh, ow = pool.out
    ow_p, c_p = -(-ow // t) * t, -(-c // t) * t
    shape = (n, c, h, w) if pool.layout == "NCHW" else (n, h, w, c)
    x = te.placeholder(shape, "int8", "x")
    if pool.layout == "NCHW":
        wide = te.compute((n, h, w, c), lambda b, i, j, k: x[b, k, i, j].astype("int32") + 128, name="x_int32")
    else:
        wide = te.compute((n, h, w, c), lambda b, i, j, k: x[b, i, j, k].astype("int32") + 128, name="x_int32")
    rows, cols = (oh - 1) * sh + kh, (ow_p - 1) * sw + kw
    padded = te.compute((n, rows, cols, c_p), lambda b, i, j, k: tirx.if_then_else(
        tirx.all(i >= top, i < h + top, j >= left, j < w + left, k < c), wide[b, i - top, j - left, k], 0),
        name="padded")
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    # a maximum whose identity is 0 (every widened value is >= 0): the ALU tile's reset
    largest = te.comm_reducer(lambda a, b: tirx.max(a, b), lambda dtype: tirx.const(0, dtype), name="max_from_0")
    pooled = te.compute((n, oh, ow_p, c_p), lambda b, i, j, k: largest(padded[b, i * sh + ry, j * sw + rx, k],
                                                                       axis=[ry, rx]), name="pooled")
    narrow = te.compute((n, oh, ow, c), lambda b, i, j, k: (pooled[b, i, j, k] - 128).astype("int8"), name="narrow")
    result = narrow if pool.layout == "NHWC" else te.compute(
        (n, c, oh, ow), lambda b, k, i, j: narrow[b, i, j, k], name="transposed")
    sch = tp.Schedule(te.create_prim_func([x, result]))
    blk = sch.get_sblock("pooled")
    b_, i_, j_, k_, ry_, rx_ = sch.get_loops(blk)
    j_o, j_i = sch.split(j_, [None, t])
    k_o, k_i = sch.split(k_, [None, t])
    sch.reorder(b_, i_, j_o, k_o, ry_, rx_, j_i, k_i)
    sch.set_scope(blk, 0, ACC)
    strip = sch.cache_read(blk, 0, ACC)
    sch.compute_at(strip, ry_)
    sch.compute_inline(sch.get_sblock("padded"))
    sch.reverse_compute_at(sch.get_sblock("narrow"), k_o)
    sch.decompose_reduction(blk, ry_)
    scheduled = sch.mod["main"]
    for key, value in (func.attrs or {}).items():
        scheduled = scheduled.with_attr(key, value)
    steps = [["x_int32", "widens the input to int32 channels-last (+128) on the CPU: LOAD into ACC moves int32"]]
    if pool.layout == "NCHW":
        steps.append(["transposed", "transposes the result from channels-last to NCHW on the CPU (a STORE row is "
                                    "a run of channels)"])
    notes = {"host_macs": 0, "device_macs": 0, "host_steps": steps, "epilogue": [],
             "details": [f"offloaded max pool {kh}x{kw} stride {sh}x{sw} padding {list(pool.padding)}: ALU MAX on "
                         "ACC tiles of 16 pixels x 16 channels, a LOAD per window row"]}
    return scheduled.with_attr(tp.SCHEDULE_NOTES, json.dumps(notes))
