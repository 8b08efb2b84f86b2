"""Graph-level partitioning: the backends of a target pick their operators out of a Relax module.

Each backend's :meth:`~tirpat.Backend.patterns` go to Relax's ``FuseOpsByPattern`` in the
target's priority order (an earlier backend wins an overlap), with their checks; every
match becomes a private Relax function tagged with its backend and the backend's options
(``tirpat.backend``, ``tirpat.options``), which the rest of the flow dispatches on.
A backend's ``PRE_PARTITION`` passes run before, its ``POST_PARTITION`` passes after.

A check is FuseOpsByPattern's ``check(ctx) -> bool``; it may also return a string instead of
``False``: the reason it declines, which the build report gives for the operators left on
the host (``"float32 x float32; accel takes int8 x int8 -> int32"``), and which the build
warns about. A :class:`DataMovement` reason says the operators only move data in a way the
backend does not: the report gives it, the build does not warn (nothing in the model would
put them on the device).

>>> mod2 = tp.partition(mod, "accel, llvm")                      # doctest: +SKIP
>>> [f.attrs["tirpat.backend"] for f in mod2.functions.values() if "tirpat.backend" in (f.attrs or {})]  # doctest: +SKIP
['accel']
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import tvm
from tvm import ir, relax
from tvm.relax.dpl import pattern as dpl

from .backend import Backend, Phase
from .target import CompositeTarget, parse_target

__all__ = ["partition", "Partitioner", "DataMovement", "BACKEND_ATTR", "OPTIONS_ATTR", "PARTITION_ATTR",
           "PartitionOrigin", "tagged", "origin_of", "fold_constant_calls"]

#: Function attribute naming the backend a partition (Relax function or PrimFunc) belongs to.
BACKEND_ATTR = "tirpat.backend"
#: Function attribute holding that backend's resolved options, as JSON text.
OPTIONS_ATTR = "tirpat.options"


#: PrimFunc attribute naming the Relax partition a PrimFunc computes, for what a backend tells
#: its users and the build report: ``{"name": the partition's function name, "ops": [the Relax
#: operators it computes, in order]}``. Copies TVM makes of the PrimFunc (the prepacked one of a
#: weight layout stage, the stage itself) keep it, so no layer parses another's function names.
PARTITION_ATTR = "tirpat.partition"


@dataclass(frozen=True)
class PartitionOrigin:
    """The Relax partition a PrimFunc computes (its :data:`PARTITION_ATTR`)."""

    name: str           # the partition's function name, as the build report calls it
    ops: tuple          # the Relax operators it computes, in order ("relax.matmul", ...)

    def attr(self) -> dict:
        """The value of :data:`PARTITION_ATTR` for this origin."""
        return {"name": self.name, "ops": list(self.ops)}


def origin_of(func: tvm.tirx.PrimFunc) -> PartitionOrigin | None:
    """The Relax partition the PrimFunc ``func`` computes, from its :data:`PARTITION_ATTR`;
    None for a function not lowered from a partition (a hand-written PrimFunc).

    >>> from tvm import tirx
    >>> func = tirx.PrimFunc([], tirx.Evaluate(0))
    >>> origin_of(func.with_attr(PARTITION_ATTR, PartitionOrigin("part3", ("relax.matmul",)).attr()))
    PartitionOrigin(name='part3', ops=('relax.matmul',))
    >>> origin_of(func) is None
    True
    """
    attrs = func.attrs
    if attrs is None or PARTITION_ATTR not in attrs:
        return None
    value = attrs[PARTITION_ATTR]
    return PartitionOrigin(str(value["name"]), tuple(str(op) for op in value["ops"]))


def tagged(func) -> tuple[str, dict] | None:
    """``(backend name, options)`` of a function tagged by :func:`partition`, else None.

    >>> tagged(mod2["fused_relax_matmul"])                    # doctest: +SKIP
    ('accel', {'tile': 16, ...})
    """
    attrs = func.attrs
    if attrs is None or BACKEND_ATTR not in attrs:
        return None
    return str(attrs[BACKEND_ATTR]), json.loads(str(attrs[OPTIONS_ATTR])) if OPTIONS_ATTR in attrs else {}


def options_text(opts: dict) -> str:
    """Options as the JSON text of :data:`OPTIONS_ATTR` (sorted keys: equal options, equal text)."""
    return json.dumps(opts, sort_keys=True)


class DataMovement(str):
    """A check's reason (a string, see the module doc) that the matched operators are data
    movement the backend does not run (a channel shuffle, a gather): the build report gives
    it for them, but the build neither warns about them nor, strict, fails for them.

    >>> why = tp.DataMovement("a channel shuffle: data movement the device does not run")
    >>> isinstance(why, str), why
    (True, 'a channel shuffle: data movement the device does not run')
    """

    __slots__ = ()


@dataclass
class _Declined:
    """Why a backend's check declined an operator: the first reason per backend, by bound
    variable (the variable itself: names repeat in a Relax function, e.g. after a rewrite).

    A declined match gives its reason to its operators unless a smaller match of the same
    backend was declined for the same reason: FuseOpsByPattern tries conv + add, then the
    conv alone, and a grouped conv's reason is not the add's. The add was part of the
    declined conv + add all the same: :meth:`part_of` says so, naming the operators whose
    reason it is.
    """

    matches: list = field(default_factory=list)     # (backend, reason, pattern, {var handle: var}) per declined match
    _blamed: tuple | None = None                    # (direct, part of), made on first use

    def add(self, variables: list, backend: str, reason: str, pattern: str = "") -> None:
        # the vars are kept: their handles stay their own
        self.matches.append((backend, reason, pattern, {v.__chandle__(): v for v in variables}))
        self._blamed = None

    def of(self, var: relax.Var) -> list:
        """``[(backend, reason)]`` for ``var``, empty if no check declined it."""
        return self._blame()[0].get(var.__chandle__(), [])

    def part_of(self, var: relax.Var) -> list:
        """``[(backend, pattern, owners)]``: the declined matches ``var`` was part of whose
        reason is that of other operators (``owners``, the variables the check declined),
        for the backends that gave ``var`` no reason of its own."""
        return self._blame()[1].get(var.__chandle__(), [])

    def _blame(self) -> tuple:
        if self._blamed is not None:
            return self._blamed
        direct: dict = {}
        part_of: dict = {}
        for backend, reason, pattern, match in self.matches:
            smaller = [m for b, r, _, m in self.matches if b == backend and r == reason and m.keys() < match.keys()]
            if smaller:     # the smallest gives the reason to its own operators
                owners = min(smaller, key=len)
                for handle in match.keys() - owners.keys():
                    seen = part_of.setdefault(handle, {})
                    if backend not in seen or len(match) > seen[backend][0]:     # the whole chain it was in
                        seen[backend] = (len(match), pattern, list(owners.values()))
                continue
            for handle in match:
                seen = direct.setdefault(handle, [])
                if all(b != backend for b, _ in seen):
                    seen.append((backend, reason))
        pointers = {handle: [(b, pattern, owners) for b, (_, pattern, owners) in seen.items()
                             if all(b != mine for mine, _ in direct.get(handle, ()))]     # its own reason says more
                    for handle, seen in part_of.items()}
        self._blamed = (direct, pointers)
        return self._blamed


def _op_names(patterns: list) -> set:
    """The Relax operator names the DPL ``patterns`` mention (each shared sub-pattern seen once)."""
    names, stack, seen = set(), list(patterns), set()
    while stack:
        p = stack.pop()
        if p.__chandle__() in seen:
            continue
        seen.add(p.__chandle__())
        if isinstance(p, dpl.CallPattern):
            stack.append(p.op)
            stack.extend(p.args)
        elif isinstance(p, (dpl.OrPattern, dpl.AndPattern)):
            stack += [p.left, p.right]
        elif isinstance(p, dpl.ExprPattern) and isinstance(p.expr, ir.Op):
            names.add(p.expr.name)
        elif isinstance(p, (dpl.DataTypePattern, dpl.ShapePattern, dpl.AttrPattern)):
            stack.append(p.pattern)
        elif isinstance(p, dpl.TupleGetItemPattern):
            stack.append(p.tuple)
        elif isinstance(p, dpl.TuplePattern):
            stack.extend(p.fields)
    return names


def _required_ops(pattern, memo: dict) -> frozenset:
    """The Relax operator names that every match of the DPL ``pattern`` calls: those of a
    call, its operator's and its arguments'; what both sides of an alternative require; none
    for a pattern of another kind (a wildcard, a constant)."""
    key = pattern.__chandle__()
    if key in memo:
        return memo[key]
    if isinstance(pattern, dpl.ExprPattern) and isinstance(pattern.expr, ir.Op):
        out = frozenset([pattern.expr.name])
    elif isinstance(pattern, dpl.CallPattern):
        out = _required_ops(pattern.op, memo).union(*(_required_ops(a, memo) for a in pattern.args or ()))
    elif isinstance(pattern, dpl.OrPattern):
        out = _required_ops(pattern.left, memo) & _required_ops(pattern.right, memo)
    elif isinstance(pattern, dpl.AndPattern):
        out = _required_ops(pattern.left, memo) | _required_ops(pattern.right, memo)
    elif isinstance(pattern, (dpl.DataTypePattern, dpl.ShapePattern, dpl.AttrPattern)):
        out = _required_ops(pattern.pattern, memo)
    elif isinstance(pattern, dpl.TupleGetItemPattern):
        out = _required_ops(pattern.tuple, memo)
    elif isinstance(pattern, dpl.TuplePattern):
        out = frozenset().union(*(_required_ops(f, memo) for f in pattern.fields))
    else:
        out = frozenset()
    memo[key] = out
    return out


def _called_ops(mod: ir.IRModule) -> set:
    """The names of the Relax operators the Relax functions of ``mod`` call."""
    names: set = set()

    def on_expr(e) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, ir.Op):
            names.add(e.op.name)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, on_expr)
    return names


class Partitioner:
    """Partitioning for one target, remembering what it learnt for the build report:
    which operators each backend's patterns mention (:attr:`covered`) and why checks
    declined operators (:attr:`declined`).

    >>> p = Partitioner(tp.parse_target("accel, llvm")); mod2 = p(mod)    # doctest: +SKIP
    """

    def __init__(self, target) -> None:
        self.target = as_target(target)
        self.covered: dict[str, set] = {}         # backend name -> op names its patterns mention
        self.declined = _Declined()

    def _patterns(self) -> list:
        out = []
        for backend, opts in self.target.backends:
            mine = []
            for entry in backend.patterns(opts) or []:
                if isinstance(entry, relax.transform.FusionPattern):
                    name, pat, annotations, check = entry.name, entry.pattern, dict(entry.annotation_patterns), entry.check
                else:
                    if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3, 4):
                        raise TypeError(f"{backend.name}.patterns() must give (name, pattern[, check]) tuples, "
                                        f"got {entry!r}")
                    name, pat = entry[0], entry[1]
                    annotations = entry[2] if len(entry) == 4 else {}
                    check = entry[-1] if len(entry) >= 3 else None
                    if isinstance(check, dict):
                        annotations, check = check, None
                if not name.startswith(backend.name + "."):
                    name = f"{backend.name}.{name}"
                mine.append(relax.transform.FusionPattern(name, pat, annotations, self._checked(backend, name, check)))
            self.covered.setdefault(backend.name, set()).update(_op_names([p.pattern for p in mine]))
            out += mine
        return out

    def _checked(self, backend: Backend, pattern: str, check):
        if check is None:
            return None
        declined = self.declined

        def run(ctx) -> bool:
            verdict = check(ctx)
            if isinstance(verdict, str):
                bound = [ctx.value_to_bound_var.get(call) for call in _calls_in(ctx)]
                declined.add([v for v in bound if v is not None], backend.name, verdict, pattern)
                return False
            return bool(verdict)

        return run

    def phase(self, phase: Phase) -> list:
        """Every backend's passes for a Relax ``phase``, in priority order."""
        return [p for backend, opts in self.target.backends for p in backend.passes(phase, opts) or []]

    def fuse(self, mod: ir.IRModule) -> ir.IRModule:
        """FuseOpsByPattern with every backend's patterns (those that can match: see below), then tag
        each partition."""
        patterns = self._patterns()
        # a pattern calling an operator the module does not call matches nothing (its check
        # never runs): FuseOpsByPattern, which walks the module once per pattern, skips it
        called, memo = _called_ops(mod), {}
        patterns = [p for p in patterns if _required_ops(p.pattern, memo) <= called]
        if patterns:
            mod = relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=False)(mod)
        opts_of = {b.name: options_text(o) for b, o in self.target.backends}
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or func.attrs is None or "Composite" not in func.attrs:
                continue
            backend = str(func.attrs["Composite"]).split(".", 1)[0]
            if backend in opts_of:
                mod[gv] = func.with_attr(BACKEND_ATTR, backend).with_attr(OPTIONS_ATTR, opts_of[backend])
        return mod

    def __call__(self, mod: ir.IRModule) -> ir.IRModule:
        if not isinstance(mod, ir.IRModule):
            raise TypeError(f"partition takes a Relax IRModule, got {type(mod).__name__}")
        mod = relax.transform.ConvertToDataflow()(mod)
        mod = tvm.transform.Sequential(self.phase(Phase.PRE_PARTITION))(mod)
        # constants computed from constants (a filled broadcast scalar) become plain constants,
        # after the backends' own passes (which may look for a dequantised weight) and before
        # their patterns. Only where needed: folding compiles such calls for the CPU (once, in
        # fold_constant_calls), and a cast or transpose of a weight is the patterns' own.
        if _has_foldable_calls(mod):
            mod = fold_constant_calls(mod)
        mod = self.fuse(mod)
        return tvm.transform.Sequential(self.phase(Phase.POST_PARTITION))(mod)


