"""Sessions and runtime functions: how compiled code reaches a device.

A backend's runtime is a :class:`Runtime`: a prefix (``"vecunit"``) and a :class:`Session`
class. Functions registered with :meth:`Runtime.function` become TVM global functions
``<prefix>.<name>`` that compiled code calls through ``T.call_packed``; each receives the
calling thread's current session first. Three promises hold for every backend:

- **current session.** ``with session:`` makes it current on this thread (sessions nest);
  outside any, each thread has its own default session, so threads never share one by
  accident. A session entered by several threads is used by one at a time: a thread that
  starts a stream owns it until that stream is synced or discarded (a compiled model's call,
  inside :meth:`Session.running`, owns it until the call ends).
- **error relay.** An exception raised inside a runtime function reaches the caller of
  the compiled function through :func:`invoke` as itself (TVM's FFI would turn it into a
  ``RuntimeError``).
- **atomic calls.** A runtime function that raises discards its session's pending work,
  and :func:`invoke` does the same for whatever else fails inside the call: nothing of a
  failed call stays pending to run later against memory that is gone. Compiled code
  called directly (no :func:`invoke`) that fails in host code after some runtime calls
  cannot tell the runtime so; compiled code syncs its device work before it returns, so
  what compiled code left pending when another compiled call reaches the session is a
  failed call's, and is discarded unrun. A call is told apart by the Python frame and
  instruction that made it; calls made again and again from one line (a loop) are told
  apart by :meth:`Runtime.begin`, which code the planner planned (``<prefix>.begin()``)
  and code built by tirpat's model pipelines call as each function starts.
- **options.** A session may say which backend options it runs code for
  (:attr:`Session.options`); :meth:`Runtime.begin` refuses code built for other options
  with :class:`OptionsMismatch` (device code built for a 32-wide tile computes garbage
  on a 16-wide one).

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

import contextlib
import functools
import gc
import inspect
import sys
import threading
from collections import OrderedDict
from types import MappingProxyType
from typing import (TYPE_CHECKING, Any, Callable, ClassVar, Hashable, Iterator, Mapping, Optional,
                    Sequence)

import numpy as np
import tvm_ffi

from .buffers import BufferTable, HostBuffer, dtype_entry, host_spans, raw_view

if TYPE_CHECKING:
    from .instr import Instruction

__all__ = ["Session", "Runtime", "invoke", "runtimes", "OptionsMismatch", "full_collections_deferred"]

_relay = threading.local()      # .error: the exception the last failing runtime function raised
_RUNTIMES: dict[str, "Runtime"] = {}
_OWNER_POLL_SECONDS = 0.05


@tvm_ffi.register_error
class OptionsMismatch(ValueError):
    """Code built for some backend options runs in a session made for others (registered
    with TVM's FFI, so it reaches the caller as its class through any compiled code, and
    through :func:`invoke` as itself). ``built`` and ``said`` are the differing options as
    the code and the session give them (``said`` is None for a session that says nothing),
    ``runtime`` the prefix of the session's runtime."""

    def __init__(self, message: str, built: Optional[dict] = None, said: Optional[dict] = None,
                 runtime: str = "") -> None:
        super().__init__(message)
        self.built, self.said, self.runtime = built, said, runtime


class _PerThread(threading.local):
    """One runtime's sessions on one thread: those entered (innermost last) and the defaults."""

    def __init__(self) -> None:
        self.stack: list = []
        self.defaults: dict = {}


