"""accel's graph-level patterns: what ``tp.partition`` hands to accel.

Two compute cores, each followed by an epilogue chain of up to :data:`MAX_EPILOGUE` ALU
operations:

- ``accel.matmul``: ``matmul(a, b)`` with int8 operands and an int32 result: dense
  (``b`` through ``permute_dims``, as ``nn.Linear`` writes it), matmul and batch matmul;
  ``b`` a constant weight (re-laid out once at compile time) or a tensor computed at run
  time (attention's ``Q K^T`` and ``softmax V``: its layout stage runs on each call, then
  the GEMM LOADs it as WGT by DMA like any host buffer);
- ``accel.conv2d``: ``conv2d(x, w)``, any data and kernel layout (NCHW/OIHW, NHWC/HWIO, ...),
  groups = 1 (GEMM), or groups = channels with one output channel per group (a depthwise
  convolution: DWMAC, see :mod:`accel.compiler.depthwise`).

An operand may be widened first (``astype(int8 -> int32)`` before an int32 matmul is the form
TVM's ONNX importer gives ``MatMulInteger``). The epilogue operations are those the ALU
runs on the accumulator: ``add``/``subtract``/``multiply``/``maximum``/``minimum``/
``right_shift`` with an int32 tensor or scalar (bias, residual add, a per-tensor or
per-channel requantise multiplier), ``relu``, ``clip``, and a final ``astype`` to int8 (a
narrowing STORE). Longer chains are listed first, so the longest one wins. A chain that ends
in a clip to int8 and the cast may go on into a table lookup, ``take(table, astype(x, int32) +
128)`` with a 256-entry int8 constant table (how :mod:`tirpat.model.integerize` writes sigmoid,
HardSwish, GELU, ... after a requantise): accel's LUT instruction, see :func:`table`. A
requantise whose operations read the accumulator twice (integerize's precise form, a
multiplier in two int32 products; its round-half-to-even form) after a bias and a ReLU at
most is :func:`tirpat.model.integerize.rules.requantize_pattern`'s: those come first.

A third core, ``accel.elementwise`` (the requantised add, subtract or multiply of int8 tensors
that integerize writes, with no matmul or convolution), has its patterns in
:mod:`accel.compiler.elementwise`; the backend offers them after these.

Each check returns True, or the reason it declines (``"float32 x float32 -> float32; accel
takes int8 x int8 -> int32"``), which the build report gives for operators left on the host.
A new epilogue operation is one more entry in :data:`EPILOGUE_OPS`.

>>> [name for name, _, _, _ in patterns()][:2]
['accel.matmul', 'accel.matmul']
"""

from __future__ import annotations

import functools

import numpy as np
from tvm import ir, relax, tirx
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from tirpat.model.integerize.rules import requantize_pattern

__all__ = ["patterns", "check", "table", "split_operand_permutes", "MAX_EPILOGUE", "EPILOGUE_OPS", "TABLE_ENTRIES"]

#: The longest epilogue chain matched (bias, ReLU and a requantise multiply/add/shift/clip/cast fit).
MAX_EPILOGUE = 8

#: Epilogue operations the ALU runs: op name -> number of operands besides the accumulator
#: (``clip`` takes its bounds as two scalars).
EPILOGUE_OPS = {
    "relax.add": 1, "relax.subtract": 1, "relax.multiply": 1, "relax.maximum": 1, "relax.minimum": 1,
    "relax.right_shift": 1, "relax.nn.relu": 0, "relax.clip": 2, "relax.astype": 0,
}
#: The longest epilogue chain before a requantise whose DAG reads the accumulator twice (a
#: bias and a ReLU): :func:`tirpat.model.integerize.rules.requantize_pattern` takes the rest.
MAX_BEFORE_DAG = 2
_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1
#: Entries of a table lookup's int8 table: entry ``k`` is the result for the int8 value ``k - 128``.
TABLE_ENTRIES = 256
#: Operations with a scalar that make the result a constant (``x * 0``, ``min(x, -2**31)``,
#: ``max(x, 2**31 - 1)``): TVM's simplifier folds them, and no accumulator is left to read.
_CONSTANT_RESULT = {("relax.multiply", 0), ("relax.minimum", _INT32_MIN), ("relax.maximum", _INT32_MAX)}
#: Operations with a scalar whose wrap-around TVM's llvm code does not compute: it marks int32
#: arithmetic "no signed wrap", and LLVM turns ``x + -2**31`` into ``x | -2**31``, which differs
#: from the wrapped sum for every negative x. Left to the host, they give the llvm result.
_NOT_WRAPPED_BY_LLVM = {("relax.add", _INT32_MIN), ("relax.subtract", _INT32_MIN)}
#: Commutative operations matched with the accumulator on either side. Relax's pattern
#: matcher already tries both operand orders of ``add`` and ``multiply``; a second pattern
#: for those would only double the matching work at every level of the chain.
_SWAPPED = {"relax.maximum", "relax.minimum"}
_COMMUTATIVE = {"relax.add", "relax.multiply"} | _SWAPPED


