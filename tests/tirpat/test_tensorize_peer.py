"""tirpat against ``Schedule.tensorize`` on TVM's own tensorize tests, built end to end.

Every ``tensorize`` call of TVM's tensorize tests (apache/tvm ``tests/python/s_tir``:
``schedule/test_tir_schedule_tensorize.py``, ``..._tensorize_ldmatrix_mma_numeric.py``,
``..._tensorize_mfma_numeric.py``, ``dlight/test_gpu_matmul_tensorize.py``,
``meta_schedule/test_meta_schedule_mma_tensorize.py`` and
``..._postproc_rewrite_tensorize.py``), rewritten here: each case's schedule is run as
written and with its ``tensorize`` calls recorded instead of applied
(``tirpat.testing.intrin.replay``). The recorded calls become ``from_module`` rules (the
intrinsic's desc and impl, each taking the sites that store to the buffers tensorize was
pointed at), registered as a tirpat pipeline, and the schedule without the calls is built
through it. The two builds are compared:

- on this CPU (llvm), by running both on random inputs, with the C externs of TVM's test
  intrinsics compiled here; a refused site is checked against TVM's build of the schedule
  without intrinsics;
- for other targets (CUDA, ROCm, Metal, Arm, Hexagon), on the generated source (no device:
  nvcc and the ROCm linker are stubbed), debug metadata aside;
- where tensorize's build fails, on TVM's error and on the module TVM failed on.

``EXPECTED`` says what each case must give; a disagreement is a refusal that ``explain``
justifies, listed in docs/tensor-intrinsics.md ("tensorize's own tests").
"""

import ctypes
import importlib
import itertools
import pathlib
import re
import subprocess

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir, te, tirx
from tvm.script import tirx as T

import tirpat as tp
from tirpat.testing.intrin import replay

from tvm.s_tir import dlight as dl  # noqa: E402  isort: skip
from tvm.testing.tir import mfma_schedule, mma_schedule  # noqa: E402  isort: skip

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "tensor-intrinsics.md"

# TVM's TensorIntrins are named here by the names they are registered under (the values of
# tvm.s_tir.tensor_intrin's *_INTRIN constants, quirks included), which is what tensorize
# looks them up by, and its layout functions through tvm_layout: importing tensor_intrin
# parses ~600 TVMScript functions (~40 s), and every xdist worker collects every test file,
# so collection must not import it. The fixture below does, once, in the worker that runs
# this file.


@pytest.fixture(scope="module")
def tensor_intrins():
    """Registers TVM's TensorIntrins, so that tensorize finds them by name."""
    from tvm.s_tir.tensor_intrin import arm_cpu, cuda, hexagon, rocm, x86  # noqa: F401


def tvm_layout(name):
    """TVM's layout function ``tvm.s_tir.tensor_intrin.<name>`` (``"cuda.shared_..."``),
    imported when first called, which is when a schedule runs (never at collection)."""
    module, attr = name.split(".")

    def layout(i, j):
        return getattr(importlib.import_module(f"tvm.s_tir.tensor_intrin.{module}"), attr)(i, j)

    return layout


@tvm.register_global_func("tvm_callback_cuda_compile", override=True)
def _no_nvcc(code, *_):  # CUDA source only: nothing is compiled for a device
    return bytearray(code.encode())


@tvm.register_global_func("tvm_callback_rocm_link", override=True)
def _no_lld(obj):  # ROCm: the object is not linked into a code object
    return bytearray(obj)


@tvm.register_global_func("tvm_callback_rocm_bitcode_path", override=True)
def _no_device_libs(rocdl_dir=None):
    return []


# --------------------------------------------------------------------------------------
# The intrinsics TVM's schedule tests define for themselves (rewritten), with their externs
# --------------------------------------------------------------------------------------

def _mma_desc(annotated):
    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (16, 16), align=64, offset_factor=1)
        B = T.match_buffer(b, (16, 16), align=64, offset_factor=1)
        C = T.match_buffer(c, (16, 16), align=64, offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            for i, j, k in T.grid(16, 16, 16):
                with T.sblock("update"):
                    if annotated:
                        T.sblock_attr({"test_annotation": True})
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vj, vk]

    return desc


