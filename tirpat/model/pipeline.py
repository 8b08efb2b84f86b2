"""The Relax and TIR pipelines of a whole-model build, public so that ``tvm.compile`` can use them.

- :func:`relax_pipeline` partitions the model for the target's backends
  (:mod:`tirpat.model.partition`), lowers each partition to one PrimFunc (``LegalizeOps``,
  ``FuseTIR``; the scalar constants a call passes become immediates, in a PrimFunc of its own
  for each distinct set of them when one PrimFunc serves several calls), hands it to its
  backend's ``schedule`` and marks it opaque to TVM's fusion
  (``op_pattern`` kOpaque, else ``FuseOps`` would merge it with its neighbours); the host
  buffers the scheduled PrimFunc allocates become outputs of its calls, which Relax's memory
  planning places (:mod:`tirpat.model.scratch`); a weight
  layout stage the schedule marked (``meta_schedule.layout_rewrite_preproc``, as
  meta_schedule's layout rewriting does) becomes a function of its own, which runs at
  compile time when the weight is a constant (:mod:`tirpat.model.prepack`). The rest of the
  module then takes TVM's default pipeline for the host target, and the host's fused
  functions get their elementwise steps inlined (:mod:`tirpat.model.host_inline`).
- :data:`TIR_PIPELINE` is one registered TIR pipeline for every target: it sees every
  PrimFunc, and runs a backend's ``BEFORE_REWRITE`` passes, rules and ``AFTER_REWRITE``
  passes only on the PrimFuncs tagged with that backend (:data:`~tirpat.model.partition.BACKEND_ATTR`,
  options in :data:`~tirpat.model.partition.OPTIONS_ATTR`); the others take TVM's default TIR
  pipeline alone. In every PrimFunc, the CPU's copy loops (a partition's layout copies,
  paddings and im2col) then run in the order of the memory they write, tiled against the
  memory they read (:mod:`tirpat.model.host_loops`).

Each offloaded PrimFunc starts with a call of :data:`PARTITION_MARKER` that carries its backend
options: the device runtimes it calls refuse a session made for other ones
(:meth:`tirpat.device.Runtime.begin`), so the code runs only under the options it was built for.
It begins them in place of the ``<prefix>.begin()`` a planner puts first, which is dropped.

>>> t = "accel, llvm"
>>> ex = tvm.compile(mod, "llvm", relax_pipeline=tp.relax_pipeline(t), tir_pipeline=tp.TIR_PIPELINE)  # doctest: +SKIP
>>> with accel.Session():                                                    # doctest: +SKIP
...     out = relax.VirtualMachine(ex, tvm.cpu())["main"](x)
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import warnings
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from .. import device
from .backend import Phase, lookup
from .host_inline import inline_elementwise
from .cpu_loops import outline_cpu_loops
from .host_loops import host_loops
from .partition import (BACKEND_ATTR, OPTIONS_ATTR, PARTITION_ATTR, PartitionOrigin, Partitioner, as_target,
                        options_text, origin_of, tagged)
from .prepack import split_layout_stages
from .scratch import scratch_outputs, scratch_params
from .report import SCHEDULE_NOTES
from ..tir.lowering import lower_blocks
from ..tir.pipeline import registered, tir_pipeline
from ..tir.wrapping import wrapping_arithmetic

__all__ = ["relax_pipeline", "lower_partitions", "partition_functions", "schedule_for", "with_records", "TIR_PIPELINE",
           "KOPAQUE"]

#: The registered TIR pipeline name (``tvm.compile(..., tir_pipeline=tp.TIR_PIPELINE)``).
TIR_PIPELINE = "tirpat.backends"
#: TVM's ``OpPatternKind::kOpaque``: ``FuseOps`` fuses nothing into a PrimFunc with this ``op_pattern``.
KOPAQUE = 8


@dataclass
class Record:
    """What the pipelines learn during one build, for its report: handed to them explicitly
    (``relax_pipeline(..., record=)``, :func:`tir_pipeline_for`), so concurrent builds each
    fill their own. Keyed by partition: the name of the PrimFunc a Relax partition was lowered
    to, which its copies carry (:data:`~tirpat.model.partition.PARTITION_ATTR`)."""

    partitioned: object = None                        # the module right after partitioning
    partitioner: object = None                        # the Partitioner (what its checks declined)
    partitions: dict = field(default_factory=dict)    # partition -> (backend, composite, relax ops)
    notes: dict = field(default_factory=dict)         # partition -> the schedule's notes
    rules: dict = field(default_factory=dict)         # partition -> {rule: sites}
    folded: dict = field(default_factory=dict)        # partition -> layout stages run at compile time
    failed: dict = field(default_factory=dict)        # partition -> why its backend could not lower it
    from_records: set = field(default_factory=set)    # partitions scheduled from a tuning record
    records: object = None                            # the tuning records given, if any
    record_misses: dict = field(default_factory=dict)  # partition -> why no record applied
    #: a partition its backend cannot lower runs on the host (a model's); False: the error is
    #: raised (a TIR workload, whose functions the user handed to the target themselves)
    fall_back: bool = True
    #: (backend, options text, structural hash) -> (what the TIR stages took, what they gave):
    #: the stages :func:`schedule_for` tried, which the dispatch reuses for the same function
    tried: dict = field(default_factory=dict)
    #: True: the TIR pipeline of :func:`tir_pipeline_for` takes the offloaded PrimFuncs out of
    #: the host module, lowered and finalised, into :attr:`offloaded` (``tp.build`` compiles
    #: them apart: :mod:`tirpat.model.native`)
    take_offloaded: bool = False
    offloaded: object = None                          # IRModule of the offloaded PrimFuncs taken
    #: True: the offloaded partitions' large CPU loop nests become host functions they call
    #: (:mod:`tirpat.model.cpu_loops`), for a build whose model will be linked
    outline_loops: bool = False
    #: the function that allocates the storages lifted out of the entry
    #: (:func:`tirpat.model.storages.lift_storages`), None when none were
    storages: str | None = None


#: The runtime function every offloaded PrimFunc calls first, with its name, its backend, the
#: backend options it was built for (JSON) and the prefixes of the device runtimes it calls
#: (comma-separated): see :func:`_on_partition`.
PARTITION_MARKER = "tirpat.partition_begin"


def _on_partition(name, backend: str = "", options: str = "", runtimes: str = "") -> None:
    """An offloaded partition starts: each device runtime it calls begins its work on its
    current session (a failed call's leftovers are discarded, a session of other options
    refuses the code: the options travel with the code, whatever ran it), and a session's
    :attr:`~tirpat.device.Session.on_partition` listener hears the partition's name, once."""
    if not runtimes:
        return
    # once per partition and call (a hundred times a model call): what the arguments say is
    # read once per partition, not parsed again each time; found by the name, the others
    # compared with those it came with (new strings each call: hashing the options' JSON, as a
    # cache keyed by all four would, costs more than comparing it)
    seen = _SEEN.get(name)
    if seen is None or seen[0] != options or seen[1] != backend or seen[2] != runtimes:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        seen = _SEEN[name] = (options, backend, runtimes, _marker(name, backend, options, runtimes))
    prefixes, built, code, text = seen[3]
    known, caller, heard = device.runtimes(), sys._getframe().f_back, []
    for prefix in prefixes:
        runtime = known.get(prefix)
        if runtime is not None:
            listener = runtime.begin(built, code, caller=caller).on_partition
            if listener is not None and listener not in heard:     # one function, or one object's method: once
                heard.append(listener)
    for listener in heard:
        listener(text)


