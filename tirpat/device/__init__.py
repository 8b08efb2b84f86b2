"""The device kit: what every backend's runtime needs, with nothing of any one backend.

- :mod:`~tirpat.device.buffers`: the host buffer table (slots, zero-copy views,
  bounds-checked strided views, byte ranges for aliasing), ``tensor_view``;
- :mod:`~tirpat.device.session`: sessions (per-thread current and default sessions,
  one owner per pending stream), runtime functions registered under a backend's prefix
  with error relay, atomic calls (:func:`invoke`) and the options check;
- :mod:`~tirpat.device.memory`: :class:`Memory`, an on-chip memory declared once (scope,
  dtype, capacity, alignment, buffering), which owns the allocation rule (``footprint``);
- :mod:`~tirpat.device.instr`: :func:`instr`, an instruction declared once as the TIR
  program it computes, from which its rule, its call, the runtime's argument order and its
  reference semantics follow;
- :mod:`~tirpat.device.planner`: scratchpad-address planning for a backend's memories,
  with double buffering and sync insertion;
- :mod:`~tirpat.device.trace`: a session's timeline (its statistics' ``timeline.events``,
  each with ``unit``, ``start``, ``end``) as Chrome/Perfetto trace-event JSON
  (``tirpat run --timeline t.json``).

A backend's runtime, in five steps (``tests/device/test_session.py`` builds a 16-lane
vector unit this way in about forty lines):

1. subclass :class:`Session` with the device's state (registers, scratchpads, a simulator);
   keep the default pending work (:meth:`Session.enqueue` of closures run at sync) or
   override ``pending`` / ``execute`` / ``drop`` for an instruction stream of your own;
   set ``options`` to the backend options the session runs code for (code tirpat built
   for other ones refuses to run in it: :class:`OptionsMismatch`); implement
   ``stored_stream`` / ``run_stored`` when a finished stream can run again on other host
   buffers, so that planned code replays it in one callback (:meth:`Session.replay`);
2. declare its memories (:class:`Memory`) and instructions (:func:`instr`);
3. ``rt = Runtime("<prefix>", MySession)`` and implement each instruction with
   ``@rt.implement(ins)`` (or a function without a declaration with ``@rt.function``): it
   gets the current session first, then the call's arguments by name (host buffers as
   DLTensors: ``s.buffers.view(s.buffers.slot(t), offset, shape, strides)`` is a checked
   zero-copy view; never ``np.from_dlpack``, which crashes on them). ``<prefix>.sync`` and
   ``<prefix>.replay`` are already there;
4. plan the device's memories with :class:`ScratchpadPlanner` as a pass after your rules
   (the instructions' rules, ``ins.rule()``, and your own): it turns ``access_ptr``
   operands into addresses, inserts ``<prefix>.sync()`` and asks ``<prefix>.replay`` before
   each static run of calls;
5. call compiled functions with :func:`invoke` inside ``with MySession():`` (or not: each
   thread has a default session) to get runtime errors as themselves and atomic calls.

>>> from tirpat import device
>>> sorted(device.__all__)[:4]
['BoundsError', 'BufferTable', 'Instruction', 'Memory']
"""

from .buffers import BoundsError, BufferTable, SlotError, is_tensor, strided_view, tensor_view
from .instr import Instruction, Operand, instr
from .memory import Memory
from .planner import PlanError, ScratchpadOverflow, ScratchpadPlanner
from .session import OptionsMismatch, Runtime, Session, full_collections_deferred, invoke, runtimes
from .trace import save_trace, trace_events

__all__ = [
    "BoundsError", "BufferTable", "Instruction", "Memory", "Operand", "OptionsMismatch", "PlanError", "Runtime",
    "ScratchpadOverflow", "ScratchpadPlanner", "Session", "SlotError", "full_collections_deferred", "instr", "invoke",
    "is_tensor", "runtimes",
    "save_trace", "strided_view", "tensor_view", "trace_events",
]
