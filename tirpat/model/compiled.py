"""A compiled model: call it on numpy arrays, read its report and device statistics, export it
to one file and load it in another process.

An exported model is a zip file holding the compiled library (``export_library``) and a JSON
manifest: the backends with their options, the host target, the inputs and the report.
:func:`load` finds the backends by name through the registry (entry points included), so
a fresh process needs no import of the backend's package.

>>> model = tp.build(mod, "accel, llvm")              # doctest: +SKIP
>>> model.export("m.tirpat"); tp.load("m.tirpat")(x)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import tvm
from tvm import relax

from .. import device
from ..device import invoke
from .archive import FORMAT, LIBRARY, read_archive, write_archive
from .backend import BackendNotFound, lookup
from .host_cpu import check_runs_here
from .host_cpu import describe as describe_host
from .native import Linked
from . import pipeline  # noqa: F401 - registers PARTITION_MARKER, the runtime function compiled code calls first
from .report import ModelReport
from .target import TargetError
from .tvm_noise import filtered_native_stderr

__all__ = ["CompiledModel", "Input", "Layer", "load", "describe_stats", "FORMAT"]


@dataclass(frozen=True)
class Input:
    """One input of a model's entry function: name, static shape and dtype."""

    name: str
    shape: tuple
    dtype: str


