"""``tp.build``: a Relax model to a :class:`~tirpat.model.compiled.CompiledModel` for a composite
target, or a TIR workload (a PrimFunc) to a :class:`~tirpat.model.kernel.CompiledKernel`.

A thin layer over ``tvm.compile`` with the public pipelines of :mod:`tirpat.model.pipeline`:
partition for the target's backends, lower and schedule each partition, run each backend's
rules on its own PrimFuncs only, and compile everything else with TVM's default pipelines
for the host. It also writes the report, and says when less was offloaded than the
backends could take.

>>> model = tp.build(mod, "accel, llvm")      # doctest: +SKIP
>>> y = model(x); print(model.report)         # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import json
import os
import warnings
from typing import Mapping, Sequence

import numpy as np
import tvm
from tvm import ir, relax, tirx

from .compiled import CompiledModel, Input
from .interrupts import interrupts_kept
from .kernel import CompiledKernel
from .native import can_link, link, offloaded_library
from .partition import DataMovement, as_target, tagged
from .pipeline import Record, relax_pipeline, schedule_for, tir_pipeline_for, with_records
from .storages import lift_storages
from .report import (HostOp, Partition, ModelReport, epilogue_of, macs_known, macs_of, notes_of, primfunc_macs,
                     records_line)

__all__ = ["build", "OffloadWarning", "OffloadError"]


class OffloadWarning(UserWarning):
    """A build offloaded nothing, or left on the host a matmul, a convolution or an operator a
    backend declined; the message says why."""


class OffloadError(ValueError):
    """``strict=True``: what would have been an :class:`OffloadWarning`."""


def build(mod: ir.IRModule, target, *, strict: bool = False, params: Mapping[str, np.ndarray] | None = None,
          entry: str = "main", records=None, input_shapes: Mapping[str, Sequence[int]] | None = None,
          preprocess: bool = True, record_streams: bool = True) -> CompiledModel | CompiledKernel:
    """Compile the Relax module ``mod`` for ``target`` (a ``tp.CompositeTarget`` or a string
    such as ``"accel, llvm"``): partitions for the backends, the rest for the host.

    ``mod`` may also be a TIR workload, as ``tvm.compile`` takes one: a PrimFunc (its entry
    is ``main``) or an IRModule of PrimFuncs only. It has no operators to partition: each
    PrimFunc goes whole to the target's first backend (its ``schedule`` hook, rules and
    passes, as a partition would), or to the host when the target has none; an error the
    backend raises lowering it is raised (there is no partition to fall back); ``records``
    apply to it as to a partition (``tp.tune`` tunes a PrimFunc too). The result is a
    :class:`~tirpat.model.kernel.CompiledKernel`, called with the entry's buffers.

    ``mod`` may also be an ONNX model (an ``onnx.ModelProto``, or the path of an ``.onnx``
    file), float or QDQ, as exported: it is imported by
    :func:`tirpat.model.onnx_import.import_onnx`, with ``input_shapes`` (``{input: dims}``)
    fixing the dimensions it leaves open and ``preprocess`` (default True) running
    onnxruntime's basic graph optimisation first; an error TVM raises compiling it names it.

    ``params`` binds inputs of ``entry`` to constants (weights), so that their layout is
    changed at compile time. When nothing is offloaded, or an operator a backend's patterns
    cover is left on the host, an :class:`OffloadWarning` names the reason; ``strict=True``
    raises :class:`OffloadError` instead. ``records`` (a directory ``tp.tune`` wrote, or a
    ``tp.Records``) schedules each partition that has a tuning record with its best one.

    An interrupt (Ctrl-C) raises ``KeyboardInterrupt``, wherever in TVM it arrives.

    A model is run once on zeros at the end (``record_streams``, default True: see
    :meth:`~tirpat.model.compiled.CompiledModel.record_streams`), so that its devices' instruction
    streams are built at compile time and its first call replays them; False leaves that to the
    first call (a model built only to be exported: a ``.tirpat`` file holds no streams).

    >>> model = tp.build(mod, "accel, llvm", params={"w": w})     # doctest: +SKIP
    >>> model = tp.build(mod, "accel, llvm", records="records/")  # doctest: +SKIP
    >>> model = tp.build("det.onnx", "accel, llvm", input_shapes={"x": [1, 3, 320, 320]})  # doctest: +SKIP
    """
    # (Ctrl-C inside TVM's passes comes back as a RuntimeError a fallback would take for a failure)
    with interrupts_kept():
        model = _build(mod, target, strict=strict, params=params, entry=entry, records=records,
                       input_shapes=input_shapes, preprocess=preprocess, record_streams=record_streams)
    _return_freed_memory()      # after _build's frame, and what only it held, is gone
    return model


def _build(mod, target, *, strict: bool, params: Mapping[str, np.ndarray] | None, entry: str, records,
           input_shapes: Mapping[str, Sequence[int]] | None, preprocess: bool,
           record_streams: bool) -> CompiledModel | CompiledKernel:
    """:func:`build`, but for giving the memory it freed back."""
    if _is_onnx(mod):
        return _build_onnx(mod, target, input_shapes, preprocess, strict=strict, params=params, entry=entry,
                           records=records, record_streams=record_streams)
    if input_shapes is not None:
        raise TypeError("input_shapes is for ONNX models; a Relax module declares its shapes")
    if _is_tir(mod):
        if params:
            raise TypeError("params is for Relax models, not a TIR workload")
        return _build_tir(mod, target, strict, entry, records)
    if not isinstance(mod, ir.IRModule):
        given = f"{mod!r}, a path that is not an .onnx file" if isinstance(mod, (str, os.PathLike)) \
            else type(mod).__name__
        raise TypeError(f"tp.build takes a Relax IRModule, a PrimFunc or an IRModule of PrimFuncs, or an ONNX "
                        f"model (an onnx.ModelProto or the path of an .onnx file), got {given}")
    if entry not in [gv.name_hint for gv in mod.functions]:
        raise ValueError(f"the module has no function {entry!r}")
    t = as_target(target)
    mod = bind_params(mod, params, entry)
    inputs = _inputs(mod[entry])
    # this build's: handed to the pipelines, whatever other threads build; the offloaded
    # partitions' code is compiled apart, at -O0 (tirpat.model.native)
    # their large CPU loops go to the host's code, at -O3, when the model is linked (tirpat.model.cpu_loops)
    record = Record(take_offloaded=True, outline_loops=can_link(t.host))
    # the entry's static storages allocated once per VM, not per call (tirpat.model.storages)
    pipeline = tvm.transform.Sequential([relax_pipeline(t, records, record=record), lift_storages(entry, record)])
    with tir_pipeline_for(record) as tir:
        executable = tvm.compile(mod, t.host, relax_pipeline=pipeline, tir_pipeline=tir)
    if record.offloaded is not None:
        executable.mod.import_module(offloaded_library(record.offloaded, t.host))
    report, declined, in_float = _report(record, t)
    _complain(report, t, declined, strict, in_float)
    if report.records is not None and not report.records["applied"]:
        warnings.warn(f"no partition was scheduled from the {records_line(report.records)}", UserWarning, stacklevel=2)
    # a backend whose partitions all fell back to the host has no code in the model: not needed to run it
    used = [(b, opts) for b, opts in t.backends if any(p.backend == b.name and not p.fallback for p in report.partitions)]
    # machine code now, so that the model's first call compiles none
    model = CompiledModel(executable, used, t.host, inputs, report, entry, linked=link(executable, t.host),
                          storages=record.storages)
    if used and record_streams:
        model.record_streams()
    return model


def _return_freed_memory() -> None:
    """Give the memory the compile freed back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Compiling leaves glibc's heap strewn with freed chunks, and the first large
    allocations after it sort and merge them all: ppocr_v2_cls's first call took 95 ms
    instead of 15 (its later calls 6), ppocrv6_det_small's 260 instead of 105; the trim costs
    0.2 s of a 30 s build."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):      # not glibc
        return
    trim(0)