#: partition name -> (options, backend, runtimes, :func:`_marker` of them): the markers last seen
_SEEN: dict = {}
_SEEN_MAX = 1024


@functools.lru_cache(maxsize=1024)
def _marker(name, backend: str, options: str, runtimes: str) -> tuple:
    """What a partition's marker says (:func:`_on_partition`): the prefixes of the runtimes it
    calls, the options it was built for, how an error names it, and its name as text.

    >>> _marker("f", "accel", '{"tile": 16}', "accel")
    (('accel',), mappingproxy({'tile': 16}), 'the accel partition f', 'f')
    """
    return tuple(str(runtimes).split(",")), _built(options), f"the {backend} partition {name}", str(name)


@functools.lru_cache(maxsize=256)
def _built(options: str) -> MappingProxyType:
    """The backend options a marker gives as JSON, read-only and one mapping for every
    partition built with them: a session that found them agreeing with its own does not
    compare them again (:meth:`tirpat.device.Runtime.begin`)."""
    return MappingProxyType(json.loads(options) if options else {})


def _runtime_prefixes(func: tirx.PrimFunc) -> str:
    """The prefixes of the runtime functions ``func`` calls (``accel`` of ``accel.load``),
    comma-separated; those of device runtimes (:func:`tirpat.device.runtimes`) count when it runs."""
    found: dict = {}

    def on_call(call):
        if call.op.name == "tirx.tvm_call_packed" and isinstance(call.args[0], ir.StringImm):
            prefix = call.args[0].value.split(".", 1)[0]
            if prefix != "tirpat":
                found[prefix] = None

    tvm_ffi.structural_walk(func.body, (ir.Call, on_call))
    return ",".join(found)


