"""Reference implementations for differential tests of rewrite rules.

``reference_copy_rule()`` rewrites every copy nest into one call of a numpy-backed packed
function that performs the copy from the :class:`~tirpat.CopyRegion` alone. If a compiled
function gives the same outputs before and after this rule, the region (offsets, strides,
extents, cast and padding) was understood exactly — the property a DMA rule relies on.

>>> A = tvm.te.placeholder((4, 8), "int8", name="A")
>>> func = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((8, 4), lambda i, j: A[j, i], name="B")]))
>>> rw = reference_copy_rule()
>>> a = np.arange(32, dtype="int8").reshape(4, 8)
>>> _, b = run(rw(func), [a, np.zeros((8, 4), "int8")])
>>> rw.report.counts, bool((b == a.T).all())
({'reference_copy': 1}, True)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tvm
from tvm import tirx

from ..device.buffers import strided_view, tensor_view
from ..tir.copy import is_copy
from ..tir.rewrite import Rewriter

COPY_FUNC = "tirpat.testing.copy"


@tvm.register_global_func(COPY_FUNC, override=True)
def _copy(dst, src, *fields):
    n = int(fields[0])
    dst_off, src_off = int(fields[1]), int(fields[2])
    ext = [int(x) for x in fields[3:3 + n]]
    dst_st = [int(x) for x in fields[3 + n:3 + 2 * n]]
    src_st = [int(x) for x in fields[3 + 2 * n:3 + 3 * n]]
    padded = int(fields[3 + 3 * n])  # 0: plain, 1: padded, 2: partial (outside the box untouched)
    dst_flat, src_flat = tensor_view(dst), tensor_view(src)
    out = strided_view(dst_flat, dst_off, ext, dst_st, what="copy destination")
    if not padded:
        out[...] = strided_view(src_flat, src_off, ext, src_st, what="copy source").astype(dst_flat.dtype)
        return
    pad_value = fields[4 + 3 * n]
    before = [int(x) for x in fields[5 + 3 * n:5 + 4 * n]]
    after = [int(x) for x in fields[5 + 4 * n:5 + 5 * n]]
    inner = [max(0, e - b - a) for e, b, a in zip(ext, before, after)]
    if padded == 1:
        out[...] = np.array(pad_value).astype(dst_flat.dtype)
    box = tuple(slice(b, b + i) for b, i in zip(before, inner))
    start = src_off + sum(b * s for b, s in zip(before, src_st))
    out[box] = strided_view(src_flat, start, inner, src_st, what="copy source").astype(dst_flat.dtype)


def _copy_call(m):
    c = m["copy"]
    if c.predicate is not None and c.pad is None:
        return None  # a guard that is not a box of bounds: leave the nest alone
    if any(not isinstance(e, int) for e in c.extents):
        return None
    n = len(c.extents)
    args = [c.dst.buffer, c.src.buffer, n, c.dst.offset, c.src.offset, *c.extents,
            *c.dst.strides, *c.src.strides]
    if c.predicate is None:
        args.append(0)
    elif c.pad_value is None:
        args += [2, 0, *[b for b, _ in c.pad], *[a for _, a in c.pad]]
    else:
        pad_value = c.pad_value if c.pad_value.ty.dtype == c.dst.buffer.dtype else tirx.Cast(
            str(c.dst.buffer.dtype), c.pad_value)
        args += [1, pad_value, *[b for b, _ in c.pad], *[a for _, a in c.pad]]
    return tirx.Evaluate(tirx.call_packed(COPY_FUNC, *args))


def reference_copy_rule(name: str = "reference_copy") -> Rewriter:
    """A rule replacing every copy nest by a numpy copy driven by its CopyRegion alone.

    >>> reference_copy_rule().rules[0].name
    'reference_copy'
    """
    return Rewriter.from_pattern(is_copy(name="copy"), _copy_call, name=name)


def run(func_or_mod, arrays: Sequence[np.ndarray], target: str = "llvm", pipeline: str = "default") -> list:
    """Compile with ``tvm.compile`` and run on copies of ``arrays``; returns all of them after.

    >>> A = tvm.te.placeholder((4,), "float32", name="A")
    >>> func = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((4,), lambda i: A[i] * 2.0, name="B")]))
    >>> run(func, [np.arange(4, dtype="float32"), np.zeros(4, "float32")])[1]
    array([0., 2., 4., 6.], dtype=float32)
    """
    mod = func_or_mod if isinstance(func_or_mod, tvm.IRModule) else tvm.IRModule({"main": func_or_mod})
    ex = tvm.compile(mod, target=target, tir_pipeline=pipeline)
    tensors = [tvm.runtime.tensor(np.array(a, copy=True)) for a in arrays]
    ex["main"](*tensors)
    return [t.numpy() for t in tensors]