def _is_tir(workload) -> bool:
    """Whether ``workload`` is a PrimFunc, or an IRModule of PrimFuncs only."""
    if isinstance(workload, tirx.PrimFunc):
        return True
    return isinstance(workload, ir.IRModule) and len(workload.functions) > 0 and \
        all(isinstance(f, tirx.PrimFunc) for f in workload.functions.values())


def _build_tir(workload, target, strict: bool, entry: str, records) -> CompiledKernel:
    """A TIR workload through the backends' schedule, rules and passes (see :func:`build`)."""
    t = as_target(target)
    if records is not None:
        from .records import Records

        records = records if isinstance(records, Records) else Records(records)
    if isinstance(workload, tirx.PrimFunc):
        workload = ir.IRModule({"main": workload})
    if entry not in [gv.name_hint for gv in workload.functions]:
        raise ValueError(f"the workload has no function {entry!r}")
    # each function is exported under its own name (Relax's legalized PrimFuncs have none)
    given = {gv.name_hint: f.with_attr("global_symbol", gv.name_hint) for gv, f in workload.functions.items()}
    record = Record(fall_back=False)
    lowered = {}
    for name, func in given.items():
        if t.backends:
            backend, opts = t.backends[0]
            record.partitions[name] = (backend.name, _TIR, [])
            if records is not None:
                func = with_records(records, func, backend.name, opts, name, record)
            func = schedule_for(func, backend.name, opts, name, record)
            record.notes[name] = json.dumps(notes_of(func))
        lowered[name] = func
    with tir_pipeline_for(record) as tir:
        executable = tvm.compile(ir.IRModule(lowered), t.host, tir_pipeline=tir)
    report = ModelReport(backends=[b.name for b, _ in t.backends])
    for name, func in given.items():
        macs = primfunc_macs(func)
        if macs is None:
            report.uncounted_ops.append(f"{_TIR} ({name})")
        report.total_macs += macs or 0
        if name not in record.partitions:
            report.on_host.append(HostOp(_TIR, name, "the target has no backend", macs or 0))
            continue
        backend = record.partitions[name][0]
        notes, rules = json.loads(record.notes[name]), record.rules.get(name, {})
        # MACs the schedule left for the CPU, of those the report counts (a sum is no MAC)
        host = min(int(notes.get("host_macs", 0)), macs or 0) if rules else macs or 0
        report.partitions.append(Partition(backend, name, _TIR, [], macs or 0, notes.get("epilogue") or [], rules,
                                           host, notes.get("device_macs"),
                                           [list(step) for step in notes.get("host_steps", [])],
                                           from_records=name in record.from_records,
                                           details=list(notes.get("details", []))))
    if records is not None:
        report.records = {"path": str(records.path), "applied": len(record.from_records),
                          "partitions": len(report.partitions), "misses": dict(record.record_misses)}
    _complain(report, t, [], strict, False)
    if report.records is not None and not report.records["applied"]:
        warnings.warn(f"no function was scheduled from the {records_line(report.records)}", UserWarning, stacklevel=3)
    used = [(b, opts) for b, opts in t.backends if any(p.backend == b.name for p in report.partitions)]
    return CompiledKernel(executable, given[entry], used, report, entry)