tvm.register_global_func(PARTITION_MARKER, _on_partition, override=True)


def _single_primfunc(scheduled, name: str):
    if isinstance(scheduled, tirx.PrimFunc):
        return scheduled
    if isinstance(scheduled, ir.IRModule):
        funcs = [f for f in scheduled.functions.values() if isinstance(f, tirx.PrimFunc)]
        if len(funcs) == 1:
            return funcs[0]
    raise TypeError(f"{name}.schedule must return a PrimFunc (or an IRModule with one), got {type(scheduled).__name__}")


def _legalized(mod: ir.IRModule, bases: dict | None = None) -> tuple[ir.IRModule, dict]:
    """Each tagged Relax partition legalized into one PrimFunc of the same name (what the
    backend's ``schedule`` gets), and the tags: name -> ((backend, opts), composite, ops).
    ``bases``, if given, is filled as :func:`_inline_scalar_constants` says."""
    tags = {}
    for gv, func in mod.functions.items():
        tag = tagged(func) if isinstance(func, relax.Function) else None
        if tag is not None:
            tags[gv.name_hint] = (tag, str(func.attrs["Composite"]), _ops_of(func))
    if not tags:
        return mod, tags
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()])(mod)
    return _inline_scalar_constants(mod, tags, bases)


def partition_functions(mod: ir.IRModule, target, *, bases: dict | None = None) -> list:
    """``[(name, backend name, options, PrimFunc)]``: every partition of the Relax module
    ``mod`` for ``target``, legalized as its backend's ``schedule`` receives it (what
    ``tp.tune`` tunes).

    ``bases``, if given (a dict), is filled with ``{copy: partition}`` for the copies of a
    partition that one call site's scalar constants made (``<name>_s1``, ...: the same
    computation but for those immediates).

    >>> [name for name, *_ in tp.partition_functions(mod, "accel, llvm")]   # doctest: +SKIP
    ['fused_relax_matmul_relax_add']
    """
    mod, tags = _legalized(Partitioner(as_target(target))(mod), bases)
    return [(gv.name_hint, *tags[gv.name_hint][0], func) for gv, func in mod.functions.items()
            if gv.name_hint in tags and isinstance(func, tirx.PrimFunc)]


