"""A grouped convolution (1 < groups < channels: ResNeXt, RegNet, ShuffleNet) as one batched
matrix product on accel.

accel's GEMM multiplies a whole block of input channels into every output channel, and its
DWMAC one channel into one; a convolution with several input and output channels per group is
neither. Each group is a convolution of its own, though: output channels ``[g*O, (g+1)*O)`` read
input channels ``[g*I, (g+1)*I)`` alone, and its im2col matrix times its weights. So, after
integerize, :func:`split_groups` writes such an int8 convolution and its epilogue (bias, clamp,
requantise, up to the cast to int8: element-wise operations on the accumulator and constants)
as:

- the im2col matrices of all groups, ``[G, N*Ho*Wo, I*KH*KW]``, gathered on the host from the
  input by one ``take`` (whose indices are the same for every group), zero outside the image
  (a ``where``);
- one ``matmul`` by the weights ``[G, I*KH*KW, O]`` (a batch of G products, each group's own
  weights), its epilogue's per-channel constants ``[G, 1, O]``: one ``accel.matmul``
  partition, one device stream for all groups;
- a permute and reshape of the int8 result back to NCHW, on the host.

The gather stays on the host: :func:`patterns` matches it only to say so in the build report
(data movement accel does not run), as upsample's check says it of the permute back to NCHW.

The products are the grouped convolution's, no more (the report's MACs are unchanged), bit for
bit (the same integers, summed in another order: int32 addition wraps alike in any order).
One convolution per group instead made a partition per group (RegNet's 22 grouped convolutions
were 380, a device stream each: most of a call's time was the streams' fixed costs, and each
group's input slice and the concat of their results were host and DMA copies of their own).

A convolution whose epilogue reads anything but the accumulator and constants that are one
value or one per output channel (a weight zero point's window sums), or whose intermediate
values are used elsewhere, is left as it is, and stays on the host with accel's reason.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import ir, relax
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.expr_functor import PyExprMutator, mutator

import tirpat as tp
from tirpat.model.shapes import static_shape

__all__ = ["split_groups", "patterns", "GATHERED"]

#: Why the gather of a grouped convolution's im2col matrices stays on the host (the report's reason).
GATHERED = ("the im2col matrices of a grouped convolution's groups, gathered for accel's batched matmul "
            "(accel.compiler.groups): data movement accel does not run, one pass on the CPU")

#: the element-wise operations of an integerized epilogue, applied to the batched product (its
#: per-channel constants as [G, 1, O])
_EPILOGUE = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum",
                       "relax.right_shift", "relax.left_shift", "relax.clip", "relax.astype"})


def _grouped(call) -> tuple[int, int, int] | None:
    """``(groups, input channels, output channels)`` per group of an int8 NCHW/OIHW ``conv2d``
    with several input or output channels per group and more than one group, its weight a
    constant; else None."""
    if not (isinstance(call, relax.Call) and isinstance(call.op, ir.Op) and call.op.name == "relax.nn.conv2d"):
        return None
    attrs = call.attrs
    groups = int(attrs.groups)
    x, w = call.args
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout or attrs.data_layout))
    if groups == 1 or layouts != ("NCHW", "OIHW", "NCHW") or not isinstance(w, ir.Constant):
        return None
    if str(x.ty.dtype) != "int8" or str(w.ty.dtype) != "int8" or str(call.ty.dtype) != "int32":
        return None
    dims, out = static_shape(x), static_shape(call)
    if dims is None or out is None:
        return None
    per_in, per_out = dims[1] // groups, out[1] // groups
    if per_in == 1 and per_out == 1:     # depthwise: DWMAC's
        return None
    return groups, per_in, per_out


def _epilogue(conv_var, bindings: dict, uses: dict) -> tuple[list, relax.Var] | None:
    """The epilogue after the convolution bound to ``conv_var``: the bindings (in order) of the
    element-wise operations on it and constants up to the single value read outside, and that
    value's variable; None if it is not such a chain."""
    out = static_shape(conv_var)
    region, frontier = [conv_var], [conv_var]
    while frontier:
        var = frontier.pop()
        for user in uses.get(var, []):
            if user is None or user in region:
                continue
            call = bindings.get(user)
            if not (isinstance(call, relax.Call) and isinstance(call.op, ir.Op) and call.op.name in _EPILOGUE
                    and static_shape(user) == out):
                continue
            # the other operands constants (a tensor, or a scalar bound of a clip)
            if all(a in region for a in call.args if isinstance(a, relax.Var)):
                region.append(user)
                if str(user.ty.dtype) != "int8":    # the epilogue ends at its cast to int8
                    frontier.append(user)
    exits = [v for v in region if any(u is None or u not in region for u in uses.get(v, [None]))]
    if len(exits) != 1 or exits[0] is conv_var or str(exits[0].ty.dtype) != "int8":
        return None
    order = {v: k for k, v in enumerate(bindings)}
    return sorted(region[1:], key=order.__getitem__), exits[0]