class CompiledModel:
    """A model compiled by ``tp.build``: ``model(*arrays)``, or by input name ``model(x=...)``,
    runs it (numpy in, numpy out, a tuple for several outputs) with the sessions of the
    backends it uses entered; an error a backend's runtime raises reaches the caller as
    itself, and leaves nothing pending.

    - ``report``: the offload report (``str()``, ``.to_json()``);
    - ``stats``: the last call's device statistics by backend name (what each backend's
      session exposes as ``.stats``; for accel an ``accel.Stats``; see :func:`describe_stats`);
    - ``profile()``: those statistics as text, a section per backend of the target
      (``tirpat run --profile`` prints it);
    - ``layers``: the last call's offloaded partitions in the order they ran, each a
      :class:`Layer` with its span of device cycles (a timeline labelled by layer);
    - ``export(path)`` writes one file that :func:`load` reads back.

    **Threads.** A model may be called from several threads at once: each thread runs it
    on a Relax VM of its own (made on the thread's first call, with the storages of the
    model's intermediate tensors, allocated then for all its calls: :mod:`tirpat.model.storages`)
    and in sessions of its own, so concurrent calls compute what the same calls made one
    after another compute.
    ``stats`` and ``layers`` describe the calling thread's last call (or, on a thread that
    has made none, the last call to finish on any thread).
    """

    def __init__(self, executable, backends: list, host: tvm.target.Target, inputs: list,
                 report: ModelReport, entry: str = "main", *, linked: Linked | None = None,
                 storages: str | None = None, spread: bool = True) -> None:
        self.executable = executable
        # the executable as machine code in a shared library (tirpat.model.native.link), which
        # the VMs load and export copies; without it each VM's creation compiles the code
        self._linked = linked
        # the function that allocates the storages and tensors lifted out of the entry, which
        # then takes them as its last arguments (tirpat.model.storages); None: the entry
        # allocates its own. ``spread``: one argument each; else (a file written before the
        # tensors were lifted) one tuple of the storages
        self._storages = storages
        self._spread = spread
        self.backends = [(b, dict(o)) for b, o in backends]
        self.host = host
        self.inputs = list(inputs)
        self.report = report
        self.entry = entry
        #: The file :func:`load` read the model from (None for a model ``tp.build`` made).
        self.source = None
        self._library: bytes | None = None     # a loaded model's library, which export writes again
        # A relax.VirtualMachine keeps its registers and frames in itself: one VM called from
        # two threads corrupts both calls (wrong results, InternalErrors, crashes). Each thread
        # makes its own on its first call (building one costs as much as a small compile).
        self._here = threading.local()      # .vm, .storages, .inputs, and .last: this thread's last (stats, starts, end)
        self._last = None                   # the last call to finish on any thread: (stats, starts, end)
        # backend sessions kept between calls ({backend: session}, one set per concurrent call)
        self._kept_sessions: list[dict] = []
        self._kept_lock = threading.Lock()

    @property
    def stats(self) -> dict:
        """The last call's device statistics by backend name (see the class docstring)."""
        last = self._last_call()
        return last[0] if last is not None else {}

    @property
    def layers(self) -> list:
        """The last call's offloaded partitions in the order they ran (see the class docstring)."""
        last = self._last_call()
        # made when asked for, not by every call (a model's call starts a hundred partitions)
        return self._layers(last[1], last[2]) if last is not None else []

    def _last_call(self):
        return getattr(self._here, "last", None) or self._last

    def _vm(self):
        """This thread's VM, and the arguments its entry takes after the model's inputs."""
        vm = getattr(self._here, "vm", None)
        if vm is None:
            runnable = self.executable if self._linked is None else self._linked.module
            vm = relax.VirtualMachine(runnable, tvm.cpu())
            # the entry's storages, allocated once for this VM: the same addresses every call
            lifted = () if self._storages is None else vm[self._storages]()
            self._here.storages = tuple(lifted) if self._spread else (lifted,)
            self._here.vm = vm
        return vm, self._here.storages

    def _check(self, args) -> list:
        if len(args) != len(self.inputs):
            names = ", ".join(i.name for i in self.inputs)
            count = f"{len(self.inputs)} input{'s' * (len(self.inputs) != 1)}"
            raise TypeError(f"the model takes {count} ({names}), got {len(args)}")
        tensors = []
        for spec, a in zip(self.inputs, args):
            if isinstance(a, tvm.runtime.Tensor):
                shape, dtype = tuple(int(d) for d in a.shape), str(a.dtype)
            else:
                a = np.asarray(a)
                shape, dtype = a.shape, str(a.dtype)
            if dtype != spec.dtype:
                raise TypeError(f"input {spec.name}: expected dtype {spec.dtype}, got {dtype}")
            if len(shape) != len(spec.shape) or any(s is not None and s != g for s, g in zip(spec.shape, shape)):
                raise ValueError(f"input {spec.name}: expected shape {spec.shape}, got {shape}")
            # np.require, not np.ascontiguousarray: that one makes a 0-d (scalar) input 1-d
            tensors.append(a if isinstance(a, tvm.runtime.Tensor) else
                           self._input_tensor(len(tensors), np.require(a, requirements="C")))
        return tensors

    def _input_tensor(self, n: int, a: np.ndarray) -> tvm.runtime.Tensor:
        """The array ``a`` for input ``n``, copied into this thread's tensor for it, made on
        the first call with its shape: a tensor made per call costs an allocation of its size
        each time (ppocr_v2_cls: 110 KB, whose pages the kernel maps afresh; ~4% of the host's
        share of a steady call), and the call's result never holds the input (the caller gets
        copies, :func:`_to_numpy`)."""
        held = getattr(self._here, "inputs", None)
        if held is None:
            held = self._here.inputs = {}
        shape, tensor = held.get(n, (None, None))
        if shape != a.shape:        # its dtype is the input's (checked)
            tensor = tvm.runtime.empty(a.shape, a.dtype)
            held[n] = (a.shape, tensor)
        return tensor.copyfrom(a)

    def _by_name(self, args: tuple, kwargs: dict) -> tuple:
        """The positional arguments, with those given by input name (``model(x=...)``) in place."""
        names = [i.name for i in self.inputs]
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise TypeError(f"the model has no input {unknown[0]!r} (its inputs: {', '.join(names)})")
        twice = [k for k in kwargs if names.index(k) < len(args)]
        if twice:
            raise TypeError(f"input {twice[0]!r} given twice, by position and by name")
        missing = [n for n in names[len(args):] if n not in kwargs]
        if missing:
            raise TypeError(f"missing input {', '.join(missing)} (the model's inputs: {', '.join(names)})")
        return tuple(args) + tuple(kwargs[n] for n in names[len(args):])

    def __call__(self, *args, **kwargs):
        """Run the model on its inputs, by position or by name (``model(x, w=w)``)."""
        tensors = self._check(self._by_name(args, kwargs) if kwargs else args)
        self._check_host()
        sessions = {}
        started = []        # (partition, {backend: cycles so far}) as each partition starts

        def cycles_now() -> dict:
            return {n: s.stats.cycles for n, s in counted}

        kept = self._take_sessions()
        with contextlib.ExitStack() as stack:
            for backend, opts in self.backends:
                session = kept.get(backend.name)
                if session is None:
                    session = backend.session(opts)
                    if isinstance(session, device.Session):    # re-enterable: kept for the next call
                        kept[backend.name] = session
                else:
                    session.begin_run()
                sessions[backend.name] = stack.enter_context(session)
                if isinstance(session, device.Session):
                    if session.options is None:
                        session.options = dict(opts)    # the backend made it for opts: it says so
                    stack.enter_context(session.running())
            vm, storages = self._vm()
            # layers are measured on the statistics that count cycles (describe_stats)
            counted = [(n, s) for n, s in sessions.items() if hasattr(getattr(s, "stats", None), "cycles")]
            # the sessions this call entered hear each partition start: which layer the device's work is
            listening = [s for s in sessions.values() if isinstance(s, device.Session)]
            for session in listening:
                session.on_partition = lambda name: started.append((name, cycles_now()))
            try:
                out = invoke(vm[self.entry], *tensors, *storages)     # a device's error arrives as itself
            except device.OptionsMismatch as err:
                raise self._options_mismatch(err) from None
            finally:
                for session in listening:
                    session.on_partition = None
        with self._kept_lock:       # only after a call that succeeded: a failed one starts afresh next time
            self._kept_sessions.append(kept)
        stats = {name: s.stats for name, s in sessions.items() if getattr(s, "stats", None) is not None}
        # one tuple, assigned at once: a reader on another thread never sees half of two calls
        self._here.last = self._last = (stats, started, cycles_now())
        return _to_numpy(out)

    def record_streams(self) -> bool:
        """Run the model once on zeros so that its devices record their instruction streams now:
        the streams of compiled code do not depend on the data (a device has no branch on it),
        so the model's first call replays them, as its later calls do, instead of building
        them (on accel that building costs seconds for a detector, its replay milliseconds).
        ``tp.build`` calls it, as a compiler that writes a device's command stream ahead of
        time does; it returns False and runs nothing when no backend's session
        :attr:`~tirpat.device.Session.replays` streams (nothing would be kept), an input's shape is
        not static or the model was compiled for another CPU. Statistics and layers stay those of no call.
        A run on zeros that raises (a check in the host code or in a device's session that zeros do not
        pass) warns with the error and returns False, keeping nothing: the first call records the
        streams, on its own inputs, and raises whatever is still wrong there.

        >>> model = tp.build(mod, "accel, llvm")      # doctest: +SKIP
        >>> model.record_streams()                    # doctest: +SKIP
        True
        """
        if any(None in i.shape for i in self.inputs):
            return False
        try:
            self._check_host()
        except TargetError:     # compiled for another CPU, to export: its code cannot run here
            return False
        made = {b.name: b.session(opts) for b, opts in self.backends}
        kept = {name: s for name, s in made.items() if isinstance(s, device.Session)}
        if not any(s.replays for s in kept.values()):
            return False
        with self._kept_lock:
            self._kept_sessions.append(kept)
        try:
            # (a call that raises keeps no session: the next one starts afresh)
            self(*(np.zeros(i.shape, i.dtype) for i in self.inputs))
        except Exception as err:  # noqa: BLE001 - the build stands; the first call meets it on real inputs
            warnings.warn(f"the device streams are recorded at the first call instead: the model's run on "
                          f"zeros raised {type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)
            return False
        finally:
            self._here.last = self._last = None
        return True

    def _take_sessions(self) -> dict:
        """The backend sessions an earlier call left (a device that remembers the streams it
        ran replays them instead of building them again), or none; concurrent calls each
        take their own."""
        with self._kept_lock:
            return self._kept_sessions.pop() if self._kept_sessions else {}

    def _check_host(self) -> None:
        """Before the first call, a ``TargetError`` when the model was compiled for CPU
        features this machine lacks (``tp.build`` compiles for any CPU, to export): its code
        would stop the process with an illegal instruction."""
        if not getattr(self, "_host_runs_here", False):
            check_runs_here(self.host, what=f"the model (compiled for {describe_host(self.host)})",
                            hint="export it and run it on a machine that has them")
            self._host_runs_here = True

    def _options_mismatch(self, err: "device.OptionsMismatch") -> "device.OptionsMismatch":
        """``err`` (the code refused a session made with the model's own backend options) as
        what it means for the model: its options are not those its code was compiled for."""
        if err.said is None:
            return err
        text = lambda opts: ", ".join(f"{k}={v}" for k, v in opts.items())  # noqa: E731
        if self.source is None:
            return device.OptionsMismatch(f"this model's {err.runtime} options say {text(err.said)}, but its code "
                                          f"was compiled for {text(err.built)}", err.built, err.said, err.runtime)
        return device.OptionsMismatch(
            f"{self.source}: its manifest gives {err.runtime} {text(err.said)}, but its library was compiled for "
            f"{text(err.built)}: the manifest was edited, or belongs to another library",
            err.built, err.said, err.runtime)

    def profile(self) -> str:
        """The last call's device statistics, a section per backend of the target: what
        :func:`describe_stats` makes of its session's ``.stats``, and the cycles of each
        layer when the statistics count cycles; a backend that ran nothing says why."""
        used = {b.name for b, _ in self.backends}
        sections = []
        for name in self.report.backends or list(used):
            if name not in used:
                sections.append(f"{name}: nothing ran on it ({self._idle(name)})")
            elif self._last_call() is None:
                sections.append(f"{name}: nothing ran yet (call the model first)")
            elif name not in self.stats:
                sections.append(f"{name}: its session keeps no device statistics (.stats)")
            else:
                model_macs = self.report.macs.get(name, 0)
                sections.append("\n".join([f"{name}:", describe_stats(self.stats[name], model_macs)]
                                          + _layer_table([l for l in self.layers if l.backend == name])))
        return "\n\n".join(sections) or "no backend of this model keeps device statistics"

    def _idle(self, backend: str) -> str:
        """Why ``backend``, a backend of the target, has no code in the model."""
        fell_back = [p for p in self.report.partitions if p.backend == backend]
        if not fell_back:
            return "it took no operator of the model"
        more = f"; {len(fell_back) - 1} more likewise, the report says why" if len(fell_back) > 1 else ""
        return f"its partition {fell_back[0].function} ran on the host: {fell_back[0].fallback}{more}"

    def _layers(self, started: list, end: dict) -> list:
        owner = {p.function: p for p in self.report.partitions}
        out = []
        for n, (name, at) in enumerate(started):      # the marker names the partition, not a copy of it
            part = owner.get(name)
            if part is None or part.backend not in at:
                continue
            nxt = next((c for _, c in started[n + 1:] if part.backend in c), end)
            out.append(Layer(name, part.backend, " + ".join(_layer_words(part)), at[part.backend],
                             nxt.get(part.backend, at[part.backend])))
        return out

    # ------------------------------------------------------------------ export / load
    def export(self, path) -> Path:
        """Write the model to ``path`` (one file: the library and a manifest); returns the path.
        An existing file is replaced only if its name ends in ``.tirpat`` (as ``tirpat compile``
        does): ``model.export("m.onnx")`` must not put a model over the ONNX file it came from."""
        path = Path(path)
        if path.exists() and not path.is_file():        # a zip archive is written with seeks: not to a device
            raise ValueError(f"{path}: not a regular file, so a model cannot be written there")
        if path.exists() and path.suffix != ".tirpat":
            raise FileExistsError(f"{path}: exists and its name does not end in .tirpat: not replaced by a model")
        manifest = {
            "format": FORMAT, "entry": self.entry, "storages": self._storages, "spread": self._spread,
            "host": dict(self.host.export()),
            "backends": [{"name": b.name, "options": o} for b, o in self.backends],
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in self.inputs],
            "report": self.report.to_json(),
        }
        with tempfile.TemporaryDirectory() as tmp:
            if self._linked is not None:        # linked at build time: that library
                lib = self._linked.path
            elif self._library is not None:     # read by load: its bytes
                lib = os.path.join(tmp, LIBRARY)
                Path(lib).write_bytes(self._library)
            else:
                lib = os.path.join(tmp, LIBRARY)
                with filtered_native_stderr():      # TVM logs a line per memory scope it saves
                    self.executable.export_library(lib)
            write_archive(path, lib, manifest, default=_json_default)
        return path

    def __repr__(self) -> str:
        names = ", ".join(b.name for b, _ in self.backends) or "no backend"
        ins = ", ".join(f"{i.name}: {i.dtype}{list(i.shape)}" for i in self.inputs)
        return f"<CompiledModel ({ins}) on {names} + {self.host.kind.name}>"


