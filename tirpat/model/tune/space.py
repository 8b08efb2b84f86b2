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

__all__ = ["Knob", "knob_space", "MutateKnob"]


@dataclass(frozen=True)
class Knob:
    """One choice of a backend's schedule: block ``block`` gets annotation ``key`` set to one
    of ``values`` (ints); ``default`` is the value the backend picks by itself.

    >>> tp.Knob("conv", "accel.bn", (1, 2, 4), default=2).decision
    1
    """

    block: str
    key: str
    values: tuple
    default: int

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

    @property
    def decision(self) -> int:
        """The index of :attr:`default` in :attr:`values` (the design space's decision)."""
        return self.values.index(self.default)


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
            uniform = [1.0 / len(knob.values)] * len(knob.values)
            value = sch.sample_categorical(list(knob.values), uniform, decision=knob.decision)
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
