"""A host target this CPU cannot run is refused, never a SIGILL: ``tp.load`` refuses a model
compiled for it (``tirpat compile`` and ``run``: tests/cli/test_cross_compile.py).

The CPU is made a plain x86-64 one (only the features LLVM's generic x86-64 has) by
replacing :func:`tirpat.model.host_cpu.host_features`, so every case holds on any CPU."""

import pathlib
import runpy

import numpy as np
import pytest
from tvm.target import Target, codegen

import tirpat as tp
from tirpat.model import host_cpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "models" / "mlp_int8.py"
# what -mattr=+avx2 needs beyond a plain x86-64 CPU
AVX2 = "avx, avx2, sse3, sse4.1, sse4.2, ssse3"



def _other_arch() -> str:
    return "aarch64-linux-gnu" if not codegen.llvm_get_system_triple().startswith("aarch64") else "x86_64-linux-gnu"


def test_the_host_has_the_features_of_its_own_cpu():
    cpu = codegen.llvm_get_system_cpu()
    assert host_cpu.features(Target({"kind": "llvm", "mcpu": cpu})) <= host_cpu.host_features()
    host_cpu.check_runs_here(Target({"kind": "llvm", "mcpu": cpu}))
    host_cpu.check_runs_here(Target({"kind": "llvm"}))


def test_features_the_host_lacks_are_named(plain_cpu):
    cpu = codegen.llvm_get_system_cpu()
    with pytest.raises(tp.TargetError) as err:
        host_cpu.check_runs_here(Target({"kind": "llvm", "mattr": ["+avx2"]}))
    assert str(err.value) == (f"the host target 'llvm -mattr=+avx2' needs {AVX2}, which this CPU ({cpu}) lacks: its "
                              "code would stop with an illegal instruction here")
    with pytest.raises(tp.TargetError, match=r"'llvm -mcpu=skylake-avx512' needs .*avx512bw, .*avx512f"):
        host_cpu.check_runs_here(Target({"kind": "llvm", "mcpu": "skylake-avx512"}))
    # tuning features (how LLVM prefers to generate code) and features taken away are no instructions
    host_cpu.check_runs_here(Target({"kind": "llvm", "mattr": ["+fast-gather", "+slow-shld", "-sse2"]}))


def test_code_for_another_architecture_is_refused():
    triple = _other_arch()
    with pytest.raises(tp.TargetError, match=f"is for {triple.split('-')[0]} \\({triple}\\); this machine is "):
        host_cpu.check_runs_here(Target({"kind": "llvm", "mtriple": triple}))


def test_the_kernel_reports_features_beyond_the_cpu_name(monkeypatch):
    """A virtual machine's CPU may be named for an older model than the features it offers."""
    host_cpu.host_features.cache_clear()
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: "x86-64")
    monkeypatch.setattr(host_cpu, "_cpuinfo_flags", lambda: {"sse4_1", "sse4_2", "pni", "avx512f", "avx512_vnni"})
    try:
        found = host_cpu.host_features()
    finally:
        host_cpu.host_features.cache_clear()
    assert {"sse4.1", "sse4.2", "sse3", "crc32", "avx512f", "avx512vnni"} <= found
    assert "avx2" not in found and "avx512bw" not in found


def test_tp_load_refuses_a_model_for_features_the_host_lacks(plain_cpu, tmp_path):
    """tp.build compiles for any target (a model exported for another machine); tp.load, which
    loads it to run it here, refuses before loading the library."""
    model = tp.build(runpy.run_path(str(MLP))["Module"], "accel, llvm -mattr=+avx2")
    model.export(tmp_path / "m.tirpat")
    with pytest.raises(tp.TargetError, match=r"m\.tirpat \(compiled for llvm -mattr=\+avx2\) needs avx, avx2"):
        tp.load(tmp_path / "m.tirpat")
    # nor is the model tp.build returned run here: its first call is refused
    x = np.zeros((16, 64), np.int8)
    with pytest.raises(tp.TargetError, match=r"^the model \(compiled for llvm -mattr=\+avx2\) needs avx, avx2, .*; "
                                             r"export it and run it on a machine that has them$"):
        model(x)


def test_a_model_for_this_cpu_loads_and_runs(tmp_path):
    cpu = codegen.llvm_get_system_cpu()
    model = tp.build(runpy.run_path(str(MLP))["Module"], f"accel, llvm -mcpu={cpu}")
    model.export(tmp_path / "m.tirpat")
    x = np.random.default_rng(1).integers(-128, 128, (16, 64), dtype=np.int8)
    np.testing.assert_array_equal(tp.load(tmp_path / "m.tirpat")(x), model(x))
