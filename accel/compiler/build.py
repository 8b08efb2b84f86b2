"""The accel TIR pipeline and ``accel.build``.

``tvm.compile(mod, target="llvm", tir_pipeline="accel")`` runs accel's tirpat rules after
block lowering and before flattening, merges ALU runs on one block into ALU chains
(:mod:`accel.compiler.chains`), then plans the scratchpads (:mod:`accel.compiler.planner`);
whatever no rule matched stays on the CPU and is compiled by LLVM. :func:`build` is
``tp.build`` for accel's target: it also schedules unscheduled workloads first
(:mod:`accel.compiler.schedule`, the backend's ``schedule`` hook).

>>> ex = accel.build(te.create_prim_func([A, W, C]))      # doctest: +SKIP
>>> with accel.Session() as s:                             # doctest: +SKIP
...     ex(a, w, c)
>>> print(ex.report)                                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

from tvm import ir, tirx

import tirpat as tp
from accel.hw.config import Config
from accel.compiler.chains import merge_chains_pass
from accel.compiler.planner import plan_pass
from accel.compiler.rules import rules

_REGISTERED: dict = {}


def pipeline_name(config: Config | None = None) -> str:
    """Register (once) and return the TIR pipeline name for ``config``: ``"accel"`` for the
    default Config.

    >>> pipeline_name()
    'accel'
    """
    config = config or Config()
    name = "accel" if config == Config() else f"accel_{abs(hash(config)):x}"
    if name not in _REGISTERED:
        rw = rules(config)
        tp.register_pipeline(name, rw, after=[merge_chains_pass(), plan_pass(config)])
        _REGISTERED[name] = rw
    return name


pipeline_name()


def target(config: Config | None = None) -> str:
    """The composite target string of accel with ``config`` (its non-default fields as
    options) and the llvm host.

    >>> target(Config(tile=32))
    'accel -tile=32, llvm'
    """
    config = config or Config()
    opts = "".join(f" -{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(Config)
                   if getattr(config, f.name) != f.default)
    return f"accel{opts}, llvm"


def build(workload: tirx.PrimFunc | ir.IRModule, config: Config | None = None, *, strict: bool = False) -> tp.CompiledKernel:
    """Schedule (if needed) and compile a TIR workload for accel + the llvm host: ``tp.build``
    of ``workload`` for :func:`target` of ``config``.

    ``workload`` is a PrimFunc or an IRModule of PrimFuncs (a module of one is called by that
    one's name), e.g. from ``te.create_prim_func`` on topi's ``nn.dense``/``nn.matmul``/
    ``nn.batch_matmul`` or ``nn.conv2d`` with int8 inputs and int32 outputs, with fused
    bias / ReLU / requantise epilogues. A workload that already uses accel's scratchpad
    scopes is only run through accel's rules and planner. When nothing, or only part of the
    multiply-accumulates, is offloaded, a ``tp.OffloadWarning`` names the reason (the
    dtypes found, say); ``strict=True`` raises ``tp.OffloadError`` instead. The result is
    a ``tp.CompiledKernel``: ``ex(a, w, c)`` runs it, ``ex.report`` is the build's
    ``tp.ModelReport``.

    >>> ex = accel.build(te.create_prim_func([A, W, C]))     # doctest: +SKIP
    """
    if not isinstance(workload, (tirx.PrimFunc, ir.IRModule)):
        raise TypeError(f"accel.build takes a PrimFunc or an IRModule, got {type(workload).__name__}")
    entry = "main"
    if isinstance(workload, ir.IRModule):
        names = [gv.name_hint for gv, f in workload.functions.items() if isinstance(f, tirx.PrimFunc)]
        if len(names) != len(workload.functions) or not names:
            raise ValueError(f"accel.build takes a module of PrimFuncs, the module has "
                             f"{len(workload.functions) - len(names)} other functions and {len(names)} PrimFuncs")
        if len(names) == 1:
            entry = names[0]
    return tp.build(workload, target(config), strict=strict, entry=entry)
