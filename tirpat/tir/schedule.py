"""``tp.Schedule``: TVM's ``s_tir.Schedule`` without the Python type check of each call's arguments.

Every public method of ``s_tir.Schedule`` is wrapped by TVM's ``type_checked``, which binds the
call's arguments to the signature (``inspect``) and walks each type hint in Python before the
primitive runs, and the primitive's FFI call then checks each argument's type again: a
``compute_inline`` of a small block spent more time in the first check than in C++. A backend's
scheduler makes thousands of such calls per model (a real OCR recogniser: ~37,000 on its 123
partitions), so this subclass calls the same methods unwrapped; a wrongly typed argument is
still a ``TypeError``, raised by the FFI call. The state, the trace and every primitive's
result are the ones ``s_tir.Schedule`` gives: it is the same C++ object.

>>> from tvm import te
>>> a = te.placeholder((4,), "int32", name="a")
>>> b = te.compute((4,), lambda i: a[i] + 1, name="b")
>>> c = te.compute((4,), lambda i: b[i] * 2, name="c")
>>> sch = tp.Schedule(te.create_prim_func([a, c]))
>>> sch.compute_inline(sch.get_sblock("b"))
>>> "b[" in sch.mod.script(), type(sch.copy()) is tp.Schedule
(False, True)
>>> sch.get_loops(3)
Traceback (most recent call last):
    ...
TypeError: Mismatched type on argument #1 ...
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.schedule import _ffi_api

__all__ = ["Schedule"]


class Schedule(s_tir.Schedule):
    """``s_tir.Schedule`` whose methods skip TVM's Python argument type check (the FFI call
    checks the types); :meth:`copy` gives a :class:`Schedule` too."""

    def copy(self) -> "Schedule":
        """A copy of the schedule (state and symbol table), as ``s_tir.Schedule.copy`` gives,
        of this class."""
        new = Schedule.__new__(Schedule)
        new.__init_handle_by_constructor__(_ffi_api.ScheduleCopy, self)
        return new


# TVM's type_checked keeps the undecorated method as __wrapped__ (functools.wraps)
for _name, _method in list(vars(s_tir.Schedule).items()):
    if _name != "copy" and callable(_method) and hasattr(_method, "__wrapped__"):
        setattr(Schedule, _name, _method.__wrapped__)
del _name, _method
