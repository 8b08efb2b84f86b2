"""A TIR workload compiled by ``tp.build``: its entry PrimFunc, called as ``tvm.compile``'s
result is, in the sessions of the backends that took it.

>>> kernel = tp.build(te.create_prim_func([A, W, C]), "accel, llvm")    # doctest: +SKIP
>>> kernel(a, w, c); print(kernel.report)                               # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import tvm
from tvm import tirx

from .. import device
from .report import ModelReport

__all__ = ["CompiledKernel"]


class CompiledKernel:
    """A TIR workload compiled by ``tp.build``: ``kernel(*args)`` calls its entry PrimFunc
    (destination-passing, as ``tvm.compile``'s result: the outputs are arguments too) on
    numpy arrays or tensors; ``report`` is the build's :class:`~tirpat.model.report.ModelReport`.

    Dtypes and shapes are checked before the run. Numpy arrays are copied in, and copied
    back only where the run changed them, so ``kernel(a, w, out)`` fills ``out`` and
    read-only or broadcast inputs are fine. Each backend's device work runs in the innermost
    ``with`` session of its runtime on this thread (which must have been made for the
    options the kernel was built with), else in a session of the kernel's own for this
    thread (``backend.session(options)``, kept between calls); a failed call leaves nothing
    pending.

    >>> import numpy as np
    >>> from tvm import te
    >>> A = te.placeholder((4,), "int32", name="A")
    >>> kernel = tp.build(te.create_prim_func([A, te.compute((4,), lambda i: A[i] * 2, name="B")]), "llvm")
    >>> out = np.zeros(4, np.int32)
    >>> kernel(np.arange(4, dtype=np.int32), out); out.tolist(), kernel.params[1]
    ([0, 2, 4, 6], ('B', (4,), 'int32'))
    """

    def __init__(self, module, func: tirx.PrimFunc, backends: list, report: ModelReport, entry: str = "main") -> None:
        self.module = module
        self.report = report
        self.entry = entry
        self.backends = [(b, dict(o)) for b, o in backends]
        #: ``(name, shape, dtype)`` of each buffer argument of the entry, in order
        self.params = [(p.name, tuple(int(d) for d in p.shape), str(p.dtype)) for p in func.params
                       if tirx.is_buffer_var(p)]
        self._here = threading.local()      # .sessions: this thread's own {backend name: session}

    def __call__(self, *args) -> None:
        """Run the entry on ``args`` (one per buffer argument, outputs included)."""
        if len(args) != len(self.params):
            raise TypeError(f"{self.entry} takes {len(self.params)} arguments "
                            f"({', '.join(n for n, _, _ in self.params)}), got {len(args)}")
        tensors, copied = [], []
        for (name, shape, dtype), a in zip(self.params, args):
            got_shape, got_dtype = tuple(int(d) for d in a.shape), str(a.dtype)
            if got_dtype != dtype:
                raise TypeError(f"argument {name}: expected dtype {dtype}, got {got_dtype}")
            if got_shape != shape:
                raise ValueError(f"argument {name}: expected shape {shape}, got {got_shape}")
            if isinstance(a, np.ndarray):
                src = np.require(a, requirements="C")     # (np.ascontiguousarray makes a 0-d array 1-d)
                t = tvm.runtime.tensor(src)
                tensors.append(t)
                copied.append((name, a, src, t))
            else:
                tensors.append(a)
        with contextlib.ExitStack() as stack:
            for backend, opts in self.backends:
                session = self._session(backend, opts)
                if session is not None:
                    stack.enter_context(session)
                    if isinstance(session, device.Session):
                        stack.enter_context(session.running())     # what each stream would set up, once
            device.invoke(self.module[self.entry], *tensors)
        changed = [(name, a, out) for name, a, src, t in copied for out in [t.numpy()] if not _same_bits(out, src)]
        for name, a, _ in changed:
            if not a.flags.writeable:
                raise ValueError(f"argument {name} is read-only, but {self.entry} writes it")
        for _, a, out in changed:
            a[...] = out

    @property
    def sessions(self) -> dict:
        """This thread's own sessions by backend name: those the calls made outside any ``with``
        session of the backend's runtime ran in (each call starts its statistics afresh)."""
        return dict(getattr(self._here, "sessions", None) or {})

    def _session(self, backend, opts: dict):
        """The session to enter for ``backend``'s work: None when the user entered one of its
        runtime's already (the code's first call checks it has the kernel's options)."""
        sessions = getattr(self._here, "sessions", None)
        if sessions is None:
            sessions = self._here.sessions = {}
        session = sessions.get(backend.name)
        if session is None:
            session = sessions[backend.name] = backend.session(opts)
            if isinstance(session, device.Session) and session.options is None:
                session.options = dict(opts)    # the backend made it for opts: it says so
        runtime = getattr(type(session), "runtime", None)
        if runtime is not None and runtime.entered() is not None:
            return None
        if isinstance(session, device.Session):
            session.begin_run()
        return session


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    return np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))
