"""accel: a small simulated int8 NPU (Gemmini/VTA style) that tirpat offloads to.

The hardware side: :class:`Config`, the scratchpads and instructions declared once
(:mod:`accel.hw.instructions`), the ISA's encoding (:mod:`accel.hw.isa`), the stream emitter
(:mod:`accel.hw.emitter`), the simulator and cycle model (:mod:`accel.hw.sim`) and the runtime
(:mod:`accel.hw.runtime`), which registers the ``accel.*`` TVM global functions on import.

>>> import accel
>>> with accel.Session() as s:
...     _ = s.alu(accel.AluOp.ADD, 0, imm=1, use_imm=True)
>>> int(s.scratchpad(accel.Mem.ACC)[0])
1
"""

from accel.hw.config import Config
from accel.hw.errors import (
    AccelError, AlignmentError, DeadlockError, DecodeError, DmaRangeError, DtypeMismatchError,
    InstructionError, ScratchpadOverflowError, TokenError, UnknownSlotError,
)
from accel.hw.isa import (
    INSTRUCTION_BYTES, Alu, AluChain, AluOp, Dwmac, Finish, Lut, Gemm, Instruction, Load, Mem, Opcode, Queue, Store,
    StoreMode, decode, disassemble, encode,
)
from accel.hw.runtime import (
    AUTO, POP_NEXT, POP_PREV, PUSH_NEXT, PUSH_PREV, ConfigMismatchError, Session, current_session,
    default_session,
)
from accel.hw.stats import Stats, Timeline

# The compiler side (tirpat rules, scratchpad planner, scheduler, build) is loaded on first
# use, so that importing the hardware side alone never loads the compiler.
_COMPILER = {
    "rules": "accel.compiler.rules", "PlanError": "accel.compiler.planner",
    "ScratchpadOverflow": "accel.compiler.planner", "build": "accel.compiler.build",
    "pipeline_name": "accel.compiler.build", "target": "accel.compiler.build",
}


def __getattr__(name: str):
    module = _COMPILER.get(name)
    if module is None:
        raise AttributeError(f"module 'accel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_COMPILER))

__all__ = [
    "Config", "Session", "current_session", "default_session", "Stats", "Timeline",
    "INSTRUCTION_BYTES", "Opcode", "Queue", "Mem", "StoreMode", "AluOp", "Instruction", "Load",
    "Store", "Gemm", "Alu", "AluChain", "Dwmac", "Lut", "Finish", "encode", "decode", "disassemble",
    "AUTO", "POP_PREV", "POP_NEXT", "PUSH_PREV", "PUSH_NEXT",
    "AccelError", "DecodeError", "InstructionError", "DmaRangeError", "ScratchpadOverflowError",
    "AlignmentError", "UnknownSlotError", "DtypeMismatchError", "TokenError", "DeadlockError",
    "ConfigMismatchError", "rules", "build", "pipeline_name", "target", "PlanError", "ScratchpadOverflow",
]