def lower_partitions(records=None, *, record: Record | None = None) -> tvm.transform.Pass:
    """Lower every tagged Relax partition to one PrimFunc, scheduled by its backend and
    opaque to fusion; split off weight layout stages (see the module docstring). Each
    PrimFunc says which partition it computes (:data:`~tirpat.model.partition.PARTITION_ATTR`).

    ``records`` (a ``tp.Records`` or its directory) are tuning records: a partition with
    one reaches its backend's ``schedule`` with the best record's decisions applied.
    ``record``: a build's :class:`Record`, which the pass fills (else a partition its backend
    cannot lower is a warning).

    >>> mod = tp.lower_partitions()(tp.partition(mod, "accel, llvm"))       # doctest: +SKIP
    """
    if records is not None:
        from .records import Records

        records = records if isinstance(records, Records) else Records(records)

    @tvm.transform.module_pass(opt_level=0, name="tirpat.LowerPartitions")
    def run(mod: ir.IRModule, ctx) -> ir.IRModule:
        bases: dict = {}        # a call site's copy -> the partition it computes
        widened: list = []      # the partitions whose scratch buffers became parameters
        mod, tags = _legalized(mod, bases)
        if not tags:
            return mod
        for gv, func in list(mod.functions.items()):
            entry = tags.get(gv.name_hint)
            if entry is None or not isinstance(func, tirx.PrimFunc):
                continue
            (name, opts), composite, ops = entry
            if record is not None:
                record.partitions[gv.name_hint] = (name, composite, ops)
            if records is not None:
                func = with_records(records, func, name, opts, gv.name_hint, record)
            # a copy for other scalar constants is the same partition: its layer is named as the partition
            origin = PartitionOrigin(bases.get(gv.name_hint, gv.name_hint), tuple(str(c.op.name) for c in ops))
            scheduled = schedule_for(func, name, opts, gv.name_hint, record, origin, scratch=True)
            mod[gv] = func.with_attr("op_pattern", KOPAQUE) if scheduled is None else scheduled
            if scheduled is not None and len(scheduled.params) > len(func.params):
                widened.append(gv.name_hint)
        # the calls allocate the scratch buffers that schedule_for made parameters
        mod = scratch_outputs(mod, widened)
        mod, folded = split_layout_stages(mod)
        if record is not None:
            record.folded.update(folded)
            for func in mod.functions.values():
                origin = origin_of(func) if isinstance(func, tirx.PrimFunc) and tagged(func) is not None else None
                if origin is not None and origin.name in record.partitions and SCHEDULE_NOTES in func.attrs:
                    record.notes[origin.name] = str(func.attrs[SCHEDULE_NOTES])
        return mod

    return run


def with_records(records, func: tirx.PrimFunc, backend: str, opts: dict, function: str,
                 record: Record | None = None) -> tirx.PrimFunc:
    """``func`` with the decisions of the best of the tuning ``records`` (a ``tp.Records``) for
    ``backend`` and ``opts`` applied, or as it is when none applies; ``record`` notes which
    (the partition ``function``) and why not.

    >>> func = with_records(tp.Records("records/"), func, "accel", opts, "main")   # doctest: +SKIP
    """
    tuned = records.apply(func, backend, opts)
    if record is not None:
        record.records = records
        if tuned.same_as(func):
            record.record_misses[function] = records.why_none(func, backend, opts)
        else:
            record.from_records.add(function)
    return tuned


def schedule_for(func: tirx.PrimFunc, backend: str, opts: dict, function: str, record: Record | None = None,
                 origin: PartitionOrigin | None = None, *, scratch: bool = False) -> tirx.PrimFunc | None:
    """``func`` scheduled by ``backend`` (its ``schedule`` hook, with the resolved ``opts``),
    tagged for the TIR pipeline's dispatch and opaque to fusion; None when the schedule
    raised (the partition ``function`` runs on the host, ``record`` says why), unless
    ``record.fall_back`` is False (then it raises). ``origin``: the Relax partition it
    computes, for :data:`~tirpat.model.partition.PARTITION_ATTR` (none for a TIR workload).
    ``scratch``: the host buffers the scheduled function allocates become parameters after
    its own (:func:`~tirpat.model.scratch.scratch_params`), which its callers must allocate
    (:func:`~tirpat.model.scratch.scratch_outputs`).

    >>> f = schedule_for(func, "accel", tp.backends()["accel"].resolve({}), "main")      # doctest: +SKIP
    >>> f.attrs[BACKEND_ATTR]                                                            # doctest: +SKIP
    'accel'
    """
    try:
        scheduled = _single_primfunc(lookup(backend).schedule(func, opts), backend)
    except Exception as err:  # noqa: BLE001 - the partition runs on the host; the report says why
        if record is not None and not record.fall_back:
            raise
        _fell_back(record, function, backend, "its schedule", err)
        return None
    if scratch:     # before the trial below, so that the dispatch finds it for the same function
        scheduled = scratch_params(scheduled)
    if _calls_device(scheduled):
        # A schedule that already emits the device's calls leaves nothing the CPU could run if
        # the TIR stages later refuse it (the dispatch's fallback lowers the scheduled PrimFunc
        # for the host): those stages are tried now, on a copy, while the unscheduled PrimFunc
        # can still take the partition's place.
        # Under the name TVM gives it (its GlobalVar's), as the dispatch will see it: the
        # dispatch then takes this result when the same function reaches it, and does not
        # run the stages twice.
        staged = _stage_input(_single_primfunc(lower_blocks()(ir.IRModule({function: scheduled})), backend),
                              function)
        try:
            done = _lowered_by(backend, options_text(opts), ir.GlobalVar(function), staged)
        except Exception as err:  # noqa: BLE001 - as above
            if record is not None and not record.fall_back:
                raise
            _fell_back(record, function, backend, "its TIR passes or rules", err)
            return None
        if record is not None:
            record.tried[_tried_key(backend, options_text(opts), staged)] = (staged, done)
    if func.attrs is None or "global_symbol" not in func.attrs:
        scheduled = scheduled.without_attr("global_symbol")
    scheduled = (scheduled.with_attr(BACKEND_ATTR, backend).with_attr(OPTIONS_ATTR, options_text(opts))
                 .with_attr("op_pattern", KOPAQUE))
    return scheduled if origin is None else scheduled.with_attr(PARTITION_ATTR, origin.attr())