_LAYOUT_OPS = {"relax.astype", "relax.permute_dims", "relax.reshape"}


def _has_foldable_calls(mod: ir.IRModule) -> bool:
    """Whether a call other than a cast, transpose or reshape has only constant inputs."""
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if isinstance(call, relax.Call) and isinstance(call.op, ir.Op) and call.op.name not in _LAYOUT_OPS \
                        and all(isinstance(a, ir.Constant) or not isinstance(a, relax.Var) for a in call.args) \
                        and any(isinstance(a, ir.Constant) for a in call.args):
                    return True
    return False


def fold_constant_calls(mod: ir.IRModule) -> ir.IRModule:
    """What ``relax.transform.FoldConstant`` makes of ``mod`` (each operator call whose
    inputs are all constants, or results of such calls, replaced by its value; unused
    bindings dropped), faster: FoldConstant legalizes every call of the module to find the
    foldable ones and compiles each alone (10 s for the 2,000 calls of a PaddleOCR
    recogniser, of which 160 fold); here those calls are copied into one function, compiled
    once and run.

    >>> from tvm.script import relax as R
    >>> @R.function
    ... def f(x: R.Tensor((2,), "int32")):
    ...     with R.dataflow():
    ...         c = R.add(R.const(1, "int32"), R.const(2, "int32"))
    ...         y = R.add(x, c)
    ...         R.output(y)
    ...     return y
    >>> print(fold_constant_calls(tvm.IRModule({"main": f}))["main"].body.blocks[0].bindings[0].value)
    R.add(x, R.const(3, "int32"))
    """
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            mod[gv] = _with_values(func, _folded_values(func))
    return mod


