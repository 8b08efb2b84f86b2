"""``tirpat compile`` refuses a host ``-mcpu``/``-mattr`` this CPU cannot run unless
``--cross-compile`` (nor does ``tirpat tune`` measure here for one), and ``tirpat run``
refuses a model compiled for one: it died by SIGILL.

The CPU is made a plain x86-64 one by replacing
:func:`tirpat.model.host_cpu.host_features`, so the cases hold on any CPU."""

import pathlib

import pytest
from tvm.target import codegen

from tirpat.model import host_cpu

MLP = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models" / "mlp_int8.py"
# what -mattr=+avx2 needs beyond a plain x86-64 CPU
AVX2 = "avx, avx2, sse3, sse4.1, sse4.2, ssse3"



def test_compile_refuses_and_cross_compile_allows(plain_cpu, tirpat_here, tmp_path):
    """And a model cross-compiled for features this CPU lacks is refused by run: it died by SIGILL."""
    (tmp_path / "m.py").write_text(MLP.read_text())
    target = "accel, llvm -mattr=+avx2"
    status, out, err = tirpat_here("compile", "m.py", "-t", target)
    assert (status, out) == (1, "")
    assert err == (f"tirpat compile: error: target {target!r} needs {AVX2}, which this CPU "
                   f"({codegen.llvm_get_system_cpu()}) lacks: its code would stop with an illegal instruction here; "
                   "give --cross-compile to compile it for another machine\n")
    assert not (tmp_path / "m.tirpat").exists()
    status, out, err = tirpat_here("compile", "m.py", "-t", target, "--cross-compile")
    assert status == 0, err
    status, out, err = tirpat_here("run", "m.tirpat")
    assert (status, out) == (1, "")
    assert err.startswith(f"tirpat run: error: m.tirpat (compiled for llvm -mattr=+avx2) needs {AVX2}, which this CPU")
    assert err.endswith("; run it on the machine it was compiled for, or compile it again for this one\n")


def test_compile_help_states_cross_compile(tirpat_here):
    status, out, _ = tirpat_here("compile", "--help")
    assert status == 0 and "--cross-compile" in out and "compile for another machine's CPU" in " ".join(out.split())


def test_tune_here_refuses_features_this_cpu_lacks(plain_cpu, tirpat_here, tmp_path):
    """Tuning without --rpc measures the candidates here."""
    (tmp_path / "m.py").write_text(MLP.read_text())
    status, out, err = tirpat_here("tune", "m.py", "-t", "accel, llvm -mattr=+avx2", "--trials", "1", "--records", "r")
    assert (status, out) == (1, "")
    assert err.startswith(f"tirpat tune: error: target 'accel, llvm -mattr=+avx2' needs {AVX2}, which this CPU")
    assert err.endswith("; tune on RPC servers whose CPU has them (--rpc)\n") and err.count("\n") == 1
    assert not (tmp_path / "r").exists()
