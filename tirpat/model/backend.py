"""The Backend API: what a vendor writes to put an accelerator under tirpat.

A backend is a subclass of :class:`Backend` (UMA's ``UMABackend`` porcelain, for Relax and
TIR): a ``name``, typed :class:`Option`\\ s, and optional hooks for each level of the flow:
graph patterns for partitioning, a schedule for one partition's PrimFunc, tirpat rules,
passes at each :class:`Phase`, the session that compiled code calls into, and for
``tp.tune`` a design space of a partition's schedule and a measure of its cost. Every hook
is optional; a backend with only a ``name`` registers and offloads nothing.

>>> import tirpat as tp
>>> class Nothing(tp.Backend):
...     name = "nothing"
...     options = {"lanes": tp.Option(int, 16, help="vector lanes")}
>>> tp.register_backend(Nothing)
>>> tp.backends()["nothing"].resolve({"lanes": "32"})
{'lanes': 32}
>>> tp.backends()["nothing"].patterns({"lanes": 16})
[]

Backends are also found through the ``tirpat.backends`` entry-point group, so a
pip-installed vendor package registers itself (the bundled ``accel`` does so too)::

    [project.entry-points."tirpat.backends"]
    mynpu = "mynpu.backend:MyNpu"
"""

from __future__ import annotations

import contextlib
import enum
import numbers
import threading
import time
import warnings
from typing import Any, ClassVar, Mapping

__all__ = ["Option", "Phase", "Backend", "register_backend", "backends", "lookup", "BackendNotFound",
           "ENTRY_POINT_GROUP"]

#: The entry-point group scanned by :func:`backends` for pip-installed backends.
ENTRY_POINT_GROUP = "tirpat.backends"

_SCALARS = (int, float, bool, str)


class Option:
    """A typed backend option with a default: ``tp.Option(int, 16, help="vector lanes")``.

    ``type`` is ``int``, ``float``, ``bool``, ``str`` or a tuple of allowed strings.
    :meth:`convert` turns a Python value or the text of a target string into that type.

    >>> tp.Option(int, 16).convert("32", "lanes")
    32
    >>> tp.Option(("wrap", "saturate"), "wrap").convert("saturate", "mode")
    'saturate'
    >>> tp.Option(bool, False).convert("true", "fast")
    True
    """

    def __init__(self, type: type | tuple, default: Any, help: str = "") -> None:  # noqa: A002 - DESIGN's name
        if isinstance(type, tuple):
            if not type or not all(isinstance(c, str) for c in type):
                raise TypeError(f"Option: a choice type must be a non-empty tuple of strings, got {type!r}")
        elif type not in _SCALARS:
            raise TypeError(f"Option: type must be int, float, bool, str or a tuple of allowed strings, got {type!r}")
        if not isinstance(help, str):
            raise TypeError(f"Option: help must be a string, got {help!r}")
        self.type = type
        self.help = help
        self.default = self.convert(default, "default")

    @property
    def type_name(self) -> str:
        """The type as a user reads it: ``int``, ``bool``, ``one of 'a', 'b'``."""
        if isinstance(self.type, tuple):
            return "one of " + ", ".join(repr(c) for c in self.type)
        return self.type.__name__

    def convert(self, value: Any, name: str) -> Any:
        """``value`` (a Python value, or text from a target string) as this option's type.

        Raises ``TypeError`` (wrong Python type) or ``ValueError`` (unparsable text, a
        string not among the choices), naming the option ``name`` and its type.
        """
        kind = self.type
        if isinstance(kind, tuple):
            if isinstance(value, str) and value in kind:
                return value
            raise ValueError(f"option {name!r} must be {self.type_name}, got {value!r}")
        if isinstance(value, str) and kind is not str:
            return self._parse(value, name)
        if kind is bool:
            if isinstance(value, bool):
                return value
        elif kind is float:
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                return float(value)
        elif kind is int:
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                return int(value)      # numpy integers too
        elif isinstance(value, kind):
            return value
        raise TypeError(f"option {name!r} must be of type {self.type_name}, got {type(value).__name__} {value!r}")

    def _parse(self, text: str, name: str) -> Any:
        if self.type is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        else:
            try:
                return self.type(text.strip())
            except ValueError:
                pass
        raise ValueError(f"option {name!r} must be of type {self.type_name}, got {text!r}")

    def __repr__(self) -> str:
        kind = self.type if isinstance(self.type, tuple) else self.type.__name__
        return f"Option({kind}, {self.default!r}{f', help={self.help!r}' if self.help else ''})"


