"""vecunit: an int8 vector unit brought to tirpat the way a vendor would bring theirs.

The worked example of ``docs/bring-your-own-accelerator.md``. The hardware side,
:mod:`vecunit.isa` (the instructions, each written once as the program it replaces) and
:mod:`vecunit.runtime` (the session and functions compiled code calls), never imports the
compiler side, :mod:`vecunit.compiler` (graph patterns, schedule, rules, register
planning); :mod:`vecunit.backend` ties them to tirpat's Backend API.

>>> import tirpat as tp
>>> tp.register_backend(VecUnitBackend)            # then "vecunit, llvm" is a target
"""

from .backend import VecUnitBackend
from .isa import ALU, INSTRUCTIONS, VRF, Imm, Reg, alu
from .runtime import RUNTIME, Stats, VecUnit, VecUnitError

__all__ = ["VecUnitBackend", "ALU", "INSTRUCTIONS", "VRF", "Imm", "Reg", "alu", "RUNTIME", "Stats",
           "VecUnit", "VecUnitError"]
