"""Native code for a built model, made at build time so that its first call compiles nothing.

``tvm.compile`` leaves the host code as an LLVM module that the Relax VM compiles to machine
code (LLVM's JIT, always at -O3) when the first VM is made: seconds on a real model, and
nearly all of it the offloaded partitions (their packed-call wrappers and loops of runtime
calls: ``accel.load``, ``accel.gemm``, ...), whose speed is the device runtime's, not the
CPU code's. So ``tp.build`` compiles those partitions apart, with LLVM at -O0
(:func:`offloaded_library`; :func:`tirpat.model.pipeline.tir_pipeline_for` takes them out of the
host module), keeps the host's own operators at TVM's -O3, and links the whole into a shared
library at once (:func:`link`): the model's VMs load machine code, compile none. The CPU loops
of a partition that compute per element (zero padding, an im2col gather) are the exception:
they run at every call, so when the model will be linked (:func:`can_link`) they move into host
functions the partition calls by symbol (:mod:`tirpat.model.cpu_loops`), optimised at -O3.

The offloaded partitions are compiled without the argument checks TVM's packed calling
convention puts at the top of every function (``tirx.disable_assert``, as TVM's own build
takes it): their one caller is the model's VM, whose calls Relax typed at compile time with
the shapes and dtypes each partition declares, on tensors it allocated itself or on the
entry's inputs, which the entry checks (the host's functions keep theirs). The checks were
two thirds of that code and of LLVM's time on it (ppocrv6_rec_small: 123 partitions, 13,887
checks; its object 8.5 MB, 2.7 MB without).

>>> lib = offloaded_library(record.offloaded, target.host)   # doctest: +SKIP
>>> executable.mod.import_module(lib)                          # doctest: +SKIP
>>> linked = link(executable, target.host)                     # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import weakref
from dataclasses import dataclass

import tvm
from tvm import ir
from tvm.support import cc

from .host_cpu import check_runs_here
from .target import TargetError
from .tvm_noise import filtered_native_stderr

__all__ = ["offloaded_library", "link", "can_link", "Linked", "OFFLOADED_OPT_LEVEL"]

#: LLVM's optimisation level for the offloaded partitions' code: -O0 compiles it 4-5x faster
#: than -O3 (ppocr_v2_cls: 1.8 s, not 7.4 s; the calls cost what the device runtime does); the
#: CPU loops partitions keep that compute per element run at -O3 in the host's code instead
#: (:mod:`tirpat.model.cpu_loops`), and their ordered layout copies run as fast at -O0.
OFFLOADED_OPT_LEVEL = 0


def offloaded_library(offloaded: ir.IRModule, host: tvm.target.Target) -> tvm.runtime.Module:
    """The LLVM module of ``offloaded`` (lowered, finalised PrimFuncs) for the ``host`` target
    at :data:`OFFLOADED_OPT_LEVEL`, without their argument checks (see the module docstring);
    import it into the executable that calls them.

    >>> lib = offloaded_library(record.offloaded, tvm.target.Target("llvm"))   # doctest: +SKIP
    """
    config = dict(host.export())
    config["opt-level"] = OFFLOADED_OPT_LEVEL
    target = tvm.target.Target(config)
    # tvm.tirx.build's own last step, for a module already through the pipeline; the checks
    # dropped as that step drops them under tirx.disable_assert
    return sys.modules["tvm.tirx.build"].codegen_build(tvm.tirx.transform.SkipAssert()(offloaded), target)


@dataclass
class Linked:
    """An executable linked into a shared library and loaded: ``module`` (what a Relax VM
    takes) and ``path``, the library's file, kept while this object lives (``export`` copies it)."""

    module: tvm.runtime.Module
    path: str
    _directory: str         # made by link() for the library alone

    def __post_init__(self) -> None:
        # removed with this object, quietly: a TemporaryDirectory left to the collector warns
        # ("Implicitly cleaning up") once per model a user builds
        weakref.finalize(self, shutil.rmtree, self._directory, ignore_errors=True)


def can_link(host: tvm.target.Target) -> bool:
    """Whether :func:`link` can link code for ``host`` here: it runs on this CPU, and there is a
    C++ compiler to link with.

    >>> can_link(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))
    False
    """
    try:
        check_runs_here(host)
    except TargetError:
        return False
    return cc.get_cc() is not None       # what export_library links with


def link(executable, host: tvm.target.Target) -> Linked | None:
    """``executable`` (a Relax executable) compiled to machine code and linked into a shared
    library, loaded; None when that cannot be done here: the code is for another CPU (it
    could not run here), or there is no C++ compiler to link with (its VMs then compile the
    code when they are made, as ``tvm.compile``'s do).

    >>> import numpy as np
    >>> from tvm.script import tirx as T
    >>> @T.prim_func
    ... def double(A: T.Buffer((4,), "float32")):
    ...     for i in range(4):
    ...         A[i] = A[i] * T.float32(2)
    >>> linked = link(tvm.compile(tvm.IRModule({"main": double}), "llvm"), tvm.target.Target("llvm"))
    >>> a = tvm.runtime.tensor(np.arange(4, dtype="float32")); linked.module["main"](a); a.numpy()
    array([0., 2., 4., 6.], dtype=float32)
    >>> link(tvm.compile(tvm.IRModule({"main": double}), "llvm"),
    ...      tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})) is None
    True
    """
    if not can_link(host):
        return None
    directory = tempfile.mkdtemp(prefix="tirpat-")
    path = os.path.join(directory, "model.so")
    try:
        with filtered_native_stderr():      # TVM logs a line per memory scope it saves, and loads
            executable.export_library(path)
            module = tvm.runtime.load_module(path)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return Linked(module, path, directory)