class Phase(enum.Enum):
    """Where a backend's extra passes run (UMA's pass phases).

    ``PRE_PARTITION`` and ``POST_PARTITION`` are Relax passes over the whole module, before
    and after graph partitioning; ``BEFORE_REWRITE`` and ``AFTER_REWRITE`` are TIR passes on
    that backend's PrimFuncs only, around its tirpat rules.
    """

    PRE_PARTITION = "pre_partition"
    POST_PARTITION = "post_partition"
    BEFORE_REWRITE = "before_rewrite"
    AFTER_REWRITE = "after_rewrite"


class Backend:
    """Base class of an accelerator backend; override what your hardware needs.

    ``opts`` passed to every hook is a dict of every declared option, typed, with the
    defaults filled in (see :meth:`resolve`).

    >>> class VecUnit(tp.Backend):
    ...     name = "vecunit"
    ...     options = {"lanes": tp.Option(int, 16, help="vector lanes")}
    >>> VecUnit().resolve()
    {'lanes': 16}
    """

    #: The backend's name in target strings; also the prefix of its pattern names.
    name: ClassVar[str] = ""
    #: The backend's options, ``{name: tp.Option(...)}``.
    options: ClassVar[Mapping[str, Option]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        options = cls.__dict__.get("options")
        if options is not None:
            if not isinstance(options, Mapping):
                raise TypeError(f"{cls.__name__}.options must be a dict of tp.Option, got {type(options).__name__}")
            for key, opt in options.items():
                if not isinstance(key, str) or not isinstance(opt, Option):
                    raise TypeError(f"{cls.__name__}.options[{key!r}] must be a tp.Option, got {opt!r}")

    # -- options ---------------------------------------------------------------------
    def resolve(self, given: Mapping[str, Any] | None = None) -> dict:
        """Every declared option, typed, with defaults filled in; unknown names are errors.

        >>> class Lanes(tp.Backend):
        ...     name = "lanes"
        ...     options = {"lanes": tp.Option(int, 16)}
        >>> Lanes().resolve({"lanes": 8})
        {'lanes': 8}
        """
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise ValueError(f"backend {self.name!r} has no option {unknown[0]!r}; "
                             f"its options are {self.describe_options()}")
        return {key: opt.convert(given[key], key) if key in given else opt.default
                for key, opt in self.options.items()}

    def check_options(self, opts: dict) -> None:
        """Refuse resolved options that each have the right type but that the device cannot
        take, alone or together (a tile that is not a power of two, a scratchpad smaller than
        one tile): raise ``ValueError`` saying why, using the options' names. A target is
        checked when it is parsed, before anything compiles; the error then starts with
        the options it names as the target string gave them (``accel -tile=7: ...``).

        >>> class Lanes(tp.Backend):
        ...     name = "lanes"
        ...     options = {"lanes": tp.Option(int, 16)}
        ...     def check_options(self, opts):
        ...         if opts["lanes"] % 4:
        ...             raise ValueError(f"lanes must be a multiple of 4, got {opts['lanes']}")
        >>> tp.CompositeTarget([(Lanes(), {"lanes": 6})])
        Traceback (most recent call last):
        ...
        tirpat.model.target.TargetError: lanes -lanes=6: lanes must be a multiple of 4, got 6
        """

    def describe_options(self) -> str:
        """The options as ``name: type = default`` for messages and ``tirpat targets``."""
        if not self.options:
            return "(none)"
        return ", ".join(f"{k}: {o.type_name} = {o.default!r}" for k, o in self.options.items())

    # -- hooks (each optional) ---------------------------------------------------------
    def patterns(self, opts: dict) -> list:
        """Graph-level patterns: ``[(name, relax.dpl pattern[, check])]``, highest priority first.

        Names are prefixed with the backend's name when they are not already.
        """
        return []

    def schedule(self, func, opts: dict):
        """One partition's legalized PrimFunc -> a scheduled PrimFunc (or IRModule)."""
        return func

    def rules(self, opts: dict):
        """The TIR-level rules: a ``tp.Rewriter``, or None for none."""
        return None

    def passes(self, phase: Phase, opts: dict) -> list:
        """``[tvm.transform.Pass]`` to run at ``phase`` (see :class:`Phase`)."""
        return []

    def session(self, opts: dict):
        """A context manager: the device that compiled code calls while it is entered."""
        return contextlib.nullcontext()

    # -- tuning hooks (optional too; see tirpat.model.tune) ------------------------------
    def tune_space(self, func, opts: dict):
        """The design space of one partition's legalized PrimFunc for ``tp.tune``: a
        ``tvm.s_tir.meta_schedule.SpaceGenerator`` (``tp.knob_space`` makes one from
        knobs), or None when there is nothing to tune.

        A tuning record is applied by replaying the design-space part of its trace on the
        partition (the sampled decisions, e.g. knob annotations) and handing the result to
        :meth:`schedule`, so ``schedule`` must do what the space's post-processors do.
        """
        return None

    def tune_candidates(self, func, opts: dict) -> list | None:
        """The candidates of :meth:`tune_space` (a ``tp.knob_space``) that ``tp.tune``
        measures first, after the backend's own schedule, the cheapest first: each
        ``(estimated cost, {(block, annotation key): value})``, the cost in the unit of
        :meth:`tune_work` (a backend's estimate over the whole space, cheaper than measuring:
        ``tp.tune`` spends its budget on the tasks it saves most on); None (the default): the
        knobs' likeliest values (``tp.Knob(prior=)``), then the search's own.

        >>> tp.Backend().tune_candidates(None, {}) is None
        True
        """
        return None

    def tune_work(self, func, opts: dict) -> float | None:
        """An estimate of one partition's cost under the backend's own schedule (in the unit
        of :meth:`measure`), by which ``tp.tune`` ranks the tasks for its budget, the most
        first; None (the default): TVM's estimate of the workload's operations.

        >>> tp.Backend().tune_work(None, {}) is None
        True
        """
        return None

    def measure(self, run, opts: dict) -> float:
        """The cost of ``run()`` (one call of compiled code) on this backend's device, lower
        is better: by default the wall-clock seconds it takes inside :meth:`session`; a
        simulated device returns its cycles.

        >>> tp.Backend().measure(lambda: None, {}) >= 0
        True
        """
        with self.session(opts):
            start = time.perf_counter()
            run()
            return time.perf_counter() - start

    def __repr__(self) -> str:
        return f"<Backend {self.name!r}>"


_REGISTRY: dict[str, Backend] = {}
_LOCK = threading.RLock()
_entry_points_loaded = False


def register_backend(backend: type[Backend] | Backend) -> None:
    """Register a :class:`Backend` subclass or instance under its ``name``.

    Registering the same class again is a no-op; another backend under a taken name is an
    error.

    >>> class Scalar(tp.Backend):
    ...     name = "scalar"
    >>> tp.register_backend(Scalar)
    >>> "scalar" in tp.backends()
    True
    """
    instance = backend() if isinstance(backend, type) and issubclass(backend, Backend) else backend
    if not isinstance(instance, Backend):
        raise TypeError(f"register_backend takes a tp.Backend subclass or instance, got {backend!r}")
    name = instance.name
    if not isinstance(name, str) or not name or not _valid_name(name):
        raise ValueError(f"{type(instance).__name__}.name must be a target-string name (letters, digits, "
                         f"'_' and '-', not starting with '-'), got {name!r}")
    from tvm.target import Target

    if name in Target.list_kinds():     # "name, llvm" would then read as two backends, no host
        raise ValueError(f"{type(instance).__name__}.name {name!r} is a TVM target kind; a backend needs a name "
                         "of its own")
    with _LOCK:
        old = _REGISTRY.get(name)
        if old is not None and type(old) is not type(instance):
            raise ValueError(f"a backend named {name!r} is already registered ({type(old).__module__}."
                             f"{type(old).__qualname__})")
        if old is None:
            _REGISTRY[name] = instance


def _valid_name(name: str) -> bool:
    return not name.startswith("-") and all(c.isalnum() or c in "_-" for c in name)


def backends() -> dict[str, Backend]:
    """Every registered backend, ``{name: Backend instance}``, entry points included.

    >>> sorted(tp.backends())      # doctest: +SKIP
    ['accel', ...]
    """
    _load_entry_points()
    with _LOCK:
        return dict(_REGISTRY)


class BackendNotFound(KeyError):
    """No backend of that name is registered: a ``KeyError`` whose message reads as written
    (a plain ``KeyError`` shows its message quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def lookup(name: str) -> Backend:
    """The registered backend called ``name``; :class:`BackendNotFound` (a ``KeyError``)
    lists the registered ones and says how a backend gets registered.

    >>> lookup("nosuch")
    Traceback (most recent call last):
    ...
    tirpat.model.backend.BackendNotFound: no backend named 'nosuch' is registered (registered: ...): ...
    """
    found = backends().get(name)
    if found is None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise BackendNotFound(f"no backend named {name!r} is registered (registered: {known}): install the package "
                              f"that provides it (an installed backend registers itself through the "
                              f"{ENTRY_POINT_GROUP!r} entry point), or register it with tp.register_backend first")
    return found


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    with _LOCK:
        if _entry_points_loaded:
            return
        _entry_points_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                register_backend(ep.load())
            except Exception as err:  # noqa: BLE001 - one broken vendor package must not hide the rest
                warnings.warn(f"tirpat: the backend entry point {ep.name!r} ({ep.value}) failed to load: "
                              f"{type(err).__name__}: {err}", stacklevel=3)
