"""accel: a small simulated int8 NPU (Gemmini/VTA style) that tirpat offloads to.

The hardware side: :class:`Config`, the ISA (:mod:`accel.isa`), the stream emitter
(:mod:`accel.emitter`), the simulator and cycle model (:mod:`accel.sim`) and the runtime
(:mod:`accel.runtime`), which registers the ``accel.*`` TVM global functions on import.

>>> import accel
>>> with accel.Session() as s:
...     _ = s.alu(accel.AluOp.ADD, 0, imm=1, use_imm=True)
>>> int(s.scratchpad(accel.Mem.ACC)[0])
1
"""

from accel.config import Config
from accel.errors import (
    AccelError, AlignmentError, DeadlockError, DecodeError, DmaRangeError, DtypeMismatchError,
    InstructionError, ScratchpadOverflowError, TokenError, UnknownSlotError,
)
from accel.isa import (
    INSTRUCTION_BYTES, Alu, AluOp, Finish, Gemm, Instruction, Load, Mem, Opcode, Queue, Store,
    StoreMode, decode, disassemble, encode,
)
from accel.runtime import (
    AUTO, POP_NEXT, POP_PREV, PUSH_NEXT, PUSH_PREV, Session, current_session, default_session,
)
from accel.stats import Stats, Timeline

# The compiler side (tirpat rules, scratchpad planner, scheduler, build) on top.
from accel.rules import rules  # noqa: E402
from accel.planner import PlanError, ScratchpadOverflow  # noqa: E402
from accel.pipeline import Executable, Report, build, pipeline_name  # noqa: E402

__all__ = [
    "Config", "Session", "current_session", "default_session", "Stats", "Timeline",
    "INSTRUCTION_BYTES", "Opcode", "Queue", "Mem", "StoreMode", "AluOp", "Instruction", "Load",
    "Store", "Gemm", "Alu", "Finish", "encode", "decode", "disassemble",
    "AUTO", "POP_PREV", "POP_NEXT", "PUSH_PREV", "PUSH_NEXT",
    "AccelError", "DecodeError", "InstructionError", "DmaRangeError", "ScratchpadOverflowError",
    "AlignmentError", "UnknownSlotError", "DtypeMismatchError", "TokenError", "DeadlockError",
    "rules", "build", "pipeline_name", "Executable", "Report", "PlanError", "ScratchpadOverflow",
]
