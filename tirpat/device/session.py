"""Sessions and runtime functions: how compiled code reaches a device.

A backend's runtime is a :class:`Runtime`: a prefix (``"vecunit"``) and a :class:`Session`
class. Functions registered with :meth:`Runtime.function` become TVM global functions
``<prefix>.<name>`` that compiled code calls through ``T.call_packed``; each receives the
calling thread's current session first. Three promises hold for every backend:

- **current session.** ``with session:`` makes it current on this thread (sessions nest);
  outside any, each thread has its own default session, so threads never share one by
  accident. A session entered by several threads is used by one at a time: a thread that
  starts a stream owns it until that stream is synced or discarded.
- **error relay.** An exception raised inside a runtime function reaches the caller of
  the compiled function through :func:`invoke` as itself (TVM's FFI would turn it into a
  ``RuntimeError``).
- **atomic calls.** A runtime function that raises discards its session's pending work,
  and :func:`invoke` does the same for whatever else fails inside the call: nothing of a
  failed call stays pending to run later against memory that is gone.

>>> import numpy as np
>>> class Counter(Session):
...     total = 0
>>> rt = Runtime("doc_counter", Counter)
>>> @rt.function
... def add(s, host, n):
...     view = s.buffers.view(s.buffers.slot(host), 0, (n,))   # bounds-checked, now
...     s.enqueue(lambda: setattr(s, "total", s.total + int(view.sum())))
>>> with Counter() as s:
...     rt.functions["add"](np.arange(4), 4)                   # as compiled code would call it
>>> s.total
6
"""

from __future__ import annotations

import threading
from typing import Any, Callable, ClassVar, Hashable, Optional

from .buffers import BufferTable

__all__ = ["Session", "Runtime", "invoke", "runtimes"]

_relay = threading.local()      # .error: the exception the last failing runtime function raised
_RUNTIMES: dict[str, "Runtime"] = {}
_OWNER_POLL_SECONDS = 0.05


class _PerThread(threading.local):
    """One runtime's sessions on one thread: those entered (innermost last) and the defaults."""

    def __init__(self) -> None:
        self.stack: list = []
        self.defaults: dict = {}


class Session:
    """One device instance: its host :class:`~tirpat.device.BufferTable` (``buffers``) and
    the work pending since the last sync.

    The default pending work is a list of callables (:meth:`enqueue`) run in order by
    :meth:`sync`. A device with its own instruction stream overrides :attr:`pending`,
    :meth:`execute` and :meth:`drop` instead, and calls :meth:`claim` before it adds to
    the stream. As a context manager the session becomes current on this thread; a
    clean exit syncs what is pending, an exception discards it.

    >>> s = Session(); log = []
    >>> s.enqueue(lambda: log.append("ran")); s.pending
    1
    >>> s.sync(); log
    ['ran']
    """

    #: The runtime this session class belongs to (set by :class:`Runtime`).
    runtime: ClassVar[Optional["Runtime"]] = None

    def __init__(self) -> None:
        self.buffers = BufferTable()
        self._work: list[Callable[[], None]] = []
        self._owner: Optional[int] = None            # thread ident owning the pending stream
        self._owner_thread: Optional[threading.Thread] = None
        self._free = threading.Condition(threading.Lock())

    # -- the pending work (override these three for a device with its own stream) --------
    @property
    def pending(self) -> int:
        """How much work waits for the next sync (0: none)."""
        return len(self._work)

    def execute(self) -> None:
        """Run the pending work (called by :meth:`sync`); it is forgotten whatever happens."""
        work, self._work = self._work, []
        for op in work:
            op()

    def drop(self) -> None:
        """Forget the pending work without running it (called by :meth:`discard`)."""
        self._work = []

    def enqueue(self, op: Callable[[], None]) -> None:
        """Add ``op`` to the pending work (check its arguments before, not inside, ``op``)."""
        self.claim()
        self._work.append(op)

    def begin_run(self) -> None:
        """Called before each call of a compiled model (``tp.build``'s) that keeps this session
        from its previous call: forget what describes one call (its statistics), keep what
        makes the next one cheaper (streams built before). The default does nothing."""

    # -- stream boundaries ---------------------------------------------------------------
    def sync(self) -> Any:
        """Run the pending work; the borrowed buffer slots are released either way.

        Returns what :meth:`execute` returns (a device's statistics, say).
        """
        self.claim()
        try:
            return self.execute()
        finally:
            self._end_stream()

    def discard(self) -> None:
        """Drop the pending work unrun and release the borrowed buffer slots."""
        self.claim()
        try:
            self.drop()
        finally:
            self._end_stream()

    def _end_stream(self) -> None:
        self.buffers.release_borrowed()
        with self._free:
            self._owner = self._owner_thread = None
            self._free.notify_all()

    def claim(self) -> None:
        """Make the calling thread the owner of the pending stream, waiting while another
        live thread owns it (a dead owner's stream is discarded: it can never be synced)."""
        me = threading.get_ident()
        if self._owner == me:
            return
        with self._free:
            while self._owner is not None and self._owner != me:
                if not self._owner_thread.is_alive():
                    self._owner = self._owner_thread = None
                    self.drop()
                    self.buffers.release_borrowed()
                    break
                # an owner that dies mid-stream notifies nobody: look again now and then
                self._free.wait(timeout=_OWNER_POLL_SECONDS)
            self._owner, self._owner_thread = me, threading.current_thread()

    def owned_here(self) -> bool:
        """True when the calling thread owns this session's pending stream."""
        return self._owner == threading.get_ident()

    # -- context ------------------------------------------------------------------------
    def __enter__(self):
        runtime = type(self).runtime
        if runtime is None:
            raise TypeError(f"{type(self).__name__} belongs to no tirpat.device.Runtime; create one with "
                            f"Runtime(prefix, {type(self).__name__}) before entering its sessions")
        runtime._stack().append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        stack = type(self).runtime._stack()
        # remove the innermost entry of this session (it may be entered more than once)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break
        if not self.owned_here():
            return
        if exc_type is not None:
            self.discard()
        elif self.pending:
            self.sync()
        else:
            self._end_stream()


