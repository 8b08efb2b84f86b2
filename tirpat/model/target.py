"""Composite targets: which backends take which part of a model, and the host for the rest.

A composite target string lists targets in descending priority, as TVMC's ``--target`` did
(``"ethos-n77, llvm -mattr=+neon"``): registered backends first (an earlier one wins where
two could take the same operators), and last a TVM target kind, the host, which compiles
everything no backend takes.

- ``,`` separates targets; each is a name followed by its options.
- ``-opt=value`` sets an option; ``--flag`` sets a bool option to True.
- A value may hold commas without quotes (``-mattr=+avx512f,+avx512vnni``): a comma
  directly followed by more text continues the value, a comma followed by a space or the
  end of the string separates targets. Single or double quotes keep commas and spaces
  inside one value (``-opt='a, b'``).
- Backend options are typed by the backend's :class:`~tirpat.Option`\\ s, host options by
  TVM's ``TargetKind.options_from_name`` (``Array<str>`` options take a comma-separated
  list). ``-`` and ``_`` are interchangeable in option names.
- The host is the one TVM target kind, last: it compiles the model's code around the
  backends' partitions and runs it, in this process, on this CPU. :func:`host_kinds` says
  which kinds can be the host here (``llvm``) and why the others cannot (a GPU such as
  ``cuda`` only runs kernels a host launches; ``c`` emits C source). TVMC's ``device,
  host`` pair of two TVM kinds has no meaning here: tirpat's devices are its backends.
- Errors are :class:`TargetError`: an empty target, a duplicate, an unknown name (the
  message lists the registered backends), an unknown option (it lists the known ones with
  their types), a value of the wrong type or one the backend's ``check_options`` refuses
  (the message starts with the option as given: ``accel -tile=7: ...``), an ``-mcpu`` LLVM
  does not know, a TVM kind anywhere but last, or a last target that cannot be the host here.
- Whether this machine's CPU has the features the host's ``-mcpu`` and ``-mattr`` ask for
  is not the parser's business (a target may describe another machine): what runs a
  model here checks it (:mod:`tirpat.model.host_cpu`: ``tirpat compile`` unless
  ``--cross-compile``, ``tirpat tune`` without ``--rpc``, ``tp.load``, a model's first call).

>>> t = tp.parse_target("accel -tile=32, llvm -mcpu=skylake -mattr=+avx2,+fma")
>>> [(b.name, opts["tile"]) for b, opts in t.backends]
[('accel', 32)]
>>> list(t.host.export()["mattr"])
['+avx2', '+fma']
>>> str(t)
'accel -tile=32, llvm -mcpu=skylake -mattr=+avx2,+fma'
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Union

import tvm_ffi
from tvm import runtime
from tvm.target import Target, TargetKind

from .backend import Backend, Option, backends
from .llvm_features import close_features, unknown_features
from .tvm_noise import UNRECOGNISED_FEATURE, filtered_native_stderr

__all__ = ["TargetError", "CompositeTarget", "TargetSpec", "parse_target", "tokenize", "host_options", "host_kinds"]


class TargetError(ValueError):
    """A malformed composite target: the message says what is wrong and where.

    >>> tp.parse_target("accel")
    Traceback (most recent call last):
    ...
    tirpat.model.target.TargetError: target 'accel': the last target must be a TVM target kind (the host, e.g. llvm), not the backend 'accel'; add ', llvm'
    """


# -- tokenising ---------------------------------------------------------------------------

@dataclass
class TargetSpec:
    """One comma-separated piece of a target string, before names and types are checked:
    its ``name``, its ``options`` as written (``{name: text or True}``) and the ``raw`` text.

    >>> tokenize("foo -opt1=value1 --flag, bar -opt2=value2")
    [TargetSpec(name='foo', options={'opt1': 'value1', 'flag': True}), TargetSpec(name='bar', options={'opt2': 'value2'})]
    """

    name: str
    options: dict[str, Union[str, bool]] = field(default_factory=dict)
    raw: str = field(default="", repr=False, compare=False)


_NAME = re.compile(r"[A-Za-z0-9_][\w\-.]*")
_OPTION = re.compile(r"(--?)([A-Za-z0-9_][\w\-.]*)(=?)")


def tokenize(text: str) -> list[TargetSpec]:
    """Split a composite target string into :class:`TargetSpec` pieces (TVMC's rules).

    >>> [s.options for s in tokenize("foo -a=test,+v -b='v, a, l', bar")]
    [{'a': 'test,+v', 'b': 'v, a, l'}, {}]

    Raises :class:`TargetError` for an empty piece, an unterminated quote or a character
    that starts neither a name, an option nor a separator.
    """
    if not isinstance(text, str):
        raise TargetError(f"a target string must be a str, got {type(text).__name__}")
    if not text.strip():
        raise TargetError("the target string is empty; give backends then a TVM target kind, e.g. 'accel, llvm'")
    specs: list[TargetSpec] = []
    pos, n = 0, len(text)
    current: TargetSpec | None = None
    start = 0                              # where the current piece began

    def fail(message: str, at: int) -> TargetError:
        return TargetError(f"target {text!r}: {message} at position {at}")

    def close(at: int) -> None:
        if current is None:
            where = "before the first comma" if not specs else f"after target {len(specs)} ({specs[-1].name!r})"
            raise fail(f"empty target {where}", at)
        current.raw = text[start:at].strip()
        specs.append(current)

    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos == n:
            close(pos)
            return specs
        char = text[pos]
        if char == ",":
            close(pos)
            current, pos, start = None, pos + 1, pos + 1
            if not text[pos:].strip():
                raise fail(f"empty target after {specs[-1].name!r} (a trailing comma)", pos)
            continue
        if char == "-":
            m = _OPTION.match(text, pos)
            if m is None:
                raise fail(f"an option needs a name after {char!r}", pos)
            if current is None:
                raise fail(f"a target must start with its name, not the option {m.group(0)!r}", pos)
            dashes, name, eq = m.groups()
            pos = m.end()
            if not eq:
                if pos < n and not (text[pos].isspace() or text[pos] == ","):
                    raise fail(f"unexpected {text[pos]!r} in option {text[m.start():pos + 1]!r}", pos)
                if dashes == "-":
                    raise fail(f"option -{name} needs a value (-{name}=VALUE), or write --{name} for a flag", m.start())
                value: Union[str, bool] = True
            else:
                value, pos = _value(text, pos, name, fail)
            if name in current.options:
                raise fail(f"option {name!r} given twice for {current.name!r}", m.start())
            current.options[name] = value
            continue
        m = _NAME.match(text, pos)
        if m is None:
            raise fail(f"unexpected {char!r}", pos)
        if current is not None:
            raise fail(f"unexpected {m.group(0)!r} after {current.name!r}: options start with '-', "
                       f"targets are separated by ','", pos)
        current = TargetSpec(m.group(0))
        pos = m.end()
        if pos < n and not (text[pos].isspace() or text[pos] == ","):
            raise fail(f"unexpected {text[pos]!r} in the name {text[m.start():pos + 1]!r}", pos)


def _value(text: str, pos: int, name: str, fail) -> tuple[str, int]:
    """The value of ``-name=`` starting at ``pos``, and the position after it."""
    n = len(text)
    if pos < n and text[pos] in "'\"":
        quote = text[pos]
        end = text.find(quote, pos + 1)
        if end < 0:
            raise fail(f"unterminated {quote} quote in the value of -{name}", pos)
        after = end + 1
        if after < n and not (text[after].isspace() or text[after] == ","):
            raise fail(f"unexpected {text[after]!r} after the quoted value of -{name}", after)
        return text[pos + 1:end], after
    end = pos
    while end < n and not text[end].isspace() and text[end] not in "'\"":
        if text[end] == "," and (end + 1 == n or text[end + 1].isspace() or text[end + 1] == ","):
            break                             # a separating comma: the value ends here
        end += 1
    if end < n and text[end] in "'\"":
        raise fail(f"a quote may only start the value of -{name}", end)
    if end == pos:
        raise fail(f"option -{name}= has no value (write -{name}='' for an empty one)", pos)
    return text[pos:end], end


# -- typing -------------------------------------------------------------------------------

# TVM's option types as ``options_from_name`` names them; scalars convert as tp.Option does.
_TVM_SCALARS = {"str": Option(str, ""), "int": Option(int, 0), "bool": Option(bool, False)}
# Options a target string must not set: the kind is the name, the host is the last target.
_TVM_RESERVED = ("kind", "host")


def _tvm_options(kind: str) -> dict[str, str]:
    return {k: v for k, v in TargetKind.options_from_name(kind).items() if k not in _TVM_RESERVED}


def host_options(kind: str) -> dict[str, str]:
    """The options a target string can give the TVM target ``kind``, with their types as a
    user reads them (``int``, ``bool``, ``str``, ``list of str``; others cannot be given).

    >>> host_options("llvm")["mattr"], host_options("llvm")["num-cores"]
    ('list of str', 'int')
    """
    return {k: "list of str" if t == "Array<str>" else t for k, t in _tvm_options(kind).items()}


def _describe_tvm_options(kind: str) -> str:
    return ", ".join(f"{k}: {t}" for k, t in host_options(kind).items())


def _option_key(name: str, known: Iterable[str]) -> str | None:
    """``name`` as one of ``known``, with ``-`` and ``_`` interchangeable."""
    known = list(known)
    for candidate in (name, name.replace("-", "_"), name.replace("_", "-")):
        if candidate in known:
            return candidate
    return None


def _convert_tvm(kind: str, name: str, value: Any, type_name: str) -> Any:
    where = f"option {name!r} of {kind!r}"
    if type_name in _TVM_SCALARS:
        try:
            return _TVM_SCALARS[type_name].convert(value, name)
        except (TypeError, ValueError):
            raise TargetError(f"{where} must be of type {type_name}, got {value!r}") from None
    if type_name == "Array<str>":
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",")]
            if not all(items):
                raise TargetError(f"{where} is a comma-separated list of str, got {value!r} (an empty item)")
            return items
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise TargetError(f"{where} must be a list of str, got {value!r}")
    raise TargetError(f"{where} has type {type_name}, which a target string cannot give")


def _host_target(kind: str, options: Mapping[str, Any]) -> Target:
    """A ``tvm.target.Target`` of ``kind`` in 0.27's JSON form, options typed by TVM."""
    known = _tvm_options(kind)
    config: dict[str, Any] = {"kind": kind}
    for name, value in options.items():
        key = _option_key(name, known)
        if key is None:
            raise TargetError(f"TVM target {kind!r} has no option {name!r}; its options are {_describe_tvm_options(kind)}")
        config[key] = _convert_tvm(kind, key, value, known[key])
    try:
        # (an -mattr feature LLVM does not know is refused below, not printed about here)
        with filtered_native_stderr(also=UNRECOGNISED_FEATURE):
            target = Target(config)
    except Exception as err:  # noqa: BLE001 - TVM reports bad values as ValueError or TVMError
        raise TargetError(f"TVM rejects the target {kind!r}: {_first_line(err)}") from None
    if kind == "llvm" and "mcpu" in config:
        _check_llvm_cpu(config["mcpu"], config.get("mtriple"))
    if kind == "llvm" and config.get("mattr"):
        _check_llvm_mattr(config["mattr"], config.get("mtriple"))
    return target


def _check_llvm_cpu(cpu: str, triple: str | None) -> None:
    """An -mcpu LLVM does not know is an error: TVM takes it, logs an error line and
    generates code for a generic CPU.

    >>> _check_llvm_cpu("x86-64", "x86_64-linux-gnu")
    >>> _check_llvm_cpu("skylake-avx", "x86_64-linux-gnu")
    Traceback (most recent call last):
    ...
    tirpat.model.target.TargetError: option 'mcpu' of 'llvm': LLVM knows no CPU 'skylake-avx' for x86_64-linux-gnu (did you mean 'skylake-avx512', ...
    """
    from tvm.target import codegen

    if cpu == "native":             # TVM's own name for the CPU it runs on
        return
    triple = triple or codegen.llvm_get_system_triple()
    if codegen.llvm_is_valid_cpu(cpu, triple):
        return
    known = list(codegen.llvm_get_cpu_archlist(Target({"kind": "llvm", "mtriple": triple})))
    close = difflib.get_close_matches(cpu, known, n=3)
    hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
    raise TargetError(f"option 'mcpu' of 'llvm': LLVM knows no CPU {cpu!r} for {triple} ({hint}this machine's is "
                      f"{codegen.llvm_get_system_cpu()!r}; -mcpu=native means it)")


def _check_llvm_mattr(mattr, triple: str | None) -> None:
    """An -mattr feature LLVM does not know is an error: TVM takes it, and LLVM ignores it with
    a line on stderr each time it makes a code generator (dozens a build).

    >>> _check_llvm_mattr(["+avx2"], None)
    >>> _check_llvm_mattr(["+avx2", "+fooo"], None)
    Traceback (most recent call last):
    ...
    tirpat.model.target.TargetError: option 'mattr' of 'llvm': LLVM knows no feature '+fooo' for ...
    """
    from tvm.target import codegen

    unknown = unknown_features(mattr, triple)
    if unknown:
        here = triple in (None, codegen.llvm_get_system_triple())
        close = close_features(unknown[0]) if here else []      # (spellings of this machine's triple only)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise TargetError(f"option 'mattr' of 'llvm': LLVM knows no feature {', '.join(map(repr, unknown))} for "
                          f"{triple or codegen.llvm_get_system_triple()}{hint}; a feature is +name or -name")


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _resolve(backend: Backend, options: Mapping[str, Any]) -> dict:
    """``backend.resolve`` with ``-``/``_`` spelling and every failure as a TargetError."""
    given = {}
    for name, value in options.items():
        key = _option_key(name, backend.options)
        if key is None:
            raise TargetError(f"backend {backend.name!r} has no option {name!r}; "
                              f"its options are {backend.describe_options()}")
        given[key] = value
    try:
        opts = backend.resolve(given)
    except (TypeError, ValueError) as err:
        raise TargetError(f"backend {backend.name!r}: {err}") from None
    try:
        backend.check_options(opts)
    except ValueError as err:
        # name the options the message speaks of as the target string gave them
        named = [f"-{key}={given[key]}" for key in given if re.search(rf"\b{re.escape(key)}\b", str(err))]
        raise TargetError(f"{backend.name} {' '.join(named)}: {err}" if named else f"backend {backend.name!r}: {err}") from None
    return opts