@dataclass(frozen=True)
class Layer:
    """One run of an offloaded partition: its function, backend, what it computes, and the
    device cycles it took (``start``/``end`` on the backend's cumulative cycle count)."""

    function: str
    backend: str
    what: str
    start: int
    end: int

    @property
    def cycles(self) -> int:
        return self.end - self.start


def describe_stats(stats, model_macs: int = 0) -> str:
    """A backend's device statistics (its session's ``.stats``) as text, for
    :meth:`CompiledModel.profile` and ``tirpat run --profile``.

    The statistics object may offer, each optional:

    - ``summary(model_macs=...) -> str``: the text itself, given the model's own MACs that
      ran on the backend as the report counts them (accel: cycles, roofline, utilisation);
    - ``cycles``: the device's cycle count since the session began; with it each
      offloaded partition's cycles are measured (``model.layers``, the profile's layer table);
    - ``timeline.save_png(path, title=..., layers=[(label, start, end)])``: ``--timeline``;
      ``timeline.events`` (``unit``, ``start``, ``end``): ``--timeline t.json`` (:mod:`tirpat.device.trace`).

    Without ``summary``, a mapping (a ``collections.Counter``) or a dataclass prints one line
    per entry or field, a mapping inside one on a line of its own; anything else its ``str()``.

    >>> from collections import Counter
    >>> print(describe_stats(Counter({"gemv": 12, "ld_wgt": 4})))
      gemv: 12
      ld_wgt: 4
    >>> print(describe_stats(Counter()))
      nothing counted
    >>> from dataclasses import dataclass, field
    >>> @dataclass
    ... class Stats:
    ...     instructions: Counter = field(default_factory=Counter)
    ...     bytes_moved: int = 0
    >>> print(describe_stats(Stats(Counter(vld=3, vadd=1), 48)))
      instructions: vld 3, vadd 1
      bytes_moved: 48
    """
    if callable(getattr(stats, "summary", None)):
        return stats.summary(model_macs=model_macs)
    if isinstance(stats, Mapping):
        entries = dict(stats)
    elif dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        entries = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    else:
        return str(stats)
    if not entries:
        return "  nothing counted"
    return "\n".join(f"  {key}: " + (", ".join(f"{k} {v}" for k, v in value.items()) or "none"
                                      if isinstance(value, Mapping) else str(value))
                     for key, value in entries.items())