#: the pattern (and operator) name of a TIR workload's function in the report
_TIR = "tir"


def _is_onnx(model) -> bool:
    if isinstance(model, (str, os.PathLike)):
        return str(model).lower().endswith(".onnx")
    return type(model).__name__ == "ModelProto" and type(model).__module__.startswith("onnx")


def _build_onnx(model, target, input_shapes, preprocess: bool, **options) -> CompiledModel:
    from .onnx_import import import_onnx, tvm_failure

    source = str(model) if isinstance(model, (str, os.PathLike)) else "the ONNX model"
    mod = import_onnx(model, input_shapes, preprocess=preprocess, source=source)
    try:
        return _build(mod, target, input_shapes=None, preprocess=preprocess, **options)
    except Exception as err:  # noqa: BLE001 - one raised inside TVM gets the model's name
        failure = tvm_failure(err, source)
        if failure is None:
            raise
        raise failure from err


def bind_params(mod: ir.IRModule, params: Mapping[str, np.ndarray] | None, entry: str = "main") -> ir.IRModule:
    """``mod`` with the inputs of ``entry`` named in ``params`` bound to constants.

    Each value must have its input's dtype and shape (a symbolic dimension takes any size):
    a constant of another dtype would retype the model, so cast it yourself (``w.astype``).

    >>> bind_params(mod, {"w": np.zeros((64, 32), np.int32)})    # doctest: +SKIP
    Traceback (most recent call last):
    TypeError: params['w']: the model's input w is int8, got int32 (cast it: params={'w': w.astype('int8')})
    """
    if not params:
        return mod
    inputs = {p.name: p for p in mod[entry].params}
    bound = {}
    for name, value in params.items():
        if name not in inputs:
            raise ValueError(f"params: the model's {entry} has no input {name!r} (its inputs: {', '.join(inputs)})")
        bound[name] = tvm.runtime.tensor(_param_value(name, np.asarray(value), inputs[name].ty))
    return relax.transform.BindParams(entry, bound)(mod)


