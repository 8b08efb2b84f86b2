"""``tp.integerize()``: a Relax pass from QDQ float to integer arithmetic.

TVM's ONNX frontend imports a QDQ model (``tp.quantize``'s output) as float operators
between ``R.dequantize`` and ``R.quantize``; compiled as it is, the model computes in
float and an int8 accelerator has nothing to take. This pass rewrites every such site with
``tvm.relax.dpl`` rules (:mod:`.rules`) into integer arithmetic: int8 x int8 -> int32
conv2d and matmul with an int32 bias and a fixed-point requantise (:mod:`.fixed_point`)
as the epilogue; ReLU and Clip folded into the requantise's bounds; adds, subtractions and
products of two quantised tensors, pooling, resizes and layout operators on the integers;
any other element-wise function of one quantised tensor (an activation) as a 256-entry
table (:mod:`.tables`). The ``quantize`` of each input and the
``dequantize`` of each output stay (on the host). A site that cannot be made exact stays in
float and the pass warns, naming the operator and the reason.

**Zero points.** Activations may be asymmetric (onnxruntime's default ``quantize_static``:
uint8 with zero points; int8 with ``ActivationSymmetric=False``): a uint8 tensor is first
shifted to int8 (``x - 128`` with the zero point ``z - 128``: the same real values), a
conv2d/matmul folds its input's zero point into its bias (``- z_x * sum w`` per output
channel; a padded conv pads its integer input with ``z_x``, which is what the float model's
0.0 padding is), a residual add's input zero points become one constant, and every output
zero point joins its requantise's rounding constant (:mod:`.fixed_point`). A weight zero
point (uint8 weights) adds ``- z_w * sum x`` per window: an all-ones convolution (a sum for
a matmul). A bias must have a zero point of 0.

**No intermediate leaves int32.** Every multiplier and shift is chosen from the ranges of
what it multiplies: int8 activations (``|x| <= 128``), a conv2d/matmul accumulator bounded
per output channel by ``128 * sum|w| + |bias|`` (the bias with the zero point's term), a
pool's window sum by ``128 * count`` (plus ``|z_x| * count``). A
requantise takes the most precise shift for which the worst-case sum of its terms (one for a
convolution, two for a residual add) plus the rounding stays at most ``2**31 - 1``, after a
clamp where the output saturates anyway (:mod:`.fixed_point`); a site where nothing fits stays
in float, with the warning. By default (``precise=True``) an inexact multiplier is longer, in two int32
products, each within the same bounds. ``tirpat.testing.int_ranges.int32_overflows`` checks a module for
it by interval analysis.

Weights, scales and zero points must be bound constants (``from_onnx(...,
keep_params_in_input=False)``, the default, or ``relax.transform.BindParams``).

>>> from tvm import relax
>>> x = relax.Var("x", relax.TensorType((4,), "int8"))
>>> bb = relax.BlockBuilder()
>>> with bb.function("main", [x]):
...     with bb.dataflow():
...         d = bb.emit(relax.op.dequantize(x, relax.const(0.5), relax.const(0, "int8")))
...         y = bb.emit_output(relax.op.quantize(relax.op.nn.relu(d), relax.const(0.25), relax.const(0, "int8")))
...     _ = bb.emit_func_output(y)
>>> mod = integerize()(bb.get())
>>> [str(c.op.name) for c in calls(mod["main"])]      # y = clip(x * 2, 0, 127)
['relax.astype', 'relax.multiply', 'relax.clip', 'relax.astype']
"""

from __future__ import annotations

import warnings

import tvm
import tvm_ffi
from tvm import relax

from .fixed_point import Requantize
from .rules import (Declined, Rule, all_rules, clip_fold_rule, dequantized_matmul_rule, emit_requantize,
                    requantize_pattern)
from .pads import PadRule
from .tables import TABULATED, TableRule

__all__ = ["integerize", "IntegerizeWarning", "Requantize", "requantize_pattern", "emit_requantize", "calls",
           "Rule", "Declined"]


_MAX_ROUNDS = 4
#: the most operators and reasons one warning lists: a model with open input sizes declines
#: every site, each reason naming its own shapes, and a warning must stay readable
_MOST_LISTED = 4


class IntegerizeWarning(UserWarning):
    """Some QDQ sites stayed in float; the message names each with the reason."""


