"""The whole-model offload report: where each operator ran, and its multiply-accumulates.

MACs are counted on the Relax graph, before any padding or tiling: ``matmul`` is the
output's elements times the reduction length, a convolution the output's elements times
its weight's elements per output channel. A backend may say, from its ``schedule`` hook,
what it left for the CPU inside a partition and how many MACs its device really executes
(tiles padded included) by setting the PrimFunc attribute :data:`SCHEDULE_NOTES` to JSON text
``{"host_macs": int, "device_macs": int, "host_steps": [[what, why], ...],
"epilogue": [str, ...], "details": [str, ...]}`` (every key optional; ``details`` are lines
the report shows under the partition, what the backend offloaded in its own words).

>>> r = ModelReport(total_macs=100, partitions=[Partition("accel", "f", "accel.matmul", ["relax.matmul"], 100)])
>>> r.to_json()["macs"]
{'accel': 100, 'host': 0}
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

import tvm
from tvm import relax, tirx

from .shapes import static_shape

__all__ = ["ModelReport", "Partition", "HostOp", "SCHEDULE_NOTES", "macs_of", "macs_known", "primfunc_macs", "epilogue_of",
           "MAC_OPS", "OperatorShare", "operator_share"]

#: PrimFunc attribute a backend's schedule may set: JSON notes for the report (module docstring).
SCHEDULE_NOTES = "tirpat.notes"

_CONV = {"relax.nn.conv1d": "OIW", "relax.nn.conv2d": "OIHW", "relax.nn.conv3d": "OIDHW"}


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def macs_of(call, mod: tvm.IRModule | None = None) -> int:
    """The multiply-accumulates of one Relax operator call (0 for operators that do none, and
    for those :func:`macs_known` says it cannot count).

    A convolution is its output's elements times its weight's elements per output channel; a
    transposed convolution its input's elements times its weight's elements per input channel
    (each input element is multiplied into a whole kernel window, as ONNX counts
    ConvTranspose); ``matmul`` the output's elements times the reduction length; ``einsum``
    the product of every index's size; ``outer`` the output's elements; ``attention`` its two
    products, queries x keys and scores x values. A ``call_tir`` of a PrimFunc of ``mod``
    (a frontend's ``emit_te``) counts each reduction that multiplies: its iteration space.

    >>> from tvm.script import relax as R
    >>> x = relax.Var("x", R.Tensor((8, 64), "int8")); w = relax.Var("w", R.Tensor((64, 32), "int8"))
    >>> macs_of(relax.BlockBuilder().normalize(relax.op.matmul(x, w, out_dtype="int32")))
    16384
    >>> x = relax.Var("x", R.Tensor((1, 4, 5, 5), "float32")); w = relax.Var("w", R.Tensor((4, 2, 3, 3), "float32"))
    >>> macs_of(relax.BlockBuilder().normalize(relax.op.nn.conv2d_transpose(x, w)))  # 4*5*5 inputs x 2*3*3
    1800
    """
    count = _count(call, mod)
    return 0 if count is None else count


def macs_known(call, mod: tvm.IRModule | None = None) -> bool:
    """Whether :func:`macs_of` counts ``call``: False for an operator that multiplies and
    accumulates (:data:`MAC_OPS`) whose count it cannot know, such as a matmul or a
    convolution with a symbolic shape (its multiply-accumulates depend on the input's size).

    >>> from tvm.script import relax as R
    >>> n = tirx.Var("n", "int64")
    >>> x = relax.Var("x", R.Tensor((n, 64), "int8")); w = relax.Var("w", R.Tensor((64, 32), "int8"))
    >>> macs_known(relax.BlockBuilder().normalize(relax.op.matmul(x, w, out_dtype="int32")))
    False
    """
    return _count(call, mod) is not None


#: the Relax operators that multiply and accumulate: each is counted, or reported as uncounted
MAC_OPS = frozenset({
    "relax.matmul", "relax.einsum", "relax.outer", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
    "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose",
    "relax.nn.attention", "relax.nn.attention_bias", "relax.nn.attention_var_len"})

_TRANSPOSED = {"relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose"}


def _count(call, mod) -> int | None:
    """The MACs of a call (0 if it does none), or None when its shapes (or kind) leave them unknown."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return 0
    name = call.op.name
    if name == "relax.call_tir" and mod is not None and call.args[0] in mod.functions:
        return primfunc_macs(mod[call.args[0]])
    if name not in MAC_OPS:
        return 0
    out = static_shape(call)
    args = call.args[0].fields if name == "relax.einsum" else call.args
    shapes = [static_shape(a) for a in args]
    if out is None or any(s is None for s in shapes[:3]):
        return None
    if name == "relax.matmul":
        return _prod(out) * shapes[0][-1]
    if name == "relax.outer":
        return _prod(out)
    if name in _CONV or name in _TRANSPOSED:
        w = shapes[1]
        if name in _CONV:
            return _prod(out) * _prod(w) // w[str(call.attrs.kernel_layout).index("O")]
        return _prod(shapes[0]) * _prod(w) // w[str(call.attrs.kernel_layout).index("I")]
    if name == "relax.einsum":
        if len(shapes) < 2:
            return 0        # a sum or a transpose: no multiplication
        sizes = {}
        for subscripts, shape in zip(str(call.attrs.subscripts).split("->")[0].split(","), shapes):
            if "." in subscripts or len(subscripts) != len(shape):
                return None         # an ellipsis: left to the uncounted list rather than guessed
            sizes.update(zip(subscripts, shape))
        return _prod(sizes.values()) * (len(shapes) - 1)
    if name in ("relax.nn.attention", "relax.nn.attention_bias"):
        (b, s, n, h), (_, s_kv, _, _), (_, _, _, h_v) = shapes[:3]
        return b * n * s * s_kv * (h + h_v)
    return None         # attention_var_len: its lengths are run-time values


def primfunc_macs(func: tirx.PrimFunc) -> int | None:
    """The multiply-accumulates of a PrimFunc's reductions that multiply (``C += A * B``
    blocks, as ``te.compute`` writes them): each one's iteration space, None if symbolic.

    >>> from tvm import te
    >>> A = te.placeholder((8, 64), "int8"); W = te.placeholder((32, 64), "int8"); k = te.reduce_axis((0, 64))
    >>> C = te.compute((8, 32), lambda i, j: te.sum(A[i, k].astype("int32") * W[j, k].astype("int32"), axis=k))
    >>> primfunc_macs(te.create_prim_func([A, W, C]))
    16384
    """
    from tvm_ffi import structural_walk

    total = 0

    def block(node):
        nonlocal total
        if total is None or type(node).__name__ != "SBlock" or node.init is None:
            return
        products = []
        structural_walk(node.body, (tirx.Mul, products.append))
        if not products:
            return
        extents = [iv.dom.extent for iv in node.iter_vars]
        total = _prod(int(e.value) for e in extents) + total if all(isinstance(e, tirx.IntImm) for e in extents) else None

    structural_walk(func.body, block)
    return total


_REQUANT = {"relax.multiply", "relax.right_shift"}


def _const_value(expr):
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return expr.value
    if isinstance(expr, tvm.ir.Constant) and tuple(expr.value.shape) == ():
        return expr.value.numpy().item()
    return None


def epilogue_of(calls: list) -> list:
    """What the operators after a partition's matmul or convolution do, in words: ``bias``,
    ``ReLU``, ``clip``, ``requantise``, ``residual add``, ``cast``.

    ``calls`` are the partition's Relax calls in order, the compute operator first. Once a
    requantise has begun (a product or a shift), an add of a constant or of a vector along the
    channels is one of its constants, not a bias, and, after a shift, an add of a value the
    partition computed (integerize's precise form adds its low product shifted; its
    round-half-to-even form a parity) is part of it too, not a residual add.
    """
    words: list = []

    def say(word):
        if word not in words:
            words.append(word)

    core = calls[0]
    out_shape = static_shape(core)
    requant = any(c.op.name in _REQUANT for c in calls[1:])
    scaled = shifted = False        # a requantise's product, its shift seen so far
    for call in calls[1:]:
        name = call.op.name
        scaled |= name in _REQUANT
        shifted |= name == "relax.right_shift"
        if name in ("relax.add", "relax.subtract"):
            if requant and call is not calls[1] and _const_value(call.args[1]) is not None:
                say("requantise")
                continue
            operand = static_shape(call.args[1])
            full = operand is not None and out_shape is not None and _prod(operand) == _prod(out_shape)
            # a DataflowVar is bound inside the partition (a parameter, such as a residual, never is)
            computed = any(isinstance(a, relax.DataflowVar) for a in call.args[1:])
            if (scaled and not full) or (shifted and computed):
                say("requantise")
                continue
            say("residual add" if full else "bias")
        elif name == "relax.nn.relu":
            say("ReLU")
        elif name in _REQUANT:
            say("requantise")
        elif name in ("relax.clip", "relax.maximum", "relax.minimum"):
            low = _const_value(call.args[1])
            if requant:
                say("requantise")
                if low == 0:
                    say("ReLU")
            else:
                say("ReLU" if low == 0 and name != "relax.minimum" else "clip")
        elif name == "relax.astype":
            if not (requant and str(call.ty.dtype) == "int8"):
                say(f"cast to {call.ty.dtype}")
        else:
            say(name.removeprefix("relax."))
    return words


@dataclass
class Partition:
    """One operator group a backend took: its function, pattern, operators and MACs."""

    backend: str
    function: str
    pattern: str
    ops: list
    macs: int
    epilogue: list = field(default_factory=list)
    rules: dict = field(default_factory=dict)       # TIR rule -> sites rewritten
    host_macs: int = 0                              # MACs the backend left for the CPU
    device_macs: int | None = None                  # MACs the device executes, padding included
    on_host: list = field(default_factory=list)     # [what, why] steps the CPU does for it
    fallback: str | None = None                     # why its backend could not lower it (it ran on the host)
    from_records: bool = False                      # scheduled from a tuning record
    details: list = field(default_factory=list)     # lines the backend's schedule says about what it offloaded


@dataclass
class HostOp:
    """One operator left for the host target, with the reason no backend took it; ``var`` is
    the name it is bound to as ``tp.partition(mod, target).show()`` prints it."""

    op: str
    var: str
    reason: str
    macs: int = 0


@dataclass
class ModelReport:
    """What ``tp.build`` did with each operator of a model: :meth:`text` is a summary that fits
    on a screen whatever the model's size (``str()``), ``text(verbose=True)`` every partition
    call and host operator; :meth:`to_json` a JSON-serialisable dict of them all
    (``tirpat compile --report``)."""

    total_macs: int = 0
    partitions: list = field(default_factory=list)
    on_host: list = field(default_factory=list)
    #: the operators that multiply and accumulate whose MACs are not in :attr:`total_macs`
    #: (symbolic shapes), each as ``"relax.nn.conv2d_transpose (lv12)"``: the operator and where
    uncounted_ops: list = field(default_factory=list)
    #: tuning records given to the build: ``{"path", "applied", "partitions", "misses"}``
    #: (partitions scheduled from a record, of how many; ``misses``: partition -> why none)
    records: dict | None = None
    #: the target's backends, in priority order (those that took nothing included)
    backends: list = field(default_factory=list)

    @property
    def uncounted(self) -> int:
        """How many operators that multiply and accumulate are not in :attr:`total_macs`."""
        return len(self.uncounted_ops)

    @property
    def macs(self) -> dict:
        """MACs by backend name, ``"host"`` included; they sum to :attr:`total_macs`. A
        partition that fell back to the host counts for the host."""
        out: dict = {}
        for p in self.partitions:
            out[p.backend] = out.get(p.backend, 0) + (0 if p.fallback else p.macs - p.host_macs)
        out["host"] = self.total_macs - sum(out.values())
        return out

    def share(self, backend: str) -> float:
        """The fraction of :attr:`total_macs` that ran on ``backend`` (0.0 when there are none).

        >>> ModelReport(total_macs=100, partitions=[Partition("accel", "f", "accel.matmul", ["relax.matmul"], 75)]).share("accel")
        0.75
        """
        return self.macs.get(backend, 0) / self.total_macs if self.total_macs else 0.0

    def to_json(self) -> dict:
        """``total_macs``, ``macs`` (by backend, ``"host"`` included), ``partitions`` (one per
        call), ``on_host`` (every operator), ``uncounted`` (how many operators' MACs depend on
        symbolic shapes) and ``uncounted_ops`` (which), ``records`` (None when the build had
        no tuning records) and ``backends`` (the target's)."""
        return {"total_macs": self.total_macs, "macs": self.macs,
                "partitions": [asdict(p) for p in self.partitions],
                "on_host": [asdict(h) for h in self.on_host], "uncounted": self.uncounted,
                "uncounted_ops": list(self.uncounted_ops), "records": self.records, "backends": self.backends}

    @classmethod
    def from_json(cls, data: dict) -> "ModelReport":
        """The inverse of :meth:`to_json`."""
        partitions = [Partition(**p) for p in data["partitions"]]
        backends = data.get("backends") or list(dict.fromkeys(p.backend for p in partitions))
        uncounted = data.get("uncounted_ops", ["an operator"] * data.get("uncounted", 0))
        return cls(data["total_macs"], partitions, [HostOp(**h) for h in data["on_host"]],
                   uncounted, data.get("records"), backends)

    def __str__(self) -> str:
        return self.text()

    def text(self, verbose: bool = False) -> str:
        """The report as text: a summary (the default; at most about 60 lines), or with
        ``verbose`` every partition call and every operator left on the host.

        The summary groups the partitions by backend, pattern and what they compute (with
        their calls and MACs), and the host's operators by reason (with their count and MACs,
        the most MACs first), then names the largest items left on the host.

        >>> part = Partition("accel", "f", "accel.matmul", ["relax.matmul"], 100, rules={"gemm": 1})
        >>> host = [HostOp("relax.matmul", f"lv{n}", "float", 50) for n in range(2)]
        >>> r = ModelReport(300, [part, part], host + [HostOp("relax.exp", f"e{n}", "no backend takes exp") for n in range(9)])
        >>> print(r.text())
        tirpat model report
          multiply-accumulates: 300
            on accel: 200 (66.7%)
            on host: 100 (33.3%)
          accel: accel.matmul: matmul, 2 calls, 200 MACs
          on the host: 11 operators, 100 MACs
            2 x matmul, 100 MACs: float
            9 x exp: no backend takes exp
          the largest on the host:
            lv0 = matmul, 50 MACs
            lv1 = matmul, 50 MACs
          (text(verbose=True), tirpat compile --verbose: every call and operator)
        """
        lines = ["tirpat model report", *self._totals(None if verbose else _SHOWN // 2)]
        if self.records is not None:
            lines += f"  {records_line(self.records, None if verbose else _SHOWN // 2)}".splitlines()
        if verbose:
            return "\n".join(lines + self._every())
        summary, complete = self._summary(SUMMARY_LINES - len(lines))
        # a summary that leaves something out (but the functions' names) says where to find it
        complete &= len(self.uncounted_ops) <= _SHOWN // 2 and \
            (self.records is None or len(self.records["misses"]) <= _SHOWN // 2)
        return "\n".join(lines + summary + [_VERBOSE] * (not complete))

    def _totals(self, most: int | None) -> list:
        """The MACs and their shares; the uncounted operators, where the first ``most`` are."""
        total = self.total_macs
        share = lambda n: f"{100 * n / total:.1f}%" if total else "-"  # noqa: E731
        if self.uncounted:
            count = (f"{total:,} counted" if total else "unknown") + \
                f" ({self.uncounted} matmul or convolution operators have symbolic shapes: their MACs depend on the input)"
        else:
            count = f"{total:,}" + ("" if total else " (the model has no matmul or convolution)")
        lines = [f"  multiply-accumulates: {count}"]
        lines += [f"    on {name}: {n:,} ({share(n)})" for name, n in self.macs.items()]
        if self.uncounted:       # "relax.einsum (lv6)": the kinds, then where the first few are
            kinds = _counted(_short(op.split(" (")[0]) for op in self.uncounted_ops)
            where = [op.split(" (", 1)[1].rstrip(")") for op in self.uncounted_ops if " (" in op]
            at = ", ".join(where[:most]) + (", ..." if most is not None and len(where) > most else "")
            lines.append(f"  uncounted: {self.uncounted} operator{'s' * (self.uncounted > 1)}: "
                         + ", ".join(kinds) + (f" (at {at})" if at else ""))
        return lines

    def _every(self) -> list:
        """Every partition call and host operator, in program order."""
        lines = []
        for p in self.partitions:
            if not p.fallback:          # else listed with the host's operators
                lines.append(f"  {p.backend}: {p.function} ({p.pattern}): {_what(p)}, {p.macs:,} MACs")
                if p.device_macs is not None and p.device_macs != p.macs - p.host_macs:
                    lines.append(f"      the device executes {p.device_macs:,} MACs: the matrices are padded to whole tiles")
                lines += [f"      {note}" for note in _notes(p)]
                lines += [f"      {line}" for line in p.details]
                lines += [f"      on the CPU: {what_cpu} {why}" for what_cpu, why in p.on_host]
        fell_back = [p for p in self.partitions if p.fallback]
        if self.on_host or fell_back:
            lines.append("  on the host:")
        lines += [f"    {_item(p.macs, f'{p.function} ({p.pattern}): {_what(p)}', p.fallback, True)}" for p in fell_back]
        lines += [f"    {_item(h.macs, f'{h.var} = {_short(h.op)}', h.reason)}" for h in self.on_host]
        return lines

    def _summary(self, room: int) -> tuple[list, bool]:
        """The partitions grouped by what they compute, the host's operators by reason, in at
        most ``room`` lines; and whether they say all the verbose text does (but its names)."""
        host = self._host_summary()
        groups: dict = {}
        for p in self.partitions:
            if not p.fallback:
                groups.setdefault((p.backend, p.pattern, _what(p)), []).append(p)
        shown = [self._group_lines(key, parts) for key, parts in
                 sorted(groups.items(), key=lambda kv: sum(p.macs for p in kv[1]), reverse=True)]
        room -= len(host) + 1       # and a line to point to the verbose text
        lines = []
        for n, group in enumerate(shown):
            # the last kind that fits leaves a line to say how many more there are
            if len(lines) + len(group) > room - (n + 1 < len(shown)):
                lines.append(f"  ... and {len(shown) - n} more kinds of partition")
                break
            lines += group
        complete = len(lines) == sum(map(len, shown)) and all(
            len(ps) == 1 and len(_group_notes(ps)) <= _NOTES for ps in groups.values())
        return lines + host, complete and host[:1] in ([], ["  on the host:"])

    @staticmethod
    def _group_lines(key: tuple, parts: list) -> list:
        """A kind of partition: its backend, pattern, what it computes, calls, MACs, notes (its
        functions, by the names TVM's fusion gives them, are in the verbose text)."""
        backend, pattern, what = key
        calls = f", {len(parts)} calls" if len(parts) > 1 else ""
        notes = _group_notes(parts)
        if len(notes) > _NOTES:
            notes = notes[:_NOTES - 1] + [f"... and {len(notes) - _NOTES + 1} more notes"]
        return [f"  {backend}: {pattern}: {what}{calls}, {sum(p.macs for p in parts):,} MACs"] + [f"      {n}" for n in notes]

    def _host_summary(self) -> list:
        """The host's items as they are when few, else grouped by reason and the largest."""
        # (MACs, what, why, whether to say 0 MACs) of each host item: partitions that fell back, operators
        items = [(p.macs, f"{p.function} ({p.pattern}): {_what(p)}", p.fallback, True) for p in self.partitions if p.fallback]
        items += [(h.macs, f"{h.var} = {_short(h.op)}", h.reason, False) for h in self.on_host]
        if len(items) <= _SHOWN:        # few enough to list as they are, the most MACs first
            return ["  on the host:"] * bool(items) + [f"    {_item(*i)}" for i in sorted(items, key=lambda i: -i[0])]
        lines = [f"  on the host: {len(items)} operators, {sum(i[0] for i in items):,} MACs"]
        by_reason: dict = {}
        for p in self.partitions:
            if p.fallback:
                by_reason.setdefault(p.fallback, []).append((p.ops[0] if p.ops else p.pattern, p.macs))
        for h in self.on_host:
            by_reason.setdefault(_SEE.sub("", h.reason), []).append((h.op, h.macs))
        ranked = sorted(by_reason.items(), key=lambda kv: (sum(m for _, m in kv[1]), len(kv[1])), reverse=True)
        for reason, ops in ranked[:_GROUPS - 1 if len(ranked) > _GROUPS else _GROUPS]:
            macs = sum(m for _, m in ops)
            kinds = _counted(_short(op) for op, _ in ops)
            what = f"{len(ops)} operators ({', '.join(kinds)})" if len(kinds) > 1 else f"{len(ops)} x {_short(ops[0][0])}"
            lines.append(f"    {_item(macs, what, reason)}")
        if len(ranked) > _GROUPS:
            lines.append(f"    ... and {len(ranked) - _GROUPS + 1} more reasons")
        largest = sorted((i for i in items if i[0]), key=lambda i: -i[0])[:_LARGEST]
        if largest:
            lines.append("  the largest on the host:")
            lines += [f"    {what}, {macs:,} MACs" for macs, what, _, _ in largest]
        return lines


#: a summary's most lines
SUMMARY_LINES = 60

#: the most items a summary lists in one place (host items as they are, uncounted operators,
#: tuning-record misses), host reasons, lines under one kind of partition, largest host items
_SHOWN, _GROUPS, _NOTES, _LARGEST = 8, 10, 4, 5

_VERBOSE = "  (text(verbose=True), tirpat compile --verbose: every call and operator)"

#: the pointer in a host operator's reason to the operator whose check declined it
_SEE = re.compile(r": see [^;]*")


def _group_notes(parts: list) -> list:
    """The notes under a kind of partition: the device's padded MACs, then its partitions'
    (what the CPU does for them once per reason, with how many of the calls need it)."""
    notes = list(dict.fromkeys(n for p in parts for n in [*_notes(p), *p.details]))
    steps: dict = {}         # why -> [the first step's what, how many calls]
    for p in parts:
        for what_cpu, why in p.on_host:
            steps.setdefault(why, [what_cpu, 0])[1] += 1
    for why, (what_cpu, calls) in sorted(steps.items(), key=lambda kv: -kv[1][1]):
        share = "" if len(parts) == 1 else " (each call)" if calls == len(parts) else f" ({calls} of {len(parts)} calls)"
        notes.append(f"on the CPU{share}: {what_cpu} {why}")
    if any(p.device_macs is not None and p.device_macs != p.macs - p.host_macs for p in parts):
        device = sum(p.macs - p.host_macs if p.device_macs is None else p.device_macs for p in parts)
        notes.insert(0, f"the device executes {device:,} MACs: the matrices are padded to whole tiles")
    return notes


def _notes(p: Partition) -> list:
    """What the lines under a partition say, but its padding and CPU steps: its schedule,
    or that it ran on the host."""
    notes = ["scheduled from a tuning record"] * p.from_records
    if not p.rules and not p.on_host:     # else the backend's own reasons follow
        notes.append(f"ran on the host: none of {p.backend}'s rules matched its code")
    return notes


def _item(macs: int, what: str, why: str, zero: bool = False) -> str:
    """A line of the host's: ``what, MACs: why`` (no MACs if none, unless ``zero``)."""
    return f"{what}{f', {macs:,} MACs' if macs or zero else ''}: {why}"


def _counted(names) -> list:
    """Names with how often each occurs, the most frequent first: ``["add 3", "exp"]``."""
    counts: dict = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return [f"{n} {k}" if k > 1 else n for n, k in sorted(counts.items(), key=lambda kv: -kv[1])]


def records_line(records: dict, most: int | None = None) -> str:
    """How many partitions the build scheduled from its tuning records, and why the others not
    (the first ``most`` of them, all by default)."""
    line = (f"tuning records {records['path']}: {records['applied']} of {records['partitions']} partitions "
            "scheduled from a record")
    misses = [f"{name}: {why}" for name, why in records["misses"].items()]
    if most is not None and len(misses) > most:
        misses = misses[:most - 1] + [f"... and {len(misses) - most + 1} more without a record"]
    return "\n    ".join([line] + misses)


def _what(p: Partition) -> str:
    """What a partition computes, in words: ``matmul + bias + ReLU`` (a TIR workload's function,
    which has no operators: its name)."""
    return " + ".join([_short(p.ops[0]) if p.ops else p.function] + p.epilogue)


def _short(op: str) -> str:
    return op.removeprefix("relax.").removeprefix("nn.")


def notes_of(func) -> dict:
    """The backend's :data:`SCHEDULE_NOTES` notes of a PrimFunc (empty when it set none)."""
    if func.attrs is None or SCHEDULE_NOTES not in func.attrs:
        return {}
    return json.loads(str(func.attrs[SCHEDULE_NOTES]))


_INTEGER_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "bool")


@dataclass(frozen=True)
class OperatorShare:
    """How many of a module's operator calls are integer arithmetic: ``integer`` of ``total``
    calls have an integer result and only integer tensor operands; ``other`` counts the rest
    by operator (the float ones, quantize and dequantize included)."""

    total: int
    integer: int
    other: dict

    @property
    def share(self) -> float:
        """``integer / total`` (1.0 for a module without operators)."""
        return self.integer / self.total if self.total else 1.0

    def __str__(self) -> str:
        rest = ", ".join(_counted(n for n, k in self.other.items() for _ in range(k)))
        return f"{self.integer} of {self.total} operators integer ({100 * self.share:.1f}%)" + (
            f"; not: {rest}" if rest else "")


def operator_share(mod: tvm.IRModule) -> OperatorShare:
    """The :class:`OperatorShare` of the operator calls in ``mod``'s Relax functions (what
    ``tp.integerize`` turns from float into integer arithmetic; ``call_tir`` counts by its result).

    >>> x = relax.Var("x", relax.TensorType((4,), "int8"))
    >>> bb = relax.BlockBuilder()
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         y = bb.emit(relax.op.astype(x, "int32"))
    ...         z = bb.emit_output(relax.op.astype(y, "float32"))
    ...     _ = bb.emit_func_output(z)
    >>> print(operator_share(bb.get()))
    1 of 2 operators integer (50.0%); not: astype
    """
    total, integer, other = 0, 0, {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                    continue
                total += 1
                tensors = [call, *(a for a in call.args if isinstance(getattr(a, "ty", None), relax.TensorType))]
                if isinstance(call.ty, relax.TensorType) and all(str(t.ty.dtype) in _INTEGER_DTYPES for t in tensors):
                    integer += 1
                else:
                    name = str(call.op.name).removeprefix("relax.")
                    other[name] = other.get(name, 0) + 1
    return OperatorShare(total, integer, other)