def _widened(p):
    """``p``, or ``astype(p)`` from int8 to int32: an int8 operand widened before an int32 product."""
    return is_op("relax.astype")(p.has_dtype("int8")).has_dtype("int32") | p


def _operand():
    return _widened(wildcard())


def _weight():
    w = wildcard()
    return (is_op("relax.permute_dims")(_widened(w)) | _widened(is_op("relax.permute_dims")(w))
            | _widened(w))


def _epilogue(x):
    """One epilogue operation applied to ``x`` (any operand order for commutative ones)."""
    alternatives = None
    for op, operands in EPILOGUE_OPS.items():
        forms = [[x] + [wildcard() for _ in range(operands)]]
        if op in _SWAPPED:
            forms.append([wildcard(), x])
        for args in forms:
            p = is_op(op)(*args)
            if op == "relax.astype":
                p = p.has_dtype("int8")     # the narrowing STORE ends an epilogue
            alternatives = p if alternatives is None else alternatives | p
    return alternatives


def table(x: DFPattern) -> DFPattern:
    """The pattern of a table lookup of an int8 ``x``: ``take(table, astype(x, int32) + 128)``
    with a constant table (:func:`tirpat.model.integerize.rules.emit_table`'s form).

    >>> type(table(wildcard())).__name__
    'CallPattern'
    """
    index = is_op("relax.add")(is_op("relax.astype")(x).has_dtype("int32"), is_const())
    return is_op("relax.take")(is_const(), index)


def _cores():
    return {
        "matmul": is_op("relax.matmul")(_operand(), _weight()),
        "conv2d": is_op("relax.nn.conv2d")(_operand(), _weight()),
    }


def patterns(max_epilogue: int = MAX_EPILOGUE) -> list:
    """``[(name, pattern, annotations, check)]``, longest epilogue first; then the pooling
    core (:mod:`accel.compiler.pooling`: an int8 max pool)."""
    from accel.compiler import pooling

    return list(_patterns(max_epilogue)) + pooling.patterns()


@functools.lru_cache(maxsize=None)
def _patterns(max_epilogue: int) -> tuple:
    # built once per process (patterns are immutable); the chain of length n + 1 is one more
    # epilogue around the chain of length n, so the patterns share their sub-patterns
    out = []
    for name, core in _cores().items():
        chains = [core]
        for _ in range(max_epilogue):
            chains.append(_epilogue(chains[-1]))
        # a requantise that reads its accumulator twice (integerize's precise form, or its
        # round-half-to-even one) is longer still, after a bias or ReLU at most: those first
        dags = [requantize_pattern(root) for root in reversed(chains[:MAX_BEFORE_DAG + 1])]
        out += [(f"accel.{name}", table(root), {"core": core}, check) for root in dags]
        out += [(f"accel.{name}", root, {"core": core}, check) for root in dags]
        # a table lookup after the chain is longer still: those first
        out += [(f"accel.{name}", table(root), {"core": core}, check) for root in reversed(chains)]
        out += [(f"accel.{name}", root, {"core": core}, check) for root in reversed(chains)]
    return tuple(out)


def _dtype(expr) -> str:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else type(ty).__name__


def _source(expr, bound: dict):
    """The tensor an operand reads, through a widening ``astype`` and a ``permute_dims``
    (``bound``: the match's bindings, variable handle -> value)."""
    while True:
        expr = bound.get(expr.__chandle__(), expr)
        if not (isinstance(expr, relax.Call) and expr.op.name in ("relax.astype", "relax.permute_dims")):
            return expr
        expr = expr.args[0]


def _operand_calls(core, bound: dict) -> list:
    """The ``astype``/``permute_dims`` calls between the core and its operands' tensors."""
    out = []
    for expr in core.args[:2]:
        while True:
            expr = bound.get(expr.__chandle__(), expr)
            if not (isinstance(expr, relax.Call) and expr.op.name in ("relax.astype", "relax.permute_dims")):
                break
            out.append(expr)
            expr = expr.args[0]
    return out


def _static(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr) and all(
        isinstance(d, tirx.IntImm) for d in ty.shape.values)