class Runtime:
    """A backend's runtime: TVM global functions ``<prefix>.*`` bound to its sessions.

    ``session`` is the backend's :class:`Session` subclass; ``default(key)`` makes the
    per-thread default sessions (``session()``, or ``session(key)`` for a keyed one, e.g.
    one per hardware configuration). ``<prefix>.sync`` is registered from the start.

    >>> rt = Runtime("doc_rt", type("DocSession", (Session,), {}))
    >>> sorted(rt.functions)
    ['sync']
    >>> rt.current() is rt.default() and rt.entered() is None
    True
    """

    def __init__(self, prefix: str, session: type[Session] = Session,
                 default: Optional[Callable[[Optional[Hashable]], Session]] = None) -> None:
        if not isinstance(prefix, str) or not prefix.isidentifier():
            raise ValueError(f"Runtime: the prefix must be an identifier, got {prefix!r}")
        if not (isinstance(session, type) and issubclass(session, Session)):
            raise TypeError(f"Runtime: session must be a tirpat.device.Session subclass, got {session!r}")
        bound = session.__dict__.get("runtime")
        if bound is not None and bound.prefix != prefix:
            raise ValueError(f"{session.__name__} already belongs to the runtime {bound.prefix!r}")
        self.prefix = prefix
        self.session_class = session
        self.functions: dict[str, Callable] = {}
        self._make_default = default or (lambda key: session() if key is None else session(key))
        self._local = _PerThread()
        session.runtime = self
        _RUNTIMES[prefix] = self
        self.function(lambda s: s.sync(), name="sync")

    # -- sessions -----------------------------------------------------------------------
    def _stack(self) -> list:
        return self._local.stack

    def entered(self) -> Optional[Session]:
        """The innermost session entered with ``with`` on this thread, or None."""
        stack = self._local.stack
        return stack[-1] if stack else None

    def default(self, key: Optional[Hashable] = None) -> Session:
        """This thread's default session (for ``key``), made on first use."""
        defaults = self._local.defaults
        session = defaults.get(key)
        if session is None:
            session = defaults[key] = self._make_default(key)
        return session

    def current(self) -> Session:
        """The session a runtime function called on this thread now would use."""
        local = self._local
        return local.stack[-1] if local.stack else self.default()

    def _sessions_here(self) -> list:
        return [*self._local.stack, *self._local.defaults.values()]

    # -- runtime functions --------------------------------------------------------------
    def function(self, fn: Optional[Callable] = None, *, name: Optional[str] = None):
        """Register ``fn(session, *args)`` as the TVM global ``<prefix>.<name>`` (``name``
        defaults to ``fn.__name__``); usable as a decorator, returns ``fn``.

        The registered function calls ``fn`` with the current session. If ``fn`` raises,
        the session's pending work is discarded and the exception is kept for
        :func:`invoke` to raise as itself.
        """
        if fn is None:
            return lambda f: self.function(f, name=name)
        short = name or fn.__name__
        if not short.isidentifier():
            raise ValueError(f"Runtime.function: {short!r} is not a valid function name")
        current = self.current

        def call(*args):
            session = current()
            try:
                session.claim()
                return fn(session, *args)
            except BaseException as err:
                if getattr(_relay, "active", 0):     # kept only for an invoke() to raise
                    _relay.error = err
                if session.owned_here():
                    session.discard()
                raise

        call.__name__ = call.__qualname__ = f"{self.prefix}.{short}"
        call.__doc__ = fn.__doc__
        import tvm

        tvm.register_global_func(call.__name__, call, override=True)
        self.functions[short] = call
        return fn

    def __repr__(self) -> str:
        return f"<Runtime {self.prefix!r}: {', '.join(sorted(self.functions))}>"


def runtimes() -> dict[str, Runtime]:
    """Every :class:`Runtime` created in this process, by prefix."""
    return dict(_RUNTIMES)


def invoke(func: Callable, *args: Any) -> Any:
    """Call a compiled function atomically, relaying its runtime functions' exceptions.

    If the call fails, the sessions this thread is using have their pending work
    discarded (nothing of the call runs later), and an exception raised inside a runtime
    function is re-raised as itself rather than as TVM's ``RuntimeError``.

    >>> class Boom(Exception): pass
    >>> rt = Runtime("doc_invoke", type("S", (Session,), {}))
    >>> @rt.function
    ... def fail(s):
    ...     raise Boom("no")
    >>> invoke(rt.functions["fail"])
    Traceback (most recent call last):
      ...
    tirpat.device.session.Boom: no
    """
    _relay.error = None
    _relay.active = getattr(_relay, "active", 0) + 1
    try:
        return func(*args)
    except BaseException as err:
        for runtime in list(_RUNTIMES.values()):
            for session in runtime._sessions_here():
                if session.owned_here():
                    session.discard()
        original, _relay.error = _relay.error, None
        if original is not None and original is not err:
            raise original from None
        raise
    finally:
        _relay.active -= 1
