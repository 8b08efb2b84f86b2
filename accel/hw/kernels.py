"""Machine code for the batched plan's hottest step kinds, compiled with TVM (llvm, for this
CPU) once per process and tile width, on first use.

numpy runs a step as whole-array passes: a depthwise kernel's tap sum gathers every tap's
input rows into a new array (49 copies of the input for a 7x7 kernel), then multiplies and
sums them. Compiled, each output vector is summed in registers straight from the source
vector's rows: on ``ppocrv6_det_small``'s tap sums 45 -> 8 ms. A kernel's shapes are symbolic,
so one compile (~0.3 s, all kernels at once) serves every plan of the process.

A STORE's int32 values narrowed to int8 and scattered into a host buffer, an ACC LOAD's rows
gathered, a scratchpad's final contents: :func:`copy_runs` copies them run by run in one pass
(numpy: a gather into a temporary, a cast, a scatter, each a pass with an index per element).

A requantisation is a chain of ALU batches (multiply, shift, add, clamps, a table lookup), each
a numpy pass over millions of int32 values: :func:`alu_chain` runs a whole chain in one pass,
a few tile rows at a time in registers, interpreting the chain's steps from a small table (one
kernel for every chain, no compile per chain). Its sums and products are int64 truncated to
int32: the wrap-around of the ISA, which llvm's int32 arithmetic (no signed overflow) would
not promise once it simplified a clamp after an add.

Results are bit-identical to the numpy steps they replace: products of int8 values are exact
in float32, so are sums of up to 1024 of them in any order (below 2**24), and int32 addition
wraps in llvm's code as in numpy's.

>>> import numpy as np
>>> source = np.arange(40, dtype=np.float32)
>>> xs = np.array([[[0, 16]]]); ws = np.array([[20]]); out = np.zeros(10, np.int32)
>>> tap_sum(4, assign=True)(source, xs, ws, out, 2)
>>> out.tolist()        # [0..3] * [20..23] and [16..19] * [20..23], from 2 on
[0, 0, 0, 21, 44, 69, 320, 357, 396, 437]
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from accel.hw.instructions import LUT_ENTRIES, AluOp

__all__ = ["tap_sum", "scaled_rows", "alu_chain", "copy_runs", "LOOKUP", "IMM", "RUN", "ROWS", "SPLAT"]

#: :func:`alu_chain`'s code of a table lookup step (the ALU ops are their :class:`AluOp` values).
LOOKUP = max(AluOp) + 1
#: :func:`alu_chain`'s operand kinds: an immediate; row ``r`` at ``value + r * tile`` (a run);
#: row ``r`` at ``bases[value + r]``; row ``r`` all ``values[bases[value + r]]`` (a broadcast).
IMM, RUN, ROWS, SPLAT = range(4)
# tile rows a chain carries through all its steps at once: the dispatch on a step's code is
# paid once per block (16 rows of 16 lanes, 1 KB in L1: the fastest of 4, 16 and 64 on a
# requantisation's chain)
_CHAIN_ROWS = 16


@functools.lru_cache(maxsize=None)
def _target():
    from tvm.target import Target, codegen

    # this CPU's vector width (the default "llvm" target is x86-64's baseline: SSE2)
    return Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})


@functools.lru_cache(maxsize=None)
def tap_sum(tile: int, assign: bool) -> Callable[..., None]:
    """``f(source, xs, ws, out, base)``: for each ``d, p`` and lane ``c < tile``,
    ``out[base + (d * P + p) * tile + c]`` set (``assign``) or increased (int32, wrapping) by
    ``sum_s source[xs[d, s, p] + c] * source[ws[d, s] + c]``, summed in float32. ``source``
    float32 (int8 values), ``xs`` ``[D, S, P]`` and ``ws`` ``[D, S]`` int64 row starts in
    it, ``out`` int32: a :class:`~accel.hw.fused._TapSum` whose rows and weights are whole
    rows of the source vector and whose targets are a run, exact while ``S <= 1024``.

    >>> import numpy as np
    >>> out = np.full(2, 7, np.int32)
    >>> tap_sum(2, assign=False)(np.array([3, 4], np.float32), np.zeros((1, 2, 1), np.int64),
    ...                          np.zeros((1, 2), np.int64), out, 0)
    >>> out.tolist()        # 7 + 2 * 3 * 3, 7 + 2 * 4 * 4
    [25, 39]
    """
    return _keeping(_module(tile)["tap_sum"], assign)


@functools.lru_cache(maxsize=None)
def scaled_rows(tile: int, assign: bool) -> Callable[..., None]:
    """``f(source, xs, w, out, base)``: ``out[base + r * tile + c]`` set (``assign``) or
    increased (int32, wrapping) by ``source[xs[r] + c] * source[w]`` for each row ``r`` and lane
    ``c < tile``: ``source`` float32 (int8 values), ``xs`` int64 row starts in it, ``out`` int32
    (a :class:`~accel.hw.fused._PerChannel` that multiplies whole rows by one weight element:
    an element-wise core's widening by a ones weight), in one pass, without a gathered copy.

    >>> import numpy as np
    >>> out = np.ones(4, np.int32)
    >>> scaled_rows(2, assign=False)(np.array([3, 4, -2], np.float32), np.array([1, 0]), 2, out, 0)
    >>> out.tolist()        # 1 + [4, -2, 3, 4] * -2
    [-7, 5, -5, -7]
    """
    return _keeping(_module(tile)["scaled_rows"], assign)


def alu_chain(tile: int) -> Callable[..., None]:
    """``f(values, bases, tables, program, rows, out)`` (DLPack tensors, then ints): for each
    of ``rows`` rows of ``tile`` lanes, ``v`` = the row of ``program[0]``'s operand, then for
    each later step ``(code, kind, value) = program[k]``: ``v = op(v, operand)`` with wrapping
    int32 arithmetic (:data:`~accel.hw.instructions.ALU_UFUNCS`, a shift by the operand clipped
    to 0..31), or for ``code`` :data:`LOOKUP` ``v = tables[value * 256 + clip(v, -128, 127) +
    128]``; then ``values[out + r * tile + lane] = v``. An operand (``kind``, ``value``) is
    :data:`IMM`, :data:`RUN`, :data:`ROWS` or :data:`SPLAT` of ``values`` (int32); ``bases``
    int64, ``program`` ``[steps, 3]`` int64. A block of rows is read before it is written: the
    rows written may be the first operand's run (in place), and overlap no other operand.

    >>> import numpy as np, tvm_ffi
    >>> values = np.array([5, -7, 100, 3, 0, 0], np.int32)
    >>> program = np.array([[0, RUN, 0], [int(AluOp.MUL), IMM, 3], [int(AluOp.ADD), ROWS, 0],
    ...                     [int(AluOp.MAX), IMM, 0]])
    >>> tensors = [tvm_ffi.from_dlpack(a) for a in (values, np.array([2]), np.zeros(1, np.int32), program)]
    >>> alu_chain(2)(*tensors, 1, 4)
    >>> values.tolist()       # max(5 * 3 + 100, 0), max(-7 * 3 + 3, 0)
    [5, -7, 100, 3, 115, 0]
    """
    return _module(tile)["alu_chain"]


@functools.lru_cache(maxsize=None)
def copy_runs(src: str, dst: str) -> Callable[..., None]:
    """``f(source, starts, source_steps, to, lengths, target, step, saturate)`` (DLPack tensors,
    then ints): for each run ``i`` and ``c < lengths[i]``, ``target[to[i] + c * step] =
    source[starts[i] + c * source_steps[i]]``, cast as numpy's ``astype`` casts an integer (int8:
    the low byte), clipped to int8's range first when ``saturate``: ``src`` and ``dst``
    ``"int32"`` and ``"int8"`` or ``"int32"`` (a STORE, an ACC LOAD, ACC's final contents), or
    both ``"float32"`` (INP's or WGT's, copied as they are); the run arrays int64, a run's
    source step 0 (one element repeated) or 1. Runs are copied in order (a later one wins an
    element).

    >>> import numpy as np, tvm_ffi
    >>> target = np.zeros(6, np.int8)
    >>> arrays = (np.array([300, 5, -7], np.int32), np.array([0, 1]), np.array([0, 1]), np.array([0, 5]),
    ...           np.array([2, 1]), target)
    >>> copy_runs("int32", "int8")(*(tvm_ffi.from_dlpack(a) for a in arrays), 2, 1)
    >>> target.tolist()     # 300 repeated (step 0), clipped, at 0 and 2; 5 at 5
    [127, 0, 127, 0, 0, 5]
    """
    return _copies()[f"copy_runs_{src}_{dst}"]


@functools.lru_cache(maxsize=None)
def _copies():
    """:func:`copy_runs`'s kernels, compiled together (one compile, no tile width in them)."""
    import tvm
    from tvm.script import tirx as T

    def make(src_dtype: str, dst_dtype: str):
        def cast(value, saturate):
            if src_dtype == dst_dtype != "int32":
                return value        # (a scratchpad's float32 int8 values: as they are)
            return T.Cast(dst_dtype, T.if_then_else(saturate != 0, T.max(T.min(value, 127), -128), value))

        @T.prim_func
        def copy_runs(a_source: T.handle, a_starts: T.handle, a_steps: T.handle, a_to: T.handle,
                      a_lengths: T.handle, a_target: T.handle, step: T.int64, saturate: T.int32):
            T.func_attr({"global_symbol": f"copy_runs_{src_dtype}_{dst_dtype}", "tirx.noalias": True})
            n, r, m = T.int64(), T.int64(), T.int64()
            source = T.match_buffer(a_source, (n,), src_dtype, align=4)
            starts = T.match_buffer(a_starts, (r,), "int64", align=8)
            steps = T.match_buffer(a_steps, (r,), "int64", align=8)
            to = T.match_buffer(a_to, (r,), "int64", align=8)
            lengths = T.match_buffer(a_lengths, (r,), "int64", align=8)
            target = T.match_buffer(a_target, (m,), dst_dtype, align=1)
            # the common case as a loop of its own, which llvm vectorises: a run of the source
            # into a run of the target (a load's rows, a scratchpad's, an NCHW STORE's)
            for i in range(r):
                first = starts[i]
                at = to[i]
                if steps[i] == 1 and step == 1:
                    for c in range(lengths[i]):
                        target[at + c] = cast(source[first + c], saturate)
                else:
                    for c in range(lengths[i]):
                        target[at + c * step] = cast(source[first + c * steps[i]], saturate)
        return copy_runs

    pairs = [("int32", "int8"), ("int32", "int32"), ("float32", "float32")]
    return tvm.compile(tvm.IRModule({f"copy_runs_{a}_{b}": make(a, b) for a, b in pairs}), target=_target())


def _keeping(kernel, assign: bool) -> Callable[..., None]:
    """``kernel`` (numpy arrays and ints) with its last argument, ``keep``: 0 to set the
    outputs, 1 to add to them."""
    import tvm_ffi

    keep = 0 if assign else 1

    def call(*args) -> None:
        kernel(*(tvm_ffi.from_dlpack(a) if isinstance(a, np.ndarray) else a for a in args), keep)
    return call


@functools.lru_cache(maxsize=None)
def _module(tile: int):
    """The kernels for ``tile`` lanes, compiled together (one compile: ~0.1 s)."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def tap_sum(a_source: T.handle, a_xs: T.handle, a_ws: T.handle, a_out: T.handle, base: T.int64,
                keep: T.int32):
        T.func_attr({"global_symbol": "tap_sum", "tirx.noalias": True})
        n, d, s, p, m = T.int64(), T.int64(), T.int64(), T.int64(), T.int64()
        # element alignment only: the arrays are views of the plan's vectors at any offset
        source = T.match_buffer(a_source, (n,), "float32", align=4)
        xs = T.match_buffer(a_xs, (d, s, p), "int64", align=8)
        ws = T.match_buffer(a_ws, (d, s), "int64", align=8)
        out = T.match_buffer(a_out, (m,), "int32", align=4)
        acc = T.alloc_buffer((tile,), "float32", scope="local")
        for i in range(d):
            for j in range(p):
                for c in T.vectorized(tile):
                    acc[c] = T.float32(0)
                for k in range(s):
                    for c in T.vectorized(tile):
                        acc[c] = acc[c] + source[xs[i, k, j] + c] * source[ws[i, k] + c]
                for c in T.vectorized(tile):
                    # an old value times 0 is 0 whatever it is (int32: no NaN)
                    out[base + (i * p + j) * tile + c] = T.Cast("int32", acc[c]) + \
                        out[base + (i * p + j) * tile + c] * keep

    @T.prim_func
    def scaled_rows(a_source: T.handle, a_xs: T.handle, w: T.int64, a_out: T.handle, base: T.int64,
                    keep: T.int32):
        T.func_attr({"global_symbol": "scaled_rows", "tirx.noalias": True})
        n, r, m = T.int64(), T.int64(), T.int64()
        source = T.match_buffer(a_source, (n,), "float32", align=4)
        xs = T.match_buffer(a_xs, (r,), "int64", align=8)
        out = T.match_buffer(a_out, (m,), "int32", align=4)
        for i in range(r):
            for c in T.vectorized(tile):
                out[base + i * tile + c] = T.Cast("int32", source[xs[i] + c] * source[w]) + \
                    out[base + i * tile + c] * keep

    block = _CHAIN_ROWS
    add, most, least, shr, mul = (int(AluOp.ADD), int(AluOp.MAX), int(AluOp.MIN), int(AluOp.SHR), int(AluOp.MUL))

    @T.prim_func
    def alu_chain(a_values: T.handle, a_bases: T.handle, a_tables: T.handle, a_program: T.handle, rows: T.int64,
                  out: T.int64):
        T.func_attr({"global_symbol": "alu_chain"})
        n, b, e, k = T.int64(), T.int64(), T.int64(), T.int64()
        values = T.match_buffer(a_values, (n,), "int32", align=4)
        bases = T.match_buffer(a_bases, (b,), "int64", align=8)
        tables = T.match_buffer(a_tables, (e,), "int32", align=4)
        program = T.match_buffer(a_program, (k, 3), "int64", align=8)
        acc = T.alloc_buffer((block * tile,), "int32", scope="local")
        arg = T.alloc_buffer((block * tile,), "int32", scope="local")
        for r0 in range((rows + block - 1) // block):
            m = T.min(block, rows - r0 * block)
            first = r0 * block
            # the chain's first operand (not an immediate)
            if program[0, 1] == RUN:
                for j in range(m):
                    for c in T.vectorized(tile):
                        acc[j * tile + c] = values[program[0, 2] + (first + j) * tile + c]
            elif program[0, 1] == ROWS:
                for j in range(m):
                    for c in T.vectorized(tile):
                        acc[j * tile + c] = values[bases[program[0, 2] + first + j] + c]
            else:
                for j in range(m):
                    for c in T.vectorized(tile):
                        acc[j * tile + c] = values[bases[program[0, 2] + first + j]]
            for s in range(1, k):
                code = program[s, 0]
                kind = program[s, 1]
                if kind == IMM:
                    # (the immediate as a scalar: no row of it to fill)
                    imm = T.Cast("int32", program[s, 2])
                    if code == add:     # int32 wraps: the sum of the int64s, truncated (llvm's
                        # int32 add may assume no overflow, and simplify around it)
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.Cast("int32", T.Cast("int64", acc[j * tile + c]) +
                                                           T.Cast("int64", imm))
                    elif code == most:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.max(acc[j * tile + c], imm)
                    elif code == least:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.min(acc[j * tile + c], imm)
                    elif code == shr:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.shift_right(acc[j * tile + c], T.max(T.min(imm, 31), 0))
                    elif code == mul:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.Cast("int32", T.Cast("int64", acc[j * tile + c]) *
                                                           T.Cast("int64", imm))
                    else:       # LOOKUP in table ``imm``
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = tables[T.Cast("int64", imm) * LUT_ENTRIES +
                                                           T.Cast("int64", T.max(T.min(acc[j * tile + c], 127), -128) + 128)]
                else:
                    if kind == RUN:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                arg[j * tile + c] = values[program[s, 2] + (first + j) * tile + c]
                    elif kind == ROWS:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                arg[j * tile + c] = values[bases[program[s, 2] + first + j] + c]
                    else:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                arg[j * tile + c] = values[bases[program[s, 2] + first + j]]
                    if code == add:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.Cast("int32", T.Cast("int64", acc[j * tile + c]) +
                                                           T.Cast("int64", arg[j * tile + c]))
                    elif code == most:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.max(acc[j * tile + c], arg[j * tile + c])
                    elif code == least:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.min(acc[j * tile + c], arg[j * tile + c])
                    elif code == shr:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.shift_right(acc[j * tile + c],
                                                                  T.max(T.min(arg[j * tile + c], 31), 0))
                    else:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.Cast("int32", T.Cast("int64", acc[j * tile + c]) *
                                                           T.Cast("int64", arg[j * tile + c]))
            for j in range(m):
                for c in T.vectorized(tile):
                    values[out + (first + j) * tile + c] = acc[j * tile + c]

    return tvm.compile(tvm.IRModule({"tap_sum": tap_sum, "scaled_rows": scaled_rows, "alu_chain": alu_chain}),
                       target=_target())