def _param_value(name: str, value: np.ndarray, ty) -> np.ndarray:
    """``value`` checked against the type of the input it binds."""
    if not isinstance(ty, relax.TensorType):
        raise TypeError(f"params[{name!r}]: the model's input {name} is not a tensor ({ty})")
    dtype = str(ty.dtype)        # '' when the model leaves it open
    if dtype and str(value.dtype) != dtype:
        raise TypeError(f"params[{name!r}]: the model's input {name} is {dtype}, got {value.dtype} "
                        f"(cast it: params={{{name!r}: {name}.astype({dtype!r})}})")
    if isinstance(ty.shape, relax.ShapeExpr):
        want = [int(d.value) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]
        if len(want) != value.ndim or any(w is not None and w != g for w, g in zip(want, value.shape)):
            shown = tuple(w if w is not None else "?" for w in want)
            raise ValueError(f"params[{name!r}]: the model's input {name} has shape {shown}, got {value.shape}")
    return value


def _inputs(func: relax.Function) -> list:
    out = []
    for p in func.params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise TypeError(f"input {p.name}: tp.build takes tensor inputs, got {ty}")
        shape = tuple(int(d.value) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values)
        out.append(Input(p.name, shape, str(ty.dtype)))
    return out


def _report(record: Record, target) -> tuple[ModelReport, list, bool]:
    """The report, the host operators a backend's check declined, and whether a matmul or
    convolution on the host computes in floating point."""
    mod = record.partitioned
    partitioner = record.partitioner
    composite = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and tagged(func) is not None:
            composite[gv.name_hint] = func
    report = ModelReport(backends=[b.name for b, _ in target.backends])
    declined = []
    in_float = quantised = False
    calls = []      # (composite function name) per call, in program order
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or gv.name_hint in composite:
            continue
        names = _printed_names(func)
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if not isinstance(call, relax.Call):
                    continue
                if isinstance(call.op, ir.GlobalVar) and call.op.name_hint in composite:
                    calls.append(call.op.name_hint)
                    continue
                if not isinstance(call.op, ir.Op):
                    continue
                macs = macs_of(call, mod)
                report.total_macs += macs
                if not macs_known(call, mod):
                    report.uncounted_ops.append(f"{call.op.name} ({names[binding.var.__chandle__()]})")
                if macs or not macs_known(call, mod):
                    in_float |= "float" in str(getattr(call.ty, "dtype", ""))
                quantised |= call.op.name in _QDQ
                host = HostOp(call.op.name, names[binding.var.__chandle__()],
                              _reason(call.op.name, binding.var, partitioner, target, names), macs)
                report.on_host.append(host)
                # data movement a backend does not run is no problem to warn about
                if any(not isinstance(why, DataMovement) for _, why in partitioner.declined.of(binding.var)):
                    declined.append(host)
    for name in calls:      # one entry per call: a partition function may be called more than once
        if name not in record.partitions:
            continue
        backend, pattern, ops = record.partitions[name]
        macs = sum(macs_of(c) for c in ops)
        report.total_macs += macs
        report.uncounted_ops += [f"{c.op.name} (in {name})" for c in ops if not macs_known(c)]
        notes = json.loads(record.notes.get(name, "{}"))
        rules = record.rules.get(name, {})
        core = next((n for n, c in enumerate(ops) if macs_of(c)), 0)
        fallback = record.failed.get(name)
        if fallback:        # what the backend's schedule planned did not happen
            rules, notes = {}, {"epilogue": notes.get("epilogue")}
        part = Partition(backend, name, pattern, [c.op.name for c in ops[core:]], macs,
                         notes.get("epilogue") or epilogue_of(ops[core:]), rules,
                         macs if not rules else int(notes.get("host_macs", 0)),
                         notes.get("device_macs"), [_at_compile_time(s, record.folded.get(name, ()))
                                                    for s in notes.get("host_steps", [])],
                         fallback, name in record.from_records)
        report.partitions.append(part)
    if record.records is not None:
        report.records = {"path": str(record.records.path), "applied": sum(p.from_records for p in report.partitions),
                          "partitions": len(report.partitions),
                          "misses": {p.function: record.record_misses[p.function] for p in report.partitions
                                     if p.function in record.record_misses}}
    # a float matmul in a quantised (QDQ) model: the QDQ pattern was not made integer arithmetic
    return report, declined, in_float and not quantised


