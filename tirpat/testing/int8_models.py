"""Random int8 Relax models: a differential corpus for backends that take integer networks.

:func:`random_int8_model` builds, from one seed, a Relax module of the kind ``tp.integerize``
gives and an int8 backend partitions: chains of int8 x int8 -> int32 ``conv2d`` and
``matmul`` each followed by an int32 epilogue (bias, ReLU, fixed-point requantise, clamps)
that ends in int8; blocks of the same layer repeated at several sites with different
constants (weights, biases, multipliers, shifts), so that one partition function is called
at several sites; residual adds rescaled on the host, and residuals added inside a
convolution's epilogue; max pooling; odd shapes, strides, asymmetric padding, dilation and
grouped convolutions (which an accelerator may decline). With ``overflow=True`` some
epilogues multiply past int32 (the products wrap, as in LLVM's ``i32``) and some narrow
int32 to int8 without a clip (truncation); with ``overflow=False`` every int32 intermediate
provably fits, by interval arithmetic over the whole chain.

The model and its inputs depend on the seed alone, so a seed reproduces a finding.
:func:`int8_models` is the hypothesis strategy; :func:`compare_with_llvm` builds a model with
``tp.build`` and with ``tvm.compile(mod, "llvm")`` and says whether they agree bit for bit.
:func:`int8_layer` is one such layer with an epilogue of the caller's, for a test of one
epilogue form.

>>> model = random_int8_model(7, overflow=False)
>>> str(model.mod["main"].params[0].ty.dtype)
'int8'
>>> model.inputs().dtype == np.int8 and model.inputs().shape == model.input_shape
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from hypothesis import strategies as st
from tvm import relax

from .differential import llvm_reference

__all__ = ["Int8Model", "random_int8_model", "int8_models", "int8_layer", "Comparison", "compare_with_llvm"]

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Int8Model:
    """One generated model.

    ``mod`` has one function ``main(x: int8[input_shape]) -> int8[...]``; ``layers`` says,
    one line per layer, what was generated (the ops, shapes and constants that matter to a
    reader of a disagreement); ``seed`` and ``overflow`` regenerate it. ``sites`` is the
    most sites one layer was repeated at (more than 1: a partition function called at
    several sites with different constants); ``wraps`` says whether some int32 intermediate
    passes int32 (always False when ``overflow`` is).
    """

    seed: int
    overflow: bool
    mod: tvm.IRModule
    input_shape: tuple
    layers: tuple
    sites: int = 1
    wraps: bool = False

    def inputs(self, seed: int | None = None) -> np.ndarray:
        """Int8 inputs spanning the whole range (from ``seed``, by default the model's)."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        return rng.integers(-128, 128, self.input_shape, dtype=np.int8)

    def describe(self) -> str:
        """The layers, one a line, under a header naming the seed."""
        head = f"random_int8_model({self.seed}, overflow={self.overflow}): input int8{list(self.input_shape)}"
        return "\n".join([head, *(f"  {line}" for line in self.layers)])


@dataclass
class _Interval:
    """Bounds of an int32 tensor's values (Python ints: no overflow in the bookkeeping)."""

    lo: int
    hi: int

    @property
    def magnitude(self) -> int:
        return max(abs(self.lo), abs(self.hi))

    def fits(self) -> bool:
        return _I32_MIN <= self.lo and self.hi <= _I32_MAX


_FULL = _Interval(_I32_MIN, _I32_MAX)


def _const(v, dtype: str) -> relax.Constant:
    return relax.const(np.asarray(v).astype(dtype), dtype)


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


@dataclass
class _Epilogue:
    """An epilogue's plan: the sequence of operations, drawn once per layer so that every
    site of a repeated block has the same structure (and different constants)."""

    bias: bool
    relu: bool
    per_channel: bool
    overflow: bool            # the multiply is chosen to pass int32
    extra: tuple              # ("max"|"min"|"sub"|"add", ...) after the multiply, before the shift
    rounding: bool
    clip: tuple | None        # (lo, hi) before the narrowing cast, or None: a wrapping narrow
    residual: bool            # an int32 residual (a widened int8 tensor times m) added before the shift

    @classmethod
    def draw(cls, rng: np.random.Generator, overflow: bool, residual_ok: bool) -> "_Epilogue":
        wraps = overflow and rng.random() < 0.35
        extra = tuple(str(op) for op in rng.choice(["max", "min", "sub", "add"], size=int(rng.integers(0, 3))))
        clip = None if wraps and rng.random() < 0.3 else ((0, 127) if rng.random() < 0.3 else (-128, 127))
        return cls(bias=rng.random() < 0.7, relu=rng.random() < 0.4, per_channel=rng.random() < 0.4, overflow=wraps,
                   extra=extra, rounding=rng.random() < 0.8, clip=clip, residual=residual_ok and rng.random() < 0.5)

    def text(self) -> str:
        parts = (["+bias"] if self.bias else []) + (["relu"] if self.relu else [])
        parts.append(("*m[c]" if self.per_channel else "*m") + (" (overflows)" if self.overflow else ""))
        parts += [f"{op} c" for op in self.extra]
        parts += (["+skip*m2"] if self.residual else []) + (["+r"] if self.rounding else []) + [">>s"]
        parts.append(f"clip{list(self.clip)}" if self.clip else "(no clip: wrapping narrow)")
        return " ".join(parts) + " int8"


class _Builder:
    """Emits layers into a BlockBuilder, tracking int8 tensors for residuals."""

    def __init__(self, bb: relax.BlockBuilder, rng: np.random.Generator, overflow: bool) -> None:
        self.bb, self.rng, self.overflow = bb, rng, overflow
        self.layers: list[str] = []
        self.sites = 1
        self.wraps = False
        self.tensors: list[relax.Expr] = []      # int8 values emitted so far

    # ---- helpers -------------------------------------------------------------------------
    def shape(self, x: relax.Expr) -> tuple:
        return tuple(int(d) for d in x.ty.shape.values)

    def same_shape(self, shape: tuple, but: relax.Expr | None = None) -> list:
        return [t for t in self.tensors if self.shape(t) == shape and t is not but]

    def multiplier(self, bound: int, headroom: int, size: int, big: bool) -> np.ndarray:
        """Multipliers (one, or ``size``) with ``bound * m <= headroom`` unless ``big``, when
        ``bound * m`` passes int32."""
        if big:
            lo = min(max(1, _I32_MAX // max(bound, 1) + 1), _I32_MAX - 1)
            return self.rng.integers(lo, max(lo + 1, min(_I32_MAX, 64 * lo)), size)
        top = max(1, headroom // max(bound, 1))
        # small and large multipliers both occur in practice: draw the exponent
        return np.minimum(np.exp2(self.rng.uniform(0, np.log2(top), size)).astype(np.int64), top)

    # ---- the epilogue --------------------------------------------------------------------
    def epilogue(self, acc: relax.Expr, bound: _Interval, plan: _Epilogue, axis: int,
                 skip: relax.Expr | None) -> tuple[relax.Expr, str]:
        """Emit ``plan`` on the int32 ``acc`` (values within ``bound``) and return the int8
        result and the constants drawn (for the layer's description)."""
        bb, rng = self.bb, self.rng
        shape = self.shape(acc)
        channels, ndim = shape[axis], len(shape)
        consts = []
        v, iv = acc, bound
        if plan.bias:
            b = rng.integers(-(2**14), 2**14, channels)
            v = bb.emit(relax.op.add(v, _const(_along(b, axis, ndim), "int32")))
            iv = _Interval(iv.lo + int(b.min()), iv.hi + int(b.max()))
        if plan.relu:
            v = bb.emit(relax.op.nn.relu(v))
            iv = _Interval(max(iv.lo, 0), max(iv.hi, 0))
        shift = int(rng.integers(0, 25))
        rounding = (1 << (shift - 1)) if plan.rounding and shift else 0
        # leave room for the residual term, the extra operations and the rounding
        headroom = (_I32_MAX - rounding) // (2 if plan.residual else 1) - 2**20
        m = self.multiplier(iv.magnitude, headroom, channels if plan.per_channel else 1, plan.overflow)
        m_const = _along(m, axis, ndim) if plan.per_channel else m.reshape(())
        v = bb.emit(relax.op.multiply(v, _const(m_const, "int32")))
        consts.append(f"m={m.tolist() if plan.per_channel else int(m[0])}")
        iv = _Interval(min(iv.lo * int(m.max()), iv.lo * int(m.min())), max(iv.hi * int(m.max()), iv.hi * int(m.min())))
        if not iv.fits():
            iv, self.wraps = _FULL, True
        for op in plan.extra:
            c = int(rng.integers(-(2**19), 2**19))
            consts.append(f"{op} {c}")
            if op == "max":
                v, iv = bb.emit(relax.op.maximum(v, _const(c, "int32"))), _Interval(max(iv.lo, c), max(iv.hi, c))
            elif op == "min":
                v, iv = bb.emit(relax.op.minimum(v, _const(c, "int32"))), _Interval(min(iv.lo, c), min(iv.hi, c))
            elif op == "sub":
                v, iv = bb.emit(relax.op.subtract(v, _const(c, "int32"))), _Interval(iv.lo - c, iv.hi - c)
            else:
                v, iv = bb.emit(relax.op.add(v, _const(c, "int32"))), _Interval(iv.lo + c, iv.hi + c)
            if not iv.fits():
                iv, self.wraps = _FULL, True
        if plan.residual and skip is not None:
            m2 = self.multiplier(128, headroom, 1, False)[0]
            consts.append(f"m2={int(m2)}")
            term = bb.emit(relax.op.multiply(bb.emit(relax.op.astype(skip, "int32")), _const(m2, "int32")))
            v = bb.emit(relax.op.add(v, term))
            iv = _Interval(iv.lo - 128 * int(m2), iv.hi + 127 * int(m2))
            if not iv.fits():
                iv, self.wraps = _FULL, True
        if rounding:
            v = bb.emit(relax.op.add(v, _const(rounding, "int32")))
        if shift:
            v = bb.emit(relax.op.right_shift(v, _const(shift, "int32")))
        consts.append(f"s={shift}")
        if plan.clip is not None:
            v = bb.emit(relax.op.clip(v, *plan.clip))
        elif iv.lo < -128 or iv.hi > 127:
            self.wraps = True             # the narrowing cast truncates
        out = bb.emit(relax.op.astype(v, "int8"))
        self.tensors.append(out)
        return out, " ".join(consts)

    # ---- layers --------------------------------------------------------------------------
    def conv(self, x: relax.Expr, repeat: int) -> relax.Expr:
        """A conv2d layer (``repeat`` > 1: the same layer at ``repeat`` sites in a chain, each
        with its own constants; then it keeps the shape: stride 1, 'same' padding)."""
        rng = self.rng
        n, c, h, w = self.shape(x)
        for _ in range(20):
            kh, kw = (int(k) for k in rng.integers(1, 4, 2))
            dh, dw = (int(d) for d in rng.choice([1, 1, 2], 2))
            if repeat > 1:
                sh = sw = 1
                ph, pw = dh * (kh - 1), dw * (kw - 1)
                pad = [ph // 2, pw // 2, ph - ph // 2, pw - pw // 2]
                groups, cout = (c if rng.random() < 0.2 else 1), c
            else:
                sh, sw = (int(s) for s in rng.choice([1, 1, 2], 2))
                pad = [int(p) for p in rng.integers(0, 2, 4)]
                groups = 1
                if rng.random() < 0.2:
                    groups = int(rng.choice([g for g in range(2, c + 1) if c % g == 0] or [1]))
                cout = groups * int(rng.integers(1, max(2, 9 // groups)))
            oh = (h + pad[0] + pad[2] - dh * (kh - 1) - 1) // sh + 1
            ow = (w + pad[1] + pad[3] - dw * (kw - 1) - 1) // sw + 1
            if oh >= 1 and ow >= 1:
                break
        else:
            kh = kw = dh = dw = sh = sw = 1
            pad, groups, cout = [0, 0, 0, 0], 1, c
        plan = _Epilogue.draw(rng, self.overflow, residual_ok=True)
        head = (f"conv2d {c}->{cout} k{kh}x{kw} s{sh}x{sw} d{dh}x{dw} pad{pad} g{groups} on {[n, c, h, w]}"
                f"{f' x{repeat} sites' if repeat > 1 else ''}: {plan.text()}")
        site_consts = []
        self.sites = max(self.sites, repeat)
        for _ in range(repeat):
            wt = rng.integers(-128, 128, (cout, c // groups, kh, kw), dtype=np.int8)
            acc = self.bb.emit(relax.op.nn.conv2d(x, _const(wt, "int8"), strides=[sh, sw], padding=pad,
                                                  dilation=[dh, dw], groups=groups, out_dtype="int32"))
            bound = 128 * int(np.abs(wt.astype(np.int64)).reshape(cout, -1).sum(axis=1).max())
            skip = self._skip(self.shape(acc)) if plan.residual else None
            x, consts = self.epilogue(acc, _Interval(-bound, bound), plan, 1, skip)
            site_consts.append(consts + ("" if skip is not None or not plan.residual else " (no skip)"))
        self.layers.append(head + "".join(f"\n    site {i}: {s}" for i, s in enumerate(site_consts)))
        return x

    def _skip(self, shape: tuple) -> relax.Expr | None:
        """An earlier int8 tensor of ``shape`` to add in an epilogue, or None."""
        same = self.same_shape(shape)
        return same[int(self.rng.integers(len(same)))] if same else None

    def matmul(self, x: relax.Expr, repeat: int) -> relax.Expr:
        """A matmul layer on the last axis (dense ``x @ W.T`` or ``x @ W``)."""
        rng = self.rng
        shape = self.shape(x)
        k = shape[-1]
        nout = k if repeat > 1 else int(rng.integers(1, 20))
        dense = rng.random() < 0.6
        plan = _Epilogue.draw(rng, self.overflow, residual_ok=True)
        head = (f"matmul {list(shape)} x [{k}, {nout}] ({'dense: permute_dims(W[N, K])' if dense else 'W[K, N]'})"
                f"{f' x{repeat} sites' if repeat > 1 else ''}: {plan.text()}")
        site_consts = []
        self.sites = max(self.sites, repeat)
        for _ in range(repeat):
            wt = rng.integers(-128, 128, (nout, k) if dense else (k, nout), dtype=np.int8)
            weight = relax.op.permute_dims(_const(wt, "int8")) if dense else _const(wt, "int8")
            acc = self.bb.emit(relax.op.matmul(x, weight, out_dtype="int32"))
            w_nk = wt if dense else wt.T
            bound = 128 * int(np.abs(w_nk.astype(np.int64)).sum(axis=1).max())
            skip = self._skip(self.shape(acc)) if plan.residual else None
            x, consts = self.epilogue(acc, _Interval(-bound, bound), plan, len(shape) - 1, skip)
            site_consts.append(consts)
        self.layers.append(head + "".join(f"\n    site {i}: {s}" for i, s in enumerate(site_consts)))
        return x

    def residual_add(self, x: relax.Expr) -> relax.Expr:
        """``clip((a*ma + b*mb + r) >> s)`` of two int8 tensors of one shape (the integer
        form of a rescaled residual add), on the host."""
        same = self.same_shape(self.shape(x), but=x)
        if not same:
            return x
        rng, bb = self.rng, self.bb
        other = same[int(rng.integers(len(same)))]
        shift = int(rng.integers(1, 25))
        rounding = 1 << (shift - 1)
        big = self.overflow and rng.random() < 0.3
        self.wraps |= big
        ma, mb = (self.multiplier(128, (_I32_MAX - rounding) // 2, 1, big)[0] for _ in range(2))
        terms = [bb.emit(relax.op.multiply(bb.emit(relax.op.astype(t, "int32")), _const(m, "int32")))
                 for t, m in ((x, ma), (other, mb))]
        v = bb.emit(relax.op.add(terms[0], terms[1]))
        v = bb.emit(relax.op.right_shift(bb.emit(relax.op.add(v, _const(rounding, "int32"))), _const(shift, "int32")))
        out = bb.emit(relax.op.astype(bb.emit(relax.op.clip(v, -128, 127)), "int8"))
        self.tensors.append(out)
        self.layers.append(f"residual add {list(self.shape(x))}: a*{int(ma)} + b*{int(mb)} + r >> {shift}"
                           f"{' (overflows)' if big else ''}")
        return out

    def max_pool(self, x: relax.Expr) -> relax.Expr:
        rng = self.rng
        _, _, h, w = self.shape(x)
        k = int(min(rng.integers(2, 4), h, w))
        s = int(rng.integers(1, 3))
        if k < 1 or (h - k) // s + 1 < 1:
            return x
        out = self.bb.emit(relax.op.nn.max_pool2d(x, pool_size=[k, k], strides=[s, s]))
        self.tensors.append(out)
        self.layers.append(f"max_pool2d {list(self.shape(x))} k{k} s{s}")
        return out

    def to_matrix(self, x: relax.Expr) -> relax.Expr:
        n, c, h, w = self.shape(x)
        out = self.bb.emit(relax.op.reshape(x, [n * c * h, w]) if self.rng.random() < 0.5
                           else relax.op.reshape(x, [n * c, h * w]))
        self.tensors = [out]
        self.layers.append(f"reshape {[n, c, h, w]} -> {list(self.shape(out))}")
        return out


def random_int8_model(seed: int, *, overflow: bool = True, max_layers: int = 5) -> Int8Model:
    """The model of ``seed`` (see the module docstring).

    Parameters
    ----------
    seed
        Determines the structure, shapes, constants and inputs.
    overflow
        Whether epilogues may pass int32 (wrapping products, narrowing without a clip);
        when False every int32 intermediate fits by construction.
    max_layers
        At most this many layers (a repeated block counts once).
    """
    rng = np.random.default_rng(seed)
    image = rng.random() < 0.75
    if image:
        shape = (1, int(rng.integers(1, 9)), int(rng.integers(3, 10)), int(rng.integers(3, 10)))
    else:
        shape = tuple(int(d) for d in rng.integers(1, 20, int(rng.integers(2, 4))))
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(list(shape), "int8"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            b = _Builder(bb, rng, overflow)
            b.tensors.append(xv)
            x = xv
            for _ in range(int(rng.integers(1, max_layers + 1))):
                repeat = int(rng.choice([1, 1, 2, 3]))
                r = rng.random()
                if len(b.shape(x)) == 4:
                    if r < 0.55:
                        x = b.conv(x, repeat)
                    elif r < 0.7:
                        x = b.residual_add(x)
                    elif r < 0.8:
                        x = b.max_pool(x)
                    else:
                        x = b.to_matrix(x)
                elif r < 0.8:
                    x = b.matmul(x, repeat)
                else:
                    x = b.residual_add(x)
            if not b.layers or all(not line.startswith(("conv2d", "matmul")) for line in b.layers):
                x = b.conv(x, 1) if len(b.shape(x)) == 4 else b.matmul(x, 1)
            out = bb.emit_output(x)
        bb.emit_func_output(out)
    return Int8Model(seed, overflow, bb.get(), shape, tuple(b.layers), b.sites, b.wraps)


def int8_layer(kind: str, m: int, n: int, k: int, epilogue: Callable[[relax.BlockBuilder, relax.Expr], relax.Expr],
               *, seed: int = 0, bias: int = 0, layout: str = "NHWC") -> tvm.IRModule:
    """``main(x)``: one int8 layer with constant random weights, its int32 result, a
    per-channel bias, then ``epilogue``.

    Parameters
    ----------
    kind
        ``"matmul"``: ``x[m, k] @ W[n, k]^T`` (as ``nn.Linear`` writes it); ``"conv2d"``: a 3x3
        convolution, padding 1, of an ``m x m`` image from ``k`` to ``n`` channels;
        ``"depthwise"``: the same with one channel per group (``k`` must equal ``n``).
    m, n, k
        The sizes above.
    epilogue
        ``epilogue(bb, y)`` emits into ``bb`` what follows the int32 value ``y`` and returns
        the function's output (say, a requantise to int8).
    seed
        Seeds the weights, then the bias.
    bias
        Nonzero: a bias of ``n`` int32 values in ``[-bias, bias)`` added to ``y`` (along the
        channels: ``[1, n, 1, 1]`` for NCHW, ``[n]`` otherwise).
    layout
        ``"NHWC"`` (kernel HWIO) or ``"NCHW"`` (kernel OIHW) for the convolutions.

    Returns
    -------
    tvm.IRModule
        ``main(x: int8[...])`` returning what ``epilogue`` returned.

    >>> mod = int8_layer("depthwise", 4, 8, 8, lambda bb, y: bb.emit(relax.op.nn.relu(y)), bias=100)
    >>> [op for op in ("conv2d", "groups=8", "relu") if op in mod.script()]
    ['conv2d', 'groups=8', 'relu']
    """
    if kind not in ("matmul", "conv2d", "depthwise"):
        raise ValueError(f"kind {kind!r}: one of 'matmul', 'conv2d', 'depthwise'")
    if layout not in ("NHWC", "NCHW"):
        raise ValueError(f"layout {layout!r}: 'NHWC' or 'NCHW'")
    if kind == "depthwise" and k != n:
        raise ValueError(f"a depthwise layer maps each of its channels to one: k ({k}) must equal n ({n})")
    rng = np.random.default_rng(seed)
    nchw = layout == "NCHW" and kind != "matmul"
    x_shape = (m, k) if kind == "matmul" else (1, k, m, m) if nchw else (1, m, m, k)
    x = relax.Var("x", relax.TensorType(x_shape, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "matmul":
                w = relax.const(rng.integers(-128, 128, (n, k), dtype=np.int8))
                y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w), out_dtype="int32"))
            else:
                groups = n if kind == "depthwise" else 1
                kernel = (n, k // groups, 3, 3) if nchw else (3, 3, k // groups, n)
                w = relax.const(rng.integers(-128, 128, kernel, dtype=np.int8))
                y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, data_layout=layout, groups=groups, out_dtype="int32",
                                               kernel_layout="OIHW" if nchw else "HWIO"))
            if bias:
                b = rng.integers(-bias, bias, (1, n, 1, 1) if nchw else (n,), dtype=np.int32)
                y = bb.emit(relax.op.add(y, relax.const(b)))
            out = bb.emit_output(epilogue(bb, y))
        bb.emit_func_output(out)
    return bb.get()


def int8_models(overflow: bool = True, max_layers: int = 5) -> st.SearchStrategy:
    """A hypothesis strategy of :class:`Int8Model` (drawn by seed: a failure prints its seed,
    and ``random_int8_model(seed, overflow=...)`` rebuilds it). A seed does not shrink to a
    simpler model: leave out hypothesis's shrink phase
    (``settings(phases=(Phase.explicit, Phase.reuse, Phase.generate))``)."""
    return st.integers(0, 2**32 - 1).map(lambda seed: random_int8_model(seed, overflow=overflow,
                                                                         max_layers=max_layers))


@dataclass
class Comparison:
    """What :func:`compare_with_llvm` found for one model.

    ``outcome`` is ``"bit-exact"``, ``"disagreed"`` or ``"failed"`` (the build or a run
    raised: ``error`` says what); ``macs`` maps each backend to the multiply-accumulates it
    took; for a disagreement, ``differing`` of ``size`` elements differ and ``example``
    shows the first as ``(index, got, expected)``.
    """

    outcome: str
    macs: dict = field(default_factory=dict)
    error: str = ""
    differing: int = 0
    size: int = 0
    example: tuple | None = None


def compare_with_llvm(model: Int8Model, target: str = "accel, llvm") -> Comparison:
    """Build ``model`` with ``tp.build(mod, target)`` and with ``tvm.compile(mod, "llvm")``,
    run both on the model's inputs and compare bit for bit."""
    from tirpat.model.build import build

    x = model.inputs()
    try:
        (expected,) = llvm_reference(model.mod)(x)
        compiled = build(model.mod, target)
        got = np.asarray(compiled(x))
        macs = dict(compiled.report.to_json().get("macs", {}))
    except Exception as err:           # a build or run failure is an outcome, with its message
        return Comparison("failed", error=f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
                          if str(err).strip() else type(err).__name__)
    if got.shape == expected.shape and np.array_equal(got, expected):
        return Comparison("bit-exact", macs, size=expected.size)
    if got.shape != expected.shape:
        return Comparison("disagreed", macs, error=f"shape {got.shape} != {expected.shape}", size=expected.size)
    bad = np.argwhere(got != expected)
    first = tuple(int(i) for i in bad[0])
    return Comparison("disagreed", macs, differing=len(bad), size=expected.size,
                      example=(first, int(got[first]), int(expected[first])))
