"""Knob design spaces: a backend's schedule choices as a meta_schedule design space.

A backend whose schedule makes a few discrete choices per block (block sizes, where a
buffer lives, how an operand is gathered) describes them as :class:`Knob`\\ s and hands
:func:`knob_space` two functions: one listing the knobs of a PrimFunc, one scheduling a
PrimFunc whose blocks carry the chosen values as annotations. The design space samples each
knob with ``sample_categorical`` and annotates the block with the *sampled value* (the
``ExprRV``, not a Python int), so replaying a trace with other decisions, as the
evolutionary search and :class:`MutateKnob` do, gives other annotations; the post-processor
then schedules. The backend's own (heuristic) choice is each knob's default decision, so
the design space itself is the heuristic's schedule.

>>> import tvm, tirpat as tp
>>> knobs = lambda sch: [tp.Knob("C", "my.block", (1, 2, 4), default=2)]
>>> space = tp.knob_space(knobs, lambda sch: None)
>>> type(space).__name__
'ScheduleFn'
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.mutator import PyMutator
from tvm.s_tir.meta_schedule.postproc import PyPostproc
from tvm.s_tir.meta_schedule.space_generator import ScheduleFn

__all__ = ["Knob", "knob_space", "MutateKnob", "likeliest"]


@dataclass(frozen=True)
class Knob:
    """One choice of a backend's schedule: block ``block`` gets annotation ``key`` set to one
    of ``values`` (ints); ``default`` is the value the backend picks by itself.

    ``prior`` (optional, one positive weight per value) says which values the backend
    expects to pay more often: the search draws values in these proportions (uniformly
    without it), and the first candidate after the backend's own schedule takes each
    knob's most likely value (:attr:`likely`; the default where there is no prior).

    >>> tp.Knob("conv", "accel.bn", (1, 2, 4), default=2).decision
    1
    >>> tp.Knob("conv", "accel.bm", (1, 2, 4), default=1, prior=(1, 2, 3)).likely
    2
    """

    block: str
    key: str
    values: tuple
    default: int
    prior: tuple | None = None

    def __post_init__(self) -> None:
        values = tuple(self.values)
        object.__setattr__(self, "values", values)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise TypeError(f"Knob {self.key!r} of block {self.block!r}: values must be ints, got {values!r}")
        if len(set(values)) != len(values):
            raise ValueError(f"Knob {self.key!r} of block {self.block!r}: values repeat: {values!r}")
        if self.default not in values:
            raise ValueError(f"Knob {self.key!r} of block {self.block!r}: the default {self.default!r} "
                             f"is not one of {values!r}")
        if self.prior is not None:
            prior = tuple(float(p) for p in self.prior)
            if len(prior) != len(values) or not all(p > 0 for p in prior):
                raise ValueError(f"Knob {self.key!r} of block {self.block!r}: the prior must be one positive "
                                 f"weight per value ({len(values)}), got {self.prior!r}")
            object.__setattr__(self, "prior", prior)

    @property
    def decision(self) -> int:
        """The index of :attr:`default` in :attr:`values` (the design space's decision)."""
        return self.values.index(self.default)

    @property
    def probabilities(self) -> list:
        """The chance the search draws each value with (:attr:`prior` normalised, or uniform)."""
        weights = self.prior or (1.0,) * len(self.values)
        return [w / sum(weights) for w in weights]

    @property
    def likely(self) -> int:
        """The index of the most likely value under :attr:`prior` (the first of equals), or
        :attr:`decision` when all values are as likely."""
        return likeliest(self.probabilities, self.decision)


def likeliest(probabilities: Sequence[float], decision: int) -> int:
    """The index of the largest of ``probabilities`` (the first of equals), or ``decision``
    when they are all equal (a uniform draw prefers nothing).

    >>> likeliest([0.2, 0.5, 0.3], 0), likeliest([0.5, 0.5], 1)
    (1, 1)
    """
    probabilities = list(probabilities)
    if max(probabilities) == min(probabilities):
        return decision
    return probabilities.index(max(probabilities))


def knob_space(knobs: Callable[[s_tir.Schedule], Sequence[Knob]],
               schedule: Callable[[s_tir.Schedule], None]) -> ScheduleFn:
    """A meta_schedule design space of knobs (see the module docstring).

    ``knobs(sch)`` lists the knobs of ``sch``'s ``main`` function (it must not change
    ``sch``); ``schedule(sch)`` schedules ``main`` in place, reading each knob's value from
    its block's annotation. A combination of knobs ``schedule`` cannot do may raise: the
    candidate is dropped, as meta_schedule drops any candidate a post-processor rejects.
    Knobs with a single value are not sampled (the backend decides).
    """

    def sample(sch: s_tir.Schedule) -> None:
        for knob in knobs(sch):
            if len(knob.values) < 2:
                continue
            value = sch.sample_categorical(list(knob.values), knob.probabilities, decision=knob.decision)
            sch.annotate(sch.get_sblock(knob.block), knob.key, value)

    return ScheduleFn(sample, sch_rules=[], postprocs=[_Schedule(schedule)], mutator_probs={MutateKnob(): 1.0})


@derived_object
class _Schedule(PyPostproc):
    """The post-processor of a knob space: the backend's schedule, reading the knobs."""

    def __init__(self, schedule: Callable[[s_tir.Schedule], None]) -> None:
        super().__init__()
        self.schedule = schedule

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch: s_tir.Schedule) -> bool:
        try:
            self.schedule(sch)
        except Exception:  # noqa: BLE001 - a combination the schedule cannot do: drop the candidate
            return False
        return True

    def clone(self):
        return _Schedule(self.schedule)


@derived_object
class MutateKnob(PyMutator):
    """A mutator for the evolutionary search: one ``sample_categorical`` decision of the
    trace, drawn anew among the other values (TVM's own mutators change tile sizes, unroll
    steps and compute locations, not general categorical choices)."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, seed):
        choices = [inst for inst in trace.insts
                   if inst.kind.name == "SampleCategorical" and len(inst.attrs[0]) > 1]
        if not choices:
            return None
        rng = random.Random(seed)
        inst = rng.choice(choices)
        current = int(trace.decisions[inst])
        decision = rng.choice([d for d in range(len(inst.attrs[0])) if d != current])
        return trace.with_decision(inst, decision, remove_postproc=True)

    def clone(self):
        return MutateKnob()