def _printed_names(func: relax.Function) -> dict:
    """Each variable's name as ``func.show()`` prints it (var handle -> name): a repeated name
    (a rewrite's ``lv5``) gets ``_1``, ``_2``, ... in order of definition, as TVMScript's
    printer does, so that the report's names are found in ``tp.partition(mod, target).show()``."""
    out, used = {}, set()
    defined = list(func.params) + [b.var for block in func.body.blocks for b in block.bindings]
    for var in defined:
        name, k = var.name, 0
        while name in used:
            k += 1
            name = f"{var.name}_{k}"
        used.add(name)
        out[var.__chandle__()] = name
    return out


def _at_compile_time(step, folded) -> list:
    what, why = step
    return [what, f"{why} (once, at compile time: a constant)" if what in folded else why]


def _reason(op: str, var: relax.Var, partitioner, target, names: dict) -> str:
    """Why no backend took ``var``'s operator ``op``; ``names``: printed names by var handle."""
    declined = [f"{b}: {why}" for b, why in partitioner.declined.of(var)]
    # in a chain a check declined for another operator's reason: point to that operator
    declined += [f"part of {pattern}, which {b} declined: see {', '.join(names.get(v.__chandle__(), v.name) for v in owners)}"
                 for b, pattern, owners in partitioner.declined.part_of(var)]
    if declined:
        return "; ".join(declined)
    names = [b.name for b, _ in target.backends]
    if not names:
        return "the target has no backend"
    takers = [b for b in names if op in partitioner.covered.get(b, ())]
    if takers:
        return f"not in a form the patterns of {', '.join(takers)} take"
    return f"no backend of the target takes {op} ({', '.join(names)})"


def _complain(report: ModelReport, target, declined: list, strict: bool, in_float: bool) -> None:
    """Warn (or raise, ``strict``) when nothing was offloaded, or operators with MACs, or that
    a backend's check declined, stay on the host; one line per operator."""
    names = [b.name for b, _ in target.backends]
    if not names:
        return
    problems = [f"{h.var} = {h.op}: {h.reason}" for h in report.on_host
                if h.macs or any(h is d for d in declined)]
    if not report.partitions:
        head = f"nothing was offloaded to {', '.join(names)}" + (":" if problems else " (no operator matched a pattern)")
    else:
        head = f"part of the model stays on the host, not on {', '.join(names)}:"
    for p in report.partitions:
        if p.fallback:
            problems.append(f"{p.function} ({p.pattern}) ran on the host: {p.fallback}")
        elif not p.rules:
            said = "; ".join(f"{what} {why}" for what, why in p.on_host)     # the backend's schedule says why
            problems.append(f"{p.function} ({p.pattern}) ran on the host: "
                            + (said or f"none of {p.backend}'s rules matched its code (tp.explain(rules, func) "
                                       "on its scheduled, tp.lower'ed PrimFunc says why)"))
        elif p.host_macs:
            problems.append(f"{p.function} ({p.pattern}): {p.host_macs:,} of its {p.macs:,} MACs stay on the host")
    if not problems and report.partitions:
        return
    shown = problems[:_MAX_LINES] + ([f"... and {len(problems) - _MAX_LINES} more (the build's report lists every "
                                      "operator on the host: report.text(verbose=True), tirpat compile --verbose)"]
                                     if len(problems) > _MAX_LINES else [])
    advice = ""
    if not report.partitions and report.uncounted:
        advice = ("\nthe model's shapes are symbolic (a dimension such as its batch is left open); give them "
                  "sizes (`tirpat compile --input-shapes`, or bind them in the model) so that the backends "
                  "can take its matmuls and convolutions")
    elif not report.partitions and in_float:
        advice = ("\nthe model's matmuls and convolutions compute in floating point; for an integer "
                  "accelerator, quantise it first: `tirpat quantize model.onnx --calibration calib.npz` (or tp.quantize, then "
                  "tp.integerize; the README's 'Quantise a float model')")
    if strict:      # the advice first: the command line shows an error as one line, cut when long
        first = head.rstrip(":") + (f" ({advice.strip()})" if advice else "") + (":" if shown else "")
        raise OffloadError("\n  ".join([first] + shown))
    message = "\n  ".join([head] + shown) + advice
    warnings.warn(message, OffloadWarning, stacklevel=3)


#: Relax's quantise and dequantise: a model with them is quantised already (QDQ)
_QDQ = frozenset({"relax.quantize", "relax.dequantize"})

#: the most operators an OffloadWarning lists (the report has them all)
_MAX_LINES = 12
