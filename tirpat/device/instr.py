"""An instruction, declared once as the TIR program it computes (Exo's ``@instr``).

:func:`instr` turns a function returning a PrimFunc (the instruction's semantics; its
arguments are the parameters the program depends on, such as a vector length, each with
a default) into an :class:`Instruction`. Everything else comes from that one program:

- its :attr:`~Instruction.operands`, the program's parameters, typed: a buffer in one of
  the declared :class:`~tirpat.device.Memory` scopes is a ``memory`` operand (the runtime
  gets its address), a buffer in the default scope a ``host`` buffer (a DLTensor), any
  other parameter a ``scalar``; each buffer's role is what the program does to it:
  ``read``, ``write``, both (``accumulate``) or neither (``unused``: one runtime function
  can back instructions that do not all use every argument);
- :meth:`~Instruction.rule`: the rewrite rule whose pattern is the program and whose
  replacement is the call, declining with the reason of the first failing precondition;
- :meth:`~Instruction.call`: the call the compiler emits, arguments by name;
- the runtime's argument order (:attr:`~Instruction.arguments`: the ``fixed`` arguments,
  then the operands as declared), which :meth:`tirpat.device.Runtime.implement` binds to a
  Python function's parameters by name;
- :meth:`~Instruction.reference`: the program run on numpy arrays (compiled once for the
  host, scopes dropped), what a simulator's fast paths are tested against;
- what the scratchpad planner needs: :attr:`~Instruction.memory_operands` and
  :meth:`~Instruction.arguments_of` a call.

>>> from tvm.script import tirx as T
>>> VRF = Memory("VRF", "local.doc_instr", "int8", capacity=64, align=8)
>>> @instr("doc.vadd", memories=[VRF], requires=[(lambda n, lanes: n <= lanes, "n={n} exceeds {lanes} lanes")])
... def vadd(lanes: int = 8):
...     @T.prim_func
...     def program(d: T.Buffer((lanes,), "int8", scope="local.doc_instr"),
...                 a: T.Buffer((lanes,), "int8", scope="local.doc_instr"), n: T.int32):
...         for i in range(n):
...             d[i] = d[i] + a[i]
...     return program
>>> [(o.name, o.kind, o.role) for o in vadd.operands]
[('d', 'memory', 'accumulate'), ('a', 'memory', 'read'), ('n', 'scalar', 'read')]
>>> import numpy as np
>>> vadd.reference(d=np.arange(8, dtype="int8"), a=np.ones(8, "int8"), n=3)["d"].tolist()
[1, 2, 3, 3, 4, 5, 6, 7]
>>> vadd.check(n=9, lanes=8)
'n=9 exceeds 8 lanes'
>>> print(str(vadd.call(d=VRF.buffer((8,), "x"), a=VRF.buffer((8,), "y"), n=8)).splitlines()[-1])
T.call_packed("doc.vadd", T.tvm_access_ptr(T.type_annotation("int8"), x.data, 0, 8, 3), T.tvm_access_ptr(T.type_annotation("int8"), y.data, 0, 8, 1), 8)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, tirx

from ..tir.rewrite import Rewriter
from ..tir.scan import decline
from .memory import Memory

__all__ = ["Instruction", "Operand", "instr"]

#: A precondition: ``(check, reason)``; ``check`` takes operands and parameters by its
#: parameters' names and returns a truth value (in a rule, on the TIR values bound: a TIR
#: condition then holds when the analyzer proves it); ``reason`` may name them as ``{name}``.
Requirement = tuple[Callable[..., Any], str]

_MODES = {"read": "r", "write": "w", "accumulate": "rw", "unused": "r"}


@dataclass(frozen=True)
class Operand:
    """One operand of an instruction (see the module doc): its ``name``, ``kind``
    (``memory``, ``host`` or ``scalar``), ``role`` (``read``, ``write``, ``accumulate``,
    ``unused``), ``dtype``, and for a memory operand its :class:`Memory`.

    >>> acc = Operand("acc", "memory", "accumulate", "int32", Memory("ACC", "local.doc_acc", "int32", 64))
    >>> acc.reads, acc.writes, acc.mode
    (True, True, 'rw')
    """

    name: str
    kind: str
    role: str
    dtype: str
    memory: Optional[Memory] = None

    def __post_init__(self) -> None:
        if self.kind not in ("memory", "host", "scalar") or self.role not in _MODES:
            raise ValueError(f"operand {self.name}: kind {self.kind!r} / role {self.role!r}; kinds are memory, host, "
                             f"scalar and roles {', '.join(_MODES)}")
        if (self.kind == "memory") != (self.memory is not None):
            raise ValueError(f"operand {self.name}: a memory operand, and only one, names its Memory")

    @property
    def reads(self) -> bool:
        """The instruction reads this operand."""
        return self.role in ("read", "accumulate")

    @property
    def writes(self) -> bool:
        """The instruction writes this operand."""
        return self.role in ("write", "accumulate")

    @property
    def mode(self) -> str:
        """The ``access_ptr`` mode of the role: ``r``, ``w`` or ``rw``."""
        return _MODES[self.role]


def _buffer_roles(func: tirx.PrimFunc) -> dict:
    """``{buffer handle: (reads, writes)}`` of what ``func``'s body does to each buffer."""
    roles: dict = {}

    def mark(buf, k):
        r = roles.setdefault(buf.__chandle__(), [False, False])
        r[k] = True

    tvm_ffi.structural_walk(func.body, [(tirx.BufferStore, lambda s: mark(s.buffer, 1)),
                                        (ir.TensorLoad, lambda l: mark(l.source, 0) if tirx.is_buffer_var(l.source)
                                         else None)])
    return roles