# -- hosts ----------------------------------------------------------------------------------

# The host compiles the code around the backends' partitions (TVM's Relax VM program and its
# kernels) and runs it in this process: it must be a CPU that TVM generates code for here.
_GPU = "a GPU: it runs the kernels a host launches, it is not one"
_NOT_HOST = {
    "c": "TVM's C source generator has no Relax pipeline, and its output needs a C compiler to run",
    "hexagon": "a Hexagon DSP: its code is cross-compiled and runs on that device over RPC",
    **dict.fromkeys(("cuda", "nvptx", "rocm", "metal", "opencl", "vulkan", "webgpu"), _GPU),
}
_NOT_A_PROCESSOR = "not a CPU target that runs the model's host code here"


def host_kinds() -> dict[str, str | None]:
    """Every TVM target kind, with None when it can be the host here, else why it cannot.

    The host (the last target) compiles what no backend takes and runs the whole model in
    this process, on this machine's CPU: with TVM's LLVM code generator, ``llvm``.

    >>> kinds = host_kinds()
    >>> [kind for kind, why in kinds.items() if why is None]
    ['llvm']
    >>> kinds["cuda"]
    'a GPU: it runs the kernels a host launches, it is not one'
    """
    found = {}
    for kind in sorted(Target.list_kinds()):
        if kind == "llvm":
            found[kind] = None if runtime.enabled("llvm") else "this TVM was built without LLVM"
        else:
            found[kind] = _NOT_HOST.get(kind, _NOT_A_PROCESSOR)
    return found


