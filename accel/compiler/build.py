"""The accel TIR pipeline and ``accel.build``.

``tvm.compile(mod, target="llvm", tir_pipeline="accel")`` runs accel's tirpat rules after
block lowering and before flattening, then plans the scratchpads (:mod:`accel.compiler.planner`);
whatever no rule matched stays on the CPU and is compiled by LLVM. :func:`build` also
schedules unscheduled workloads first (:mod:`accel.compiler.schedule`).

>>> ex = accel.build(te.create_prim_func([A, W, C]))      # doctest: +SKIP
>>> with accel.Session() as s:                             # doctest: +SKIP
...     ex(a, w, c)
>>> print(ex.report)                                       # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import ir, tirx

from tirpat import device

import tirpat as tp
from accel.hw.config import Config
from accel.compiler.planner import plan_pass
from accel.hw.runtime import RUNTIME, session_for
from accel.compiler.rules import rules
from accel.compiler.schedule import Notes, schedule

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
        tp.register_pipeline(name, rw, after=[plan_pass(config)])
        _REGISTERED[name] = rw
    return name


pipeline_name()


@dataclass
class Report:
    """What ``accel.build`` did: rule counts and sites, the MAC share, what stayed on the CPU."""

    counts: dict = field(default_factory=dict)
    sites: list = field(default_factory=list)
    total_macs: int = 0
    accel_macs: int = 0
    offloaded: list = field(default_factory=list)
    on_cpu: list = field(default_factory=list)

    @property
    def mac_share(self) -> float:
        """Fraction of the workload's multiply-accumulates that run on the accelerator."""
        return 1.0 if self.total_macs == 0 else self.accel_macs / self.total_macs

    def __str__(self):
        macs = (f"  MACs on accel: {self.accel_macs} of {self.total_macs} ({100 * self.mac_share:.1f}%)"
                if self.total_macs else "  MACs on accel: none (the workload has no multiply-accumulate)")
        lines = ["accel offload report", macs]
        device = sum(g.device_macs for g in self.offloaded)
        if device > self.accel_macs:
            lines.append(f"  the device executes {device} MACs: M, N and K are padded to whole tiles")
        for g in self.offloaded:
            epi = f" + epilogue {', '.join(g.epilogue)}" if g.epilogue else ""
            gather = f"; {g.gather}" if g.gather else ""
            lines.append(f"  offloaded {g.block}: {g.batch}x{g.m}x{g.n}x{g.k}{epi}{gather}")
        lines.append("  rules fired (sites in the code):")
        lines += [f"    {n:5d}  {rule}" for rule, n in sorted(self.counts.items())] or ["    none"]
        if self.on_cpu:
            lines.append("  on the CPU:")
            lines += [f"    {name}: {why}" for name, why in self.on_cpu]
        return "\n".join(lines)


class Executable:
    """A compiled workload: call it like ``tvm.compile``'s result (arrays or tensors).

    Checks dtypes and shapes of the arguments before running. Numpy arrays are copied in,
    and copied back only where the run changed them, so ``ex(a, w, out)`` fills ``out``
    and read-only or broadcast inputs are fine. It runs in the innermost ``with
    accel.Session()``, which must have the Config it was built for, else in this
    thread's default session for that Config; a failed call leaves nothing pending.
    """

    def __init__(self, compiled, func: tirx.PrimFunc, report: Report, entry: str = "main",
                 config: Config | None = None):
        self.module = compiled
        self.report = report
        self.entry = entry
        self.config = config or Config()
        self.params = [(p.name, tuple(int(d) for d in p.shape), str(p.dtype)) for p in func.params
                       if tirx.is_buffer_var(p)]

    def __call__(self, *args):
        if len(args) != len(self.params):
            raise TypeError(f"{self.entry} takes {len(self.params)} arguments "
                            f"({', '.join(n for n, _, _ in self.params)}), got {len(args)}")
        tensors, copied = [], []
        for (name, shape, dtype), a in zip(self.params, args):
            got_shape, got_dtype = tuple(int(d) for d in a.shape), str(a.dtype)
            if got_dtype != dtype:
                raise TypeError(f"argument {name}: expected dtype {dtype}, got {got_dtype}")
            if got_shape != shape:
                raise ValueError(f"argument {name}: expected shape {shape}, got {got_shape}")
            if isinstance(a, np.ndarray):
                src = np.ascontiguousarray(a)
                t = tvm.runtime.tensor(src)
                tensors.append(t)
                copied.append((name, a, src, t))
            else:
                tensors.append(a)
        session = session_for(self.config)
        if RUNTIME.entered() is session:
            device.invoke(self.module[self.entry], *tensors)
        else:
            with session:
                device.invoke(self.module[self.entry], *tensors)
        changed = [(name, a, out) for name, a, src, t in copied for out in [t.numpy()] if not _same_bits(out, src)]
        for name, a, _ in changed:
            if not a.flags.writeable:
                raise ValueError(f"argument {name} is read-only, but {self.entry} writes it")
        for _, a, out in changed:
            a[...] = out


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    return np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))