def _layer_table(layers: list) -> list:
    """Lines of a table of ``layers``' cycles (none when there are none)."""
    if not layers:
        return []
    width = max(len(layer.what) for layer in layers)
    return [f"  {'layer':<{width + 4}}  cycles"] + [f"  {n + 1:>2}  {layer.what:<{width}}  {layer.cycles:>6}"
                                                     for n, layer in enumerate(layers)]


def _layer_words(part) -> list:
    return [part.ops[0].removeprefix("relax.").removeprefix("nn.")] + list(part.epilogue) if part.ops else [part.pattern]


def _json_default(value):
    if isinstance(value, (tvm.ir.Array, list, tuple)):
        return list(value)
    if isinstance(value, tvm.ir.Map):
        return dict(value)
    return str(value)


def _to_numpy(out):
    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    if isinstance(out, (tvm.ir.Array, list, tuple)) or type(out).__name__ == "Array":
        return tuple(_to_numpy(o) for o in out)
    return out


def load(path) -> CompiledModel:
    """Load a model written by :meth:`CompiledModel.export`; its backends are found by name
    in the registry (``tirpat.backends`` entry points included).

    Loading a ``.tirpat`` runs native code, like loading any shared library: the file holds
    the compiled library, and loading it runs its initialisers. Load only files you trust.
    The file is checked first (:func:`tirpat.model.archive.read_archive`: a ``ValueError``
    names a damaged or edited one: a manifest key missing, the library truncated or not the
    one the manifest records) and so is this CPU (a :class:`~tirpat.TargetError` when the
    model was compiled for features it lacks, whose code would stop with an illegal
    instruction).

    >>> model = tp.load("m.tirpat")          # doctest: +SKIP
    """
    with read_archive(path) as (manifest, lib):
        host = _host(path, manifest["host"])
        check_runs_here(host, what=f"{path} (compiled for {describe_host(host)})",
                        hint="run it on the machine it was compiled for, or compile it again for this one")
        try:        # every part of the manifest is read before the library is loaded
            entries = [(entry["name"], entry["options"]) for entry in manifest["backends"]]
            inputs = [Input(i["name"], tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"]]
            report = ModelReport.from_json(manifest["report"])
            storages = manifest.get("storages")     # a file written before storages were lifted has none
            if storages is not None and not isinstance(storages, str):
                raise TypeError(f"'storages' is a JSON {type(storages).__name__}, not a string")
            spread = manifest.get("spread", False)      # written before the tensors were lifted: a tuple
            if not isinstance(spread, bool):
                raise TypeError(f"'spread' is a JSON {type(spread).__name__}, not a boolean")
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: its manifest is malformed ({type(err).__name__}: {err})") from None
        try:
            with filtered_native_stderr():          # and one per scope it loads
                executable = tvm.runtime.load_module(lib)
        except RuntimeError as err:         # TVM's errors; the dynamic loader's reason follows the path
            reason = _last_line(err).rsplit(f"{lib}: ", 1)[-1].replace(lib, LIBRARY)
            raise ValueError(f"{path}: its {LIBRARY} cannot be loaded ({reason})") from None
        # the library's bytes, for export: a loaded library cannot save itself again (TVM: "does
        # not support SaveToBytes"), and the archive's copy goes with its directory
        library = Path(lib).read_bytes()
    backends = []
    for name, options in entries:
        try:
            backend = lookup(name)
        except BackendNotFound as err:
            raise BackendNotFound(f"{path} was compiled for a backend this process lacks: {err}") from None
        backends.append((backend, backend.resolve(options)))
    model = CompiledModel(executable, backends, host, inputs, report, manifest["entry"], storages=storages,
                          spread=spread)
    model._library = library
    model.source = path     # its code checks the manifest's backend options when it runs
    return model


def _host(path, config: dict) -> tvm.target.Target:
    """The host target a manifest records."""
    try:
        return tvm.target.Target(config)
    except Exception as err:  # noqa: BLE001 - TVM reports a bad config as ValueError or TVMError
        raise ValueError(f"{path}: its manifest's host target is not one TVM takes ({_last_line(err)})") from None


def _last_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
