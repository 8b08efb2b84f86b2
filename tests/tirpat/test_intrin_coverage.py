"""TVM's own TensorIntrins (x86 and arm_cpu) as ``Rewriter.from_module`` rules.

Each desc/impl pair becomes a rule; the target runs the desc on tiles of bigger buffers
(``tirpat.testing.intrin.tile_target``). The full list is in
``benchmarks/bench_intrin_coverage.py``.
"""

import pathlib

import numpy as np
import pytest
import tvm

import tirpat as tp
from tirpat.testing import run
from tirpat.testing.intrin import registered_intrins, tile_target, view_escapes

# dot products whose impls read a whole tile with one vector load (B[0, Ramp(0, 1, 64)])
SAMPLE = [
    ("x86", "dot_16x4_vnni"),
    ("x86", "dot_16x4_avx512"),
    ("arm_cpu", "dot_4x4_i8i8s32_neon"),
    ("arm_cpu", "dot_4x4_i8i8s32_sdot"),
    ("arm_cpu", "dot_4x4_u8u8u32_udot"),
    ("arm_cpu", "dot_4x4_u8u8i32_hdot"),
]


@pytest.fixture(scope="module")
def intrins():
    """Imports the intrinsics (about 15 s, once per session; x86 alone pulls in all of them)."""
    listed = registered_intrins(("x86", "arm_cpu"))
    from tvm.s_tir import TensorIntrin

    return listed, {name: TensorIntrin.get(name) for _, name in SAMPLE}


def _rule(ti, name):
    return tp.Rewriter.from_module({"pattern": ti.desc, "replacement": ti.impl}, name=name)


def test_registered_intrins_lists_the_sample(intrins):
    listed, _ = intrins
    assert set(SAMPLE) <= set(listed)


@pytest.mark.parametrize("module,name", SAMPLE, ids=[n for _, n in SAMPLE])
def test_desc_on_compact_tiles_is_rewritten(intrins, module, name):
    rw = _rule(intrins[1][name], name)
    target = tile_target(intrins[1][name].desc, layout="stacked")
    new = rw(target)
    assert rw.report.counts == {name: 1}, str(tp.explain(rw, target))
    assert view_escapes(new) == []
    assert "for t in range(2)" in new.script()  # one site, inside the tile loop


@pytest.mark.parametrize("module,name", SAMPLE, ids=[n for _, n in SAMPLE])
def test_whole_tile_vector_load_is_refused_on_a_strided_region(intrins, module, name):
    """The impls declare no strides and load a (16, 4) tile as 64 contiguous elements:
    right on a compact region only. On a (32, 8) buffer the rule must not fire."""
    rw = _rule(intrins[1][name], name)
    target = tile_target(intrins[1][name].desc, layout="tiled")
    new = rw(target)
    assert rw.report.counts == {}
    assert new.same_as(target)
    text = str(tp.explain(rw, target))
    assert "past its shape" in text and "not compact" in text


def test_avx512_rewrite_computes_the_desc(intrins):
    """Compiled for this host's AVX-512 (skipped elsewhere): same numbers as the loops."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if "avx512bw" not in (cpuinfo.read_text() if cpuinfo.exists() else ""):
        pytest.skip("needs AVX-512BW")
    name = "dot_16x4_avx512"
    rw = _rule(intrins[1][name], name)
    target = tile_target(intrins[1][name].desc, layout="stacked")
    new = rw(target)
    assert rw.report.counts == {name: 1}
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (2, 4)).astype("uint8")
    b = rng.integers(-128, 128, (2, 16, 4)).astype("int8")
    c = rng.integers(-1000, 1000, (2, 16)).astype("int32")
    got = run(new, [a, b, c], target=tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))[2]
    want = c + np.einsum("tk,tik->ti", a.astype("int32"), b.astype("int32"))
    np.testing.assert_array_equal(got, want)