def _inline_scalar_constants(mod: ir.IRModule, tags: dict, bases: dict | None = None) -> tuple[ir.IRModule, dict]:
    """Scalar constants a partition is called with (a requantise's shift, a zero point) become
    immediates in its PrimFunc, where a backend's rules can see their values; the blocks no
    longer list them among what they read (a schedule sees no read of them).

    ``FuseTIR`` gives structurally equal partitions one PrimFunc, called at several sites with
    different constants (two convolutions of one shape, each with its own requantise). A
    PrimFunc whose sites pass different scalars is therefore copied, one copy per distinct set
    of scalar values (``<name>_s1``, ``<name>_s2``, ...; the first set keeps the name), and each
    site calls its own copy: immediates baked into a shared PrimFunc would give every site the
    values of one. Returns the module and ``tags`` with an entry for each copy; ``bases``, if
    given, gets ``{copy name: name}``."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    pattern = is_op("relax.call_tir")(wildcard(), wildcard())
    variants: dict = {}     # PrimFunc name -> {scalar key: GlobalVar}, in order of first use

    def note(call, _):
        if call.args[0].name_hint in tags:
            variants.setdefault(call.args[0].name_hint, {}).setdefault(_scalar_key(call), None)
        return call

    relax_funcs = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    for _, func in relax_funcs:
        rewrite_call(pattern, note, func)       # the same walk as the one that repoints below
    variants = {name: keys for name, keys in variants.items() if any(keys)}
    if not variants:
        return mod, tags
    tags = dict(tags)
    builder = relax.BlockBuilder(mod)        # its add_func gives a new GlobalVar its type and a free name
    for name, keys in variants.items():
        gv = mod.get_global_var(name)
        func = mod[gv]
        for n, key in enumerate(keys):
            if n == 0:
                keys[key] = gv
                builder.update_func(gv, _with_immediates(func, key))
            else:
                copy = builder.add_func(_with_immediates(func, key), f"{name}_s{n}")
                if func.attrs is not None and "global_symbol" in func.attrs:     # one symbol per copy
                    builder.update_func(copy, builder.get()[copy].with_attr("global_symbol", copy.name_hint))
                keys[key] = copy
                tags[copy.name_hint] = tags[name]
                if bases is not None:
                    bases[copy.name_hint] = name
    mod = builder.get()

    def repoint(call, _):       # each site calls the copy made for its scalars
        keys = variants.get(call.args[0].name_hint)
        if keys is None:
            return call
        target = keys[_scalar_key(call)]
        if target.same_as(call.args[0]):
            return call
        return relax.Call(call.op, [target, *call.args[1:]], call.attrs, call.ty_args)

    for gv, _ in relax_funcs:
        mod[gv] = rewrite_call(pattern, repoint, mod[gv])
    return mod, tags


def _scalar_key(call) -> tuple:
    """The scalar constants a ``call_tir`` passes: ``((param index, dtype, bytes), ...)`` (bytes,
    not values, so that a NaN equals itself and -0.0 differs from 0.0)."""
    key = []
    for n, arg in enumerate(call.args[1].fields):
        if isinstance(arg, ir.Constant) and not isinstance(arg, (tirx.IntImm, tirx.FloatImm)) \
                and int(np.prod(arg.value.shape)) == 1:
            value = arg.value.numpy().reshape(-1)
            key.append((n, str(value.dtype), value.tobytes()))
    return tuple(key)


def _with_immediates(func: tirx.PrimFunc, key: tuple) -> tirx.PrimFunc:
    """``func`` with the parameters a :func:`_scalar_key` names read as immediates."""
    values = {func.params[n].__chandle__(): (func.params[n], np.frombuffer(raw, dtype)[0].item())
              for n, dtype, raw in key}

    def on_load(load):
        found = values.get(load.source.__chandle__())
        if found is None:
            return load
        buf, value = found
        return tirx.const(value, str(buf.dtype))

    def on_block(block):
        reads = [r for r in block.reads if r.source.__chandle__() not in values]
        if len(reads) == len(block.reads):
            return block
        return s_tir.SBlock(block.iter_vars, reads, block.writes, block.name_hint, block.body, block.init,
                            block.alloc_buffers, block.match_buffers, block.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, [(ir.TensorLoad, on_load), (s_tir.SBlock, on_block)]))


def _ops_of(func: relax.Function) -> list:
    """The operator calls of a partition's body, in order."""
    return [b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, ir.Op)]


