"""Machine code for the batched plan's hottest step kinds, compiled with TVM (llvm, for this
CPU) once per tile width, on first use, and kept as a shared library in :data:`CACHE` for later
processes (whose first model call then loads it instead of compiling).

numpy runs a step as whole-array passes: a depthwise kernel's tap sum gathers every tap's
input rows into a new array (49 copies of the input for a 7x7 kernel), then multiplies and
sums them. Compiled, each output vector is summed in registers straight from the source
vector's rows: on ``ppocrv6_det_small``'s tap sums 45 -> 8 ms. A kernel's shapes are symbolic,
so one compile (~0.5 s, all kernels at once) serves every plan of the process, and later ones.

A block matrix product (a convolution's im2col GEMM) is :func:`gemm`: int8 x int8 -> int32 with
``pmaddwd`` (two int16 products summed into an int32 lane, 16 per AVX2 instruction where a
float32 FMA does 8), reading its operands' rows straight from the int8 source vector. On
``ppocrv6_det_small``'s products' shapes it is 1.5-5x float32 BLAS (one thread), which also
needed the source vector in float32 (a conversion pass per call) and float64 beyond 1024 terms.

A STORE's int32 values narrowed to int8 and scattered into a host buffer, an ACC LOAD's rows
gathered, a scratchpad's final contents: :func:`copy_runs` copies them run by run in one pass
(numpy: a gather into a temporary, a cast, a scatter, each a pass with an index per element).

A requantisation is a chain of ALU batches (multiply, shift, add, clamps, a table lookup), each
a numpy pass over millions of int32 values: :func:`alu_chain` runs a whole chain in one pass,
a few tile rows at a time in registers, interpreting the chain's steps from a small table (one
kernel for every chain, no compile per chain). A LUT's lookup (a classifier's hardswish or
sigmoid) with AVX-512 VBMI is two byte permutes per 16 values of the table held in four
registers: ~1 us over ``ppocr_v2_cls``'s 36,864 values of a layer, against 14 us a load per
value. Its sums and products are int64 truncated to int32: the wrap-around of the ISA, which
llvm's int32 arithmetic (no signed overflow) would not promise once it simplified a clamp after
an add.

Results are bit-identical to the numpy steps they replace: a product of int8 values is exact in
int16 (at most 2**14 in magnitude), sums of up to 2**17 of them in int32, and what is added into
the accumulators wraps as int32 addition does in numpy (int64 sums truncated).

>>> import numpy as np
>>> source = np.arange(40, dtype=np.int8)
>>> xs = np.array([[[0, 16]]]); ws = np.array([[20]]); out = np.zeros(10, np.int32)
>>> tap_sum(4, assign=True)(source, xs, ws, out, 2)
>>> out.tolist()        # [0..3] * [20..23] and [16..19] * [20..23], from 2 on
[0, 0, 0, 21, 44, 69, 320, 357, 396, 437]
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from accel.hw.instructions import LUT_ENTRIES, AluOp

__all__ = ["tap_sum", "scaled_rows", "gemm", "alu_chain", "copy_runs", "LOOKUP", "WRITE", "START", "WRAPPED",
           "SATURATED", "SCALE", "ROUND", "MIN_MAX", "MAX_MIN", "IMM", "RUN", "ROWS", "SPLAT",
           "CACHE", "cache_path"]

#: :func:`alu_chain`'s code of a table lookup step (the ALU ops are their :class:`AluOp` values).
LOOKUP = max(AluOp) + 1
#: :func:`alu_chain`'s codes that end one chain and begin the next in the same pass: WRITE the
#: rows so far at the immediate's run of ``values``, START again from an operand.
WRITE, START = LOOKUP + 1, LOOKUP + 2
#: :func:`alu_chain`'s codes that write the rows so far, narrowed to int8 as a STORE of that
#: mode does (the low byte, or clipped first), into its ``target`` (a host buffer).
WRAPPED, SATURATED = LOOKUP + 3, LOOKUP + 4
#: :func:`alu_chain`'s codes of two steps by immediates (``kind`` the first's, ``value`` the
#: second's) in one pass: MUL then SHR (a requantisation's scale), ADD then SHR (its rounding),
#: MIN then MAX and MAX then MIN (its clamp).
SCALE, ROUND, MIN_MAX, MAX_MIN = LOOKUP + 5, LOOKUP + 6, LOOKUP + 7, LOOKUP + 8
#: :func:`alu_chain`'s operand kinds: an immediate; row ``r`` at ``value + r * tile`` (a run);
#: row ``r`` at ``bases[value + r]``; row ``r`` all ``values[bases[value + r]]`` (a broadcast).
IMM, RUN, ROWS, SPLAT = range(4)
# tile rows a chain carries through all its steps at once: the dispatch on a step's code is
# paid once per block (16 rows of 16 lanes, 1 KB in L1: the fastest of 4, 16 and 64 on a
# requantisation's chain)
_CHAIN_ROWS = 16
# input rows :func:`gemm` multiplies at once, each by a block of channels: 4 rows x 2 vectors, 8
# accumulators in registers (16 on x86-64), each input pair loaded once per block of channels
_GEMM_ROWS = 4
# pairs of terms :func:`gemm` sums in int32 before adding into the output: at most 2**16 products
# of int8 values (each at most 2**14 in magnitude) stay below 2**31, llvm's int32 sums (no signed
# overflow assumed) exact
_GEMM_PAIRS = 2**15
#: The directory where compiled kernels are kept for later processes (:func:`cache_path`): a
#: process that finds them there loads a shared library (~1 ms) instead of compiling (~0.5 s of
#: its first batched plan). None keeps nothing.
CACHE: Optional[Path] = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "accel-kernels"


@functools.lru_cache(maxsize=None)
def _target(cpu: str | None = None):
    from tvm.target import Target, codegen

    # this CPU's vector width (the default "llvm" target is x86-64's baseline: SSE2)
    return Target({"kind": "llvm", "mcpu": cpu or codegen.llvm_get_system_cpu()})


@functools.lru_cache(maxsize=None)
def tap_sum(tile: int, assign: bool) -> "_Keeping":
    """``f(source, xs, ws, out, base)``: for each ``d, p`` and lane ``c < tile``,
    ``out[base + (d * P + p) * tile + c]`` set (``assign``) or increased (int32, wrapping) by
    ``sum_s source[xs[d, s, p] + c] * source[ws[d, s] + c]``, summed in int32. ``source``
    int8, ``xs`` ``[D, S, P]`` and ``ws`` ``[D, S]`` int64 row starts in it, ``out`` int32: a
    :class:`~accel.hw.fused._TapSum` whose rows and weights are whole rows of the source
    vector and whose targets are a run, exact while ``S <= 2**17``.

    >>> import numpy as np
    >>> out = np.full(2, 7, np.int32)
    >>> tap_sum(2, assign=False)(np.array([3, 4], np.int8), np.zeros((1, 2, 1), np.int64),
    ...                          np.zeros((1, 2), np.int64), out, 0)
    >>> out.tolist()        # 7 + 2 * 3 * 3, 7 + 2 * 4 * 4
    [25, 39]
    """
    return _keeping(_module(tile)["tap_sum"], assign)


@functools.lru_cache(maxsize=None)
def scaled_rows(tile: int, assign: bool) -> "_Keeping":
    """``f(source, xs, w, out, base)``: ``out[base + r * tile + c]`` set (``assign``) or
    increased (int32, wrapping) by ``source[xs[r] + c] * source[w]`` for each row ``r`` and lane
    ``c < tile``: ``source`` int8, ``xs`` int64 row starts in it, ``out`` int32
    (a :class:`~accel.hw.fused._PerChannel` that multiplies whole rows by one weight element:
    an element-wise core's widening by a ones weight), in one pass, without a gathered copy.

    >>> import numpy as np
    >>> out = np.ones(4, np.int32)
    >>> scaled_rows(2, assign=False)(np.array([3, 4, -2], np.int8), np.array([1, 0]), 2, out, 0)
    >>> out.tolist()        # 1 + [4, -2, 3, 4] * -2
    [-7, 5, -5, -7]
    """
    return _keeping(_module(tile)["scaled_rows"], assign)


@functools.lru_cache(maxsize=None)
def gemm(tile: int, assign: bool, cpu: str | None = None) -> "_Gemm":
    """``f(source, xs, ws, out, base, ld)``: ``out[base + r * ld + c]`` set (``assign``) or
    increased (int32, wrapping) by ``sum_k x[r, k] * w[c, k]``, where row ``r`` of ``x`` is the
    runs of ``tile`` elements of ``source`` (int8) that start at ``xs[r]`` (``[R, J]`` int64),
    one after the other, and row ``c`` of ``w`` those at ``ws[c]`` (``[C, J]``): a
    :class:`~accel.hw.fused._Product` straight from the source vector's rows, exact for any
    number of terms (int16 multiply-adds of pairs of terms into int32 sums). Compiled for ``cpu``
    (None: this one): SSE2's ``pmaddwd`` on any x86-64, 256-bit ``vpmaddwd`` with AVX2.

    >>> import numpy as np
    >>> source = np.array([1, 2, -128, -128, 3, 1], np.int8)
    >>> out = np.full(3, 7, np.int32)
    >>> gemm(2, assign=False)(source, np.array([[0], [4]]), np.array([[2]]), out, 1, 1)
    >>> out.tolist()      # 7, 7 + (1 + 2) * -128, 7 + (3 + 1) * -128
    [7, -377, -505]
    """
    # (``_module(tile)`` for this CPU, as the other kernels ask: one cache entry, one compile)
    return _Gemm((_module(tile) if cpu is None else _module(tile, cpu))["gemm"], 0 if assign else 1,
                 2 * _lanes(cpu), tile)


class _Gemm:
    """:func:`gemm`'s kernel: called with numpy arrays (made tensors at each call, the int16
    scratch a thread's own), or :meth:`bind` to them once (a plan's product over its workspace,
    the same arrays run after run: ~15 us of a call of a few us otherwise)."""

    __slots__ = ("kernel", "keep", "block", "tile")

    def __init__(self, kernel, keep: int, block: int, tile: int) -> None:
        self.kernel, self.keep, self.block, self.tile = kernel, keep, block, tile

    def scratch(self, xs: np.ndarray, ws: np.ndarray) -> int:
        """The int16 elements the kernel packs the operands into: the weight's pairs of terms
        by blocks of channels, then a few input rows.

        >>> gemm(4, True).scratch(np.zeros((9, 3)), np.zeros((5, 3))) >= 5 * 12 + 4 * 12
        True
        """
        pairs = (xs.shape[1] * self.tile + 1) // 2
        return -(-ws.shape[0] // self.block) * self.block * pairs * 2 + _GEMM_ROWS * pairs * 2

    def __call__(self, source: np.ndarray, xs: np.ndarray, ws: np.ndarray, out: np.ndarray, base: int,
                 ld: int) -> None:
        size = self.scratch(xs, ws)
        scratch = getattr(_scratch, "array", None)
        if scratch is None or scratch.size < size:
            scratch = _scratch.array = np.empty(size, np.int16)
        self.bind(source, xs, ws, out, base, ld, scratch)()

    def bind(self, source: np.ndarray, xs: np.ndarray, ws: np.ndarray, out: np.ndarray, base: int, ld: int,
             scratch: np.ndarray) -> Callable[[], None]:
        """The call on these arrays as a call without arguments, their tensors made once:
        ``scratch`` int16, at least :meth:`scratch` elements, which nothing else uses while it runs.

        >>> out = np.zeros(2, np.int32); g = gemm(2, True)
        >>> g.bind(np.array([1, 2, 3], np.int8), np.array([[0]]), np.array([[1]]), out, 0, 1, np.empty(64, np.int16))()
        >>> out.tolist()      # 1 * 2 + 2 * 3
        [8, 0]
        """
        import tvm_ffi

        return partial(self.kernel, *(tvm_ffi.from_dlpack(a) for a in (source, xs, ws, scratch, out)), base, ld,
                       self.keep)


_scratch = threading.local()


@functools.lru_cache(maxsize=None)     # (a first call binds a chain's kernel hundreds of times)
def alu_chain(tile: int, cpu: str | None = None) -> Callable[..., None]:
    """``f(values, bases, tables, program, target, rows, out)`` (DLPack tensors, then ints): for each
    of ``rows`` rows of ``tile`` lanes, ``v`` = the row of ``program[0]``'s operand, then for
    each later step ``(code, kind, value) = program[k]``: ``v = op(v, operand)`` with wrapping
    int32 arithmetic (:data:`~accel.hw.instructions.ALU_UFUNCS`, a shift by the operand clipped
    to 0..31), or for ``code`` :data:`LOOKUP` ``v = tables[value + clip(v, -128, 127) + 128]``
    (``tables`` int8: a plan's tables where its source vector holds them, read in place); then
    ``values[out + r * tile + lane] = v``. An operand (``kind``, ``value``) is
    :data:`IMM`, :data:`RUN`, :data:`ROWS` or :data:`SPLAT` of ``values`` (int32); ``bases``
    int64, ``program`` ``[steps, 3]`` int64. A block of rows is read before it is written: the
    rows written may be the first operand's run (in place), and overlap no other operand.

    Several chains over as many rows run in one pass, block by block: a step :data:`WRITE`
    (kind :data:`IMM`) writes ``v`` at ``values[value + r * tile + lane]`` and a step
    :data:`START` sets ``v`` to its operand's row, as ``program[0]`` does (a later chain reads
    what an earlier one wrote as the same run: the same rows, just written). A step
    :data:`WRAPPED` or :data:`SATURATED` writes lanes ``c < kind`` of ``v`` as int8 at
    ``target[value + r * kind + c]`` (a STORE of the rows into a host buffer, in the same pass).
    :data:`SCALE`, :data:`ROUND`, :data:`MIN_MAX` and :data:`MAX_MIN` are two steps by the
    immediates ``kind`` and ``value``. Compiled for ``cpu`` (None: this one): a LOOKUP is two
    byte permutes per 16 values with AVX-512 VBMI, a load per value on any other x86-64.

    >>> import numpy as np, tvm_ffi
    >>> values = np.array([5, -7, 100, 3, 0, 0], np.int32)
    >>> program = np.array([[0, RUN, 0], [int(AluOp.MUL), IMM, 3], [int(AluOp.ADD), ROWS, 0],
    ...                     [int(AluOp.MAX), IMM, 0]])
    >>> tensors = [tvm_ffi.from_dlpack(a) for a in (values, np.array([2]), np.zeros(1, np.int8), program,
    ...                                             np.zeros(1, np.int8))]
    >>> alu_chain(2)(*tensors, 1, 4)
    >>> values.tolist()       # max(5 * 3 + 100, 0), max(-7 * 3 + 3, 0)
    [5, -7, 100, 3, 115, 0]
    """
    return (_module(tile) if cpu is None else _module(tile, cpu))["alu_chain"]


@functools.lru_cache(maxsize=None)
def copy_runs(tile: int, src: str, dst: str) -> Callable[..., None]:
    """``f(source, starts, source_steps, to, lengths, target, step, saturate)`` (DLPack tensors,
    then ints): for each run ``i`` and ``c < lengths[i]``, ``target[to[i] + c * step] =
    source[starts[i] + c * source_steps[i]]``, cast as numpy's ``astype`` casts an integer (int8:
    the low byte), clipped to int8's range first when ``saturate``: ``src`` and ``dst``
    ``"int32"`` and ``"int8"`` or ``"int32"`` (a STORE, an ACC LOAD, ACC's final contents), or
    ``"int8"`` and ``"float32"`` (INP's or WGT's, from the source vector); in the module of
    ``tile`` (one compile for all kernels; the copies do not depend on it); the run arrays int64, a run's
    source step 0 (one element repeated) or 1. Runs are copied in order (a later one wins an
    element).

    >>> import numpy as np, tvm_ffi
    >>> target = np.zeros(6, np.int8)
    >>> arrays = (np.array([300, 5, -7], np.int32), np.array([0, 1]), np.array([0, 1]), np.array([0, 5]),
    ...           np.array([2, 1]), target)
    >>> copy_runs(16, "int32", "int8")(*(tvm_ffi.from_dlpack(a) for a in arrays), 2, 1)
    >>> target.tolist()     # 300 repeated (step 0), clipped, at 0 and 2; 5 at 5
    [127, 0, 127, 0, 0, 5]
    """
    return _module(tile)[f"copy_runs_{src}_{dst}"]


def _keeping(kernel, assign: bool) -> "_Keeping":
    """``kernel`` (numpy arrays and ints) with its last argument, ``keep``: 0 to set the
    outputs, 1 to add to them."""
    return _Keeping(kernel, 0 if assign else 1)


class _Keeping:
    """A kernel called with numpy arrays and ints (the arrays made tensors at each call), or
    :meth:`bind` to them once; its last argument ``keep`` given."""

    __slots__ = ("kernel", "keep")

    def __init__(self, kernel, keep: int) -> None:
        self.kernel, self.keep = kernel, keep

    def __call__(self, *args) -> None:
        self.bind(*args)()

    def bind(self, *args) -> Callable[[], None]:
        """The call on ``args`` as a call without arguments, the arrays' tensors made once (a
        plan's step over its workspace: the same arrays run after run, only their contents change).

        >>> out = np.ones(2, np.int32); call = scaled_rows(2, assign=False).bind(np.array([3, 4], np.int8),
        ...                                                                      np.array([0]), 1, out, 0)
        >>> call(); call(); out.tolist()        # twice 1 + [3, 4] * 4
        [25, 33]
        """
        import tvm_ffi

        return partial(self.kernel, *(tvm_ffi.from_dlpack(a) if isinstance(a, np.ndarray) else a for a in args),
                       self.keep)


def _lanes(cpu: str | None) -> int:
    """The int32 lanes of :func:`gemm`'s vectors on ``cpu`` (None: this one): 8 with AVX2, else
    SSE2's 4 (every x86-64 has SSE2)."""
    from tvm.target import codegen

    return 8 if codegen.llvm_cpu_has_features(["avx2"], _target(cpu)) else 4


@functools.lru_cache(maxsize=None)
def _module(tile: int, cpu: str | None = None):
    """The runtime module of the kernels for ``tile`` lanes on ``cpu`` (None: this one): the
    shared library :func:`cache_path` names when a process compiled them before, else compiled
    (and that library written)."""
    path = cache_path(tile, cpu)
    module = _load(path) if path is not None and path.is_file() else None
    if module is None:
        module = _compile(tile, cpu)
        if path is not None and _save(module, path):
            # the library's machine code: an llvm module would compile its own again, in memory,
            # at its first lookup (exporting compiles once, for the file; linking adds ~0.1 s)
            module = _load(path) or module
    return module


def cache_path(tile: int, cpu: str | None = None) -> Optional[Path]:
    """The file that keeps the kernels for ``tile`` lanes on ``cpu`` (None: this one) between
    processes: in :data:`CACHE` (None: not kept), named by what the machine code depends on (this
    file's source, the constants it takes from :mod:`accel.hw.instructions`, TVM's version, the
    target CPU and ``tile``), so that a change of any of them compiles anew instead of loading stale code.

    >>> cache_path(16) != cache_path(4)
    True
    """
    if CACHE is None:
        return None
    import tvm

    key = hashlib.sha256(Path(__file__).read_bytes())
    key.update(repr((tile, LUT_ENTRIES, sorted((op.name, int(op)) for op in AluOp), tvm.__version__,
                     str(_target(cpu)))).encode())
    return Path(CACHE) / f"kernels-{tile}-{key.hexdigest()[:24]}.so"


def _load(path: Path):
    """The runtime module of the shared library at ``path``, None for a damaged or foreign file
    (compiled again, and replaced)."""
    import tvm

    try:
        return tvm.runtime.load_module(str(path))
    except (OSError, RuntimeError):
        return None


def _save(module, path: Path) -> bool:
    """Write ``module`` to ``path`` as a shared library, whole or not at all: linked under a name
    of this process' own, then renamed (processes starting together may write it at once). A
    cache that cannot be written (no C compiler, a read-only directory) only costs the next
    process the compile (returns False)."""
    temporary = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.so")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        module.export_library(str(temporary))
        os.replace(temporary, path)
        return True
    except (OSError, RuntimeError):
        temporary.unlink(missing_ok=True)
        return False


def _compile(tile: int, cpu: str | None = None):
    """The kernels for ``tile`` lanes compiled together for ``cpu``, as a runtime module (TVMScript parsed
    and lowered, ~0.3 s; llvm makes the machine code, ~0.3 s, at the first lookup or export)."""
    import tvm
    from tvm.script import tirx as T
    from tvm.target import codegen

    @T.prim_func
    def tap_sum(a_source: T.handle, a_xs: T.handle, a_ws: T.handle, a_out: T.handle, base: T.int64,
                keep: T.int64):
        T.func_attr({"global_symbol": "tap_sum", "tirx.noalias": True})
        n, d, s, p, m = T.int64(), T.int64(), T.int64(), T.int64(), T.int64()
        # element alignment only: the arrays are views of the plan's vectors at any offset
        source = T.match_buffer(a_source, (n,), "int8", align=1)
        xs = T.match_buffer(a_xs, (d, s, p), "int64", align=8)
        ws = T.match_buffer(a_ws, (d, s), "int64", align=8)
        out = T.match_buffer(a_out, (m,), "int32", align=4)
        acc = T.alloc_buffer((tile,), "int32", scope="local")
        for i in range(d):
            for j in range(p):
                for c in T.vectorized(tile):
                    acc[c] = 0
                for k in range(s):
                    for c in T.vectorized(tile):
                        # an int8 product fits int16 (at most 2**14); up to 2**17 of them int32
                        acc[c] = acc[c] + T.Cast("int32", T.Cast("int16", source[xs[i, k, j] + c]) *
                                                 T.Cast("int16", source[ws[i, k] + c]))
                for c in T.vectorized(tile):
                    # int32 wraps: the int64 sum truncated (an old value times 0 is 0)
                    out[base + (i * p + j) * tile + c] = T.Cast("int32", T.Cast("int64", acc[c]) + T.Cast(
                        "int64", out[base + (i * p + j) * tile + c]) * keep)

    @T.prim_func
    def scaled_rows(a_source: T.handle, a_xs: T.handle, w: T.int64, a_out: T.handle, base: T.int64,
                    keep: T.int64):
        T.func_attr({"global_symbol": "scaled_rows", "tirx.noalias": True})
        n, r, m = T.int64(), T.int64(), T.int64()
        source = T.match_buffer(a_source, (n,), "int8", align=1)
        xs = T.match_buffer(a_xs, (r,), "int64", align=8)
        out = T.match_buffer(a_out, (m,), "int32", align=4)
        for i in range(r):
            for c in T.vectorized(tile):
                out[base + i * tile + c] = T.Cast("int32", T.Cast("int64", T.Cast("int16", source[xs[i] + c]) *
                                                              T.Cast("int16", source[w])) +
                                                  T.Cast("int64", out[base + i * tile + c]) * keep)

    block = _CHAIN_ROWS
    add, most, least, shr, mul = (int(AluOp.ADD), int(AluOp.MAX), int(AluOp.MIN), int(AluOp.SHR), int(AluOp.MUL))
    write, start, wrapped, saturated = WRITE, START, WRAPPED, SATURATED
    scale, rounding, min_max, max_min = SCALE, ROUND, MIN_MAX, MAX_MIN

    # with AVX-512 VBMI a LOOKUP is two permutes of 64 bytes, each by the index's low 7 bits
    # over 128 entries of the table (two registers): the first half of the table for a negative
    # value (-128 + i is entry i), the second for the rest; else a load per lane (~4x as long)
    permutes = codegen.llvm_cpu_has_features(["avx512vbmi"], _target(cpu))

    def permute(tables, at, index):
        # the entries at ``at + (index & 127)`` of each byte of ``index`` (int8x64)
        return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpermi2var.qi.512"),
                                       tables.vload([at], "int8x64"), index, tables.vload([at + 64], "int8x64"),
                                       dtype="int8x64")

    @T.macro
    def by_vector(acc, m, code, operand, at):
        # a step on the ``m`` rows of ``acc`` whose operand is rows: ``operand[at + j * tile + c]``
        if code == start:
            for j in range(m):
                for c in T.vectorized(tile):
                    acc[j * tile + c] = operand[at + j * tile + c]
        elif code == add:
            for j in range(m):
                for c in T.vectorized(tile):
                    acc[j * tile + c] = T.Cast("int32", T.Cast("int64", acc[j * tile + c]) +
                                               T.Cast("int64", operand[at + j * tile + c]))
        elif code == most:
            for j in range(m):
                for c in T.vectorized(tile):
                    acc[j * tile + c] = T.max(acc[j * tile + c], operand[at + j * tile + c])
        elif code == least:
            for j in range(m):
                for c in T.vectorized(tile):
                    acc[j * tile + c] = T.min(acc[j * tile + c], operand[at + j * tile + c])
        elif code == shr:
            for j in range(m):
                for c in T.vectorized(tile):
                    acc[j * tile + c] = T.shift_right(acc[j * tile + c], T.max(T.min(operand[at + j * tile + c], 31), 0))
        else:
            for j in range(m):
                for c in T.vectorized(tile):
                    acc[j * tile + c] = T.Cast("int32", T.Cast("int64", acc[j * tile + c]) *
                                               T.Cast("int64", operand[at + j * tile + c]))

    @T.prim_func
    def alu_chain(a_values: T.handle, a_bases: T.handle, a_tables: T.handle, a_program: T.handle,
                  a_target: T.handle, rows: T.int64, out: T.int64):
        T.func_attr({"global_symbol": "alu_chain"})
        n, b, e, k, h = T.int64(), T.int64(), T.int64(), T.int64(), T.int64()
        values = T.match_buffer(a_values, (n,), "int32", align=4)
        bases = T.match_buffer(a_bases, (b,), "int64", align=8)
        tables = T.match_buffer(a_tables, (e,), "int8", align=1)
        program = T.match_buffer(a_program, (k, 3), "int64", align=8)
        target = T.match_buffer(a_target, (h,), "int8", align=1)
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
                if code == wrapped or code == saturated:    # (``kind`` the lanes written of each row)
                    low = T.if_then_else(code == saturated, -128, -2**31)      # (wrapped: clipped to nothing)
                    high = T.if_then_else(code == saturated, 127, 2**31 - 1)
                    # whole rows and half rows (a layer of half a tile's channels) as vectors
                    if kind == tile:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                target[program[s, 2] + (first + j) * tile + c] = T.Cast(
                                    "int8", T.max(T.min(acc[j * tile + c], high), low))
                    elif kind * 2 == tile:
                        for j in range(m):
                            for c in T.vectorized(tile // 2):
                                target[program[s, 2] + (first + j) * (tile // 2) + c] = T.Cast(
                                    "int8", T.max(T.min(acc[j * tile + c], high), low))
                    else:
                        for j in range(m):
                            for c in range(kind):
                                target[program[s, 2] + (first + j) * kind + c] = T.Cast(
                                    "int8", T.max(T.min(acc[j * tile + c], high), low))
                elif code == scale:
                    for j in range(m):
                        for c in T.vectorized(tile):
                            acc[j * tile + c] = T.shift_right(T.Cast("int32", T.Cast("int64", acc[j * tile + c]) *
                                                                     program[s, 1]),
                                                              T.max(T.min(T.Cast("int32", program[s, 2]), 31), 0))
                elif code == rounding:
                    for j in range(m):
                        for c in T.vectorized(tile):
                            acc[j * tile + c] = T.shift_right(T.Cast("int32", T.Cast("int64", acc[j * tile + c]) +
                                                                     program[s, 1]),
                                                              T.max(T.min(T.Cast("int32", program[s, 2]), 31), 0))
                elif code == min_max:
                    for j in range(m):
                        for c in T.vectorized(tile):
                            acc[j * tile + c] = T.max(T.min(acc[j * tile + c], T.Cast("int32", program[s, 1])),
                                                      T.Cast("int32", program[s, 2]))
                elif code == max_min:
                    for j in range(m):
                        for c in T.vectorized(tile):
                            acc[j * tile + c] = T.min(T.max(acc[j * tile + c], T.Cast("int32", program[s, 1])),
                                                      T.Cast("int32", program[s, 2]))
                elif kind == IMM:
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
                    elif code == write:     # a chain's rows out; the next one STARTs
                        for j in range(m):
                            for c in T.vectorized(tile):
                                values[program[s, 2] + (first + j) * tile + c] = acc[j * tile + c]
                    elif permutes:      # LOOKUP by byte permutes of the table in four registers
                        # (a value per int32 lane, at its low byte: the rest of the lane's bytes
                        # looked up too, then shifted out; ``acc`` is whole vectors of 16 lanes,
                        # those past the block's rows looked up and never written)
                        for q in range((m * tile + 15) // 16):
                            clipped = T.reinterpret(T.max(T.min(acc[T.ramp(q * 16, 1, 16)], 127), -128),
                                                    dtype="int8x64")
                            acc[T.ramp(q * 16, 1, 16)] = T.shift_right(T.shift_left(T.reinterpret(T.Select(
                                clipped < T.broadcast(T.int8(0), 64), permute(tables, program[s, 2], clipped),
                                permute(tables, program[s, 2] + 128, clipped)), dtype="int32x16"), 24), 24)
                    else:       # LOOKUP in the table at ``program[s, 2]``, lane by lane
                        for j in range(m):
                            for c in T.vectorized(tile):
                                acc[j * tile + c] = T.Cast("int32", tables[program[s, 2] + T.Cast(
                                    "int64", T.max(T.min(acc[j * tile + c], 127), -128) + 128)])
                elif kind == RUN:       # (read where it is: no pass through ``arg``)
                    by_vector(acc, m, code, values, program[s, 2] + first * tile)
                else:
                    if kind == ROWS:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                arg[j * tile + c] = values[bases[program[s, 2] + first + j] + c]
                    else:
                        for j in range(m):
                            for c in T.vectorized(tile):
                                arg[j * tile + c] = values[bases[program[s, 2] + first + j]]
                    by_vector(acc, m, code, arg, 0)
            for j in range(m):
                for c in T.vectorized(tile):
                    values[out + (first + j) * tile + c] = acc[j * tile + c]

    lanes = _lanes(cpu)
    block = 2 * lanes                   # output channels a block of accumulators covers: two vectors
    pair = 2 * block                    # int16 elements of a packed weight pair row
    madd = "llvm.x86.avx2.pmadd.wd" if lanes == 8 else "llvm.x86.sse2.pmadd.wd"
    rows_at_once = _GEMM_ROWS

    @T.prim_func
    def gemm(a_source: T.handle, a_xs: T.handle, a_ws: T.handle, a_packed: T.handle, a_out: T.handle,
             base: T.int64, ld: T.int64, keep: T.int64):
        T.func_attr({"global_symbol": "gemm", "tirx.noalias": True})
        n, m, j, c, q, o = T.int64(), T.int64(), T.int64(), T.int64(), T.int64(), T.int64()
        source = T.match_buffer(a_source, (n,), "int8", align=1)
        xs = T.match_buffer(a_xs, (m, j), "int64", align=8)
        ws = T.match_buffer(a_ws, (c, j), "int64", align=8)
        packed = T.match_buffer(a_packed, (q,), "int16", align=2)
        out = T.match_buffer(a_out, (o,), "int32", align=4)
        acc = T.alloc_buffer((rows_at_once * block,), "int32", scope="local")
        pairs = (j * tile + 1) // 2
        blocks = (c + block - 1) // block
        panel = blocks * pairs * pair           # where the input's rows go, after the weights
        # the weight, as int16 pairs of terms per channel: a block's channels side by side
        for b, ch in T.grid(blocks, block):
            if b * block + ch < c:
                for jj, e in T.grid(j, tile):
                    packed[(b * pairs + (jj * tile + e) // 2) * pair + ch * 2 + (jj * tile + e) % 2] = \
                        T.Cast("int16", source[ws[b * block + ch, jj] + e])
                if j * tile % 2 == 1:     # an odd number of terms: the last pair's second is 0
                    packed[(b * pairs + pairs - 1) * pair + ch * 2 + 1] = T.int16(0)
            else:
                for t2 in range(pairs * 2):
                    packed[(b * pairs + t2 // 2) * pair + ch * 2 + t2 % 2] = T.int16(0)
        for r0 in range((m + rows_at_once - 1) // rows_at_once):
            # the next rows of the input, as int16 (rows past the last: zeros)
            for i in range(rows_at_once):
                if r0 * rows_at_once + i < m:
                    for jj in range(j):
                        for e in T.vectorized(tile):
                            packed[panel + i * pairs * 2 + jj * tile + e] = T.Cast(
                                "int16", source[xs[r0 * rows_at_once + i, jj] + e])
                    if j * tile % 2 == 1:     # an odd number of terms: the last pair's second is 0
                        packed[panel + i * pairs * 2 + pairs * 2 - 1] = T.int16(0)
                else:
                    for t2 in range(pairs * 2):
                        packed[panel + i * pairs * 2 + t2] = T.int16(0)
            for b, k0 in T.grid(blocks, (pairs + _GEMM_PAIRS - 1) // _GEMM_PAIRS):
                for i in T.unroll(rows_at_once):
                    for ch in T.vectorized(block):
                        acc[i * block + ch] = 0
                for t2 in range(k0 * _GEMM_PAIRS, T.min(pairs, k0 * _GEMM_PAIRS + _GEMM_PAIRS)):
                    for i in T.unroll(rows_at_once):
                        for v in T.unroll(2):
                            # a pair of input terms times each channel's pair, summed: 2 * lanes
                            # products (each at most 2**14) in one multiply-add, exact in int32
                            acc[T.ramp(i * block + v * lanes, 1, lanes)] = \
                                acc[T.ramp(i * block + v * lanes, 1, lanes)] + T.call_llvm_pure_intrin(
                                    T.llvm_lookup_intrinsic_id(madd),
                                    T.reinterpret(T.broadcast(T.reinterpret(
                                        packed.vload([panel + i * pairs * 2 + t2 * 2], "int16x2"), dtype="int32"),
                                        lanes), dtype=f"int16x{2 * lanes}"),
                                    packed.vload([(b * pairs + t2) * pair + v * 2 * lanes], f"int16x{2 * lanes}"),
                                    dtype=f"int32x{lanes}")
                # added to what is there (int32 wraps: the int64 sum truncated), or to 0 (keep 0)
                # for the first part of the terms
                kept = T.if_then_else(k0 > 0, T.int64(1), keep)
                for i in range(rows_at_once):
                    if r0 * rows_at_once + i < m:
                        if b * block + block <= c:
                            for ch in T.vectorized(block):
                                out[base + (r0 * rows_at_once + i) * ld + b * block + ch] = T.Cast(
                                    "int32", T.Cast("int64", acc[i * block + ch]) + T.Cast(
                                        "int64", out[base + (r0 * rows_at_once + i) * ld + b * block + ch]) * kept)
                        else:
                            for ch in range(c - b * block):
                                out[base + (r0 * rows_at_once + i) * ld + b * block + ch] = T.Cast(
                                    "int32", T.Cast("int64", acc[i * block + ch]) + T.Cast(
                                        "int64", out[base + (r0 * rows_at_once + i) * ld + b * block + ch]) * kept)

    def copy_runs(src_dtype: str, dst_dtype: str):
        def cast(value, saturate):
            if src_dtype == "int8":
                return T.Cast(dst_dtype, value)     # (INP's or WGT's int8 values, exact in float32)
            return T.Cast(dst_dtype, T.if_then_else(saturate != 0, T.max(T.min(value, 127), -128), value))

        @T.prim_func
        def copy(a_source: T.handle, a_starts: T.handle, a_steps: T.handle, a_to: T.handle,
                 a_lengths: T.handle, a_target: T.handle, step: T.int64, saturate: T.int32):
            T.func_attr({"global_symbol": f"copy_runs_{src_dtype}_{dst_dtype}", "tirx.noalias": True})
            n, r, m = T.int64(), T.int64(), T.int64()
            source = T.match_buffer(a_source, (n,), src_dtype, align=1)
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
        return copy

    copies = {f"copy_runs_{a}_{b}": copy_runs(a, b) for a, b in (("int32", "int8"), ("int32", "int32"),
                                                                   ("int8", "float32"))}
    return tvm.compile(tvm.IRModule({"tap_sum": tap_sum, "scaled_rows": scaled_rows, "alu_chain": alu_chain,
                                     "gemm": gemm, **copies}), target=_target(cpu)).jit()