def _operands(name: str, func: tirx.PrimFunc, memories: Mapping[str, Memory]) -> tuple[Operand, ...]:
    roles = _buffer_roles(func)
    out = []
    for p in func.params:
        if not tirx.is_buffer_var(p):
            out.append(Operand(p.name, "scalar", "read", str(p.ty.dtype)))
            continue
        reads, writes = roles.get(p.__chandle__(), (False, False))
        role = {(True, True): "accumulate", (True, False): "read", (False, True): "write"}.get((reads, writes),
                                                                                               "unused")
        scope = p.scope()
        if scope in ("", "global"):
            out.append(Operand(p.name, "host", role, str(p.dtype)))
        elif scope in memories:
            memory = memories[scope]
            if str(p.dtype) != memory.dtype:
                raise TypeError(f"instruction {name}: operand {p.name} is {p.dtype} but memory {memory.name} "
                                f"holds {memory.dtype}")
            out.append(Operand(p.name, "memory", role, str(p.dtype), memory))
        else:
            raise ValueError(f"instruction {name}: operand {p.name} is in scope {scope!r}, which is no declared "
                             f"memory's (memories: {sorted(memories) or 'none'}) and not host memory")
    return tuple(out)


def _stores_into(name: str, body: tirx.Stmt, target) -> list:
    """``[(loops, indices)]``: each unconditional store into buffer ``target`` in ``body``,
    with the ``(var, min, extent)`` of the loops around it, outermost first."""
    found: list = []

    def visit(stmt, loops):
        if isinstance(stmt, tirx.For):
            visit(stmt.body, loops + ((stmt.loop_var, stmt.min, stmt.extent),))
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, loops)
        elif isinstance(stmt, tirx.BufferStore) and stmt.buffer.same_as(target):
            found.append((loops, stmt.indices))
        elif isinstance(stmt, tirx.AttrStmt):
            visit(stmt.body, loops)
        # anything else stores nothing surely (an IfThenElse only maybe)

    visit(body, ())
    return found


_ARITHMETIC = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply, tirx.FloorDiv: np.floor_divide,
               tirx.FloorMod: np.mod, tirx.Min: np.minimum, tirx.Max: np.maximum}


def _evaluate(name: str, expr, env: Mapping):
    """Integer ``expr`` with its variables' values (ints or numpy arrays) from ``env`` by handle."""
    kind = type(expr)
    if kind is int:
        return expr
    if kind is tirx.IntImm:
        return expr.value
    if isinstance(expr, ir.Var):
        value = env.get(expr.__chandle__())
        if value is None:
            raise ValueError(f"instruction {name}: elements_written() needs the value of {expr.name}")
        return value
    if kind in _ARITHMETIC:
        return _ARITHMETIC[kind](_evaluate(name, expr.a, env), _evaluate(name, expr.b, env))
    if kind is tirx.Cast and str(expr.dtype).startswith("int"):
        return _evaluate(name, expr.value, env)
    raise ValueError(f"instruction {name}: elements_written() evaluates integer arithmetic, not {expr}")