def _check_core(core, bound: dict) -> str | None:
    a, b = _source(core.args[0], bound), _source(core.args[1], bound)
    found = f"{_dtype(a)} x {_dtype(b)} -> {_dtype(core)}"
    if (_dtype(a), _dtype(b), _dtype(core)) != ("int8", "int8", "int32"):
        return f"{found}; accel takes int8 x int8 -> int32"
    for call in _operand_calls(core, bound):
        if call.op.name == "relax.astype" and _dtype(call) not in ("int32", _dtype(call.args[0])):
            return f"an operand is widened to {_dtype(call)}; accel multiplies int8 into int32"
    if not all(_static(e) for e in (a, b, core)):
        return "dynamic shapes; accel needs static shapes"
    if core.op.name == "relax.nn.conv2d":
        groups = int(core.attrs.groups)
        if groups != 1:
            return _check_depthwise(core, a, b, groups)
    else:
        # the shapes the matmul reads: a permuted operand's batch dimensions are those after
        # its permute_dims (attention's K^T from [1, L, H, D] is [1, H, D, L])
        a, b = core.args[0], core.args[1]
        ra, rb = len(a.ty.shape.values), len(b.ty.shape.values)
        if ra < 2 or rb < 2:
            return "a matrix-vector product; accel multiplies matrices"
        if rb > 2 and ra != rb:
            return "the operands' batch dimensions differ"
        if rb > 2 and [int(d) for d in a.ty.shape.values[:-2]] != [int(d) for d in b.ty.shape.values[:-2]]:
            return "the operands' batch dimensions are broadcast"
        if rb == 2 and ra > 2:
            return "a weight shared across a batch of matrices (reshape the input to 2-D)"
    return None


def _check_depthwise(core, data, weight, groups: int) -> str | None:
    """None for a depthwise convolution (one input and one output channel per group: DWMAC's
    per-channel multiply-accumulate), else why a grouped one stays on the host."""
    layout = str(core.attrs.data_layout)
    kernel = str(core.attrs.kernel_layout)
    channels = int(data.ty.shape.values[layout.index("C")])
    per_group_in = int(weight.ty.shape.values[kernel.index("I")])
    out = int(weight.ty.shape.values[kernel.index("O")])
    if groups == channels and per_group_in == 1 and out == channels:
        return None
    return (f"a grouped convolution (groups = {groups}, {per_group_in} input and {out // groups} output channels "
            "per group) left whole: accel runs a depthwise one (one of each per group) on DWMAC, and an int8 NCHW "
            "one with a constant weight and an epilogue that ends in int8 one group at a time; a grouped one is "
            "not one matrix product")


def _channel_axis(core) -> int:
    """The output axis a GEMM's columns run along: the last for a matmul, C for a conv2d."""
    if core.op.name == "relax.nn.conv2d":
        layout = str(core.attrs.out_layout or core.attrs.data_layout)
        return layout.index("C")
    return len(core.ty.shape.values) - 1


def _operand_fits(operand, core) -> bool:
    """Whether a tensor operand of an epilogue varies along the accumulator's columns as
    the ALU reads it: per channel or per element, not broadcast across the channels (a
    one-element tensor that is a constant is an immediate)."""
    if isinstance(operand, ir.Constant) and int(np.prod(operand.value.shape)) == 1:
        return True
    if not _static(operand):
        return False
    shape = [int(d) for d in operand.ty.shape.values]
    out = [int(d) for d in core.ty.shape.values]
    axis = _channel_axis(core) - (len(out) - len(shape))
    return axis >= 0 and shape[axis] == out[_channel_axis(core)]


def _tensor_constant(expr):
    """The values of a Relax tensor constant (a numpy array), else None (a scalar
    ``IntImm`` such as a clip bound is not one)."""
    if isinstance(expr, ir.Constant) and hasattr(expr.value, "numpy"):
        return expr.value.numpy()
    return None


