"""The accel hardware: configuration, ISA, stream emitter, dependency tokens, simulator,
cycle model, statistics and the runtime that compiled code calls.

Nothing here knows about the compiler (:mod:`accel.compiler`) or tirpat's model level:
this is what a chip vendor ships as the device and its driver.
"""