# Full collections deferred while any thread is inside full_collections_deferred(): how many
# are inside, and the thresholds to restore when the last one leaves (and the ones it set)
_deferring = threading.Lock()
_deferred = 0
_restore: Optional[tuple] = None
#: The oldest generation's threshold while full collections are deferred: never reached.
_NO_FULL_COLLECTION = 1 << 30


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Hold off the cyclic garbage collector's full (oldest-generation) collections inside
    the block; the young generations are collected as usual, and the thresholds in force
    before are restored when the last thread inside leaves (unless someone set others
    meanwhile: those stay).

    A device session holds this around a compiled model's call (:meth:`Session.running`):
    the first call of a model records and plans its streams, making hundreds of thousands of
    objects that all live on (instructions, recorded calls, plans), so the heap grows by a
    quarter again and again and each time Python walks all of it, the model's own
    long-lived objects included (det_small: ~6 s of CPU in a ~44 s first call). A later
    call makes few objects, so deferring costs nothing there. The setting is process-wide:
    acceptable because the block is one bounded model call and young collections go on,
    so other threads' cyclic garbage is still freed, only the walk of the old generation
    waits until the call ends (then Python's own rule starts it as soon as it is due).
    Python 3.11's rule: the oldest generation is collected only when its threshold count
    is exceeded.

    >>> before = gc.get_threshold()
    >>> with full_collections_deferred():
    ...     gc.get_threshold()[2] > before[2]
    True
    >>> gc.get_threshold() == before
    True
    """
    global _deferred, _restore
    with _deferring:
        if _deferred == 0:
            before = gc.get_threshold()
            deferring = (*before[:2], _NO_FULL_COLLECTION)
            gc.set_threshold(*deferring)
            _restore = (before, deferring)
        _deferred += 1
    try:
        yield
    finally:
        with _deferring:
            _deferred -= 1
            if _deferred == 0:
                before, deferring = _restore
                _restore = None
                if gc.get_threshold() == deferring:     # else another caller set its own: kept
                    gc.set_threshold(*before)


class Session:
    """One device instance: its host :class:`~tirpat.device.BufferTable` (``buffers``) and
    the work pending since the last sync.

    The default pending work is a list of callables (:meth:`enqueue`) run in order by
    :meth:`sync`. A device with its own instruction stream overrides :attr:`pending`,
    :meth:`execute` and :meth:`drop` instead, and calls :meth:`claim` before it adds to
    the stream. As a context manager the session becomes current on this thread; a
    clean exit syncs what is pending, an exception discards it.

    A device whose streams can run again on other host buffers implements
    :meth:`stored_stream` and :meth:`run_stored`: then :meth:`replay` keeps the stream of each
    static group of planned code (see :class:`~tirpat.device.ScratchpadPlanner`) and runs it
    again in one call, the group's calls unmade.

    >>> s = Session(); log = []
    >>> s.enqueue(lambda: log.append("ran")); s.pending
    1
    >>> s.sync(); log
    ['ran']
    """

    #: The runtime this session class belongs to (set by :class:`Runtime`).
    runtime: ClassVar[Optional["Runtime"]] = None
    #: The backend options this session runs code built for (a mapping of option names to
    #: values), or None when it does not say. A subclass derives it from its state (accel
    #: from its Config); a session a Backend's ``session(opts)`` made says ``opts`` when the
    #: model level enters it. Code that carries its options refuses to run in a session
    #: that says other values for any option it names, or says nothing. A read-only mapping
    #: (``types.MappingProxyType``) is taken to stay as it is: code carrying read-only options
    #: found to agree with it once is not compared again (assign new options to change them).
    options: Optional[Mapping[str, Any]] = None
    #: Called with a partition's name each time compiled code of ``tp.build`` starts an
    #: offloaded partition that works on this session, or None; the compiled model that
    #: entered the session sets it for one call (which layer the device's work belongs to).
    on_partition: Optional[Callable[[str], None]] = None
    #: How many static groups' streams :meth:`replay` keeps (the least recently used go
    #: first); 0 makes every group run its calls.
    kept_replays: int = 1024

    def __init__(self) -> None:
        self.buffers = BufferTable()
        self.replayed = 0                            # streams :meth:`replay` ran
        self._replays: OrderedDict = OrderedDict()  # key -> [_Stored], the last matched first
        self._capture: Optional[tuple] = None        # (key, host spans) of the group running its calls
        self._work: list[Callable[[], None]] = []
        self._site: Optional[tuple] = None         # the call compiled code's pending work came from
        self._owner: Optional[int] = None            # thread ident owning the pending stream
        self._owner_thread: Optional[threading.Thread] = None
        self._free = threading.Condition(threading.Lock())
        self._waiting = 0       # threads inside claim() (the condition's lock counts them)
        self._held_by: Optional[int] = None     # the thread inside running(), which owns the session between streams
        self._calls = 0     # the model calls running() has begun: what a stored stream counts its places in
        self._accepted: Optional[tuple] = None  # (session's, code's options): read-only mappings found to agree

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

    def stored_stream(self) -> Optional[tuple[Any, Sequence[int]]]:
        """Hook: the stream the last :meth:`execute` ran, as something :meth:`run_stored` can
        run again, and the buffer-table slots it uses; None (the default) when the device
        cannot run a stream again, so every group makes its calls.

        >>> Session().stored_stream() is None
        True
        """
        return None

    def run_stored(self, stream: Any, views: Sequence[Optional[np.ndarray]]) -> Any:
        """Hook: run a :meth:`stored_stream` again, as :meth:`execute` would have (statistics
        included), on ``views``: per buffer-table slot the stream uses, the flat view of this
        call's host memory (``None`` elsewhere).

        >>> Session().run_stored((), [])
        Traceback (most recent call last):
          ...
        NotImplementedError: Session stores streams but does not say how to run them
        """
        raise NotImplementedError(f"{type(self).__name__} stores streams but does not say how to run them")

    def prepare_stored(self, stream: Any, views: tuple) -> None:
        """Hook: a stream :meth:`replay` just stored will run again on ``views`` (the slot
        views over the hosts of the call that stored it, which a later call gives again when
        its hosts are where these are): a device may get ready for that now, so that the
        replay runs at once. The default does nothing.

        >>> Session().prepare_stored((), ())
        """

    @property
    def replays(self) -> bool:
        """Whether :meth:`replay` keeps streams to run again: the device implements
        :meth:`stored_stream` and :attr:`kept_replays` is not 0.

        >>> Session().replays
        False
        """
        return bool(self.kept_replays) and type(self).stored_stream is not Session.stored_stream

    def replay(self, key: str, hosts: Sequence[HostBuffer]) -> bool:
        """Compiled code is about to make the calls of the static group ``key`` on ``hosts``
        (its host buffers, see :class:`~tirpat.device.ScratchpadPlanner`): True when the
        session ran the group's stream instead (the stream ended as at a sync), False when
        the calls must run (their sync then stores the stream for ``key``).

        A stored stream runs again when each host has the dtype, size and writability it had
        and the hosts overlap as they did (which slots share memory, and at what distance, orders a
        stream's instructions); each slot's view is then rebuilt at its place in this call's
        hosts (the views of one of the last few replays, a few per place the stream runs at in
        one model call, or of the call that stored the stream, serve again when every host is
        where it was then). Otherwise, with work pending, or for
        a device without :meth:`stored_stream`, the calls run.

        A key may end with the hosts' dtypes after ``;`` (``"f:0:<hash>;int8,int32"``, as the
        :class:`~tirpat.device.ScratchpadPlanner` writes them): a tensor host is then taken to
        have the dtype the key gives it, not asked (compiled code's DLTensors carry the dtypes
        of the buffers it made them of, which are the ones the planner wrote in the key).

        >>> Session().replay("f:0", [np.zeros(4)])       # the calls run (and nothing is stored)
        False
        """
        if self._owner != threading.get_ident():
            self.claim()
        if self.pending or not self.replays:
            return False
        # per host: where it is and its (bytes, dtype, writability); a read-only numpy host is
        # told apart, as a stream stored for a writable one may write it
        spans = host_spans(hosts, _declared_dtypes(key))
        place = tuple(spans)
        variants = self._replays.get(key, ())
        for stored in variants:
            views = stored.seen.get(place)
            if views is not None:
                # the hosts are where and what they were at an earlier replay (so they
                # overlap as they did): so are the views, which the stream already ran on
                stored.used(self._call())
                return self._replay(key, stored, views)
        form = tuple(span[1:] for span in spans)
        overlaps = None     # computed when a stored stream's form is this one
        for stored in variants:
            if stored.form != form:
                continue
            overlaps = _overlaps(spans) if overlaps is None else overlaps
            if stored.overlaps != overlaps:
                continue
            views = stored.views(spans)
            stored.used(self._call())
            stored.keep(place, views)
            return self._replay(key, stored, views)
        self._capture = (key, spans, form, _overlaps(spans) if overlaps is None else overlaps)
        return False

    def _call(self) -> Optional[int]:
        """The model call under way (see :meth:`running`), None outside one."""
        return self._calls if self._held_by is not None else None

    def _replay(self, key: str, stored: "_Stored", views: tuple) -> bool:
        self._replays.move_to_end(key)
        try:
            self.run_stored(stored.stream, views)
        finally:
            self._end_stream()
        self.replayed += 1
        return True

    @property
    def capturing(self) -> bool:
        """True while a static group makes its calls so that :meth:`replay` stores its stream:
        the stream the next :meth:`execute` runs will run again (a device may prepare it for
        that at once).

        >>> s = Session(); s.capturing
        False
        """
        return self._capture is not None

    def _store(self, key: str, spans: list, form: tuple, overlaps: tuple) -> None:
        """After the sync of a group that made its calls: keep its stream for ``key``, with
        the place of each slot it uses in the group's hosts (not when a slot is outside them)."""
        stored = self.stored_stream()
        if stored is None:
            return
        stream, slots = stored
        placed = []
        for slot in slots:
            flat = self.buffers.views[slot] if 0 <= slot < len(self.buffers.views) else None
            if flat is None:
                return
            start = flat.__array_interface__["data"][0]
            host = next((i for i, (a, n, *_) in enumerate(spans) if a <= start and start + flat.nbytes <= a + n), None)
            if host is None:
                return
            placed.append((slot, host, start - spans[host][0], flat.nbytes, flat.dtype.str))
        variants = self._replays.setdefault(key, [])
        # a few hosts layouts per group (call sites that alias differently), the newest first
        stored = _Stored(stream, form, overlaps, tuple(placed))
        variants.insert(0, stored)
        del variants[_VARIANTS:]
        # the views over these hosts, which the next call's replay takes when its hosts are
        # where these are (a model whose storages stay put), and which the device prepares for
        views = stored.views(spans)
        stored.used(self._call())
        stored.keep(tuple(spans), views)
        self.prepare_stored(stream, views)
        self._replays.move_to_end(key)
        while len(self._replays) > self.kept_replays:
            self._replays.popitem(last=False)

    def begin_run(self) -> None:
        """Called before each call of a compiled model (``tp.build``'s) that keeps this session
        from its previous call: forget what describes one call (its statistics), keep what
        makes the next one cheaper (streams built before). The default does nothing."""

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """A context a compiled model (``tp.build``'s) holds around each of its calls on this
        session: a device sets up there, once per call, what each of its streams would
        otherwise set up and undo (accel: BLAS on one thread), and undoes it on the way out,
        an exception included. The default defers the garbage collector's full collections
        (:func:`full_collections_deferred`) and makes the calling thread the session's owner
        for the whole call (:meth:`claim` once, not at each of the call's hundred streams:
        another thread that uses the session meanwhile waits until the call ends, not only
        until the stream ends); a subclass that holds more holds these too.

        >>> s = Session()
        >>> with s.running():
        ...     s.owned_here()
        True
        >>> s.owned_here()
        False
        """
        me = threading.get_ident()
        self.claim()
        outer, self._held_by = self._held_by, me
        if outer is None:
            self._calls += 1
        try:
            with full_collections_deferred():
                yield
        finally:
            self._held_by = outer
            # a stream left pending stays its thread's until it is synced or discarded
            if outer is None and self.owned_here() and not self.pending:
                self._release()

    # -- stream boundaries ---------------------------------------------------------------
    def sync(self) -> Any:
        """Run the pending work; the borrowed buffer slots are released either way.

        Returns what :meth:`execute` returns (a device's statistics, say).
        """
        self.claim()
        try:
            result = self.execute()
            if self._capture is not None:
                self._store(*self._capture)
            return result
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
        self._site = None
        self._capture = None
        if self._held_by != self._owner:    # else running() keeps it to the call's end
            self._release()

    def _release(self) -> None:
        """The owner lets go of the session (it has nothing pending)."""
        # the thread first: a claim that sees an owner may find its thread already gone (it
        # then waits), never a new owner's thread cleared after it
        self._owner_thread = None
        self._owner = None
        # mostly no thread waits (streams run outside a call's running() end often): the
        # condition is taken only for one that waits (claim counts itself in before it looks
        # at the owner, so either it sees the owner gone or it is counted here)
        if self._waiting:
            with self._free:
                self._free.notify_all()

    def claim(self) -> None:
        """Make the calling thread the owner of the pending stream, waiting while another
        live thread owns it (a dead owner's stream is discarded: it can never be synced)."""
        me = threading.get_ident()
        if self._owner == me:
            return
        with self._free:
            self._waiting += 1
            try:
                while self._owner is not None and self._owner != me:
                    thread = self._owner_thread         # None: the owner is ending its stream
                    if thread is not None and not thread.is_alive():
                        self._owner = self._owner_thread = None
                        self.drop()
                        self.buffers.release_borrowed()
                        break
                    # an owner that dies mid-stream notifies nobody: look again now and then
                    self._free.wait(timeout=_OWNER_POLL_SECONDS)
                self._owner, self._owner_thread = me, threading.current_thread()
            finally:
                self._waiting -= 1

    def owned_here(self) -> bool:
        """True when the calling thread owns this session's pending stream."""
        return self._owner == threading.get_ident()

    def _from_call(self, frame) -> None:
        """Compiled code called from Python ``frame`` is about to add to the stream (this
        thread owns it): what compiled code made from another call left pending is a failed
        call's (compiled code syncs before it returns), so it is discarded. A call is its
        frame and instruction; a Python function that compiled code calls back and that
        calls compiled code in turn is part of the outer call (its frame's callers include
        the outer call's)."""
        site = (id(frame), frame.f_lasti)
        if self._site == site:
            return
        if self._site is not None:
            if self._called_back(frame):
                return          # a nested call: the stream is the outer call's
            self.discard()
            self.claim()
        self._site = site

    def _called_back(self, frame) -> bool:
        """True when compiled code called from Python ``frame`` runs inside the call that made
        the pending work: ``frame`` belongs to a Python function that call's compiled code called."""
        caller = frame.f_back if frame is not None else None
        while caller is not None and (id(caller), caller.f_lasti) != self._site:
            caller = caller.f_back
        return caller is not None

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
    one per hardware configuration). ``<prefix>.sync`` and ``<prefix>.replay``
    (:meth:`Session.replay`, returning 1 for True) are registered from the start, and so is
    the TVM global ``<prefix>.begin`` (:meth:`begin` without options), which the
    :class:`~tirpat.device.ScratchpadPlanner` puts first in each function it plans.

    >>> rt = Runtime("doc_rt", type("DocSession", (Session,), {}))
    >>> sorted(rt.functions)
    ['replay', 'sync']
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
        self.function(lambda s, key, *hosts: int(s.replay(key, hosts)), name="replay")
        import tvm

        # not a runtime function (those add to the stream first): compiled code calls it first
        tvm.register_global_func(f"{prefix}.begin", lambda: self.begin(caller=sys._getframe().f_back) and None,
                                 override=True)

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
        return self._register(fn, name or fn.__name__)

    def _register(self, fn: Callable, short: str, declared: Optional["Instruction"] = None) -> Callable:
        """:meth:`function`; with ``declared``, a call with fewer arguments than it declares gets
        them completed (:meth:`~tirpat.device.Instruction.complete`) before ``fn`` sees them:
        checked here, not in a wrapper of ``fn``, as it is once per device instruction."""
        if not short.isidentifier():
            raise ValueError(f"Runtime.function: {short!r} is not a valid function name")
        arity = -1 if declared is None else len(declared.arguments)
        current, local, default = self.current, self._local, self.default
        get_ident, getframe = threading.get_ident, sys._getframe

        def failed(session: Session, err: BaseException) -> None:
            if getattr(_relay, "active", 0):     # kept only for an invoke() to raise
                _relay.error = err
            if session.owned_here():
                session.discard()

        def call(*args):
            session = current()
            try:
                session.claim()
                if arity >= 0 and len(args) != arity:
                    args = declared.complete(args)
                return fn(session, *args)
            except BaseException as err:
                failed(session, err)
                raise

        def from_compiled(*args):
            # Compiled code calls this once per device instruction (hundreds of thousands
            # per model call), so the common case (this thread owns the stream, the same
            # call goes on) tests two fields instead of calling claim() and _from_call(), and
            # finds the current session inline (what current() does)
            stack = local.stack
            session = stack[-1] if stack else default()
            if session._owner != get_ident():
                session.claim()
            # the compiled code calling this TVM global was called from the nearest Python
            # frame (none on a thread that native code started: calls cannot be told apart)
            caller = getframe().f_back
            if caller is not None and session._site != (id(caller), caller.f_lasti):
                session._from_call(caller)
            try:
                if arity >= 0 and len(args) != arity:
                    args = declared.complete(args)
                return fn(session, *args)
            except BaseException as err:
                failed(session, err)
                raise

        call.__name__ = call.__qualname__ = from_compiled.__name__ = f"{self.prefix}.{short}"
        call.__doc__ = from_compiled.__doc__ = fn.__doc__
        import tvm

        tvm.register_global_func(call.__name__, from_compiled, override=True)
        self.functions[short] = call
        return fn

    def implement(self, *instructions: "Instruction") -> Callable[[Callable], Callable]:
        """Decorator: register ``fn(session, **arguments)`` as the runtime function of the
        declared ``instructions`` (:func:`~tirpat.device.instr`; several when one function
        backs them, told apart by their fixed arguments). The call's positional arguments
        reach ``fn`` by name, in the declared order, so it is never written twice: ``fn``'s
        parameters after the session must be exactly the declared arguments (or some of
        them and ``**rest`` for the others), else TypeError; a call compiled before the
        declared ``added`` arguments existed gets their values (:meth:`~tirpat.device.Instruction.complete`).
        A generic function, one that
        reads the order off the declarations (:attr:`~tirpat.device.Instruction.arguments`)
        instead of naming the arguments, takes ``(session, *args)`` and gets them as called,
        with no per-call binding (a runtime's hot path).

        >>> from tvm.script import tirx as T
        >>> from tirpat.device import instr
        >>> @instr("doc_impl.fill")
        ... def fill():
        ...     @T.prim_func
        ...     def program(out: T.Buffer((4,), "int8"), value: T.int8):
        ...         for i in range(4):
        ...             out[i] = value
        ...     return program
        >>> rt = Runtime("doc_impl", type("FillSession", (Session,), {}))
        >>> @rt.implement(fill)
        ... def _(s, value, out):
        ...     print(f"fill {out} with {value}")
        >>> rt.functions["fill"]("buffer", 7)
        fill buffer with 7
        >>> @rt.implement(fill)
        ... def _(s, out, valeu): pass
        Traceback (most recent call last):
          ...
        TypeError: _ implements doc_impl.fill(out, value): it lacks value; it has valeu, which fill does not declare
        """
        if not instructions:
            raise TypeError("Runtime.implement: name at least one declared instruction")
        first = instructions[0]
        names = first.arguments
        for ins in instructions:
            if ins.runtime_name != first.runtime_name or ins.arguments != names or ins.added != first.added:
                raise TypeError(f"Runtime.implement: {first.name} calls {first.runtime_name}({', '.join(names)}) but "
                                f"{ins.name} calls {ins.runtime_name}({', '.join(ins.arguments)}); one function "
                                f"implements instructions of one runtime name and argument list")
        prefix, short = first.runtime_name.split(".")
        if prefix != self.prefix:
            raise ValueError(f"Runtime.implement: {first.runtime_name} is not a {self.prefix}.* function")

        def register(fn: Callable) -> Callable:
            params = list(inspect.signature(fn).parameters.values())
            if len(params) == 2 and params[1].kind is inspect.Parameter.VAR_POSITIONAL:
                self._register(fn, short, first)
                return fn
            named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            given = [p.name for p in params[1:] if p.kind in named]
            rest = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params[1:])
            if not params or any(p.kind not in (*named, inspect.Parameter.VAR_KEYWORD) for p in params[1:]):
                raise TypeError(f"{fn.__name__} implements {first.runtime_name}: it takes the session, then the "
                                f"arguments {', '.join(names)} as named parameters")
            lacks = [] if rest else [n for n in names if n not in given]
            extra = [n for n in given if n not in names]
            if lacks or extra:
                raise TypeError(f"{fn.__name__} implements {first.runtime_name}({', '.join(names)}): " + "; ".join(
                    ([f"it lacks {', '.join(lacks)}"] if lacks else []) +
                    ([f"it has {', '.join(extra)}, which {first.name} does not declare"] if extra else [])))

            def by_name(session, *args):
                return fn(session, **dict(zip(names, args)))

            by_name.__doc__ = fn.__doc__
            self._register(by_name, short, first)
            return fn

        return register

    def begin(self, options: Optional[Mapping[str, Any]] = None, code: str = "this code", *,
              caller=None) -> Session:
        """Compiled code starts its device work on this thread's current session (returned):
        work compiled code left pending there is a failed call's, and is discarded unrun
        (unless ``caller``, the Python frame the compiled code was called from, is a Python
        function that the call which made that work called back); and when the code carries
        the backend ``options`` it was built for, the session must say the same values for
        the options it names (:attr:`Session.options`), else :class:`OptionsMismatch` names
        the differences (``code`` names the code).

        >>> class Lanes(Session):
        ...     options = {"lanes": 16}
        >>> rt = Runtime("doc_begin", Lanes)
        >>> with Lanes():
        ...     rt.begin({"lanes": 8}, "vadd")
        Traceback (most recent call last):
          ...
        tirpat.device.session.OptionsMismatch: vadd was built for doc_begin with lanes=8, but the current doc_begin session (Lanes) has lanes=16; run it in a session made for its options
        """
        session = self.current()
        if session._site is not None:
            session.claim()
            if session._site is not None and not session._called_back(caller):
                session.discard()
        if options:         # code built for a backend without options runs anywhere
            self._check_options(session, options, code)
        return session

    def _check_options(self, session: Session, built: Mapping[str, Any], code: str) -> None:
        said = session.options
        # asked at the start of every offloaded call: the common case first, the read-only
        # options the session accepted last time (a model's partitions all carry one mapping),
        # then the same options (one comparison of the two mappings), then no difference in
        # the options both name
        accepted = session._accepted
        if accepted is not None and accepted[0] is said and accepted[1] is built:
            return
        if said is not None and (said == built or all(said[k] == built[k] for k in said if k in built)):
            if type(said) is MappingProxyType and type(built) is MappingProxyType:     # neither can change
                session._accepted = (said, built)
            return
        which = (f"the current {self.prefix} session ({type(session).__name__})" if self.entered() is session else
                 f"this thread's default {self.prefix} session ({type(session).__name__}, outside any `with`)")
        if said is None:
            err = OptionsMismatch(
                f"{code} was built for {self.prefix} with {_options_text(built)}, but {which} does not say which "
                f"options it runs (its .options is None); run it in a session made for its options", dict(built),
                runtime=self.prefix)
        else:
            differ = [k for k in said if k in built and said[k] != built[k]]
            err = OptionsMismatch(
                f"{code} was built for {self.prefix} with {_options_text(built, differ)}, but {which} has "
                f"{_options_text(said, differ)}; run it in a session made for its options",
                {k: built[k] for k in differ}, {k: said[k] for k in differ}, self.prefix)
        if getattr(_relay, "active", 0):        # for invoke() to raise as itself
            _relay.error = err
        raise err

    def __repr__(self) -> str:
        return f"<Runtime {self.prefix!r}: {', '.join(sorted(self.functions))}>"