def _check_epilogue(call, root, core, bound: dict) -> str | None:
    name = call.op.name
    if name == "relax.astype":
        if call.same_as(root) and _dtype(call.args[0]) == "int32" and _dtype(call) == "int8":
            return None
        return f"astype to {_dtype(call)} inside the epilogue; accel keeps int32 until a final cast to int8"
    if name == "relax.clip" and all(isinstance(b, tirx.IntImm) for b in call.args[1:]):
        lo, hi = call.args[1].value, call.args[2].value
        if lo > hi:
            return (f"clip with its lower bound {lo} above its upper bound {hi} "
                    "(every output is a constant); accel's ALU clips to a range with lo <= hi")
        if hi <= _INT32_MIN or lo >= _INT32_MAX:
            return (f"clip(x, {lo}, {hi}) is a constant whatever the accumulator x "
                    "(TVM folds it away, leaving the ALU nothing to work on)")
    for operand in call.args:
        values = _tensor_constant(operand)
        if values is not None and values.size == 1:
            value = int(values.reshape(-1)[0])
            if (name, value) in _CONSTANT_RESULT:
                return (f"{name.removeprefix('relax.')}(x, {value}) is a constant whatever the accumulator x "
                        "(TVM folds it away, leaving the ALU nothing to work on)")
            if (name, value) in _NOT_WRAPPED_BY_LLVM:
                return (f"{name.removeprefix('relax.')}(x, {value}) overflows int32, and TVM's llvm code "
                        "(no-signed-wrap arithmetic) does not wrap it as accel's ALU does")
    amounts = _tensor_constant(call.args[1]) if name == "relax.right_shift" else None
    if amounts is not None:
        if amounts.size and (amounts.min() < 0 or amounts.max() > 31):
            bad = int(amounts.min()) if amounts.min() < 0 else int(amounts.max())
            return (f"right_shift by {bad}; an int32 shift is defined for 0 to 31 (TVM refuses the "
                    "constant for the CPU too, and accel's SHR would clip it)")
    # the accumulator is the operand the match computes; the others come from outside, on either side
    for operand in call.args:
        if operand.__chandle__() in bound or isinstance(operand, (tirx.IntImm, tirx.FloatImm)):
            continue
        if _dtype(operand) != "int32":
            return f"{name.removeprefix('relax.')} with a {_dtype(operand)} operand; the ALU takes int32"
        if not _operand_fits(operand, core):
            return (f"{name.removeprefix('relax.')} with an operand broadcast across the channels; the ALU "
                    "takes per-channel or per-element operands, or constant scalars")
    if _dtype(call) != "int32":
        return f"{name.removeprefix('relax.')} gives {_dtype(call)}; the ALU computes int32"
    return None


def _table_calls(root, bound: dict) -> tuple[list, object]:
    """``(calls, narrow)``: when ``root`` is a table lookup, its ``take``, index ``add`` and
    widening ``astype`` and the expression they look up (the chain's narrowing cast); else
    ``([], root)``."""
    if not (isinstance(root, relax.Call) and root.op.name == "relax.take"):
        return [], root
    add = bound.get(root.args[1].__chandle__(), root.args[1])
    widen = bound.get(add.args[0].__chandle__(), add.args[0])
    return [root, add, widen], bound.get(widen.args[0].__chandle__(), widen.args[0])


def _check_table(calls, narrow, bound: dict) -> str | None:
    """None when the table lookup ``calls`` (take, add, astype) is what accel's LUT computes:
    a 256-entry int8 table indexed by ``x + 128`` for an int8 ``x`` that the chain clipped to
    [-128, 127] before its cast (the LUT clamps its index; a wrapping cast would differ)."""
    take, add, widen = calls
    values = _tensor_constant(take.args[0])
    if values is None or str(values.dtype) != "int8" or values.shape != (TABLE_ENTRIES,) or \
            int(take.attrs.axis) != 0:
        return f"a take from a {_dtype(take.args[0])} table that is not {TABLE_ENTRIES} int8 entries along axis 0"
    offset = _tensor_constant(add.args[1])
    if offset is None or offset.size != 1 or int(offset.reshape(-1)[0]) != 128 or _dtype(add) != "int32":
        return "a table index that is not x + 128 in int32"
    if not (isinstance(narrow, relax.Call) and narrow.op.name == "relax.astype" and _dtype(narrow) == "int8"):
        return "a table lookup of a value the chain does not cast to int8"
    clipped = bound.get(narrow.args[0].__chandle__(), narrow.args[0])
    if not (isinstance(clipped, relax.Call) and clipped.op.name == "relax.clip" and
            all(isinstance(b, tirx.IntImm) for b in clipped.args[1:]) and
            clipped.args[1].value >= -128 and clipped.args[2].value <= 127):
        return ("a table lookup after a cast to int8 that wraps (no clip to [-128, 127] before it); accel's LUT "
                "clamps its index")
    return None