def _check_host(kind: str) -> None:
    kinds = host_kinds()
    why = kinds.get(kind, _NOT_A_PROCESSOR)
    if why is not None:
        usable = ", ".join(k for k, reason in kinds.items() if reason is None) or "none"
        raise TargetError(f"{kind!r} cannot be the host, the last target, which compiles what no backend takes "
                          f"and runs the model here: {why}; hosts here: {usable}")


# -- the composite target -------------------------------------------------------------------

BackendLike = Union[str, Backend, type]


class CompositeTarget:
    """Backends in priority order and the TVM host target that compiles the rest.

    ``backends`` is ``[(Backend, opts)]``, earliest first, each ``opts`` every declared
    option typed with defaults filled in; ``host`` is a ``tvm.target.Target`` of a kind that
    can be the host here (:func:`host_kinds`).

    Built by :func:`parse_target` or from Python: each backend is a registered name, a
    Backend (instance or class), or a ``(backend, options)`` pair; the host is a TVM kind
    name, a target piece such as ``"llvm -mcpu=skylake"``, a JSON-form dict or a ``Target``.

    >>> t = tp.CompositeTarget([("accel", {"tile": 32})], host="llvm -mcpu=skylake")
    >>> t.backends[0][1]["tile"], t.host.export()["mcpu"]
    (32, 'skylake')
    >>> t == tp.parse_target(str(t))
    True
    """

    def __init__(self, backends: Iterable[Union[BackendLike, tuple]] = (), host: Any = "llvm") -> None:
        self.backends: list[tuple[Backend, dict]] = []
        for entry in backends:
            backend, options = entry if isinstance(entry, tuple) else (entry, {})
            if not isinstance(options, Mapping):
                raise TargetError(f"options of backend {backend!r} must be a dict, got {options!r}")
            backend = _backend(backend)
            if any(b.name == backend.name for b, _ in self.backends):
                raise TargetError(f"backend {backend.name!r} is given twice")
            self.backends.append((backend, _resolve(backend, options)))
        self.host: Target = _as_host(host)

    def options(self, name: str) -> dict:
        """The resolved options of the backend called ``name``.

        >>> tp.parse_target("accel -tile=32, llvm").options("accel")["tile"]
        32
        """
        for backend, opts in self.backends:
            if backend.name == name:
                return opts
        raise KeyError(f"backend {name!r} is not in the target {str(self)!r}")

    def __str__(self) -> str:
        pieces = [_format(b.name, {k: v for k, v in opts.items() if v != b.options[k].default})
                  for b, opts in self.backends]
        return ", ".join([*pieces, _format_tvm(self.host)])

    def __repr__(self) -> str:
        return f"CompositeTarget({str(self)!r})"

    def _key(self) -> tuple:
        return (tuple((b.name, tuple(sorted(o.items()))) for b, o in self.backends),
                json.dumps(_json(self.host), sort_keys=True))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompositeTarget) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def parse_target(text: Union[str, CompositeTarget]) -> CompositeTarget:
    """Parse a composite target string (see the module docstring for the rules).

    A :class:`CompositeTarget` is returned as it is, so an API can take either.

    >>> t = tp.parse_target("accel --tile, llvm")
    Traceback (most recent call last):
    ...
    tirpat.model.target.TargetError: backend 'accel': option 'tile' must be of type int, got bool True
    >>> tp.parse_target("llvm, llvm")
    Traceback (most recent call last):
    ...
    tirpat.model.target.TargetError: target 'llvm, llvm': 'llvm' is given twice
    """
    if isinstance(text, CompositeTarget):
        return text
    specs = tokenize(text)
    registered = backends()
    kinds = Target.list_kinds()
    try:
        return _from_specs(text, specs, registered, kinds)
    except TargetError as err:
        raise TargetError(f"{err}{_comma_hint(specs, set(registered) | set(kinds))}") from None