def _options_text(options: Mapping[str, Any], keys=None) -> str:
    return ", ".join(f"{k}={options[k]}" for k in (options if keys is None else keys))


_VARIANTS = 4      # stored streams per group key (one per hosts layout seen)
_LAYOUTS = 4       # the places of its hosts whose views a stored stream keeps, per place it runs at in one call


class _Stored:
    """A static group's stored stream: the size, dtype and writability of each host (``form``), which
    hosts overlap at what distance (``overlaps``), and per slot the stream uses, where in
    which host its memory lies: ``(slot, host, byte offset, bytes, dtype)``."""

    __slots__ = ("stream", "form", "overlaps", "placed", "size", "seen", "sites", "_call", "_runs")

    def __init__(self, stream: Any, form: tuple, overlaps: tuple, placed: tuple) -> None:
        self.stream, self.form, self.overlaps, self.placed = stream, form, overlaps, placed
        self.size = 1 + max((p[0] for p in placed), default=-1)
        # the host spans of the last few replays (as a tuple) -> the views made over them, the
        # oldest first: a model called again finds its tensors where they were, or at one of a
        # few places its memory pool hands them out at in turn (three for most of the PaddleOCR
        # classifier's moving ones), at each place the stream runs at in a call (a grouped
        # convolution's function runs once per group, 25 times a call in RegNet's last stage:
        # views for four places alone were made again at every run, and so were the device's
        # calls over them)
        self.seen: dict[tuple, tuple] = {}
        self.sites = 1      # the most runs of the stream in one model call
        self._call: Optional[int] = None    # the call the runs in _runs were in
        self._runs = 0

    def used(self, call: Optional[int]) -> None:
        """Count a run of the stream in model call ``call`` (None: outside a model's call, not counted)."""
        if call is None:
            return
        if call != self._call:
            self._call, self._runs = call, 0
        self._runs += 1
        self.sites = max(self.sites, self._runs)

    def keep(self, place: tuple, views: tuple) -> None:
        """Remember ``views``, made over the hosts at ``place``, the oldest going first beyond
        :data:`_LAYOUTS` a place the stream runs at in one call.

        >>> stored = _Stored((), (), (), ())
        >>> for call in (1, 1, 2, 2):
        ...     stored.used(call)
        >>> for n in range(10): stored.keep((n,), ())
        >>> stored.sites, list(stored.seen)     # two places a call: the last 8 kept
        (2, [(2,), (3,), (4,), (5,), (6,), (7,), (8,), (9,)])
        """
        self.seen.pop(place, None)
        self.seen[place] = views
        while len(self.seen) > _LAYOUTS * self.sites:
            del self.seen[next(iter(self.seen))]

    def views(self, spans: list) -> tuple:
        """The slot views over this call's hosts (``spans``: their addresses first), a tuple:
        a device may take the same tuple again for views it has already checked."""
        views: list = [None] * self.size
        for slot, host, offset, nbytes, dtype in self.placed:
            views[slot] = raw_view(spans[host][0] + offset, nbytes, dtype)
        return tuple(views)


@functools.lru_cache(maxsize=4096)
def _declared_dtypes(key: str) -> tuple:
    """The hosts' dtypes a replay key gives after its last ``;`` (see :meth:`Session.replay`),
    each as :func:`~tirpat.device.buffers.host_spans` takes it (:func:`~tirpat.device.buffers.dtype_entry`);
    () for a key that gives none.

    >>> _declared_dtypes("f:0:ab;int8,int32"), _declared_dtypes("f:0")
    (((1, '|i1'), (4, '<i4')), ())
    """
    _, declares, dtypes = key.rpartition(";")
    return tuple(dtype_entry(name) for name in dtypes.split(",")) if declares and dtypes else ()


def _overlaps(spans: list) -> tuple:
    """``(i, j, distance)`` for each pair of host spans that share memory."""
    return tuple((i, j, spans[j][0] - a) for i, (a, n, *_) in enumerate(spans)
                 for j in range(i + 1, len(spans)) if spans[j][0] < a + n and a < spans[j][0] + spans[j][1])


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