def check(ctx) -> bool | str:
    """True when accel can run the match; else the reason (a string) it cannot."""
    core = ctx.annotated_expr["core"]
    bound = {var.__chandle__(): value for var, value in ctx.matched_bindings.items()}
    why = _check_core(core, bound)
    if why is not None:
        return why
    operand_calls = _operand_calls(core, bound)
    tables, narrow = _table_calls(ctx.matched_expr, bound)
    if tables:
        why = _check_table(tables, narrow, bound)
        if why is not None:
            return why
    for value in ctx.matched_bindings.values():
        if isinstance(value, relax.Call) and not value.same_as(core) and \
                not any(value.same_as(c) for c in operand_calls + tables):
            why = _check_epilogue(value, narrow, core, bound)
            if why is not None:
                return why
    if has_leaking_intermediate_variables(ctx):
        return False
    return True


def narrow_constant_operands() -> "tvm.transform.Pass":
    """A Relax pass: an int32 constant operand of an int32 matmul or conv2d whose values all
    fit in int8 (a widened weight that constant folding turned into int32) becomes the int8
    constant widened by ``astype``, the form accel's patterns take; the weight is stored as int8.
    """
    import tvm
    from tvm.relax.dpl import is_const, rewrite_call

    const = is_const()
    core = is_op("relax.matmul")(wildcard(), const) | is_op("relax.nn.conv2d")(wildcard(), const)

    def narrow(call, matches):
        weight = matches[const]
        values = weight.value.numpy()
        if str(values.dtype) != "int32" or _dtype(call) != "int32" or values.size == 0 or \
                values.min() < -128 or values.max() > 127:
            return call
        narrowed = relax.op.astype(relax.const(values.astype("int8")), "int32")
        return relax.Call(call.op, [call.args[0], narrowed], call.attrs)

    @tvm.transform.module_pass(opt_level=0, name="accel.NarrowConstantOperands")
    def run(mod, ctx):
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = rewrite_call(core, narrow, func)
        return mod

    return run


def split_operand_permutes() -> "tvm.transform.Pass":
    """A Relax pass: the second operand of an int matmul read through a ``permute_dims`` that
    moves its batch axes (attention's ``K^T`` from ``[1, L, H, D]``, axes ``[0, 2, 3, 1]``),
    which accel's GEMM cannot read, is read through two: the permutation to ``[batch.., N,
    K]`` (a copy on the host, outside the partition) and a transpose of the last two axes, the
    form the GEMM LOADs as WGT.

    >>> split_operand_permutes().info.name
    'accel.SplitOperandPermutes'
    """
    import tvm
    from tvm.relax.dpl import rewrite_call

    operand = wildcard()
    permute = is_op("relax.permute_dims")(operand)
    core = is_op("relax.matmul")(wildcard(), permute)

    def split(call, matches):
        ty = matches[operand].ty     # the permuted tensor's rank (a 2-D weight's may be the result's less one)
        rank = len(ty.shape.values) if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr) \
            else 0
        axes = matches[permute].attrs.axes
        if rank < 3 or _dtype(call) != "int32":
            return call
        axes = list(reversed(range(rank))) if axes is None else [int(a) % rank for a in axes]
        if axes[:-2] == list(range(rank - 2)):
            return call         # batch axes in place: the GEMM reads it as it is
        swap = list(range(rank - 2)) + [rank - 1, rank - 2]
        rows = relax.op.permute_dims(matches[operand], axes[:-2] + [axes[-1], axes[-2]])
        return relax.Call(call.op, [call.args[0], relax.op.permute_dims(rows, swap)], call.attrs)

    @tvm.transform.module_pass(opt_level=0, name="accel.SplitOperandPermutes")
    def run(mod, ctx):
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = rewrite_call(core, split, func)
        return mod

    return run


def accumulator_first() -> "tvm.transform.Pass":
    """A Relax pass: in accel's partitions, a commutative epilogue operation with the
    accumulator as its second operand (``add(bias, acc)``, which the patterns match too)
    takes it first (``add(acc, bias)``), the order the ALU's rules read."""
    import tvm
    from tvm.relax.dpl import rewrite_call

    pattern = None
    for op in _COMMUTATIVE:
        p = is_op(op)(wildcard(), wildcard())
        pattern = p if pattern is None else pattern | p

    @tvm.transform.module_pass(opt_level=0, name="accel.AccumulatorFirst")
    def run(mod, ctx):
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or func.attrs is None or \
                    not str(func.attrs.get("Composite", "")).startswith("accel."):
                continue
            inputs = {p.__chandle__() for p in func.params}

            def from_outside(e) -> bool:
                return isinstance(e, ir.Constant) or e.__chandle__() in inputs

            def swap(call, _):
                a, b = call.args
                return relax.Call(call.op, [b, a], call.attrs) if from_outside(a) and not from_outside(b) else call

            mod[gv] = rewrite_call(pattern, swap, func)
        return mod

    return run
