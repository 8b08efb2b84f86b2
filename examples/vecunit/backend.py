"""The vecunit Backend: what tirpat's model level calls, each hook one line into the package.

>>> import tirpat as tp
>>> tp.register_backend(VecUnitBackend)
>>> tp.backends()["vecunit"].resolve({"lanes": "32"})
{'lanes': 32, 'regs': 32}
"""

from tvm import tirx

import tirpat as tp

from . import compiler
from .runtime import VecUnit

__all__ = ["VecUnitBackend"]


class VecUnitBackend(tp.Backend):
    """An int8 vector unit for elementwise chains and max pooling."""

    name = "vecunit"
    options = {"lanes": tp.Option(int, 16, help="int8 lanes per vector register"),
               "regs": tp.Option(int, 32, help="vector registers")}

    def patterns(self, opts: dict) -> list:
        return compiler.patterns()

    def schedule(self, func: tirx.PrimFunc, opts: dict) -> tirx.PrimFunc:
        return compiler.schedule(func, opts["lanes"])

    def rules(self, opts: dict) -> tp.Rewriter:
        return compiler.rules(opts["lanes"])

    def passes(self, phase: tp.Phase, opts: dict) -> list:
        return [compiler.planner(**opts).as_pass()] if phase is tp.Phase.AFTER_REWRITE else []

    def session(self, opts: dict) -> VecUnit:
        return VecUnit(**opts)