def _nest_volume(node) -> int:
    volume = 1
    while isinstance(node, tirx.For):
        volume *= int(node.extent)
        node = node.body
    return volume


def _already_scheduled(func: tirx.PrimFunc) -> bool:
    import tvm_ffi

    found = []

    def on_var(v):
        if tirx.is_buffer_var(v) and v.scope().startswith("local.accel_"):
            found.append(v)

    tvm_ffi.structural_walk(func, (ir.Var, on_var))
    return bool(found)


def build(workload, config: Config | None = None, *, strict: bool = False) -> Executable:
    """Schedule (if needed) and compile a workload for accel + the llvm host.

    ``workload`` is a PrimFunc or an IRModule with one PrimFunc, e.g. from
    ``te.create_prim_func`` on topi's ``nn.dense``/``nn.matmul``/``nn.batch_matmul`` with
    int8 inputs and int32 outputs, with fused bias / ReLU / requantise epilogues. A
    workload that already uses the ``local.accel_*`` scopes is only run through the pipeline.
    When nothing, or only part of the multiply-accumulates, is offloaded, a
    ``tp.OffloadWarning`` names the reason (the dtypes found, say); ``strict=True`` raises
    ``tp.OffloadError`` instead.

    >>> ex = accel.build(te.create_prim_func([A, W, C]))     # doctest: +SKIP
    """
    config = config or Config()
    if isinstance(workload, ir.IRModule):
        funcs = [(gv, f) for gv, f in workload.functions.items() if isinstance(f, tirx.PrimFunc)]
        if len(funcs) != 1:
            raise ValueError(f"accel.build takes one PrimFunc, the module has {len(funcs)}")
        func = funcs[0][1]
    elif isinstance(workload, tirx.PrimFunc):
        func = workload
    else:
        raise TypeError(f"accel.build takes a PrimFunc or an IRModule, got {type(workload).__name__}")
    # Relax's legalized PrimFuncs are private (no global_symbol): the entry is "main" either way.
    func = func.with_attr("global_symbol", "main")
    if _already_scheduled(func):
        mod, notes = ir.IRModule({"main": func}), Notes()
    else:
        mod, notes = schedule(func, config)
    name = pipeline_name(config)
    # the pipeline of `name`, filling this build's report (whatever other threads build)
    rewrites = tp.Report()
    stage = tvm.transform.Sequential([_REGISTERED[name].as_pass(f"tirpat.{name}.0", report=rewrites),
                                      plan_pass(config)], name=f"tirpat.{name}")
    with tp.registered(tp.tir_pipeline(stage, f"tirpat.{name}"), name) as scoped:
        compiled = tvm.compile(mod, target="llvm", tir_pipeline=scoped)
    report = Report(dict(rewrites.counts), list(rewrites.sites), notes.total_macs,
                    notes.offloaded_macs, list(notes.offloaded), list(notes.on_cpu))
    if not notes.offloaded:
        # A workload scheduled by its author: count the MACs of the GEMM nests rewritten
        # (what stayed on the CPU in such code is not known as MACs).
        report.accel_macs = sum(_nest_volume(s.node) for s in report.sites if s.rule == "accel.gemm")
        report.total_macs = max(report.total_macs, report.accel_macs)
    _complain(report, strict)
    return Executable(compiled, mod["main"], report, config=config)


def _complain(report: Report, strict: bool) -> None:
    """Warn (or raise, ``strict``) when less than the workload's MACs went to accel."""
    if report.total_macs and report.accel_macs >= report.total_macs:
        return
    if not report.total_macs:
        message = "accel.build: nothing was offloaded: the workload has no multiply-accumulate"
    else:
        why = "; ".join(f"{name}: {reason}" for name, reason in report.on_cpu if "multiply-accumulate" in reason
                        or "matrix" in reason or "convolution" in reason or "not offloaded" in reason) \
            or "see the report"
        message = (f"accel.build: {report.total_macs - report.accel_macs} of {report.total_macs} MACs stay on "
                   f"the CPU: {why}")
    if strict:
        raise tp.OffloadError(message)
    warnings.warn(message, tp.OffloadWarning, stacklevel=3)
