"""vecunit's compiler side: which operators it takes, how it schedules them, its rules.

- :func:`patterns`: chains of int8 elementwise operators (add, subtract, maximum,
  minimum, ReLU, clip; operands of the result's shape or scalar constants) and max
  pooling, each with a check that says why it declines;
- :func:`schedule`: the output's last axis (longer than 1) is cut into vectors of ``lanes``, every
  intermediate lives in registers, every input is loaded into registers where it is
  needed (a pooling window row by row, its padding folded into the load);
- :func:`rules`: host <-> register copies become ``vld``/``vst``, and every ALU
  instruction's program (:mod:`vecunit.isa`) becomes that instruction (a partial last
  vector's guard is its vector length);
- :func:`planner`: register addresses, and the sync.
"""

import functools
import operator

from tvm import ir, relax, s_tir, tirx
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import is_op, wildcard

import tirpat as tp
from tirpat import device

from .isa import ALU, INSTRUCTIONS, VRF, vld, vst

__all__ = ["patterns", "schedule", "rules", "planner"]

#: The elementwise operators vecunit computes: how many operands each takes besides the
#: chain's value (a tensor of its shape or a scalar constant; clip's bounds are immediates).
ELEMENTWISE = {"relax.add": 1, "relax.subtract": 1, "relax.maximum": 1, "relax.minimum": 1,
               "relax.nn.relu": 0, "relax.clip": 2}
#: The longest chain of elementwise operators taken as one partition.
MAX_CHAIN = 4


# -- graph level ----------------------------------------------------------------------
def _then(x):
    """One elementwise operator applied to ``x`` (either side of a binary one)."""
    forms = [is_op(op)(*args) for op, others in ELEMENTWISE.items()
             for args in [[x, *(wildcard() for _ in range(others))]] + ([[wildcard(), x]] if others == 1 else [])]
    return functools.reduce(operator.or_, forms)


def _static_int8(expr) -> bool:
    """An int8 tensor of static shape with more than one element (a vector to work on)."""
    ty = expr.ty
    return (isinstance(ty, relax.TensorType) and str(ty.dtype) == "int8" and isinstance(ty.shape, relax.ShapeExpr)
            and all(isinstance(d, tirx.IntImm) for d in ty.shape.values) and max(_shape(expr), default=1) > 1)


def _shape(expr) -> list:
    return [int(d) for d in expr.ty.shape.values]


def check_elementwise(ctx):
    """True, or why vecunit cannot run this chain."""
    for call in [v for v in ctx.matched_bindings.values() if isinstance(v, relax.Call)]:
        op = call.op.name.removeprefix("relax.")
        if not _static_int8(call):
            return f"{op} gives {call.ty}; vecunit computes int8 vectors of static shape"
        tensors = [a for a in call.args if isinstance(a.ty, relax.TensorType)]
        constant = [isinstance(a, ir.Constant) and not a.ty.shape.values for a in tensors]
        if any(not c and not (_static_int8(a) and _shape(a) == _shape(call)) for a, c in zip(tensors, constant)):
            return f"{op} of {', '.join(str(a.ty) for a in tensors)}: no broadcasting on vecunit"
        if constant[0] and op in ("subtract", "maximum", "minimum"):
            return f"{op} of a constant and a tensor: vecunit's immediate comes second"
    return not has_leaking_intermediate_variables(ctx)


def check_pool(ctx):
    """True, or why vecunit cannot run this pooling."""
    pool = ctx.matched_expr
    if not _static_int8(pool):
        return f"max pooling of {pool.args[0].ty}; vecunit pools int8 vectors of static shape"
    return True


def patterns() -> list:
    """``[(name, pattern, check)]``: max pooling, then chains, the longest first."""
    out = [("vecunit.max_pool2d", is_op("relax.nn.max_pool2d")(wildcard()), check_pool)]
    chain = wildcard()
    for _ in range(MAX_CHAIN):
        chain = _then(chain)
        out.insert(1, ("vecunit.elementwise", chain, check_elementwise))
    return out