def relax_pipeline(target, records=None, *, record: Record | None = None) -> tvm.transform.Pass:
    """The Relax pipeline of ``tp.build`` for ``target`` (a ``tp.CompositeTarget`` or a string):
    partition, lower and schedule the partitions (with the best of the tuning ``records``,
    if given), then TVM's default pipeline for the host. Use it with
    ``tir_pipeline=tp.TIR_PIPELINE``; ``record``, a build's :class:`Record`, is filled with
    what the pipeline does (``tp.build``'s report).

    >>> ex = tvm.compile(mod, "llvm", relax_pipeline=tp.relax_pipeline("accel, llvm"),
    ...                  tir_pipeline=tp.TIR_PIPELINE)                     # doctest: +SKIP
    """
    t = as_target(target)
    partitioner = Partitioner(t)
    host = relax.get_default_pipeline(t.host)

    @tvm.transform.module_pass(opt_level=0, name="tirpat.Partition")
    def part(mod, ctx):
        mod = partitioner(mod)
        if record is not None:
            record.partitioned, record.partitioner = mod, partitioner
        return mod

    # the host's fused functions with their elementwise steps inlined: LLVM takes a fused
    # requantise chain of 30 loop nests many times longer than one nest (tirpat.model.host_inline)
    return tvm.transform.Sequential([part, lower_partitions(records, record=record), host, inline_elementwise()],
                                    name="tirpat.relax_pipeline")


# ----------------------------------------------------------------------------- TIR
_LOCK = threading.Lock()
_STAGES: dict = {}      # (backend, options text) -> (before passes, rewriter, after passes)


def _stages(name: str, opts_text: str):
    key = (name, opts_text)
    with _LOCK:
        found = _STAGES.get(key)
        if found is None:
            backend = lookup(name)
            opts = backend.resolve(json.loads(opts_text))
            found = (list(backend.passes(Phase.BEFORE_REWRITE, opts) or []), backend.rules(opts),
                     list(backend.passes(Phase.AFTER_REWRITE, opts) or []))
            _STAGES[key] = found
        return found


def _dispatch(record: Record | None) -> tvm.transform.Pass:
    """Each tagged PrimFunc through its backend's TIR phases and rules, alone in a module;
    what happens goes into ``record``, by partition."""
    @tvm.transform.module_pass(opt_level=0, name="tirpat.DispatchBackends")
    def dispatch(mod: ir.IRModule, ctx) -> ir.IRModule:
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and func.attrs is not None and BACKEND_ATTR in func.attrs:
                mod[gv] = _dispatch_one(gv, func, record)
        return mod

    return dispatch