def _constant_input(arg, known: dict) -> bool:
    """Whether a call's argument is known at compile time (a constant, a folded result, a
    shape or a tuple of those)."""
    if isinstance(arg, relax.Tuple):
        return all(_constant_input(a, known) for a in arg.fields)
    if isinstance(arg, relax.Var):
        return arg.__chandle__() in known
    return not isinstance(arg, relax.Call)


def _foldable(call: relax.Call) -> bool:
    """Whether FoldConstant may fold ``call`` once its inputs are constants: its operator
    legalizes and its result is one tensor of a static shape (it folds when the legalized
    call is a ``call_tir``: see :func:`_folded_values`)."""
    ty = call.ty
    return (call.op.get_attr("FLegalize") is not None and isinstance(ty, relax.TensorType)
            and isinstance(ty.shape, relax.ShapeExpr)
            and all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values) and bool(str(ty.dtype)))


def _folded_values(func: relax.Function) -> list:
    """``[(binding var, Constant)]``: the operator calls of ``func`` FoldConstant folds, with
    their values (computed by one compiled function)."""
    chosen, known = [], {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call) \
                    and isinstance(value.op, ir.Op) and _foldable(value) \
                    and all(_constant_input(a, known) for a in value.args):
                known[binding.var.__chandle__()] = None
                chosen.append(binding)
    if not chosen:
        return []

    def copied(arg, new):
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([copied(a, new) for a in arg.fields])
        return new.get(arg.__chandle__(), arg) if isinstance(arg, relax.Var) else arg

    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            new = {}
            for binding in chosen:
                call = binding.value
                new[binding.var.__chandle__()] = bb.emit(
                    relax.Call(call.op, [copied(a, new) for a in call.args], call.attrs, call.ty_args))
            out = bb.emit_output(relax.Tuple(list(new.values())))
        bb.emit_func_output(out)
    legal = relax.transform.LegalizeOps()(bb.get())
    # FoldConstant folds a call whose legalized form is a call_tir of constants; it keeps
    # any other (an astype of a 0-d constant legalizes to a constant, and stays a call)
    legalized = {b.var.__chandle__(): b.value for block in legal["main"].body.blocks for b in block.bindings}
    call_tir, folds = ir.Op.get("relax.call_tir"), {}
    for binding in chosen:
        value = legalized.get(new[binding.var.__chandle__()].__chandle__())
        if isinstance(value, relax.Call) and value.op.same_as(call_tir) \
                and all(_constant_input(a, folds) for a in binding.value.args):
            folds[binding.var.__chandle__()] = None
    if not folds:
        return []
    vm = relax.VirtualMachine(tvm.compile(legal, "llvm"), tvm.cpu())
    return [(b.var, relax.const(v.numpy())) for b, v in zip(chosen, vm["main"]()) if b.var.__chandle__() in folds]