# -- schedule -------------------------------------------------------------------------
def schedule(func: tirx.PrimFunc, lanes: int) -> tirx.PrimFunc:
    """Vectors of ``lanes`` along the output's last axis longer than 1, every value in registers."""
    sch = s_tir.Schedule(func)
    *producers, out = sch.get_child_blocks(sch.get_sblock("root"))
    result = sch.get(out).writes[0].source
    rank, axis = len(result.shape), max(k for k, d in enumerate(result.shape) if int(d) > 1)
    window = len(sch.get_loops(out)) > rank          # pooling: the loops past the output's
    if window:      # the window element by element, so that each window position loads a strided row
        k = [r.source.same_as(result) for r in sch.get(out).reads].index(False)
        producers, padding = [sch.reindex(out, ("read", k))], producers
        for p in padding:
            sch.compute_inline(p)                     # the padding becomes part of the load
    loops = sch.get_loops(out)
    tile, lane = sch.split(loops[axis], [None, lanes])
    sch.reorder(tile, *loops[axis + 1:], lane)       # a pooling's window loops go between
    sch.reverse_compute_at(sch.cache_write(out, 0, VRF.scope), tile)
    for blk in reversed(producers):                   # a chain's intermediates, a pooling's window
        sch.set_scope(blk, 0, VRF.scope)
        sch.compute_at(blk, loops[-1] if window else tile)
    if window:
        sch.decompose_reduction(out, loops[rank])
        return sch.mod["main"]
    for blk in [*producers, out]:
        for k, region in enumerate(sch.get(blk).reads):
            if region.source.scope() != VRF.scope:
                sch.compute_at(sch.cache_read(blk, k, VRF.scope), tile)
    return sch.mod["main"]


# -- rules ----------------------------------------------------------------------------
def _vector(c):
    """``(n, front, back)`` of a one-loop copy (its vector length and padded lanes), or None.
    The last vector of a row is a partial copy: lanes ``[0, n - back)``, a shorter vector."""
    if len(c.extents) != 1 or c.cast or (c.predicate is not None and c.pad is None):
        return None
    (front, back), = c.pad or [(0, 0)]
    if c.predicate is None or c.pad_value is not None:
        return c.extents[0], front, back
    return (c.extents[0] - back, 0, 0) if isinstance(front, tirx.IntImm) and front.value == 0 else None


def _vld(m):
    c = m["load"]
    vector = _vector(c)
    if vector is None or c.dst.strides[0] != 1 or c.src.buffer.scope() == VRF.scope:
        return tp.decline("vld loads one strided host row, as it is, into consecutive lanes")
    n, front, back = vector
    return vld.call(d=c.dst, host=c.src.buffer, offset=c.src.offset, stride=c.src.strides[0], n=n, front=front,
                    back=back, pad=c.pad_value if c.pad_value is not None else 0)


def _vst(m):
    c = m["store"]
    vector = _vector(c)
    if vector is None or c.pad_value is not None or c.src.strides[0] != 1 or c.dst.buffer.scope() == VRF.scope:
        return tp.decline("vst stores consecutive lanes, as they are, to one strided host row")
    return vst.call(host=c.dst.buffer, offset=c.dst.offset, stride=c.dst.strides[0], src=c.src, n=vector[0])


def rules(lanes: int) -> tp.Rewriter:
    """The rule set for vectors of ``lanes``: loads, stores, then every ALU instruction."""
    reg = tp.is_buffer(scope=VRF.scope)
    load = tp.Rewriter.from_pattern(tp.is_copy(dst=reg, name="load"), _vld, name="vecunit.vld")
    store = tp.Rewriter.from_pattern(tp.is_copy(src=reg, name="store"), _vst, name="vecunit.vst")
    return functools.reduce(operator.or_, [load, store, *(i.rule(lanes=lanes) for i in ALU.values())])


def planner(lanes: int, regs: int) -> device.ScratchpadPlanner:
    """Register addresses (a register is ``lanes`` aligned elements), checked against the
    instructions' declared operands, and the syncs."""
    return device.ScratchpadPlanner("vecunit", [VRF], {"lanes": lanes, "regs": regs},
                                    instructions=INSTRUCTIONS.values())
