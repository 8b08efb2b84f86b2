"""The rule of a core that writes accel's instruction calls itself, at schedule time.

The element-wise and upsampling cores lower their partitions to calls of the declared
instructions when they schedule them (on scratchpad buffers named with the core's prefix).
Their rule takes those calls as they are, so that the build report counts the partition as
accel's; calls on other buffers are left to the rules that wrote them.

>>> calls_rule("accel.elementwise", "elementwise_").rules[0].name
'accel.elementwise'
"""

from __future__ import annotations

import tirpat as tp
from tirpat.device.planner import access_ptr_buffer
from accel.hw.instructions import INSTRUCTIONS, instruction_of

__all__ = ["calls_rule"]


def calls_rule(name: str, buffer_prefix: str) -> tp.Rewriter:
    """The rule ``name``: every call of a declared instruction with a scratchpad operand whose
    buffer's name starts with ``buffer_prefix``, kept as it is."""
    def lowered_here(m) -> bool:
        ins = instruction_of(m.node)
        if ins is None:
            return False
        args = ins.arguments_of(m.node)
        buffers = [access_ptr_buffer(args[op.name]) for op in ins.memory_operands]
        return any(b is not None and b.name.startswith(buffer_prefix) for b in buffers)

    pattern = None
    for n in sorted({len(ins.arguments) + 1 for ins in INSTRUCTIONS.values()}):
        p = tp.is_call("tirx.tvm_call_packed", *[tp.wildcard() for _ in range(n)]).where(lowered_here)
        pattern = p if pattern is None else pattern | p
    return tp.Rewriter.from_pattern(pattern, lambda m: m.node, name=name)
