"""tirpat: a pattern language and rewriter for TVM's lowered tensor IR.

>>> import tirpat as tp
>>> i, j = tp.is_var("i"), tp.is_var("j")
>>> A, B = tp.is_buffer("A"), tp.is_buffer("B")
>>> copy = tp.is_nest([i, j], tp.is_store(B, [i, j], A[i, j]))
>>> rw = tp.Rewriter.from_pattern(copy, lambda m: None)
"""

from .device.instr import instr
from .device.memory import Memory
from .tir.copy import is_copy
from .tir.engine import Match
from .tir.explain import Explanation, explain
from .tir.match import find_all, match
from .tir.pattern import Pattern, affine, is_buffer, is_call, is_const, is_load, is_var, max, min, wildcard
from .tir.lowering import lower, lower_blocks
from .tir.pipeline import register_pipeline, registered, tir_pipeline
from .tir.region import CopyRegion, Region, RegionError, padding, split_guard
from .tir.rewrite import Rewriter, Rewritten, rewriter
from .tir.scan import Decline, Declined, Report, RewriteError, Rule, Site, decline
from .tir.schedule import Schedule
from .tir.statement import is_for, is_if, is_nest, is_seq, is_store, loop

__all__ = [
    "CopyRegion", "Decline", "Declined", "Explanation", "Match", "Memory", "Pattern", "Region", "RegionError",
    "Report", "RewriteError", "Rewriter", "Rewritten", "Rule", "Schedule", "Site", "affine", "decline", "explain",
    "find_all", "instr", "is_buffer", "is_call", "is_const", "is_copy", "is_for", "is_if", "is_load", "is_nest",
    "is_seq", "is_store", "is_var", "loop", "lower", "lower_blocks", "match", "max", "min", "padding",
    "register_pipeline", "registered", "rewriter", "split_guard", "tir_pipeline", "wildcard",
]

# The model level (backends, targets, whole-model builds) is imported on first use: the TIR
# core and the device kit never need it, and a device runtime importing tirpat stays light.
_MODEL = {
    "Backend": "backend", "Option": "backend", "Phase": "backend", "register_backend": "backend",
    "backends": "backend", "CompositeTarget": "target", "TargetError": "target", "parse_target": "target",
    "quantize": "quantize", "CalibrationError": "quantize", "integerize": "integerize",
    "IntegerizeWarning": "integerize",
    "partition": "partition", "DataMovement": "partition", "build": "build", "OffloadWarning": "build",
    "OffloadError": "build",
    "CompiledModel": "compiled", "CompiledKernel": "kernel", "load": "compiled", "relax_pipeline": "pipeline",
    "lower_partitions": "pipeline", "TIR_PIPELINE": "pipeline", "ModelReport": "report",
    "SCHEDULE_NOTES": "report", "partition_functions": "pipeline", "Records": "records",
    "tune": "tune", "TuneResult": "tune", "Knob": "tune", "knob_space": "tune",
}
__all__ += sorted(_MODEL)


def __getattr__(name: str):
    module = _MODEL.get(name)
    if module is None:
        raise AttributeError(f"module 'tirpat' has no attribute {name!r}")
    from importlib import import_module     # here, not at the top: it would be a public name of tirpat

    value = getattr(import_module(f"tirpat.model.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODEL))