def _dispatch_one(gv: ir.GlobalVar, func: tirx.PrimFunc, record: Record | None) -> tirx.PrimFunc:
    """One tagged PrimFunc lowered by its backend (else untagged, for the host)."""
    origin = origin_of(func)
    partition = gv.name_hint if origin is None else origin.name    # hand-written code: its own name
    backend = str(func.attrs[BACKEND_ATTR])
    try:
        done, counts = _tried_or_lowered(record, backend, str(func.attrs.get(OPTIONS_ATTR, "{}")), gv, func)
    except Exception as err:  # noqa: BLE001 - the partition runs on the host; the report says why
        if record is not None and not record.fall_back:
            raise
        if _calls_device(func):     # schedule_for tried these stages: only a TVM pass between can differ
            raise RuntimeError(f"{partition}: {backend} could not lower it ({type(err).__name__}: "
                               f"{str(err).strip()}) and its schedule emits {backend}'s calls, which the "
                               "host cannot run") from err
        # the scheduled PrimFunc computes what the partition computes (a schedule only
        # reorders it; its scratchpad buffers are local memory to the CPU): TVM lowers it
        _fell_back(record, partition, backend, "its TIR passes or rules", err)
        return func.without_attr(BACKEND_ATTR)
    # a marker first, so that a run can tell which partition the device's work belongs to
    # and what the code was built for, checked against the sessions that run it
    runtimes = _runtime_prefixes(done)
    marker = tirx.Evaluate(tirx.call_packed(PARTITION_MARKER, partition, backend,
                                            str(func.attrs.get(OPTIONS_ATTR, "{}")), runtimes))
    if record is not None:
        record.rules[partition] = counts
    return done.with_body(tirx.SeqStmt([marker, _without_begins(done.body, runtimes)]))


def _without_begins(body, runtimes: str):
    """``body`` without its calls of ``<prefix>.begin()`` for the runtimes ``runtimes`` names
    (a planner puts one first): the partition's marker begins each of them
    (:func:`_on_partition`), with the options the code was built for, one callback instead of
    one more per runtime on every call."""
    begins = {f"{prefix}.begin" for prefix in runtimes.split(",") if prefix}

    def on_evaluate(node, mutator):
        call = node.value
        if isinstance(call, ir.Call) and call.op.name == "tirx.tvm_call_packed" and len(call.args) == 1 \
                and isinstance(call.args[0], ir.StringImm) and call.args[0].value in begins:
            return tirx.Evaluate(tirx.IntImm("int32", 0))
        return node

    return tvm_ffi.structural_mutate(body, (tirx.Evaluate, on_evaluate))


def _lowered_by(backend: str, opts_text: str, gv: ir.GlobalVar, func: tirx.PrimFunc) -> tuple:
    """``func`` (lowered blocks) through ``backend``'s TIR phases and rules, alone in a module:
    the result and ``{rule: sites}``."""
    before, rw, after = _stages(backend, opts_text)
    sub = tvm.transform.Sequential(before)(ir.IRModule({gv: func}))
    counts = {}
    if rw is not None:
        sub, report = rw.rewrite(sub)
        counts = dict(report.counts)
    sub = tvm.transform.Sequential(after)(sub)
    return sub[gv], counts


def _stage_input(func: tirx.PrimFunc, symbol: str | None = None) -> tirx.PrimFunc:
    """``func`` with no attribute but its ``global_symbol`` (``symbol`` if it has none): all
    that the TIR stages read of a function's attributes (the planner names its replay keys
    after it), so that the same code under other tags is the same input to them."""
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        symbol = str(attrs["global_symbol"])
    bare = tirx.PrimFunc(func.params, func.body, func.ret_type)
    return bare.with_attr("global_symbol", symbol) if symbol else bare


def _tried_key(backend: str, opts_text: str, staged: tirx.PrimFunc) -> tuple:
    return backend, opts_text, tvm_ffi.structural_hash(staged)


def _tried_or_lowered(record: Record | None, backend: str, opts_text: str, gv: ir.GlobalVar,
                      func: tirx.PrimFunc) -> tuple:
    """:func:`_lowered_by`, or what :func:`schedule_for` got trying the stages on the same
    function (its attributes aside, which the stages keep as they are): ``func``'s own
    attributes on that result."""
    if record is not None and record.tried and _calls_device(func):
        staged = _stage_input(func)
        found = record.tried.get(_tried_key(backend, opts_text, staged))
        if found is not None and tvm_ffi.structural_equal(found[0], staged):
            done, counts = found[1]
            return tirx.PrimFunc(done.params, done.body, done.ret_type, func.attrs), dict(counts)
    return _lowered_by(backend, opts_text, gv, func)


