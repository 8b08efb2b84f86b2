"""Fixed-point requantisation: real multipliers as an int32 multiplier and a right shift.

A requantise maps int32 accumulators ``acc`` (one per term: a convolution's sum, or the two
int8 operands of a residual add) to int8 as

    y = clip(((sum_i clamp(acc_i) * m_i + offset + 2**(s-1)) >> s) + z_y, lo, hi)

with only the operations an int8 accelerator's ALU has: add, max, min (the clamp and the
clip), multiply by an immediate or a vector, arithmetic shift right. ``m_i = round(M_i *
2**s)`` approximates the real multiplier ``M_i`` (``s_in * s_w / s_out`` for a convolution);
``m_i`` is a scalar or a vector along one axis (per-channel weight scales).

**Zero points.** Asymmetric tensors carry ``x = s * (q - z)``. An input zero point ``z_i``
contributes ``offset = -sum_i z_i * m_i``, an exact integer added before the rounding
(a convolution folds its input's zero point into its bias instead, leaving no offset). The
output zero point ``z_y`` is added after the shift, but ``(v >> s) + z_y == (v + z_y *
2**s) >> s`` exactly, so it joins the rounding constant: no extra operation. A requantise
with a zero point takes a shift of at least 1, so that this constant exists.

**Rounding.** ``(v + 2**(s-1)) >> s`` with an arithmetic shift is ``floor(v / 2**s + 1/2)``:
round half up (toward +infinity). onnxruntime rounds half to even. The two differ only on
exact ties, and ``v / 2**s`` can only tie where the real product does when every ``m_i`` is
exactly ``M_i * 2**s`` (a dyadic multiplier, e.g. the 1/4 of a 2x2 average pool that keeps
its scale); there ties are frequent, and rounding half up would bias the result upward by
half a step on each. So exact multipliers round half to even, still with ALU operations
only: with ``f = v >> s`` and ``p = f - 2 * (v >> (s+1))`` (the parity of ``f``),
``(v + p + 2**(s-1) - 1) >> s``. Inexact ones round half up (two operations, not five), and
so does the largest shift, 31 (the parity's ``v >> 32`` would be undefined for int32).

**No int32 overflow, by construction.** The shift is the largest ``s <= 31`` for which every
intermediate provably fits int32 given ``bound``, the largest ``|acc_i|`` the producer can
give (a convolution's is ``128 * sum|w| + |bias|`` per output channel), with ``|offset|`` and
``|z_y| * 2**s`` counted in. For a single term a
*clamp* to ``[-A, A]`` first may make room for a larger ``s``: ``A`` is the smallest
magnitude past which the result saturates to ``lo``/``hi`` anyway (``A*m > max(hi - z_y,
z_y - lo) * 2**s``, and ``acc -> (acc*m + r) >> s`` is monotone), so clamping never changes ``y`` and
bounds ``|acc * m|`` by about ``128 * 2**s`` whatever the reduction length. The clamp is
emitted only when ``bound > A``.

**Precision, and the precise form.** A single product ``acc * m`` within int32 limits ``m``
to about ``2**31 / A`` (``A`` the clamp or bound): at ``A = 146,000`` (a first convolution's
range, ``M = 0.00087``) ``m`` has 14 bits, and ``y`` is off the real ``acc * M`` by up to
0.004 step, which lands on the other side of a rounding tie for about one element in a
thousand. onnxruntime's exact QDQ run computes ``acc * M`` in float32, within about
``1e-7`` relative of the real value, so those elements differ by a step from it, and deeper
layers of a real model amplify each such step (the classifier ppocr_v2_cls: 25% of its
outputs within one step). ``choose(..., precise=True)`` takes a multiplier of up to
48 bits (a shift up to 48) split in two, ``m = m_hi * 2**k + m_lo`` with ``0 <= m_lo < 2**k``,
each part multiplied in int32:

    t = (sum_i acc_i * m_lo_i + L) >> k
    y = clip(((sum_i acc_i * m_hi_i + t + H) >> (s - k)), lo, hi)

where ``H * 2**k + L`` (``0 <= L < 2**k``) is the whole constant (offset, rounding and output
zero point). It is exactly ``floor((sum_i acc_i * m_i + constant) / 2**s)``, the same
formula with a multiplier precise to ``2**-s`` (``floor((a * 2**k + b) / 2**s) ==
floor((a + floor(b / 2**k)) / 2**(s - k))`` for integers): for the convolution above, within
``2**-23`` step of ``acc * M``. It costs two more products, an add and a shift, and reads each
accumulator twice (a small DAG, not a chain of operations on one accumulator: an int8
accelerator's epilogue needs a second register region for it). It is
:func:`~tirpat.model.integerize.integerize`'s default (``precise=True``), since agreement with
onnxruntime is what a user checks a quantised model by. An exact multiplier keeps its single
product (it is exact already), and so does a split whose low parts are all 0 (``m = m_hi *
2**k``: the same value as one product at shift ``s - k``); a high part of 0 (a multiplier
below ``2**(k - s)``) is left out with its product by
:func:`~tirpat.model.integerize.rules.emit_requantize`.

>>> rq = Requantize.choose([0.01], [10_000])
>>> rq.shift, int(rq.multipliers[0]), rq.clamp is None
(24, 167772, True)
>>> rq.apply([np.array([0, 49, 51, -49, -51, 10_000])]).tolist()
[0, 0, 1, 0, -1, 100]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Requantize", "INT32_MAX"]

INT32_MAX = 2**31 - 1
_MAX_SHIFT = 31
#: The largest shift of the precise form: a multiplier of up to 48 bits (beyond, the clamp's
#: ``255 * 2**s`` would leave int64 while choosing it; the error is 2**-49 per unit of |acc|).
_PRECISE_SHIFT = 48


@dataclass(frozen=True)
class Requantize:
    """The integer parameters of one requantise (see the module docstring).

    ``multipliers`` has one int64 array per term (any shape that broadcasts against the
    accumulators: ``()`` per tensor, ``(1, C, 1, 1)`` per channel), all with the same shift;
    ``clamp`` is the accumulator clamp ``A`` (shaped like the multiplier, one term only) or
    None; ``lo``/``hi`` are the output bounds (ReLU and Clip folded in); ``half_even``
    selects rounding half to even (exact multipliers) over half up; ``offset`` (int64, 0-d or
    shaped like a multiplier) is the input zero points' term added before the rounding and
    ``zero_point`` the output's. ``split`` is ``k`` of the precise form (each multiplier
    computed as ``m >> k`` and ``m & (2**k - 1)``, see the module docstring), 0 for one product.
    """

    multipliers: tuple
    shift: int
    clamp: np.ndarray | None
    lo: int
    hi: int
    half_even: bool = False
    offset: np.ndarray = np.int64(0)
    zero_point: int = 0
    split: int = 0

    @classmethod
    def choose(cls, real_multipliers: Sequence, bounds: Sequence, lo: int = -128, hi: int = 127,
               input_zero_points: Sequence | None = None, zero_point: int = 0,
               precise: bool = False) -> "Requantize":
        """The most precise parameters for ``y = round(sum_i M_i * (acc_i - z_i)) + z_y``
        clipped to [lo, hi], given ``|acc_i| <= bounds[i]``; a ``ValueError`` if none fits int32.

        ``real_multipliers[i]`` and ``bounds[i]`` are scalars or equal-length vectors (one
        entry per channel). Multipliers must be positive and finite. ``input_zero_points``
        (``z_i``, integers; all 0 by default) and ``zero_point`` (``z_y``) are the tensors'
        zero points. ``precise`` takes the split multiplier of the module docstring where it
        is more precise than one product (an inexact multiplier).

        >>> single = Requantize.choose([0.00087], [146_000])
        >>> split = Requantize.choose([0.00087], [146_000], precise=True)
        >>> single.shift, single.split, split.shift, split.split
        (24, 0, 40, 18)
        >>> acc = np.array([4023, 12_069])        # acc * 0.00087 = 3.50001, 10.50003: round up
        >>> single.apply([acc]).tolist(), split.apply([acc]).tolist()
        ([3, 10], [4, 11])

        >>> rq = Requantize.choose([0.5, 0.25], [128, 128])     # exact: the smallest shift
        >>> rq.shift, [int(m) for m in rq.multipliers], rq.half_even
        (2, [2, 1], True)
        >>> rq = Requantize.choose([0.004], [2**30])
        >>> rq.shift, int(rq.clamp)
        (23, 32001)
        >>> rq = Requantize.choose([0.5, 0.25], [128, 128], input_zero_points=[3, -4], zero_point=-128)
        >>> rq.shift, int(rq.offset), rq.apply([np.array([3, 5]), np.array([-4, 0])]).tolist()
        (2, -2, [-128, -126])
        """
        if not len(real_multipliers) or len(real_multipliers) != len(bounds):
            raise ValueError("Requantize.choose: one bound per multiplier, at least one of each")
        if not -128 <= lo <= hi <= 127:
            raise ValueError(f"Requantize.choose: output bounds [{lo}, {hi}] are not within int8")
        reals = [np.asarray(r, dtype=np.float64) for r in real_multipliers]
        bnds = [np.asarray(b, dtype=np.int64) for b in bounds]
        for r in reals:
            if not np.all(np.isfinite(r)) or np.any(r <= 0):
                raise ValueError(f"Requantize.choose: multipliers must be positive and finite, got {r}")
        if any(np.any(b < 0) or np.any(b > INT32_MAX) for b in bnds):
            raise ValueError("Requantize.choose: accumulator bounds must lie in [0, 2**31 - 1]")
        zps = [0] * len(reals) if input_zero_points is None else [int(z) for z in input_zero_points]
        if len(zps) != len(reals) or not -128 <= zero_point <= 127:
            raise ValueError("Requantize.choose: one input zero point per multiplier, and an int8 output zero point")
        # a zero point needs the rounding constant to join: a shift of at least 1
        first = 1 if any(zps) or zero_point else 0
        fitting = [rq for rq in (cls._at_shift(s, reals, bnds, lo, hi, zps, int(zero_point))
                                 for s in range(first, _MAX_SHIFT + 1)) if rq]
        if not fitting:
            raise ValueError(f"Requantize.choose: no shift keeps int32 from overflowing for multipliers {reals} "
                             f"and accumulator bounds {bnds}")
        exact = [rq for rq in fitting if rq.half_even or (rq.shift == 0 and rq._exact(reals))]
        # an exact multiplier at the smallest shift (fewest operations); else the most precise one
        if exact:
            return exact[0]
        if precise:
            for s in range(_PRECISE_SHIFT, fitting[-1].shift, -1):
                rq = cls._split_at_shift(s, reals, bnds, lo, hi, zps, int(zero_point))
                if rq is not None:
                    return rq
        return fitting[-1]

    @classmethod
    def _at_shift(cls, s: int, reals: list, bounds: list, lo: int, hi: int, zps: list,
                  zy: int) -> "Requantize | None":
        """The parameters with shift ``s``, or None if an intermediate could leave int32."""
        scaled = [np.round(r * 2.0**s) for r in reals]
        if any(np.any(m > INT32_MAX) for m in scaled):
            return None
        ms = tuple(m.astype(np.int64) for m in scaled)
        offset = np.asarray(-sum(z * m for z, m in zip(zps, ms)), dtype=np.int64)
        # the constants added: the offset, the rounding and the output zero point (times 2**s)
        constants = np.abs(offset) + ((1 << (s - 1)) if s else 0) + (abs(zy) << s)
        clamp = None
        if np.any(sum(b * m for b, m in zip(bounds, ms)) + constants > INT32_MAX):
            if len(ms) > 1 or np.any(offset != 0):
                return None
            # past A the result saturates: A*m > max(hi - zy, zy - lo) * 2**s (m == 0: everything rounds to 0)
            m = ms[0]
            clamp = np.where(m > 0, (max(hi - zy, zy - lo) << s) // np.maximum(m, 1) + 1, 0)
            if np.any(np.minimum(bounds[0], clamp) * m + constants > INT32_MAX):
                return None
        rq = cls(ms, s, clamp, int(lo), int(hi), offset=offset, zero_point=zy)
        # the parity reads v >> (s + 1): at s = 31 that is a shift by 32, undefined for int32
        # (LLVM's poison), so the largest shift rounds half up (ties: |v| = 2**30 only)
        return cls(ms, s, clamp, int(lo), int(hi), half_even=0 < s < _MAX_SHIFT and rq._exact(reals),
                   offset=offset, zero_point=zy)

    @classmethod
    def _split_at_shift(cls, s: int, reals: list, bounds: list, lo: int, hi: int, zps: list,
                        zy: int) -> "Requantize | None":
        """The precise form with shift ``s`` (the largest ``k`` its low products allow), or None
        if no ``k`` keeps every intermediate within int32, or if the multiplier is exact at
        ``s`` with a tie in reach (the precise form rounds half up; onnxruntime to even). The
        clamp is taken only where the form does not fit without it: it costs two operations,
        and never changes the result."""
        scaled = [np.round(r * 2.0**s) for r in reals]
        if any(np.any(m > INT32_MAX * 2.0**_MAX_SHIFT) for m in scaled):
            return None             # the high part m >> k (k <= 31) could not fit int32 (nor m int64)
        ms = tuple(m.astype(np.int64) for m in scaled)
        offset = np.asarray(-sum(z * m for z, m in zip(zps, ms)), dtype=np.int64)
        clamps = [None]
        if len(ms) == 1 and not np.any(offset != 0):
            # past A the result saturates (as in _at_shift): the clamp bounds the products
            m = ms[0]
            clamp = np.where(m > 0, (max(hi - zy, zy - lo) << s) // np.maximum(m, 1) + 1, 0)
            if not np.all(bounds[0] <= clamp):
                clamps.append(clamp)
        for clamp in clamps:
            clamped = list(bounds) if clamp is None else [np.minimum(bounds[0], clamp)]
            rq = cls._split_within(s, ms, offset, clamp, clamped, reals, bounds, lo, hi, zps, zy)
            if rq is not None:
                return rq
        return None

    @classmethod
    def _split_within(cls, s: int, ms: tuple, offset: np.ndarray, clamp, clamped: list, reals: list,
                      bounds: list, lo: int, hi: int, zps: list, zy: int) -> "Requantize | None":
        """:meth:`_split_at_shift` for accumulators within ``clamped`` (``bounds`` after ``clamp``)."""
        if any(np.any(b >= 1 << (s - 1)) for b in clamped) and all(np.array_equal(m, r * 2.0**s)
                                                                   for m, r in zip(ms, reals)):
            return None
        constant = offset + (1 << (s - 1)) + (zy << s)
        total = sum(np.max(b) for b in clamped)
        for k in range(min(s, _MAX_SHIFT), 0, -1):
            high, low = [m >> k for m in ms], [m & ((1 << k) - 1) for m in ms]
            h, l = constant >> k, constant & ((1 << k) - 1)
            if s - k > _MAX_SHIFT or any(np.any(m > INT32_MAX) for m in high):
                return None         # a smaller k only makes the high parts larger
            if np.any(sum(b * m for b, m in zip(clamped, low)) + l > INT32_MAX):
                continue
            # the high sum, the low sum's quotient (|t| <= sum of the bounds) and H
            if np.any(sum(b * m for b, m in zip(clamped, high)) + total + np.abs(h) > INT32_MAX):
                return None
            if all(not np.any(m) for m in low):
                # m = m_hi * 2**k: the low products and t are zero, and the form is one product
                # at shift s - k, the same value (``_at_shift`` rounds r * 2**(s-k) to m_hi)
                single = cls._at_shift(s - k, reals, bounds, lo, hi, zps, zy)
                if single is not None:
                    return single
            return cls(ms, s, clamp, int(lo), int(hi), offset=offset, zero_point=zy, split=k)
        return None

    @property
    def parts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(m >> k, m & (2**k - 1))`` per term of the precise form (``k = split``).

        >>> [(int(h), int(l)) for h, l in Requantize.choose([0.00087], [146_000], precise=True).parts]
        [(3649, 11660)]
        """
        k = self.split
        return [(m >> k, m & ((1 << k) - 1)) for m in self.multipliers]

    @property
    def split_constants(self) -> tuple[np.ndarray, np.ndarray]:
        """``(H, L)`` of the precise form: the constant (offset, rounding and ``z_y * 2**s``)
        as ``H * 2**k + L`` with ``0 <= L < 2**k``."""
        constant = self.offset + self.rounding + (self.zero_point << self.shift)
        return constant >> self.split, constant & ((1 << self.split) - 1)

    def _exact(self, reals: list) -> bool:
        return all(np.array_equal(m, r * 2.0**self.shift) for m, r in zip(self.multipliers, reals))

    @property
    def rounding(self) -> int:
        """The constant added before the shift: ``2**(s-1)``, or 0 when ``s == 0``."""
        return (1 << (self.shift - 1)) if self.shift else 0

    @property
    def constant(self) -> int:
        """The constant added before the final shift: the rounding (``2**(s-1)``, or
        ``2**(s-1) - 1`` after a half-to-even parity) plus the output zero point times ``2**s``."""
        return self.rounding - (1 if self.half_even else 0) + (self.zero_point << self.shift)

    def apply(self, accs: Sequence) -> np.ndarray:
        """The int8 result for int accumulators ``accs`` (one array per term), evaluated the
        way the integer program does. Raises ``OverflowError`` if an intermediate leaves
        int32 (which :meth:`choose` rules out).

        >>> Requantize.choose([0.5], [128]).apply([np.array([3, -3, 5, 255])]).tolist()
        [2, -2, 2, 127]
        """
        accs = [np.asarray(acc, dtype=np.int64) for acc in accs]
        if self.clamp is not None:
            accs[0] = np.minimum(np.maximum(accs[0], -self.clamp), self.clamp)
        if self.split:
            high, low = self.split_constants
            t = _checked(sum(_checked(acc * lo) for acc, (_, lo) in zip(accs, self.parts)) + low) >> self.split
            v = _checked(sum(_checked(acc * hi) for acc, (hi, _) in zip(accs, self.parts)) + t + high)
            return np.clip(v >> (self.shift - self.split), self.lo, self.hi).astype(np.int8)
        total = 0
        for acc, m in zip(accs, self.multipliers):
            total = total + _checked(acc * m)
        total = _checked(total + self.offset)
        if self.half_even:
            parity = (total >> self.shift) - 2 * (total >> (self.shift + 1))
            v = _checked(total + parity + self.constant) >> self.shift
        else:
            v = _checked(total + self.constant) >> self.shift
        return np.clip(v, self.lo, self.hi).astype(np.int8)


def _checked(v: np.ndarray) -> np.ndarray:
    if np.any(v > INT32_MAX) or np.any(v < -INT32_MAX - 1):
        raise OverflowError("requantise intermediate leaves int32")
    return v
