"""Machine code for the batched plan's hottest step kinds, compiled with TVM (llvm, for this
CPU) once per process and kind, on first use.

numpy runs a step as whole-array passes: a depthwise kernel's tap sum gathers every tap's
input rows into a new array (49 copies of the input for a 7x7 kernel), then multiplies and
sums them. Compiled, each output vector is summed in registers straight from the source
vector's rows: on ``ppocrv6_det_small``'s tap sums 45 -> 8 ms. A kernel's shapes are symbolic,
so one compile (~0.1 s, all kernels at once) serves every plan of the process.

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

__all__ = ["tap_sum", "scaled_rows"]


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

    return tvm.compile(tvm.IRModule({"tap_sum": tap_sum, "scaled_rows": scaled_rows}), target=_target())