def _calls_device(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` calls a device runtime's functions (:func:`tirpat.device.runtimes`)."""
    known = device.runtimes()
    return any(prefix in known for prefix in _runtime_prefixes(func).split(",") if prefix)


def _fell_back(record, function: str, backend: str, stage: str, err: Exception) -> None:
    """Note that ``backend`` could not lower the partition ``function`` (its ``stage`` raised
    ``err``), which therefore runs on the host: in the build's record, else as a warning."""
    why = f"{backend} could not lower it ({stage} raised {type(err).__name__}: {str(err).strip()})"
    if record is not None:
        record.failed[function] = why
    else:
        warnings.warn(f"{function} runs on the host: {why}", UserWarning, stacklevel=2)


def _tir_stage(record: Record | None) -> tvm.transform.Pass:
    """The dispatch, the CPU's copy loops in the order of the memory they write
    (:mod:`tirpat.model.host_loops`: a partition's layout copies, which its -O0 code keeps as
    written), then the host's int32 arithmetic made to wrap (:mod:`tirpat.tir.wrapping`):
    fused host functions and the CPU parts of partitions compute what TVM's one loop nest
    per operator computes, overflow included. With ``record.outline_loops``, last, the large
    CPU nests of the partitions a device runs move into host functions (:mod:`tirpat.model.cpu_loops`)."""
    passes = [_dispatch(record), host_loops(), wrapping_arithmetic()]
    if record is not None and record.outline_loops:
        passes.append(outline_cpu_loops(_offloaded))
    return tvm.transform.Sequential(passes, name="tirpat.TIRStage")


def _offloaded(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is a partition its backend lowered into calls of a device runtime."""
    return func.attrs is not None and BACKEND_ATTR in func.attrs and _calls_device(func)


def tir_pipeline_for(record: Record):
    """A context giving the name of a TIR pipeline, registered while inside, that is
    :data:`TIR_PIPELINE` filling ``record``: ``tvm.compile`` takes a TIR pipeline by name only,
    so a build's record reaches the dispatch through a pipeline of its own (concurrent builds
    each register theirs, :func:`tirpat.registered`).

    >>> record = Record()
    >>> with tir_pipeline_for(record) as name:
    ...     name in tvm.tirx.compilation_pipeline.PIPELINE_MAP
    True
    >>> name in tvm.tirx.compilation_pipeline.PIPELINE_MAP
    False
    """
    factory = tir_pipeline(_tir_stage(record), TIR_PIPELINE)
    return registered(_taking_offloaded(factory, record) if record.take_offloaded else factory, TIR_PIPELINE)


def _taking_offloaded(factory, record: Record):
    """``factory``'s pipeline, after which the PrimFuncs a backend lowered (tagged
    :data:`~tirpat.model.partition.BACKEND_ATTR`; a fallback is not) into calls of a device
    runtime leave the module, with the host's finalisation applied, for ``record.offloaded``:
    their code is loops of runtime calls, which LLVM's optimiser and code generator at -O3
    take seconds over for nothing (a backend whose code is the CPU's own stays)."""
    def taking():
        inner, finalize_host, finalize_device = factory()

        @tvm.transform.module_pass(opt_level=0, name="tirpat.TakeOffloaded")
        def take(mod, ctx):
            mod = inner(mod)
            taken = {gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and _offloaded(f)}
            if not taken:
                return mod
            record.offloaded = finalize_host()(ir.IRModule(taken, attrs=mod.attrs))
            return ir.IRModule({gv: f for gv, f in mod.functions.items() if gv not in taken}, attrs=mod.attrs)

        return take, finalize_host, finalize_device

    return taking


# TVM's default TIR pipeline with the dispatch as its rewrite stage (after block lowering); no
# build's record: a partition its backend cannot lower is a warning
tvm.tirx.compilation_pipeline.register_tir_pipeline(TIR_PIPELINE, tir_pipeline(_tir_stage(None), TIR_PIPELINE))