def _from_specs(text: str, specs: list[TargetSpec], registered: dict[str, Backend], kinds: list[str]) -> CompositeTarget:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise TargetError(f"target {text!r}: {spec.name!r} is given twice")
        seen.add(spec.name)
        if spec.name not in registered and spec.name not in kinds:
            raise TargetError(f"target {text!r}: unknown target {spec.name!r}; registered backends: "
                              f"{', '.join(sorted(registered)) or 'none'}; TVM target kinds: {', '.join(sorted(kinds))}")
    # A backend's name wins over a TVM kind of the same name, as TVMC's codegens did.
    last = specs[-1]
    if last.name in registered:
        raise TargetError(f"target {text!r}: the last target must be a TVM target kind (the host, e.g. llvm), "
                          f"not the backend {last.name!r}; add ', llvm'")
    tvm_specs = [s for s in specs if s.name not in registered]
    if len(tvm_specs) > 1:
        raise TargetError(f"target {text!r}: {_several_kinds(tvm_specs, specs, registered)}")
    try:
        _check_host(last.name)
    except TargetError as err:
        raise TargetError(f"target {text!r}: {err}") from None
    backend_specs = [(registered[s.name], s.options) for s in specs if s.name in registered]
    return CompositeTarget(backend_specs, host=_host_target(last.name, last.options))