def integerize(precise: bool = True) -> tvm.transform.Pass:
    """The pass (a ``tvm.transform.Pass`` over a Relax ``IRModule``); see the module doc.

    ``precise`` (the default) writes each requantise whose multiplier is inexact in
    :mod:`.fixed_point`'s precise form: a multiplier of up to 48 bits as two int32 products. On
    a first convolution (accumulators up to 146,000) the result is then within ``2**-23`` of a
    step of the real product, where one product is off by up to 0.004 step, and so it is
    onnxruntime's exact QDQ result but where that lies within float32's error of a rounding tie
    (ppocr_v2_cls: all outputs equal to onnxruntime's, instead of 25% within one step). It is
    the default because onnxruntime's result is what a user compares a quantised model with,
    and a backend computes whatever this pass writes (accel's epilogue and element-wise core
    take the precise form, bit for bit llvm's); ``precise=False`` keeps one int32 product per
    requantise (fewer operations, a device whose ALU cannot read a value twice).

    >>> integerize().info.name
    'tirpat.Integerize'


    Rules run in order (a function of one int8 tensor quantised inside, such as HardSwish's
    ``x * q(HardSigmoid(x))``, first, so that it is one table and not a product; then
    convolutions and matmuls, so that their ReLU and bias join their epilogue), then a fold moves each remaining ReLU/Clip into the requantise before
    it; a matmul of two int8 tensors read by float code is then an integer matmul dequantised;
    unused bindings are removed.
    """

    @tvm.transform.module_pass(opt_level=0, name="tirpat.Integerize")
    def _integerize(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        declined: dict = {}
        rules = [TableRule(nested_only=True), *all_rules(precise), TableRule(), PadRule(), clip_fold_rule()]
        rewriters = [rule.rewriter(declined) for rule in rules]
        # one rule's output can be another's input (a dequantize moved after a reshape meets
        # an add): repeat until nothing changes
        for _ in range(_MAX_ROUNDS):
            before = mod
            for rewrite in rewriters:
                mod = rewrite(mod)
            if tvm_ffi.structural_equal(before, mod):
                break
            declined.clear()       # a later round may make a declined site exact: report the last
        # a matmul of two int8 tensors that no rule took with its quantize (its result feeds
        # float code: a softmax) multiplies in integers and dequantises its int32 result;
        # after the rounds, so that it never takes a site an integer rule would in a later one
        mod = dequantized_matmul_rule().rewriter(declined)(mod)
        mod = relax.transform.DeadCodeElimination()(mod)
        left = _float_sites(mod)
        if left:
            for name, why in left:
                if why is not None:
                    declined[name, why] = declined.get((name, why), 0) + 1
            names = {name for name, _ in left}
            reasons = "; ".join(_some([f"{name}: {why} ({n}x)" for (name, why), n in sorted(declined.items())]))
            warnings.warn(f"tp.integerize left {len(left)} quantised operator(s) in float, computed on the "
                          f"host: {', '.join(_some(sorted(names)))}"
                          + (f"; declined: {reasons}" + ("; no integer rule for the others"
                                                          if len(names) > len(declined) else "") if reasons
                             else " (no integer rule for them)"),
                          IntegerizeWarning, stacklevel=2)
        return mod

    return _integerize


def _some(items: list) -> list:
    """At most :data:`_MOST_LISTED` of ``items``, the last saying how many more there are.

    >>> _some(["a", "b", "c", "d", "e", "f"])
    ['a', 'b', 'c', 'd', '... and 2 more']
    """
    if len(items) <= _MOST_LISTED + 1:
        return items
    return items[:_MOST_LISTED] + [f"... and {len(items) - _MOST_LISTED} more"]


def _float_sites(mod: tvm.IRModule) -> list[tuple[str, str | None]]:
    """Operators left between a dequantize and a quantize: computed in float where the model
    quantises their result. One whose result is never quantised again (a float output, a
    detector's head kept in float by ``--float-outputs``) is float in the model itself.
    Each with why, where an integer rule would take it but the model does not quantise its
    result: an element-wise function that another operator reads in float first (onnxruntime
    leaves a PRelu's output unquantised, and a PyTorch PReLU before an AveragePool stays float)."""
    names = []
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        sites = []
        constant = set()      # values of constants alone (a PRelu's dequantised slope)
        for call_var, call in _bindings(func):
            name, args = str(call.op.name), list(call.args)
            if name == "relax.call_tir":      # a TE function the frontend emitted: named by its callee
                packed = call.args[1]
                name = f"call_tir {call.args[0].name_hint}"
                args = list(packed.fields) if isinstance(packed, relax.Tuple) else [packed]
            tensors = [a for a in args if isinstance(a, relax.Var)]
            if all(a in constant for a in tensors):
                constant.add(call_var)
            sites.append((call_var, name, tensors))
        dequantized = {var for var, name, _ in sites if name == "relax.dequantize"}
        # what a quantize reads, directly or through other operators (bindings are in order)
        quantized = set()
        for var, name, args in reversed(sites):
            if name == "relax.quantize" or var in quantized:
                quantized.update(args)
        readers: dict = {}
        for _, name, args in sites:
            for a in args:
                readers.setdefault(a, []).append(name)
        for var, name, args in sites:
            if name in ("relax.dequantize", "relax.quantize") or var not in quantized \
                    or not any(a in dequantized for a in args):
                continue
            first = [r for r in readers.get(var, ()) if r != "relax.quantize" and r not in TABULATED]
            # a table maps one tensor (a subtract of two, a LayerNorm's x - mean, is none)
            why = None if name not in TABULATED or len(set(args) - constant) != 1 or not first else \
                (f"element-wise (a table where a quantize reads its result), read in float by "
                 f"{first[0].removeprefix('relax.')} first: the model does not quantise its result")
            names.append((name.removeprefix("relax."), why))
    return names


def _bindings(func: relax.Function):
    """``(var, call)`` for each binding of an operator call in ``func``, in order."""
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                yield binding.var, value


def calls(func: relax.Function) -> list:
    """The operator calls in ``func`` (bound values of its bindings), in order."""
    return [call for _, call in _bindings(func)]
