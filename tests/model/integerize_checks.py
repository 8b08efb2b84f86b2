"""What the tp.integerize tests share: a QDQ ONNX model integerised with the warnings it gave,
and exact rounding, the reference of the fixed-point requantise."""

from __future__ import annotations

import warnings
from fractions import Fraction

import tvm

import tirpat as tp
from tirpat.model.integerize import IntegerizeWarning


def integerised(model, precise: bool = True) -> tuple[tvm.IRModule, list[str]]:
    """``tp.integerize(precise)`` of the ONNX ``model`` imported by Relax's ``from_onnx``, and
    the messages of the ``IntegerizeWarning``s it gave (the operators it declined, and why)."""
    from tvm.relax.frontend.onnx import from_onnx

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = tp.integerize(precise)(from_onnx(model, keep_params_in_input=False))
    return mod, [str(w.message) for w in caught if issubclass(w.category, IntegerizeWarning)]


def exact_round(value: Fraction, half_even: bool) -> int:
    """``value`` rounded to the nearest integer, a tie to the even one (``half_even``) or up."""
    floor = value.numerator // value.denominator
    rest = value - floor
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and (not half_even or floor % 2)):
        return floor + 1
    return floor