def _several_kinds(tvm_specs: list[TargetSpec], specs: list[TargetSpec], registered: Mapping) -> str:
    """Why a target string may name one TVM kind only, with the string it probably meant."""
    *others, host = [repr(s.name) for s in tvm_specs]
    text = (f"{', '.join(others)} and {host} are TVM target kinds; a composite target names one, last: the "
            f"host, which compiles what no backend takes and runs the model")
    if len(tvm_specs) == 2:
        text += (f". TVMC read two as a device ({others[0]}) and its host ({host}); tirpat does not: a device "
                 f"is a backend, named before the host")
    hosts = [s for s in tvm_specs if host_kinds().get(s.name) is None]
    if len(hosts) == 1:
        meant = ", ".join(s.raw for s in specs if s.name in registered or s is hosts[0])
        text += f"; did you mean {meant!r}?"
    return text


def _comma_hint(specs: list[TargetSpec], names: set[str]) -> str:
    """A hint when a value swallowed the next target (``-tile=16,llvm``: no space after ',')."""
    for spec in specs:
        for option, value in spec.options.items():
            if isinstance(value, str) and "," in value:
                head, tail = value.rsplit(",", 1)
                if tail.strip() in names:
                    return (f" (the value of -{option} of {spec.name!r} took {value!r}: a comma followed by text "
                            f"continues a value; write '-{option}={head}, {tail}' to start a new target)")
    return ""


