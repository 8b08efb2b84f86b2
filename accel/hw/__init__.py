"""The accel hardware: configuration, ISA, stream emitter, dependency tokens, simulator,
cycle model, statistics, and the runtime that compiled code calls (its ABI declared once in
:mod:`accel.hw.instructions` with the scratchpads, its sessions and buffer table from :mod:`tirpat.device`).

Nothing here knows about the compiler (:mod:`accel.compiler`) or tirpat's model level:
this is what a chip vendor ships as the device and its driver.
"""