@T.prim_func(s_tir=True)
def mma_impl(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (16, 16), align=64, offset_factor=1)
    B = T.match_buffer(b, (16, 16), align=64, offset_factor=1)
    C = T.match_buffer(c, (16, 16), align=64, offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        T.evaluate(T.tvm_mma_sync(C.data, C.elem_offset // 256, A.data, A.elem_offset // 256,
                                  B.data, B.elem_offset // 256, C.data, C.elem_offset // 256, dtype="handle"))


@T.prim_func(s_tir=True)
def dot_desc(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (4,))
    B = T.match_buffer(b, (4,))
    C = T.match_buffer(c, ())
    with T.sblock("root"):
        T.reads(C[()], A[0:4], B[0:4])
        T.writes(C[()])
        for i in range(4):
            with T.sblock("update"):
                vi = T.axis.remap("R", [i])
                C[()] = C[()] + A[vi] * B[vi]


def _dot_impl(annotated):
    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (4,), offset_factor=1)
        B = T.match_buffer(b, (4,), offset_factor=1)
        C = T.match_buffer(c, (), offset_factor=1)
        with T.sblock("root"):
            T.reads(C[()], A[0:4], B[0:4])
            T.writes(C[()])
            if annotated:
                T.sblock_attr({"test_annotation": True})
            T.evaluate(T.call_extern("vec4add", C.data, C.elem_offset, A.data, A.elem_offset, B.data, B.elem_offset,
                                     dtype="int32"))

    return impl


@T.prim_func(s_tir=True)
def outer_desc(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (16, 1), offset_factor=1)
    B = T.match_buffer(b, (16, 1), offset_factor=1)
    C = T.match_buffer(c, (16, 16), offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:1], B[0:16, 0:1])
        T.writes(C[0:16, 0:16])
        for i, j in T.grid(16, 16):
            with T.sblock("update"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = C[vi, vj] + A[vi, 0] * B[vj, 0]


@T.prim_func(s_tir=True)
def outer_impl(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (16, 1), offset_factor=1)
    B = T.match_buffer(b, (16, 1), offset_factor=1)
    C = T.match_buffer(c, (16, 16), offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:1], B[0:16, 0:1])
        T.writes(C[0:16, 0:16])
        T.evaluate(T.call_extern("outer_product", C.data, C.elem_offset, A.data, A.elem_offset, B.data, B.elem_offset,
                                 dtype="int32"))


def _decode_i4(val, pos):
    """The 4-bit field ``pos`` of ``val``, sign-extended and cast to float16."""
    field = (val >> (pos.astype("int32") * tirx.const(4, "int32"))) & tirx.const(15, "int32")
    return tirx.Cast("float16", (field << tirx.const(28, "int32")) >> tirx.const(28, "int32"))


@T.prim_func(s_tir=True)
def decode_desc(compressed: T.handle, decompressed: T.handle):
    Compressed = T.match_buffer(compressed, [1], dtype="int32", scope="local")
    Decompressed = T.match_buffer(decompressed, [8], dtype="float16", scope="local")
    with T.sblock("root"):
        T.reads(Compressed[0:1])
        T.writes(Decompressed[0:8])
        for i in T.grid(8):
            with T.sblock("decode"):
                vi = T.axis.remap("S", [i])
                Decompressed[vi] = _decode_i4(Compressed[vi // 8], vi % 8)


@T.prim_func(s_tir=True)
def decode_impl(compressed: T.handle, decompressed: T.handle):
    Compressed = T.match_buffer(compressed, [1], dtype="int32", scope="local")
    Decompressed = T.match_buffer(decompressed, [8], dtype="float16", scope="local")
    with T.sblock("root"):
        T.reads(Compressed[0:1])
        T.writes(Decompressed[0:8])
        T.call_extern("handle", "test_decode_i4s_to_f16", Compressed.data, Decompressed.data, 8)


for _name, _desc, _impl in [("peer_mma", _mma_desc(False), mma_impl), ("peer_annotated_mma", _mma_desc(True), mma_impl),
                            ("peer_dot", dot_desc, _dot_impl(False)), ("peer_dot_annotated", dot_desc, _dot_impl(True)),
                            ("peer_outer", outer_desc, outer_impl), ("peer_decode", decode_desc, decode_impl)]:
    s_tir.TensorIntrin.register(_name, _desc, _impl, override=True)

# What TVM's test intrinsics compute, as the C functions their impls call. outer_product
# takes its operands as compact 16-element vectors and a compact 16x16 tile, as its impl's
# undeclared strides say.
EXTERNS_C = r"""
#include <stdint.h>
int32_t vec4add(float* c, int32_t co, float* a, int32_t ao, float* b, int32_t bo) {
  float s = 0.0f;
  for (int i = 0; i < 4; ++i) s += a[ao + i] * b[bo + i];
  c[co] += s;
  return 0;
}
int32_t outer_product(float* c, int32_t co, float* a, int32_t ao, float* b, int32_t bo) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) c[co + i * 16 + j] += a[ao + i] * b[bo + j];
  return 0;
}
"""


@pytest.fixture(scope="module")
def externs(tmp_path_factory):
    """The C externs, compiled and loaded (RTLD_GLOBAL) before any module calls them."""
    folder = tmp_path_factory.mktemp("externs")
    (folder / "externs.c").write_text(EXTERNS_C)
    lib = folder / "libexterns.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(folder / "externs.c")], check=True)
    return ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


# --------------------------------------------------------------------------------------
# The workloads and schedules (rewritten from TVM's tests)
# --------------------------------------------------------------------------------------

@T.prim_func(s_tir=True)
def matmul_128(A: T.Buffer((128, 128), "float32"), B: T.Buffer((128, 128), "float32"),
               C: T.Buffer((128, 128), "float32")):
    for i, j, k in T.grid(128, 128, 128):
        with T.sblock("update"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vj, vk]


@T.prim_func(s_tir=True)
def annotated_matmul_128(A: T.Buffer((128, 128), "float32"), B: T.Buffer((128, 128), "float32"),
                         C: T.Buffer((128, 128), "float32")):
    for i, j, k in T.grid(128, 128, 128):
        with T.sblock("update"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            T.sblock_attr({"test_annotation": True})
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vj, vk]


@T.prim_func(s_tir=True)
def matmul_i64(A: T.Buffer((T.int64(128), T.int64(128)), "float32"), B: T.Buffer((T.int64(128), T.int64(128)), "float32"),
               C: T.Buffer((T.int64(128), T.int64(128)), "float32")):
    for i_0, j_0 in T.grid(T.int64(8), T.int64(8)):
        for i_1_init, j_1_init in T.grid(T.int64(16), T.int64(16)):
            with T.sblock("init"):
                vi = T.axis.spatial(T.int64(128), i_0 * T.int64(16) + i_1_init)
                vj = T.axis.spatial(T.int64(128), j_0 * T.int64(16) + j_1_init)
                C[vi, vj] = T.float32(0)
        for k_0, i_1, j_1, k_1 in T.grid(T.int64(8), T.int64(16), T.int64(16), T.int64(16)):
            with T.sblock("update"):
                vi = T.axis.spatial(T.int64(128), i_0 * T.int64(16) + i_1)
                vj = T.axis.spatial(T.int64(128), j_0 * T.int64(16) + j_1)
                vk = T.axis.reduce(T.int64(128), k_0 * T.int64(16) + k_1)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vj, vk]


@T.prim_func(s_tir=True)
def batch_matmul_128(A: T.Buffer((16, 128, 128), "float32"), B: T.Buffer((16, 128, 128), "float32"),
                     C: T.Buffer((16, 128, 128), "float32")):
    for n, i, j in T.grid(16, 128, 128):
        with T.sblock("init"):
            vn, vi, vj = T.axis.remap("SSS", [n, i, j])
            C[vn, vi, vj] = T.float32(0)
    for n, i, j, k in T.grid(16, 128, 128, 128):
        with T.sblock("update"):
            vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
            C[vn, vi, vj] = C[vn, vi, vj] + A[vn, vi, vk] * B[vn, vj, vk]


def tile_16x16x16(func, intrin, decompose=True):
    def schedule():
        s = s_tir.Schedule(func)
        update = s.get_sblock("update")
        i, j, k = s.get_loops(update)[-3:]
        io, ii = s.split(i, [None, 16])
        jo, ji = s.split(j, [None, 16])
        ko, ki = s.split(k, [None, 16])
        s.reorder(io, jo, ko, ii, ji, ki)
        if decompose:
            s.decompose_reduction(update, ko)
        s.tensorize(ii, intrin)
        return s

    return schedule


def batch_dot(intrin, func=None):
    def schedule():
        s = s_tir.Schedule(func or batch_matmul_128)
        update = s.get_sblock("update")
        ko, ki = s.split(s.get_loops(update)[-1], [None, 4])
        if func is not None:
            s.decompose_reduction(update, ko)
        s.tensorize(ki, intrin)
        return s

    return schedule


def batch_outer():
    s = s_tir.Schedule(batch_matmul_128)
    update = s.get_sblock("update")
    _, i, j, k = s.get_loops(update)
    io, ii = s.split(i, [None, 16])
    jo, ji = s.split(j, [None, 16])
    s.reorder(io, jo, k, ii, ji)
    s.tensorize(ii, "peer_outer")
    return s


def packed_dense(lhs, rhs, acc="int32", m=128):
    X = te.placeholder((m, 128), lhs, name="X")
    W = te.placeholder((128, 128), rhs, name="W")
    k = te.reduce_axis((0, 128), name="k")
    C = te.compute((m, 128), lambda i, j: te.sum(X[i, k].astype(acc) * W[j, k].astype(acc), axis=k), name="compute")
    return te.create_prim_func([X, W, C])


def dot_tiles(intrin, lhs, rhs, rows, depth):
    """W packed as [j // rows, k // depth, j % rows, k % depth]; j split by rows, k by depth."""

    def schedule():
        s = s_tir.Schedule(packed_dense(lhs, rhs))
        block = s.get_sblock("compute")
        s.transform_layout(block, "W", lambda i, j: [i // rows, j // depth, i % rows, j % depth])
        _, j, k = s.get_loops(block)
        _, ji = s.split(j, [None, rows])
        ko, ki = s.split(k, [None, depth])
        s.reorder(ko, ji, ki)
        s.decompose_reduction(block, ko)
        s.tensorize(ji, intrin)
        return s

    return schedule


def dp4a(lhs, rhs, acc, intrin):
    """TVM's dp4a test, with the tile sizes its sample_perfect_tile draws fixed and the
    block/thread loops bound (the test never builds)."""

    def schedule():
        s = s_tir.Schedule(packed_dense(lhs, rhs, acc))
        block = s.get_sblock("compute")
        i, j, k = s.get_loops(block)
        by, ty, yi = s.split(i, [4, 8, 4])
        bx, tx, xi = s.split(j, [4, 8, 4])
        ko, ki = s.split(k, [None, 4])
        ko, kt = s.split(ko, [8, 4])
        s.reorder(by, bx, ty, tx, yi, xi)
        local = s.cache_write(block, 0, "local")
        s.reverse_compute_at(local, tx)
        for index in (0, 1):
            s.compute_at(s.cache_read(block, index, "shared"), ko, True)
        for loop, thread in ((by, "blockIdx.y"), (bx, "blockIdx.x"), (ty, "threadIdx.y"), (tx, "threadIdx.x")):
            s.bind(loop, thread)
        s.decompose_reduction(block, ko)
        s.tensorize(ki, intrin)
        return s

    return schedule


@T.prim_func(s_tir=True)
def decode_kernel():
    B_decode_local = T.sblock_alloc_buffer((16384, 16384), "float16", scope="local")
    B_local = T.sblock_alloc_buffer((16384, 2048), "int32", scope="local")
    for ax0_0 in T.thread_binding(8192, thread="blockIdx.x"):
        for ax0_1 in T.thread_binding(2, thread="threadIdx.y"):
            for ax1_0 in range(32):
                for ax1_1 in T.thread_binding(64, thread="threadIdx.x"):
                    for ax0, ax1 in T.grid(1, 8):
                        with T.sblock("B_decode_local"):
                            v0 = T.axis.spatial(16384, ax0_0 * 2 + ax0_1 + ax0)
                            v1 = T.axis.spatial(16384, ax1_0 * 512 + ax1_1 * 8 + ax1)
                            T.reads(B_local[v0, v1 // 8])
                            T.writes(B_decode_local[v0, v1])
                            B_decode_local[v0, v1] = T.Cast("float16", T.shift_right(T.shift_left(T.bitwise_and(
                                T.shift_right(B_local[v0, v1 // 8], v1 % 8 * 4), 15), 28), 28))


def decode():
    s = s_tir.Schedule(decode_kernel)
    s.tensorize(s.get_loops(s.get_sblock("B_decode_local"))[-1], "peer_decode")
    return s


# -- ldmatrix/mma and mfma: TVM's own schedule helpers (tvm.testing.tir), on TVM's factors --

def gemm(m, n, k, in_dtype, out_dtype, b_transposed):
    A = te.placeholder((m, k), in_dtype, name="A")
    B = te.placeholder((n, k) if b_transposed else (k, n), in_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")

    def cast(v):
        return v if in_dtype == out_dtype else tirx.Cast(out_dtype, v)

    C = te.compute((m, n), lambda i, j: te.sum(cast(A[i, r]) * cast(B[(j, r) if b_transposed else (r, j)]), axis=[r]),
                   name="C")
    return te.create_prim_func([A, B, C])


def tiled_layout(layout, rows, cols):
    """An index map: tile (rows, cols), then ``layout`` inside the tile (ints made IntImms)."""
    def index_map(i, j):
        inner = [tirx.const(x, "int32") if isinstance(x, int) else x for x in layout(i % rows, j % cols)]
        return (i // rows, j // cols, *inner)

    return index_map


L16 = tiled_layout(tvm_layout("cuda.shared_16x16_to_ldmatrix_32x8_layout"), 16, 16)
L16x32 = tiled_layout(tvm_layout("cuda.shared_16x32_to_ldmatrix_32x16_layout"), 16, 32)
L32x16 = tiled_layout(tvm_layout("cuda.shared_32x16_to_ldmatrix_32x16_layout"), 32, 16)
F16_F32 = ([4, 8, 2, 4, 1], [1, 64, 2, 1, 2], [128, 2, 1])
F16_F16 = ([16, 2, 1, 4, 2], [16, 2, 2, 1, 4], [128, 2, 1])
I8 = ([1, 32, 1, 4, 2], [8, 4, 4, 2, 1], [32, 2, 2])
MMA = {  # the intrinsics: ldmatrix A, ldmatrix B, mma, fill, store
    "f16f16f32": (16, "float16", "float32", False, F16_F32, L16, L16, L16, "mma_ldmatrix_f16_a",
                  "mma_ldmatrix_f16_b", "mma_f16f16f32", "mma_fill_16x16_f32", "mma_store_16x16_f32_global_"),
    "f16f16f32_trans": (16, "float16", "float32", True, F16_F32, L16, L16, L16, "mma_ldmatrix_f16_a",
                        "mma_ldmatrix_f16_b_trans", "mma_f16f16f32_trans_b", "mma_fill_16x16_f32",
                        "mma_store_16x16_f32_global_"),
    "f16f16f16": (16, "float16", "float16", False, F16_F16, L16, L16, L16, "mma_ldmatrix_f16_a",
                  "mma_ldmatrix_f16_b", "mma_f16f16f16", "mma_fill_16x16_f16", "mma_store_16x16_f16_global_"),
    "f16f16f16_trans": (16, "float16", "float16", True, F16_F16, L16, L16, L16, "mma_ldmatrix_f16_a",
                        "mma_ldmatrix_f16_b_trans", "mma_f16f16f16_trans_b", "mma_fill_16x16_f16",
                        "mma_store_16x16_f16_global_"),
    "i8i8i32": (32, "int8", "int32", False, I8, L16x32, L32x16, L16, "mma_ldmatrix_i8_a", "mma_ldmatrix_i8_b",
                "mma_i8i8i32", "mma_fill_16x16_i32", "mma_store_16x16_i32_global_"),
    "i8i8i32_trans": (32, "int8", "int32", True, I8, L16x32, L16x32, L16, "mma_ldmatrix_i8_a",
                      "mma_ldmatrix_i8_b_trans", "mma_i8i8i32_trans_b", "mma_fill_16x16_i32",
                      "mma_store_16x16_i32_global_"),
    "e4m3e4m3f32_trans": (32, "float8_e4m3fn", "float32", True, I8, L16x32, L16x32, L16, "mma_ldmatrix_e4m3_a",
                          "mma_ldmatrix_e4m3_b_trans", "mma_e4m3e4m3f32_trans_b", "mma_fill_16x16_f32",
                          "mma_store_16x16_f32_global_"),
    "e5m2e5m2f32_trans": (32, "float8_e5m2", "float32", True, I8, L16x32, L16x32, L16, "mma_ldmatrix_e5m2_a",
                          "mma_ldmatrix_e5m2_b_trans", "mma_e5m2e5m2f32_trans_b", "mma_fill_16x16_f32",
                          "mma_store_16x16_f32_global_"),
}


def mma(name):
    k_inner, din, dout, bt, (fi, fj, fk), la, lb, lc, *intrins = MMA[name]
    return lambda: mma_schedule(gemm(4096, 4096, 4096, din, dout, bt), k_inner, din, bt, fi, fj, fk, la, lb, lc,
                                *intrins)


M16 = ([1, 8, 2, 4, 1], [1, 16, 2, 1, 2], [32, 2, 1])
MFMA = {  # the layouts of A and B, then the intrinsics: load A, load B, mfma, fill, store
    "i8i8i32_m16n16k16": (16, "int8", "int32", M16, "shared_16x16_to_local_64x4_layout_A",
                          "shared_16x16_to_local_64x4_layout_B", "rocm_mfma_load_16x16_a_shared_s8",
                          "rocm_mfma_load_b_16x16_shared_s8", "rocm_mfma_s8s8s32", "ROCM_mfma_fill_16x16_i32",
                          "rocm_mfma_store_16x16_s32"),
    "f16f16f32_m16n16k16": (16, "float16", "float32", M16, "shared_16x16_to_local_64x4_layout_A",
                            "shared_16x16_to_local_64x4_layout_B", "rocm_mfma_load_16x16_a_shared_f16",
                            "rocm_mfma_load_b_16x16_shared_f16", "rocm_mfma_f16f16f32", "ROCM_mfma_fill_16x16_f32",
                            "rocm_mfma_store_16x16_f32"),
    "f32f32f32_m16n16k4": (4, "float32", "float32", ([4, 2, 1, 4, 2], [4, 2, 2, 1, 4], [128, 2, 1]),
                           "shared_16x4_to_local_64x1_layout_A", "shared_4x16_to_local_64x1_layout_B",
                           "rocm_mfma_load_16x4_a_shared_f32", "rocm_mfma_load_b_16x4_shared_f32",
                           "rocm_mfma_f32f32f32", "ROCM_mfma_fill_16x16_f32", "rocm_mfma_store_16x16_f32"),
}


def mfma(name):
    k_inner, din, dout, (fi, fj, fk), la, lb, *intrins = MFMA[name]
    layouts = [tiled_layout(tvm_layout(f"rocm.{layout}"), 16, 16)
               for layout in (la, lb, "shared_16x16_to_local_64x4_layout_C")]
    return lambda: mfma_schedule(gemm(1024, 1024, 1024, din, dout, False), k_inner, din, False, fi, fj, fk,
                                 *layouts, *intrins)


# -- dlight's Matmul rule, on the workloads of its tensorize tests ---------------------------

def dlight(workload, target):
    def schedule():
        with tvm.target.Target(target):
            return dl.ApplyDefaultSchedule(dl.gpu.Matmul())(tvm.IRModule({"main": workload()}))

    return schedule


def dl_matmul(din, acc):
    return lambda: packed_dense(din, din, acc, m=256).with_attr("tirx.noalias", True)


def dl_epilogue():
    n = te.var("n")
    q = te.placeholder((4096, 256), "uint32", name="lv686")
    scale = te.placeholder((4096, 64), "float16", name="lv687")
    x = te.placeholder((1, n, 2048), "float16", name="lv42")
    residual = te.placeholder((1, n, 4096), "float16", name="lv3")
    four = tirx.const(4, "uint32")
    w = te.compute((4096, 2048), lambda i, j: (tirx.Cast("float16", (q[i, j // 8] >> (tirx.Cast("uint32", j % 8) * four))
                                                         & tirx.const(15, "uint32")) - tirx.const(7, "float16"))
                   * scale[i, j // 32], name="decode")
    k = te.reduce_axis((0, 2048), name="k")
    mm = te.compute((1, n, 4096), lambda b, i, j: te.sum(x[b, i, k] * w[j, k], axis=k), name="NT_matmul")
    half = te.compute((1, n, 4096), lambda b, i, j: residual[b, i, j] * tirx.const(0.5, "float16"), name="T_divide")
    out = te.compute((1, n, 4096), lambda b, i, j: half[b, i, j] + mm[b, i, j], name="T_add")
    return te.create_prim_func([q, scale, x, residual, out]).with_attr("tirx.noalias", True)


def dl_int8_3d2d_dyn():
    m = te.var("m")
    A = te.placeholder((1, m, 22016), "int8", name="A")
    B = te.placeholder((4096, 22016), "int8", name="B")
    k = te.reduce_axis((0, 22016), name="k")
    C = te.compute((1, m, 4096), lambda b, i, j: te.sum(A[b, i, k].astype("int32") * B[j, k].astype("int32"), axis=k),
                   name="matmul")
    return te.create_prim_func([A, B, C]).with_attr("tirx.noalias", True)


def dl_metal(quantized):
    def workload():
        batch = te.var("batch_size")
        A = te.placeholder((batch, 1, 4096), "float16", name="A")
        if quantized:
            B0 = te.placeholder((28672, 512), "uint32", name="B0")
            B1 = te.placeholder((28672, 128), "float16", name="B1")
            nibble = te.compute((28672, 4096), lambda i, j: tirx.Cast(
                "float16", (B0[i, j // 8] >> tirx.Cast("uint32", j % 8 * 4)) & tirx.const(15, "uint32")), name="compute")
            B = te.compute((28672, 4096), lambda i, j: (nibble[i, j] - tirx.const(7, "float16")) * B1[i, j // 32],
                           name="dequantize")
            args = [B0, B1, A]
        else:
            B = te.placeholder((28672, 4096), "float16", name="B")
            args = [A, B]
        k = te.reduce_axis((0, 4096), name="k")
        Cm = te.compute((batch, 1, 28672), lambda b, i, j: te.sum(A[b, i, k] * B[j, k], axis=k), name="C")
        return te.create_prim_func(args + [Cm])

    return workload


# -- meta_schedule: the mma trace of its mma tensorize test, and the RewriteTensorize postproc --

def ms_mma(out_dtype):
    acc = "f16" if out_dtype == "float16" else "f32"

    def schedule():
        s = s_tir.Schedule(gemm(4096, 4096, 4096, "float16", out_dtype, False))
        block = s.get_sblock("C")
        s.annotate(block, "meta_schedule.tiling_structure", "SSSRRSRS")
        c_write = s.reindex(block, ("write", 0))
        a_read = s.reindex(block, ("read", 0))
        b_read = s.reindex(block, ("read", 1))
        s.transform_layout(block, ("read", 0), lambda vi, vk: (vi, vk), assume_injective_transform=True)
        s.transform_layout(block, ("read", 1), lambda vj, vk: (vk, vj), assume_injective_transform=True)
        s.transform_layout(block, ("write", 0), lambda vi, vj: (vi, vj), assume_injective_transform=True)
        s.transform_block_layout(c_write, lambda vi, vj: (vi, vj))
        s.transform_block_layout(a_read, lambda vi, vk: (vi, vk))
        s.transform_block_layout(b_read, lambda vj, vk: (vk, vj))
        s.transform_block_layout(block, lambda vi, vj, vk: (vi, vj, vk))
        i, j, k = s.get_loops(block)
        s.split(k, [None, 8])
        s.split(j, [None, 8])
        s.split(i, [None, 16])
        i_o, i_i, j_o, j_i, k_o, k_i = s.get_loops(block)
        s.reorder(j_o, k_o, i_i, j_i, k_i)
        outer = s.blockize(i_i)
        s.annotate(outer, "meta_schedule.auto_tensorize", f"mma_sync_m16n8k8_f16f16{acc}")
        s.annotate(outer, "meta_schedule.auto_tensorize_init", f"mma_init_m16n8k8_{acc}")
        s.annotate(outer, "warp_execution", 1)
        i, j, k = s.get_loops(outer)
        i0, i1, i2, i3, i4 = s.split(i, [2, 16, 4, 1, 2])
        j0, j1, j2, j3, j4 = s.split(j, [2, 16, 4, 1, 4])
        k0, k1, k2 = s.split(k, [128, 1, 4])
        s.reorder(i0, j0, i1, j1, i2, j2, k0, k1, i3, j3, k2, i4, j4)
        s.bind(s.fuse(i0, j0), "blockIdx.y")
        s.bind(s.fuse(i1, j1), "blockIdx.x")
        ty = s.fuse(i2, j2)
        s.bind(ty, "threadIdx.y")
        s.write_at(ty, outer, 0, "m16n8k8.matrixC")
        s.reverse_compute_inline(c_write)
        shared = []
        for index, g2s in ((0, "g2s_A"), (1, "g2s_B")):
            stage = s.read_at(k0, outer, index, "shared.dyn")
            s.annotate(stage, "permuted_layout", g2s)
            shared.append(stage)
        for index, operand, (inner_split, outer_split) in ((0, "A", (8, 32)), (1, "B", (32, 8))):
            frag = s.cache_read(outer, index, f"m16n8k8.matrix{operand}")
            s.compute_at(frag, k1, preserve_unit_loops=True)
            *_, row, col = s.get_loops(frag)
            _, col_in = s.split(col, [None, inner_split])
            _, row_in = s.split(row, [None, outer_split])
            s.reorder(s.get_loops(frag)[-2], row_in, col_in)
            tile = s.blockize(row_in)
            s.annotate(tile, "meta_schedule.auto_tensorize", f"mma_load_m16n8k8_f16_{operand}_shared_dyn")
            s.annotate(tile, "permuted_layout", f"s2l_{operand}")
        for stage in shared:
            producer, = s.get_producers(stage)
            s.compute_inline(producer)
            s.storage_align(stage, 0, axis=-2, factor=32, offset=8)
            s.annotate(stage, "vector_bytes", 16)
        s.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        s.annotate(k1, "software_pipeline_order", [0, 1, 2])
        s.annotate(k0, "software_pipeline_async_stages", [0])
        s.annotate(k0, "software_pipeline_stage", [0, 0, 1, 2, 2])
        s.annotate(k0, "software_pipeline_order", [0, 1, 3, 2, 4])
        s.enter_postproc()
        update = s.get_sblock("C_o")
        init = s.decompose_reduction(update, s.get_loops(update)[3])
        s.unannotate(update, "meta_schedule.auto_tensorize_init")
        s.unannotate(init, "meta_schedule.auto_tensorize_init")
        s.unannotate(init, "meta_schedule.auto_tensorize")
        for name, intrin in (("C_o_init", f"mma_init_m16n8k8_{acc}"),
                             ("A_reindex_shared.dyn_m16n8k8.matrixA_o", "mma_load_m16n8k8_f16_A_shared_dyn"),
                             ("B_reindex_shared.dyn_m16n8k8.matrixB_o", "mma_load_m16n8k8_f16_B_shared_dyn"),
                             ("C_o_update", f"mma_sync_m16n8k8_f16f16{acc}")):
            tile = s.get_sblock(name)
            if name != "C_o_init":
                s.unannotate(tile, "meta_schedule.auto_tensorize")
            s.tensorize(tile, intrin)
        return s

    return schedule


def rewrite_tensorize(s, decompose):
    """meta_schedule's RewriteReductionBlock and RewriteTensorize postprocs (C++, which calls
    tensorize directly), as Python: the annotated reduction's init is split off at the loop
    ``decompose`` names (its copy of the annotation cleared), then each block annotated with
    an intrinsic is tensorized with it."""
    init = s.decompose_reduction(*decompose)
    s.unannotate(init, "meta_schedule.auto_tensorize")
    annotated = []

    def visit(block):
        intrin = s.get(block).annotations.get("meta_schedule.auto_tensorize")
        if intrin is not None:
            annotated.append((s.get(block).name_hint, str(intrin)))
        for child in s.get_child_blocks(block):
            visit(child)

    visit(s.get_sblock("root"))
    for name, intrin in annotated:
        block = s.get_sblock(name)
        s.unannotate(block, "meta_schedule.auto_tensorize")
        if intrin:
            s.tensorize(block, intrin)
    return s


def conv2d_nchwc_vnni():
    """The tiled conv2d_NCHWc of the postproc test, its 16x4 tile annotated for VNNI."""
    data = te.placeholder((1, 4, 56, 56, 16), "uint8", name="placeholder")
    kernel = te.placeholder((16, 4, 1, 1, 4, 16, 4), "int8", name="placeholder_1")
    ic_outer = te.reduce_axis((0, 4), name="ic_outer")
    ic_f = te.reduce_axis((0, 4), name="ic_f_inner")
    ic_s = te.reduce_axis((0, 4), name="ic_s_inner")
    conv = te.compute((1, 16, 56, 56, 16), lambda n, oc, oh, ow, ob: te.sum(
        data[n, ic_outer, oh, ow, ic_f * 4 + ic_s].astype("int32")
        * kernel[oc, ic_outer, 0, 0, ic_f, ob, ic_s].astype("int32"), axis=[ic_outer, ic_f, ic_s]),
        name="conv2d_NCHWc_int8")

    def schedule():
        s = s_tir.Schedule(te.create_prim_func([data, kernel, conv]))
        block = s.get_sblock("conv2d_NCHWc_int8")
        n, oc, oh, ow, ob, ico, icf, ics = s.get_loops(block)
        oc0, oc1 = s.split(oc, [4, 4])
        oh0, oh1, oh2 = s.split(oh, [2, 7, 4])
        ow0, ow1 = s.split(ow, [14, 4])
        s.reorder(oc0, oh0, ow0, ico, icf, oc1, oh1, ow1, ob, ics)
        tile = s.blockize(ob)
        s.annotate(tile, "meta_schedule.auto_tensorize", "dot_16x4_vnni")
        return rewrite_tensorize(s, decompose=(tile, ico))

    return schedule


def dense_dp4a():
    """The dense of the postproc test: vthread, shared staging, a dp4a-annotated k tile."""

    def schedule():
        s = s_tir.Schedule(packed_dense("int8", "int8"))
        block = s.get_sblock("compute")
        i, j, k = s.get_loops(block)
        i0, i1, i2 = s.split(i, [8, 4, 4])
        j0, jv, jt, j1 = s.split(j, [2, 2, 2, 16])
        k0, k1, k2, k3 = s.split(k, [2, 2, 8, 4])
        s.reorder(i0, j0, jv, jt, k0, k1, i1, j1, k2, i2, k3)
        s.bind(s.fuse(i0, j0), "blockIdx.x")
        s.bind(jv, "vthread.x")
        s.bind(jt, "threadIdx.x")
        local = s.cache_write(block, 0, "local")
        s.reverse_compute_at(local, jt)
        for index in (0, 1):
            s.compute_at(s.cache_read(block, index, "shared"), k0)
        tile = s.blockize(k3)
        s.annotate(tile, "meta_schedule.auto_tensorize", "dp4a_s8s8s32")
        return rewrite_tensorize(s, decompose=(tile, k0))

    return schedule


# --------------------------------------------------------------------------------------
# The cases and what each must give
# --------------------------------------------------------------------------------------

CPU = "llvm"
AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512"}
VNNI = {"kind": "llvm", "mcpu": "cascadelake"}
AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"]}
HEXAGON = {"kind": "llvm", "mtriple": "hexagon", "mcpu": "hexagonv68", "mattr": ["+hvxv68", "+hvx-length128b"]}
SM80 = {"kind": "cuda", "arch": "sm_80"}
SM89 = {"kind": "cuda", "arch": "sm_89"}
ROCM = {"kind": "rocm", "mcpu": "gfx90a"}
RTX2080 = "nvidia/geforce-rtx-2080-ti"

# Why tirpat declines a site tensorize takes: what explain() says.
STRIDES = "declares no strides and is used through a pointer"
ALLOCATED_INSIDE = "allocated inside this loop"


class Case:
    """One TVM test's schedule: its tensorize calls, where it is built, what must hold."""

    def __init__(self, test, schedule, target, calls, *, run=False, refused=None, early=False,
                 tensorize_fails=False, tensorize_wrong=False):
        self.test, self.schedule, self.target, self.calls = test, schedule, target, calls
        self.run = run                        # built for this CPU: run both builds
        self.refused = refused                # explain's reason when tirpat declines (a disagreement)
        self.early = early                    # the rules run in the early stage
        self.tensorize_fails = tensorize_fails  # TVM cannot build tensorize's schedule (tirpat's must still build)
        self.tensorize_wrong = tensorize_wrong  # tensorize's build computes something else (why tirpat refuses)

    def __repr__(self):
        return self.test


S = "schedule/test_tir_schedule_tensorize.py::"
CASES = [
    Case(S + "test_tensorize_matmul", tile_16x16x16(matmul_128, "peer_mma"), CPU, 1, run=True, refused=STRIDES,
         tensorize_fails=True),
    Case(S + "test_tensorize_batch_matmul", tile_16x16x16(batch_matmul_128, "peer_mma", decompose=False), CPU, 1,
         run=True, refused=STRIDES, tensorize_fails=True),
    Case(S + "test_tensorize_dot_product", batch_dot("peer_dot"), CPU, 1, run=True),
    Case(S + "test_tensorize_outer_product", batch_outer, CPU, 1, run=True, refused=STRIDES, tensorize_wrong=True),
    Case(S + "test_tensorize_with_annotation", tile_16x16x16(annotated_matmul_128, "peer_annotated_mma"), CPU, 1,
         run=True, refused=STRIDES, tensorize_fails=True),
    Case(S + "test_tensorize_intrinsic_with_annotation", batch_dot("peer_dot_annotated", matmul_128), CPU, 1,
         run=True),
    Case(S + "test_tensorize_vnni", dot_tiles("dot_16x4_vnni", "uint8", "int8", 16, 4), VNNI, 1,
         run=True),
    Case(S + "test_tensorize_avx512", dot_tiles("dot_16x4_avx512", "uint8", "int8", 16, 4), AVX512, 1,
         run=True),
    Case(S + "test_tensorize_arm_dot[sdot]", dot_tiles("dot_4x4_i8i8s32_sdot", "int8", "int8", 4, 4),
         AARCH64, 1),
    Case(S + "test_tensorize_arm_dot[neon]", dot_tiles("dot_4x4_i8i8s32_neon", "int8", "int8", 4, 4),
         AARCH64, 1),
    Case(S + "test_tensorize_vrmpy", dot_tiles("dot_32x4_u8u8i32_vrmpy", "uint8", "uint8", 32, 4), HEXAGON, 1),
    Case(S + "test_tensorize_vdmpy", dot_tiles("dot_product_32x2_i16i16i32_vdmpy", "int16", "int16", 32, 2), HEXAGON,
         1),
    Case(S + "test_tensorize_dp4a[sdot4]", dp4a("int8", "int8", "int32", "sdot4"), ROCM, 1),
    Case(S + "test_tensorize_dp4a[s8s8s32]", dp4a("int8", "int8", "int32", "dp4a_s8s8s32"), SM80, 1),
    Case(S + "test_tensorize_dp4a[s8u8s32]", dp4a("int8", "uint8", "int32", "dp4a_s8u8s32"), SM80, 1),
    Case(S + "test_tensorize_dp4a[u8s8s32]", dp4a("uint8", "int8", "int32", "dp4a_u8s8s32"), SM80, 1),
    Case(S + "test_tensorize_dp4a[u8u8u32]", dp4a("uint8", "uint8", "uint32", "dp4a_u8u8u32"), SM80, 1),
    Case(S + "test_tensorize_matmul_mixed_dtype", lambda: _tensorize_i64(), CPU, 1, run=True, refused=STRIDES,
         tensorize_fails=True),
    Case(S + "test_tensorize_arith_simplification", decode, SM80, 1, refused=ALLOCATED_INSIDE),
]
CASES += [Case(f"schedule/test_tir_schedule_tensorize_ldmatrix_mma_numeric.py[{name}]", mma(name), SM89, 5)
          for name in MMA]
CASES += [Case(f"schedule/test_tir_schedule_tensorize_mfma_numeric.py[{name}]", mfma(name), ROCM, 5) for name in MFMA]
D = "dlight/test_gpu_matmul_tensorize.py::"
CASES += [
    # dlight tries the f32 accumulator first; tensorize refuses it, then takes the f16 one
    Case(D + "test_matmul_tensorize", dlight(dl_matmul("float16", "float16"), RTX2080), RTX2080, 6),
    Case(D + "test_matmul_tensorize_epilogue", dlight(dl_epilogue, RTX2080), RTX2080, 6),
    Case(D + "test_matmul_int8_tensorize", dlight(dl_matmul("int8", "int32"), RTX2080), RTX2080, 5,
         tensorize_fails=True),
    Case(D + "test_matmul_int8_tensorize_3d2d_dyn", dlight(dl_int8_3d2d_dyn, RTX2080), RTX2080, 5,
         tensorize_fails=True),
    Case(D + "test_matmul_metal", dlight(dl_metal(False), "metal"), "metal", 5),
    Case(D + "test_matmul_metal_int4_quant", dlight(dl_metal(True), "metal"), "metal", 5),
]
M = "meta_schedule/"
CASES += [
    Case(M + "test_meta_schedule_mma_tensorize.py::test_f16f16f16_mma_gemm", ms_mma("float16"), SM80, 4, early=True),
    Case(M + "test_meta_schedule_mma_tensorize.py::test_f16f16f32_mma_gemm", ms_mma("float32"), SM80, 4, early=True),
    Case(M + "test_meta_schedule_postproc_rewrite_tensorize.py::test_rewrite_tensorize_conv2d_nchwc_vnni",
         conv2d_nchwc_vnni(), VNNI, 1, run=True),
    Case(M + "test_meta_schedule_postproc_rewrite_tensorize.py::test_rewrite_tensorize_dense_dp4a", dense_dp4a(), SM80,
         1),
]


def _tensorize_i64():
    s = s_tir.Schedule(matmul_i64)
    s.tensorize(s.get_loops(s.get_sblock("update"))[-3], "peer_mma")
    return s


# --------------------------------------------------------------------------------------
# Building and comparing
# --------------------------------------------------------------------------------------

@tvm.instrument.pass_instrument
class LastInput:
    """The module each pass was given, the last one kept: where a failing build failed."""

    def __init__(self):
        self.mod = None
        self.pass_name = None

    def run_before_pass(self, mod, info):
        self.mod, self.pass_name = mod, info.name


def build(mod, target, pipeline="default"):
    """``(executable, None, None)``, or ``(None, error line, (pass, its input))`` on failure."""
    last = LastInput()
    try:
        with tvm.transform.PassContext(instruments=[last]):
            return tvm.compile(mod, target=tvm.target.Target(target), tir_pipeline=pipeline), None, None
    except Exception as err:  # noqa: BLE001 - compared with the other build's failure
        lines = [re.sub(r", !dbg !\d+", "", l.strip()) for l in str(err).strip().splitlines() if l.strip()]
        return None, lines[-1] if lines else type(err).__name__, (last.pass_name, last.mod)


def source(ex) -> str:
    """The generated device (or LLVM) source, without LLVM's metadata and debug records."""
    text = ex.mod.imports[0].inspect_source() if ex.mod.imports else ex.mod.inspect_source("ll")
    text = re.sub(r", ![\w.]+ !\d+", "", text)
    return "\n".join(l for l in text.splitlines() if not l.startswith("!") and "#dbg_" not in l)


def random_args(func, rng):
    out = []
    for p in func.params:
        shape = [int(e) for e in p.shape]
        dtype = str(p.dtype)
        if dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            out.append(rng.integers(max(info.min, -100), min(info.max, 100), shape, dtype=dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def run(ex, func, args):
    tensors = [tvm.runtime.tensor(a) for a in args]
    ex["main"](*tensors)
    return [t.numpy() for t in tensors]


_names = itertools.count()


@pytest.fixture(scope="module")
def host_has_vnni():
    flags = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
    return "avx512bw" in flags, "avx512_vnni" in flags


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_tirpat_builds_what_tensorize_builds(case, tensor_intrins, externs, host_has_vnni):
    r = replay(case.schedule)
    assert len(r.calls) == case.calls, r.calls
    name = f"tests.peer.{next(_names)}"
    if case.early:
        tp.register_pipeline(name, [], early=r.rules)
    else:
        tp.register_pipeline(name, r.rules)
    ours, our_error, our_failure = build(r.plain, case.target, name)
    counts = dict(r.rules.report.counts)
    theirs, their_error, their_failure = build(r.tensorized, case.target)

    if case.refused is not None:
        # tirpat declines the site, and explain says why; its build is TVM's own build of the
        # schedule without intrinsics, so it must build (and on the CPU compute the workload)
        assert counts == {}, counts
        assert case.refused in str(tp.explain(r.rules, tp.lower(r.plain))), str(tp.explain(r.rules, tp.lower(r.plain)))
        assert our_error is None, our_error
        assert (their_error is not None) == case.tensorize_fails, their_error
        if case.run:
            reference, _, _ = build(r.plain, case.target)
            args = random_args(r.plain["main"], np.random.default_rng(0))
            want = run(reference, r.plain["main"], args)[-1]
            np.testing.assert_allclose(run(ours, r.plain["main"], args)[-1], want, rtol=1e-5, atol=1e-4)
            if theirs is not None:
                assert case.tensorize_wrong != np.allclose(run(theirs, r.plain["main"], args)[-1], want, rtol=1e-5,
                                                           atol=1e-4)
        return

    # every call tensorize accepted fires its rule; a call tensorize refused does not
    for call in r.calls:
        fired = counts.get(call.intrin, 0)
        assert (fired == 0) if call.refused else (fired >= 1), (call, counts)
    if their_error is not None:
        if case.tensorize_fails:
            assert our_error is None, our_error
            return
        # both fail the same way, on the same module
        assert our_error == their_error
        assert our_failure[0] == their_failure[0]
        assert tvm_ffi.structural_equal(our_failure[1], their_failure[1], map_free_vars=True), our_failure[0]
        return
    assert our_error is None, our_error
    assert not case.tensorize_fails
    runnable = case.run and (case.target != AVX512 or host_has_vnni[0]) and (case.target != VNNI or host_has_vnni[1])
    if runnable:
        args = random_args(r.plain["main"], np.random.default_rng(1))
        for a, b in zip(run(ours, r.plain["main"], args), run(theirs, r.plain["main"], args)):
            np.testing.assert_array_equal(a, b)
    else:
        assert source(ours) == source(theirs)


def test_agreement_is_at_least_90_percent_and_every_refusal_is_documented():
    total = sum(c.calls for c in CASES)
    refused = [c for c in CASES if c.refused is not None]
    agreed = total - sum(c.calls for c in refused)
    assert total == 116 and agreed / total >= 0.9, (agreed, total)
    docs = DOCS.read_text()
    for case in refused:
        assert case.test.split("::")[-1] in docs, case.test


def test_rules_that_tvm_must_see_before_its_layout_passes_say_so_outside_the_early_stage(tensor_intrins):
    """meta_schedule's mma schedule: after block lowering there is nothing left to match,
    since TVM's TransformMmaBufferLayout refuses the plain m16n8k8 accesses; the error says
    where the rules belong."""
    r = replay(ms_mma("float16"))
    tp.register_pipeline("tests.peer.late_mma", r.rules)
    with pytest.raises(Exception, match=r"(?s)TransformMmaBufferLayout.*no rule ran.*early=\["):
        tvm.compile(r.plain, target=tvm.target.Target(SM80), tir_pipeline="tests.peer.late_mma")
