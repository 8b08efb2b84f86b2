"""Exceptions raised by the accel ISA, emitter, simulator and runtime.

Every error about one instruction names it by stream index and disassembly, so a failure
inside compiled code points at the offending ``accel.*`` call.
"""

from __future__ import annotations

__all__ = [
    "AccelError", "DecodeError", "InstructionError", "DmaRangeError", "ScratchpadOverflowError",
    "AlignmentError", "UnknownSlotError", "DtypeMismatchError", "TokenError", "DeadlockError",
]


class AccelError(Exception):
    """Base class of every accel error.

    >>> issubclass(DmaRangeError, AccelError)
    True
    """


class DecodeError(AccelError, ValueError):
    """A byte stream is truncated or is not a valid encoding.

    >>> from accel.hw import isa
    >>> try:
    ...     isa.decode(b"\\x00" * 3)
    ... except DecodeError as e:
    ...     print("truncated" in str(e))
    True
    """


class InstructionError(AccelError, ValueError):
    """An instruction is invalid against the Config or the buffer table.

    ``index`` is its position in the stream, ``instruction`` the instruction itself.

    >>> InstructionError(3, None, "bad").index
    3
    """

    def __init__(self, index: int, instruction: object, reason: str) -> None:
        self.index = index
        self.instruction = instruction
        self.reason = reason
        text = str(instruction) if instruction is not None else "?"  # an Instruction prints its disassembly
        super().__init__(f"instruction #{index} `{text}`: {reason}")


class DmaRangeError(InstructionError, IndexError):
    """A LOAD or STORE touches DRAM outside its host buffer."""


class ScratchpadOverflowError(InstructionError, IndexError):
    """An instruction touches scratchpad addresses beyond the scratchpad's size."""


class AlignmentError(InstructionError):
    """A GEMM tile or ALU vector address or stride is not a multiple of ``Config.tile``."""


class UnknownSlotError(InstructionError, KeyError):
    """A LOAD or STORE names a buffer slot that the session's buffer table does not have."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


class DtypeMismatchError(InstructionError, TypeError):
    """A host buffer's dtype does not match the scratchpad or the STORE mode."""


class TokenError(AccelError, RuntimeError):
    """Dependency tokens are unbalanced or invalid; ``index`` is the offending instruction."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(message)


class DeadlockError(TokenError):
    """Some pop can never be satisfied: the stream would hang on the hardware."""