def _holds(verdict) -> bool:
    """A precondition's verdict as a bool: on TIR values (a rule's bound operands) it is a
    TIR condition, which holds when the analyzer proves it."""
    if isinstance(verdict, ir.Expr):
        return bool(tvm.sym.Analyzer().can_prove(verdict))
    return bool(verdict)


def _without_scopes(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every buffer parameter in the host's default scope (to compile for llvm)."""
    new = {p.__chandle__(): tirx.decl_buffer(p.shape, p.dtype, p.name, strides=p.strides or None)
           for p in func.params if tirx.is_buffer_var(p)}
    body = tvm_ffi.structural_map(func.body, (ir.Var, lambda v: new.get(v.__chandle__(), v)))
    return tirx.PrimFunc([new.get(p.__chandle__(), p) for p in func.params], body).with_attr("global_symbol", "main")


def _with_offset(p) -> tirx.Buffer:
    """A copy of buffer parameter ``p`` that binds to a region at any offset (its
    ``elem_offset`` a variable), for a replacement."""
    return tirx.decl_buffer(p.shape, p.dtype, p.name, strides=p.strides or None, scope=p.scope(),
                            data_alignment=1, offset_factor=1)


class Instruction:
    """One declared instruction (see the module doc); made by :func:`instr`.

    ``name``, ``runtime_name``, ``fixed`` (constant runtime arguments), ``params`` (what
    the program depends on) with their ``defaults``, ``operands``, ``requires`` (the
    preconditions) and ``added`` (arguments older calls omit) are what was declared; the methods derive the rest.

    >>> from tvm.script import tirx as T
    >>> @instr("doc_ins.neg", fixed={"op": 2})
    ... def neg():
    ...     @T.prim_func
    ...     def program(x: T.Buffer((4,), "int32"), n: T.int32):
    ...         for i in range(n):
    ...             x[i] = 0 - x[i]
    ...     return program
    >>> neg
    <instruction neg: doc_ins.neg(op=2, x, n)>
    """

    def __init__(self, semantics: Callable[..., tirx.PrimFunc], runtime_name: str, memories: Sequence[Memory],
                 fixed: Mapping[str, int], requires: Iterable[Requirement], name: Optional[str],
                 added: Optional[Mapping[str, int]] = None) -> None:
        self.name = name or semantics.__name__
        if not isinstance(runtime_name, str) or runtime_name.count(".") != 1 or \
                not all(part.isidentifier() for part in runtime_name.split(".")):
            raise ValueError(f"instruction {self.name}: the runtime name must be '<prefix>.<function>', "
                             f"got {runtime_name!r}")
        self.runtime_name = runtime_name
        self.semantics = semantics
        memories = tuple(memories)
        self.memories = {m.scope: m for m in memories}
        if any(not isinstance(m, Memory) for m in memories) or len(self.memories) != len(memories):
            raise TypeError(f"instruction {self.name}: memories must be Memory objects with distinct scopes")
        signature = inspect.signature(semantics)
        undefaulted = [p.name for p in signature.parameters.values() if p.default is inspect.Parameter.empty]
        if undefaulted:
            raise TypeError(f"instruction {self.name}: give parameter(s) {', '.join(undefaulted)} a default (the "
                            f"program built with the defaults declares the operands)")
        self.defaults = {p.name: p.default for p in signature.parameters.values()}
        self.params = tuple(self.defaults)
        self.fixed = dict(fixed or {})
        if any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in self.fixed.values()):
            raise TypeError(f"instruction {self.name}: fixed arguments are integers, got {self.fixed!r}")
        self.fixed = {k: int(v) for k, v in self.fixed.items()}
        self._programs: dict = {}
        self._executables: dict = {}
        self._stores: dict = {}
        # A fixed argument the program also takes as a scalar parameter keeps that place in
        # the runtime's argument order; the program is specialised to its value.
        self._order: Optional[tuple[str, ...]] = None
        self.operands = _operands(self.name, self.program(), self.memories)
        names = [o.name for o in self.operands]
        clash = set(names) & (set(self.params) | set(self.fixed)) or set(self.params) & set(self.fixed)
        if clash:
            raise ValueError(f"instruction {self.name}: {sorted(clash)} name both an operand, a parameter or a "
                             f"fixed argument")
        self.requires = tuple(self._requirement(r) for r in requires)
        scalars = {o.name for o in self.operands if o.kind == "scalar"} - set(self.fixed)
        added = dict(added or {})
        if any(n not in scalars or not isinstance(v, (int, np.integer)) or isinstance(v, bool)
               for n, v in added.items()):
            raise TypeError(f"instruction {self.name}: added arguments are scalar operands (not fixed) with "
                            f"integer values, got {added!r} (scalars: {', '.join(sorted(scalars))})")
        self.added = {n: int(v) for n, v in added.items()}

    def _requirement(self, requirement) -> tuple:
        try:
            check, reason = requirement
        except (TypeError, ValueError):
            raise TypeError(f"instruction {self.name}: a precondition is (check, reason), "
                            f"got {requirement!r}") from None
        if not callable(check) or not isinstance(reason, str):
            raise TypeError(f"instruction {self.name}: a precondition is (callable, reason string), "
                            f"got {requirement!r}")
        wants = tuple(inspect.signature(check).parameters)
        unknown = [w for w in wants if w not in {o.name for o in self.operands} and w not in self.params]
        if unknown:
            raise TypeError(f"instruction {self.name}: precondition {reason!r} takes {', '.join(unknown)}, which "
                            f"is neither an operand nor a parameter")
        return check, reason, wants

    # -- the declaration -------------------------------------------------------------------
    def operand(self, name: str) -> Operand:
        """The operand called ``name``."""
        found = next((o for o in self.operands if o.name == name), None)
        if found is None:
            raise KeyError(f"instruction {self.name} has no operand {name!r} (operands: "
                           f"{', '.join(o.name for o in self.operands)})")
        return found

    @property
    def arguments(self) -> tuple[str, ...]:
        """The runtime function's arguments in call order: the fixed ones the program does not
        take, then the program's parameters (a fixed one among them in its place)."""
        return (*(k for k in self.fixed if k not in self._order), *self._order)

    def complete(self, args: Sequence[Any]) -> tuple:
        """A runtime call's arguments ``args`` in full: as given when they are all there,
        with the ``added`` arguments' values put in their places when the call omits them
        (code compiled before they were added); TypeError for any other count.

        >>> from tvm.script import tirx as T
        >>> @instr("doc_cpl.copy", added={"step": 1})
        ... def copy():
        ...     @T.prim_func
        ...     def program(d: T.Buffer((8,), "int8"), s: T.Buffer((8,), "int8"), n: T.int32, step: T.int32):
        ...         for i in range(n):
        ...             d[i] = s[i * step]
        ...     return program
        >>> copy.complete(("D", "S", 4))
        ('D', 'S', 4, 1)
        >>> copy.complete(("D", 4))
        Traceback (most recent call last):
          ...
        TypeError: doc_cpl.copy takes 4 arguments (d, s, n, step) or 3 without step, got 2
        """
        names = self.arguments
        if len(args) == len(names):
            return tuple(args)
        if self.added and len(args) == len(names) - len(self.added):
            given = iter(args)
            return tuple(self.added[n] if n in self.added else next(given) for n in names)
        older = f" or {len(names) - len(self.added)} without {', '.join(self.added)}" if self.added else ""
        raise TypeError(f"{self.runtime_name} takes {len(names)} arguments ({', '.join(names)}){older}, "
                        f"got {len(args)}")

    @property
    def memory_operands(self) -> tuple[Operand, ...]:
        """The operands that are addresses in a memory."""
        return tuple(o for o in self.operands if o.kind == "memory")

    def _params(self, params: Mapping[str, Any]) -> dict:
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise TypeError(f"instruction {self.name}: unknown parameter(s) {', '.join(unknown)} "
                            f"(it has {', '.join(self.params) or 'none'})")
        return {**self.defaults, **params}

    def program(self, **params: Any) -> tirx.PrimFunc:
        """The instruction's program for ``params`` (the defaults for those not given)."""
        full = self._params(params)
        key = tuple(full.items())
        found = self._programs.get(key)
        if found is None:
            found = self.semantics(**full)
            if not isinstance(found, tirx.PrimFunc):
                raise TypeError(f"instruction {self.name}: the declaration returns {type(found).__name__}, "
                                f"not a PrimFunc")
            order = tuple(p.name for p in found.params)
            if self._order is None:
                self._order = order
            elif order != self._order:
                raise ValueError(f"instruction {self.name}: the program for {full} has the parameters "
                                 f"{order}, the one for the defaults {self._order}")
            found = self._specialise(found).with_attr("global_symbol", self.name)
            # the first program built (the defaults') declares the operands; the others must agree
            if self._programs and _operands(self.name, found, self.memories) != self.operands:
                raise ValueError(f"instruction {self.name}: the program for {full} has other operands than the "
                                 f"one for the defaults {self.defaults}")
            self._programs[key] = found
        return found

    def _specialise(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """``func`` with its fixed scalar parameters replaced by their values."""
        bound = {}
        for p in func.params:
            if p.name in self.fixed:
                if tirx.is_buffer_var(p):
                    raise TypeError(f"instruction {self.name}: fixed argument {p.name} is a buffer parameter; "
                                    f"a fixed argument is an integer")
                bound[p.__chandle__()] = tirx.IntImm(str(p.ty.dtype), int(self.fixed[p.name]))
        if not bound:
            return func
        body = tvm_ffi.structural_map(func.body, (ir.Var, lambda v: bound.get(v.__chandle__(), v)))
        return tirx.PrimFunc([p for p in func.params if p.__chandle__() not in bound], body)

    def check(self, **values: Any) -> Optional[str]:
        """The reason of the first precondition ``values`` (operands and parameters by name)
        fail, or None when all hold."""
        for check, reason, wants in self.requires:
            missing = [w for w in wants if w not in values]
            if missing:
                raise TypeError(f"instruction {self.name}: precondition {reason!r} needs {', '.join(missing)}")
            args = {w: values[w] for w in wants}
            if not _holds(check(**args)):
                return reason.format(**args)
        return None

    # -- the compiler's side ---------------------------------------------------------------
    def call(self, **operands: Any) -> tirx.Stmt:
        """The call of the runtime function, operands by name: a memory operand is a buffer
        in its memory (or a region of one: anything with ``.buffer`` and ``.offset``),
        passed as an ``access_ptr`` of its role's mode, or an address; a host operand a
        buffer; a scalar an expression or int (see the module doc's example)."""
        missing = [o.name for o in self.operands if o.name not in operands]
        unknown = sorted(set(operands) - {o.name for o in self.operands})
        if missing or unknown:
            raise TypeError(f"instruction {self.name}: call() " + "; ".join(
                ([f"misses operand(s) {', '.join(missing)}"] if missing else []) +
                ([f"has no operand(s) {', '.join(unknown)}"] if unknown else [])) +
                f" (operands: {', '.join(o.name for o in self.operands)})")
        by_name = {o.name: o for o in self.operands}
        args = [self.fixed[n] if n in self.fixed else self._argument(by_name[n], operands[n]) for n in self.arguments]
        return tirx.Evaluate(tirx.call_packed(self.runtime_name, *args))

    def _argument(self, op: Operand, value):
        if op.kind == "scalar":
            if tirx.is_buffer_var(value) if isinstance(value, ir.Var) else not isinstance(value, (int, ir.Expr)):
                raise TypeError(f"instruction {self.name}: operand {op.name} is a scalar, got {value!r}")
            return value
        buffer, offset = (value.buffer, value.offset) if hasattr(value, "buffer") else (value, 0)
        if not (isinstance(buffer, ir.Var) and tirx.is_buffer_var(buffer)):
            if op.kind == "memory" and isinstance(value, (int, ir.Expr)):
                return value            # an address already
            raise TypeError(f"instruction {self.name}: operand {op.name} is a {op.kind} buffer, got {value!r}")
        scope = buffer.scope()
        if op.kind == "host":
            if scope not in ("", "global") or offset != 0:
                raise ValueError(f"instruction {self.name}: operand {op.name} is a whole host buffer, got "
                                 f"{buffer.name} in scope {scope!r}" + (" at an offset" if offset != 0 else ""))
            return buffer
        if scope != op.memory.scope:
            raise ValueError(f"instruction {self.name}: operand {op.name} is in memory {op.memory.name} "
                             f"({op.memory.scope}), got {buffer.name} in scope {scope!r}")
        return buffer.access_ptr(op.mode, offset=offset)

    def rule(self, **params: Any) -> Rewriter:
        """The rule that replaces the program for ``params`` by the call (named after the
        runtime function), declining where a precondition fails."""
        pattern = self.program(**params)
        full = self._params(params)
        replacement_params = [_with_offset(p) if tirx.is_buffer_var(p) else p for p in pattern.params]
        call = self.call(**{p.name: p for p in replacement_params})
        replacement = tirx.PrimFunc(replacement_params, call).with_attr("global_symbol", "replacement")
        where = None
        if self.requires:
            def where(m):
                reason = self.check(**{**full, **{o.name: m[o.name] for o in self.operands}})
                return True if reason is None else decline(reason)
        return Rewriter.from_module(tvm.IRModule({"pattern": pattern, "replacement": replacement}),
                                    name=self.runtime_name, where=where)

    def is_call(self, call) -> bool:
        """True for a call of this instruction: its runtime function with its fixed arguments."""
        if not (isinstance(call, ir.Call) and call.op.name == "tirx.tvm_call_packed"
                and isinstance(call.args[0], ir.StringImm) and call.args[0].value == self.runtime_name
                and len(call.args) - 1 in (len(self.arguments), len(self.arguments) - len(self.added))):
            return False
        given = self._given(call)
        return all(isinstance(given[k], tirx.IntImm) and given[k].value == v for k, v in self.fixed.items())

    def arguments_of(self, call) -> dict:
        """``{argument name: expression}`` of a call of this instruction (see :meth:`is_call`)."""
        if not self.is_call(call):
            raise ValueError(f"instruction {self.name}: {call} is not a call of it")
        return self._given(call)

    def _given(self, call) -> dict:
        args = call.args[1:]
        if len(args) < len(self.arguments):
            args = self.complete([*args])
        return {n: tirx.IntImm("int32", a) if isinstance(a, int) else a for n, a in zip(self.arguments, args)}

    # -- what a planner asks ----------------------------------------------------------------
    def elements_written(self, operand: str, **values: Any) -> np.ndarray:
        """The elements of buffer operand ``operand`` (offsets from where it starts) that
        the program surely stores to, for the scalar operands and parameters ``values`` by
        name, sorted, each once: read off the program's loop nests (stores under a condition
        are left out), whose bounds and store indices are integer arithmetic of loop
        variables and scalars. A planner asks it what an instruction writes.

        >>> from tvm.script import tirx as T
        >>> @instr("doc.every_other")
        ... def every_other():
        ...     @T.prim_func
        ...     def program(d: T.Buffer((16,), "int8"), n: T.int32, step: T.int32):
        ...         for i in range(n):
        ...             d[i * step] = T.int8(0)
        ...     return program
        >>> every_other.elements_written("d", n=3, step=2).tolist()
        [0, 2, 4]
        """
        if not any(o.name == operand and o.kind != "scalar" for o in self.operands):
            raise ValueError(f"instruction {self.name}: {operand!r} is not a buffer operand (buffer operands: "
                             f"{', '.join(o.name for o in self.operands if o.kind != 'scalar')})")
        params = {k: v for k, v in values.items() if k in self.params}
        key = (operand, tuple(sorted(params.items())))
        stores = self._stores.get(key)
        func = self.program(**params)
        if stores is None:
            target = next(p for p in func.params if p.name == operand)
            stores = self._stores[key] = _stores_into(self.name, func.body, target)
        env = {p.__chandle__(): int(values[p.name]) for p in func.params
               if not tirx.is_buffer_var(p) and p.name in values}
        target = next(p for p in func.params if p.name == operand)
        strides = list(target.strides) or [None] * len(target.shape)
        if not target.strides:      # row-major: each dimension's stride the product of those after it
            for k in reversed(range(len(strides))):
                strides[k] = 1 if k == len(strides) - 1 else strides[k + 1] * target.shape[k + 1]
        chunks = []
        for loops, indices in stores:
            grid, shape = {}, []
            for axis, (var, lo, extent) in enumerate(loops):
                start, count = (int(_evaluate(self.name, e, env)) for e in (lo, extent))
                grid[var.__chandle__()] = (np.arange(max(count, 0), dtype=np.int64) + start).reshape(
                    [1] * axis + [-1] + [1] * (len(loops) - axis - 1))
                shape.append(max(count, 0))
            at = {**env, **grid}
            flat = sum(_evaluate(self.name, i, at) * _evaluate(self.name, st, env) for i, st in zip(indices, strides))
            chunks.append(np.broadcast_to(flat, shape).ravel())
        return np.unique(np.concatenate(chunks)) if chunks else np.zeros(0, np.int64)

    # -- the reference semantics -----------------------------------------------------------
    def executable(self, **params: Any) -> tvm_ffi.Function:
        """The program for ``params`` compiled for the host (buffers in the default scope),
        taking the operands in declared order: what a simulator can run as it is."""
        key = tuple(self._params(params).items())
        found = self._executables.get(key)
        if found is None:
            func = _without_scopes(self.program(**dict(key)))
            found = self._executables[key] = tvm.compile(tvm.IRModule({"main": func}), "llvm")["main"]
        return found

    def reference(self, **values: Any) -> dict[str, np.ndarray]:
        """Run the program on numpy arrays (buffer operands) and numbers (scalars), operands
        and parameters by name; returns the buffers it writes, by name (copies: the inputs
        are left as they are)."""
        params = {k: v for k, v in values.items() if k in self.params}
        run = self.executable(**params)
        func = self.program(**params)
        missing = [o.name for o in self.operands if o.name not in values]
        unknown = sorted(set(values) - set(self.params) - {o.name for o in self.operands})
        if missing or unknown:
            raise TypeError(f"instruction {self.name}: reference() " + "; ".join(
                ([f"misses operand(s) {', '.join(missing)}"] if missing else []) +
                ([f"has no operand or parameter {', '.join(unknown)}"] if unknown else [])))
        args = []
        for op, p in zip(self.operands, func.params):
            value = values[op.name]
            if op.kind == "scalar":
                args.append(value.item() if isinstance(value, np.generic) else value)
                continue
            array = np.array(value, dtype=op.dtype)     # a copy: the program works in place
            shape = [int(d) for d in p.shape if isinstance(d, tirx.IntImm)]
            if len(shape) == len(p.shape) and list(array.shape) != shape:
                raise ValueError(f"instruction {self.name}: operand {op.name} must have shape {shape}, "
                                 f"got {list(array.shape)}")
            args.append(tvm.runtime.tensor(array))
        run(*args)
        return {op.name: a.numpy() for op, a in zip(self.operands, args) if op.kind != "scalar" and op.writes}

    def __repr__(self) -> str:
        args = ", ".join(f"{n}={self.fixed[n]}" if n in self.fixed else n for n in self.arguments)
        return f"<instruction {self.name}: {self.runtime_name}({args})>"


def instr(runtime_name: str, *, memories: Sequence[Memory] = (), fixed: Optional[Mapping[str, int]] = None,
          requires: Iterable[Requirement] = (), name: Optional[str] = None,
          added: Optional[Mapping[str, int]] = None) -> Callable[[Callable[..., tirx.PrimFunc]], Instruction]:
    """Declare an instruction (see the module doc): decorate a function of the program's
    parameters (each with a default) that returns the program as a PrimFunc.

    ``runtime_name`` is the runtime function's (``"<prefix>.<function>"``); ``memories``
    the memories its buffer operands may live in (by scope); ``fixed`` runtime arguments
    with constant values (so one runtime function backs several instructions, e.g. an ALU's
    opcode): passed first, or, when the program takes a scalar parameter of that name, in its
    place (the program is specialised to the value); ``requires`` its preconditions as ``(check,
    reason)`` pairs; ``name`` its name (the function's by default); ``added`` scalar
    arguments the runtime function gained after code was compiled against it, each with
    the value that keeps the older meaning: a call that omits them all still runs (see
    :meth:`Instruction.complete`).

    >>> instr("no_prefix")(lambda: None)
    Traceback (most recent call last):
      ...
    ValueError: instruction <lambda>: the runtime name must be '<prefix>.<function>', got 'no_prefix'
    """
    def declare(semantics: Callable[..., tirx.PrimFunc]) -> Instruction:
        return Instruction(semantics, runtime_name, memories, fixed or {}, requires, name, added or {})

    return declare