def _with_values(func: relax.Function, folded: list) -> relax.Function:
    """``func`` with each var of ``folded`` replaced by its constant where it is used and its
    binding dropped (a var the function returns keeps its binding, now to the constant), and
    the bindings nothing uses dropped, as FoldConstant leaves it."""
    if not folded:
        return relax.analysis.remove_all_unused(func)
    value = {var.__chandle__(): const for var, const in folded}
    inner = {h: c for h, c in value.items() if any(v.__chandle__() == h and isinstance(v, relax.DataflowVar)
                                                   for v, _ in folded)}
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            h = b.var.__chandle__()
            if h in inner:
                continue
            bindings.append(relax.VarBinding(b.var, value[h]) if h in value else b)
        blocks.append(type(block)(bindings))
    # the dropped vars as parameters, bound to their constants: TVM substitutes every use
    dropped = [var for var, _ in folded if var.__chandle__() in inner]
    staged = relax.Function(list(func.params) + dropped, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                            func.is_pure, func.attrs)
    bound = staged.bind_params({var: inner[var.__chandle__()] for var in dropped}) if dropped else staged
    return relax.analysis.remove_all_unused(bound)


def _calls_in(ctx) -> list:
    """The operator calls of a pattern match (its matched bindings' values)."""
    out = [ctx.matched_expr]
    for expr in ctx.annotated_expr.values():
        if isinstance(expr, relax.Call):
            out.append(expr)
    for var, value in ctx.matched_bindings.items():
        if isinstance(value, relax.Call):
            out.append(value)
    return out


def as_target(target):
    """A ``tp.CompositeTarget`` (returned as it is) or a target string, parsed by ``tp.parse_target``.

    >>> [b.name for b, _ in as_target("accel, llvm").backends]
    ['accel']
    """
    if isinstance(target, str):
        return parse_target(target)
    if isinstance(target, CompositeTarget):
        return target
    raise TypeError(f"a target is a tp.CompositeTarget or a string like 'accel, llvm', got {target!r}")


def partition(mod: ir.IRModule, target) -> ir.IRModule:
    """``mod`` with every operator group a backend of ``target`` takes in a private function
    tagged with that backend (:data:`BACKEND_ATTR`) and its options (:data:`OPTIONS_ATTR`).

    ``target`` is a ``tp.CompositeTarget`` or a target string (``"accel, llvm"``); its
    backends' ``PRE_PARTITION`` and ``POST_PARTITION`` passes run around the partitioning.

    >>> mod2 = tp.partition(mod, "accel, llvm")          # doctest: +SKIP
    """
    return Partitioner(target)(mod)