def _backend(backend: BackendLike) -> Backend:
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, type) and issubclass(backend, Backend):
        return backend()
    if isinstance(backend, str):
        registered = backends()
        if backend not in registered:
            raise TargetError(f"no backend named {backend!r} is registered (registered: "
                              f"{', '.join(sorted(registered)) or 'none'})")
        return registered[backend]
    raise TargetError(f"a backend is a registered name, a tp.Backend or a (backend, options) pair, got {backend!r}")


def _as_host(value: Any) -> Target:
    """The host given from Python as a ``Target``, a JSON-form dict or a target piece."""
    if isinstance(value, Target):
        _check_host(value.kind.name)
        return value
    if isinstance(value, Mapping):
        value = dict(value)
        kind = value.pop("kind", None)
        if not isinstance(kind, str):
            raise TargetError(f"a host target dict needs a 'kind', got {value!r}")
        return _host_target(_host_kind(kind), value)
    if isinstance(value, str):
        specs = tokenize(value)
        if len(specs) != 1:
            raise TargetError(f"the host is one TVM target, got {value!r}")
        return _host_target(_host_kind(specs[0].name), specs[0].options)
    raise TargetError(f"the host is a TVM target kind name, a target dict or a tvm.target.Target, got {value!r}")


def _host_kind(kind: str) -> str:
    if kind not in Target.list_kinds():
        raise TargetError(f"the host must be a TVM target kind ({', '.join(sorted(Target.list_kinds()))}), got {kind!r}")
    _check_host(kind)
    return kind


# -- printing -------------------------------------------------------------------------------

_PLAIN = re.compile(r"[\w+\-.:/=@]+(,[\w+\-.:/=@]+)*")


def _format(name: str, options: Mapping[str, Any]) -> str:
    return " ".join([name, *(_format_option(k, v) for k, v in options.items())])


def _format_option(name: str, value: Any) -> str:
    if value is True:
        return f"--{name}"
    if isinstance(value, bool):
        return f"-{name}=false"
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value)
    if not _PLAIN.fullmatch(text):
        if "'" in text and '"' in text:
            raise TargetError(f"the value of -{name} ({text!r}) has both kinds of quote: a target string cannot hold it")
        text = f'"{text}"' if "'" in text else f"'{text}'"
    return f"-{name}={text}"


def _json(target: Target) -> dict:
    """A target's options as plain Python values (Arrays as lists)."""
    return {k: list(v) if isinstance(v, (tuple, list, tvm_ffi.Array)) else v for k, v in target.export().items()}


def _format_tvm(target: Target) -> str:
    """A TVM target as a target-string piece: only what differs from the kind's defaults."""
    config = _json(target)
    kind = config.pop("kind")
    defaults = _json(Target({"kind": kind}))
    options = {k: v for k, v in config.items() if k not in ("tag", "host") and defaults.get(k) != v}
    return _format(kind, options)