def _per_group(constant: ir.Constant, groups: int) -> ir.Constant | None:
    """A constant operand of the epilogue for the batched product's ``[G, N*Ho*Wo, O]``
    accumulator: a scalar for one value, ``[G, 1, O]`` for one per output channel (``[C]``
    after its leading ones: broadcast against NCHW, ``[C, 1, 1]``); None for any other."""
    if not hasattr(constant.value, "numpy"):    # a scalar
        return constant
    values = constant.value.numpy()
    if values.size == 1:
        return relax.const(values.reshape(()), str(values.dtype))
    shape = list(values.shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    if len(shape) != 3 or shape[1:] != [1, 1] or shape[0] % groups:
        return None
    return relax.const(values.reshape(groups, 1, shape[0] // groups), str(values.dtype))


@mutator
class _GroupSplitter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.sites: dict = {}        # the convolution's variable -> (groups, per group in, out, chain, exit)
        self.skipped: set = set()    # the chain variables of a site, computed on the batched product instead

    def rewrite(self) -> tvm.IRModule:
        from accel.compiler.pooling import uses_of

        changed = []
        for gv, func in self.mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings
                        if isinstance(b, relax.VarBinding)}
            uses = uses_of(func)
            found = False
            for var, value in bindings.items():
                grouped = _grouped(value)
                epilogue = _epilogue(var, bindings, uses) if grouped is not None else None
                if epilogue is not None and all(_per_group(a, grouped[0]) is not None for v in epilogue[0]
                                                for a in bindings[v].args if isinstance(a, ir.Constant)):
                    chain, exit_var = epilogue
                    self.sites[var] = (*grouped, [(v, bindings[v]) for v in chain], exit_var)
                    self.skipped.update(chain)
                    found = True
            if found:
                changed.append((gv, func))
        for gv, func in changed:
            self.builder_.update_func(gv, relax.analysis.remove_all_unused(self.visit_expr(func)))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        site = self.sites.get(binding.var)
        if site is not None:
            self._split(binding, *site)
            return
        if binding.var in self.skipped:
            return
        super().visit_var_binding_(binding)

    def _split(self, binding, groups: int, per_in: int, per_out: int, chain: list, exit_var) -> None:
        conv = binding.value
        attrs = conv.attrs
        x = self.visit_expr(conv.args[0])
        weight = conv.args[1].value.numpy()
        n, c, h, w = static_shape(conv.args[0])
        _, channels, ho, wo = static_shape(conv)
        kh, kw = weight.shape[2:]
        (sy, sx), (dy, dx) = [int(v) for v in attrs.strides], [int(v) for v in attrs.dilation]
        top, left = int(attrs.padding[0]), int(attrs.padding[1])
        # im2col: row (oy, ox), column (i, ry, rx) of a group's matrix reads its input channel i at
        # (oy*sy + ry*dy - top, ox*sx + rx*dx - left), the same element of every group's channels:
        # one gather along the last axis of [N, G, I*H*W], zero where that is outside the image
        # (a mask, not a padded copy of the input: the gather and the mask are one loop nest on
        # the host, a pad before them another pass; "clip": every index is in bounds, and topi
        # warns at every build of a "fast" take)
        i, ry, rx, oy, ox = np.ogrid[:per_in, :kh, :kw, :ho, :wo]
        row, col = oy * sy + ry * dy - top, ox * sx + rx * dx - left
        inside = np.broadcast_to((row >= 0) & (row < h) & (col >= 0) & (col < w), (per_in, kh, kw, ho, wo))
        index = np.where(inside, (i * h + row) * w + col, 0).reshape(per_in * kh * kw, ho * wo).T.astype(np.int32)
        inside = inside.reshape(per_in * kh * kw, ho * wo).T
        gathered = relax.op.take(relax.op.reshape(x, [n, groups, per_in * h * w]),
                                 relax.const(np.ascontiguousarray(index)), axis=2, mode="clip")   # [N, G, Ho*Wo, K]
        if not inside.all():
            gathered = relax.op.where(relax.const(np.ascontiguousarray(inside)), gathered, relax.const(0, "int8"))
        columns = self.builder_.emit(relax.op.reshape(relax.op.permute_dims(gathered, [1, 0, 2, 3]),
                                                      [groups, n * ho * wo, per_in * kh * kw]))
        kernel = weight.reshape(groups, per_out, per_in * kh * kw).transpose(0, 2, 1)
        values = {binding.var: self.builder_.emit(relax.op.matmul(columns, relax.const(np.ascontiguousarray(kernel)),
                                                                  out_dtype="int32"))}
        for var, call in chain:
            args = [values[a] if isinstance(a, relax.Var) and a in values else
                    _per_group(a, groups) if isinstance(a, ir.Constant) else a for a in call.args]
            values[var] = self.builder_.emit(relax.Call(call.op, args, call.attrs))
        # [G, N*Ho*Wo, O] -> [N, G, O, Ho*Wo]: NCHW
        result = relax.op.permute_dims(relax.op.reshape(values[exit_var], [groups, n, ho * wo, per_out]), [1, 0, 3, 2])
        joined = relax.op.reshape(result, [n, channels, ho, wo])
        # the epilogue's result may be the dataflow block's output, read after it
        joined = self.builder_.emit(joined) if isinstance(exit_var, relax.DataflowVar) else \
            self.builder_.emit_output(joined)
        self.set_var_remap(exit_var, joined)


def patterns() -> list:
    """``[(name, pattern, annotations, check)]``: the gather :func:`split_groups` writes (an
    int8 input reshaped to ``[N, G, I*H*W]``, a ``take`` along its last axis by constant
    indices, zeroed outside the image or not, then permuted to ``[G, N, ...]`` and reshaped), declined with
    the reason it stays on the host (:data:`GATHERED`).

    >>> [name for name, _, _, _ in patterns()]
    ['accel.matmul']
    """
    taken = is_op("relax.take")(is_op("relax.reshape")(wildcard(), wildcard()), is_const())
    masked = is_op("relax.where")(is_const(), taken, is_const()) | taken
    gather = is_op("relax.reshape")(is_op("relax.permute_dims")(masked), wildcard())
    return [("accel.matmul", gather, {"core": gather}, _check_gather)]


def _check_gather(ctx) -> bool | str:
    """The reason the matched gather stays on the host when it is :func:`split_groups`'s
    (int8, along the last of three axes, then ``[G, N, ...]``); else False (not accel's)."""
    bound = {var.__chandle__(): value for var, value in ctx.matched_bindings.items()}
    permute = bound.get(ctx.annotated_expr["core"].args[0].__chandle__())
    take = bound.get(permute.args[0].__chandle__()) if permute is not None else None
    if take is not None and take.op.name == "relax.where":
        take = bound.get(take.args[1].__chandle__())
    if take is None or str(take.ty.dtype) != "int8" or int(take.attrs.axis) != 2 or permute.attrs.axes is None \
            or [int(a) for a in permute.attrs.axes] != [1, 0, 2, 3]:
        return False
    return tp.DataMovement(GATHERED)


def split_groups() -> tvm.transform.Pass:
    """A Relax pass: each int8 convolution with more than one group and several channels per
    group, with its integerized epilogue, becomes a gather of the groups' im2col matrices, one
    batched matmul and its epilogue, and a permute back to NCHW (the module docstring).

    >>> split_groups().info.name
    'accel.SplitGroups'
    """

    @tvm.transform.module_pass(opt_level=0, name="accel.SplitGroups")
    def run(mod, ctx):
        return _GroupSplitter(mod).rewrite()

    return run
