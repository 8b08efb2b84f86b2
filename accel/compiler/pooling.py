"""Average pooling on accel: window sums as convolutions with a weight of ones.

:func:`tirpat.model.integerize` writes an int8 average pool as int32 window sums and a
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

- the global sum of ``x [N, C, H, W]`` becomes a 1 x 1 convolution of ``x`` viewed as the
  channels-last image ``[N, 1, C, H*W]`` (one pixel per channel, its H*W values the pixel's
  input channels, read in place: each DMA row is a run of one channel's values) with a
  ``[1, 1, H*W, 1]`` weight of ones: a GEMM with M = C, K = H*W and one output column. Its result
  ``[N, 1, C, 1]`` holds the sums in the order of ``[N, C, 1, 1]``: the epilogue chain after the
  sum moves with it (its constant operands re-laid the same way) and one reshape (a view)
  restores the sum's shape after the chain;
- the window sums become a depthwise convolution (``groups = C``) with a ``[C, 1, kh, kw]``
  kernel of ones and strides ``(kh, kw)``: DWMAC, one 16 x 16 tile of pixels x channels per
  instruction, its loop levels the window's taps.

Why not the ALU: accel's ALU adds 16-lane vectors of ACC, but ACC is loaded from int32 host
data only (LOAD into ACC moves int32; an int8 tensor reaches ACC through a multiply-accumulate),
and its lanes never combine with each other, so a sum along a row of the NCHW tensor (H*W values
of one channel) would need a transposition first. The MAC units do both in one step, at 16
useful additions per cycle for a global sum (one output column of the 16 the GEMM array computes),
the ALU's own rate.

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
['relax.reshape', 'relax.nn.conv2d', 'relax.reshape']
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import ir, relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

__all__ = ["sums_as_convolutions", "CHAIN_OPS"]

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


@dataclass(frozen=True)
class _Windows:
    """Sums of the int8 ``x`` [N, C, H, W] over disjoint ``kh`` x ``kw`` windows."""

    x: relax.Expr
    channels: int
    window: tuple


def _uses(func: relax.Function) -> dict:
    """For each variable of ``func``, the variables whose bound values use it (the function's
    result counts as a use by None)."""
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
    """The variables of the element-wise chain after the sum ``start`` (itself first) that can
    move onto the convolution's result: each the one use of the one before, with constant
    operands of at most ``shape`` and keeping that shape; a cast to int8 ends it."""
    chain = [start]
    while _dtype(chain[-1]) == "int32":
        users = uses.get(chain[-1], [])
        if len(users) != 1 or users[0] is None or not isinstance(chain[-1], relax.DataflowVar):
            break
        nxt = users[0]
        call = bindings.get(nxt)
        if _op_name(call) not in CHAIN_OPS or _static_dims(call) != shape or \
                sum(1 for a in call.args if a.same_as(chain[-1])) != 1:
            break
        others = [a for a in call.args if not a.same_as(chain[-1])]
        if not all(isinstance(a, tirx.IntImm) or (_tensor(a) is not None and _fits(_tensor(a), shape))
                   for a in others):
            break
        if _op_name(call) == "relax.astype" and _dtype(call) not in ("int8", "int32"):
            break
        chain.append(nxt)
    return tuple(chain)


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
            return _Global(x, dims, _chain(var, _static_dims(value), bindings, uses))
        return _Windows(x, c, (kh, kw))
    x = _widened_int8(value.args[0], bindings)
    dims = None if x is None else _static_dims(x)
    out = _static_dims(value)
    if dims is None or out is None or len(dims) != 4 or _axes(value, 4) != [2, 3] or dims[2] * dims[3] == 1:
        # a sum of one value is only its widening (a product by the one 1 would fold away)
        return None
    return _Global(x, dims, _chain(var, out, bindings, uses))


@mutator
class _SumsMutator(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.plans: dict = {}       # the sum's variable -> its plan
        self.moved: dict = {}       # a chain variable -> (its plan, the moved value so far)

    def rewrite(self) -> tvm.IRModule:
        sites = {}
        for gv, func in self.mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings
                        if isinstance(b, relax.VarBinding)}
            uses = _uses(func)
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
            image = self.builder_.emit(relax.op.reshape(self.visit_expr(plan.x), [n, 1, c, h * w]))
            ones = relax.const(np.ones((1, 1, h * w, 1), "int8"))
            value = relax.op.nn.conv2d(image, ones, data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32")
            self._moved(binding, plan, value)
            return
        if binding.var in self.moved:
            plan, current = self.moved.pop(binding.var)
            call = binding.value
            shape = [int(d) for d in _static_dims(call)]
            args = [current if a.same_as(plan.chain[plan.chain.index(binding.var) - 1]) else _relaid(a, shape)
                    for a in call.args]
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
        after = plan.chain[plan.chain.index(binding.var) + 1]
        self.moved[after] = (plan, self.builder_.emit(value))


def _relaid(arg, shape: list):
    """A constant operand of the chain, re-laid from the sum's shape onto the convolution's
    ``[N, 1, C, 1]``: a per-channel constant broadcast to the sum's shape and reshaped (a
    scalar, or clip's bounds, stay as they are)."""
    values = _tensor(arg)
    if values is None or values.size == 1:
        return arg
    n, c = shape[0], shape[1]
    return relax.const(np.ascontiguousarray(np.broadcast_to(values, shape).reshape(n, 1, c, 1)))


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
