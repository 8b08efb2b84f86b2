"""``tp.tune``: TVM's meta_schedule searching each partition's schedule with its backend's
design space, on its backend's measure.

For a Relax module, every partition the target's backends take is a task (the same
legalized PrimFunc ``tp.build`` hands to the backend's ``schedule``); for a PrimFunc or a
module of PrimFuncs, each PrimFunc is a task of the first backend of the target that has a
design space for it.

Partitions whose functions are structurally identical (whatever their names: the
workload key leaves the name out) are one task, tuned once; its records apply to every copy,
since ``tp.build`` looks records up by the same structural key. So are the copies of a
partition that differ only in a call site's scalar constants (``<name>_s1``, ...: a
requantise's multiplier and shift as immediates; the schedule and its instructions do not
depend on those values): the task's best record is written for each copy too.

The trial budget is split before tuning starts. A budget of ``SEARCH`` trials per task or
more searches them all, the rest in proportion to their work (their backend's estimate of
their cost under its own schedule, :meth:`~tirpat.Backend.tune_work`: accel's cycles; else
TVM's estimate of the workload's operations), times the number of identical copies. A
smaller one goes first to the tasks their backend estimates to gain most on (what its
cheapest candidate by :meth:`~tirpat.Backend.tune_candidates` saves on its own schedule,
times the copies; a backend without estimates: its work), ``PROBE`` (2) trials each (the
backend's own schedule and its cheapest candidate: accel's estimate, over the whole knob
space, came within 2% of the measured cycles on the PaddleOCR classifier's tasks, and its
cheapest was the best of the three measured, itself, the next and the heuristic, on 29 of
the 30 largest), while the budget lasts; a task whose gain is less than ``MATERIAL`` (1%)
of the tasks' summed gain (or not estimated) only after every task of a material gain has
a trial for each candidate within ``CLOSE`` (2%) of its cheapest by the estimate, ``SEARCH``
in all at most (the estimate cannot tell those apart: on ppocrv5_det's depthwise tasks the
cheapest measured slower than the heuristic and the next faster); what is left goes to
those tasks in proportion to the same (largest remainders rounding). The other tasks are
not measured: they keep their backend's own schedule, as they would untuned (0 trials in the
table); the summary names the tasks searched. The tasks take turns, a batch each
(meta_schedule's round-robin scheduler): while one task's batch is being measured (on RPC
servers), the next task's is searched for and packed. Per task:

- the design space is the backend's :meth:`~tirpat.Backend.tune_space`;
- the first candidate measured is the design space itself with its post-processing: the
  backend's own (heuristic) schedule, so the best record is never worse than it; then the
  backend's candidates (:meth:`~tirpat.Backend.tune_candidates`), cheapest first, those the
  scheduler makes a schedule already measured of left out; a backend without them: when the
  knobs have priors (``tp.Knob(prior=)``), the candidate of each knob's most likely value
  (:attr:`~tirpat.model.tune.space.Knob.likely`);
- then meta_schedule's search strategy (evolutionary search with an XGBoost cost model by
  default) proposes candidates; each is compiled for the host through the backends' TIR
  pipeline, run on the backend's device and checked bit for bit against the workload
  compiled by TVM alone (:mod:`tirpat.model.tune.artifact`), its cost the backend's
  :meth:`~tirpat.Backend.measure` (accel: simulated cycles);
- every measurement goes to the records directory, meta_schedule's JSON database, which
  ``tp.build(..., records=DIR)`` and ``tirpat compile --records DIR`` apply.

Measurements run in this process, or on TVM RPC servers behind a tracker
(``rpc="HOST:PORT:KEY"``, servers started with ``tirpat rpc-server``).

>>> result = tp.tune(mod, "accel, llvm", trials=64, records="records/")      # doctest: +SKIP
>>> print(result)                                                            # doctest: +SKIP
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule import TuneContext
from tvm.s_tir.meta_schedule.database import TuningRecord
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.logging import get_logging_func
from tvm.s_tir.meta_schedule.measure_callback import MeasureCallback, PyMeasureCallback
from tvm.s_tir.meta_schedule.search_strategy import (
    EvolutionarySearch, MeasureCandidate, PySearchStrategy, SearchStrategy,
)
from tvm.s_tir.meta_schedule.tune import tune_tasks

from ..backend import Backend, lookup
from ..build import bind_params
from ..partition import as_target
from ..pipeline import partition_functions
from ..records import Records, workload
from .artifact import Reference, reference
from .rpc import CONNECT_TIMEOUT, RPC, rpc_runner
from .runners import Builder, Candidates, LocalRunner
from .space import likeliest

__all__ = ["tune", "TuneResult", "TaskResult", "Progress"]


@dataclass
class _Task:
    name: str
    backend: Backend
    options: dict
    workload: ir.IRModule
    space: object
    reference: Reference
    data: bytes
    budget: int = 0                 # trials, the backend's own schedule among them; 0: not searched
    heuristic: object = None        # the module of the backend's own schedule, once handed out
    candidates: list | None = None  # the backend's cheapest knob choices by its estimate, the cheapest first


@dataclass
class TaskResult:
    """One task's outcome: trials measured, failures (candidates that did not compile, run
    or match the reference), the cost of the backend's own schedule and the best cost.
    ``budget`` 0: the task was not searched (its backend's own schedule stays); ``copies``
    are the partitions identical to ``name`` that its records serve too."""

    name: str
    backend: str
    budget: int = 0
    copies: tuple = ()
    trials: int = 0
    failures: int = 0
    heuristic: float | None = None
    best: float | None = None
    first_failure: str = ""

    @property
    def gain(self) -> float | None:
        """How much cheaper the best candidate is than the heuristic's (0.2 = 20%)."""
        if self.heuristic is None or self.best is None or self.heuristic <= 0:
            return None
        return 1.0 - self.best / self.heuristic


@dataclass
class TuneResult:
    """What :func:`tune` did, per task; ``str()`` is a table. ``asked`` is the trial budget
    the caller gave, :attr:`budget` what the searched tasks were given (the same),
    :attr:`trials` what was measured (less when a search ran out of new candidates)."""

    records: Path
    tasks: list = field(default_factory=list)
    seconds: float = 0.0
    asked: int = 0

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def budget(self) -> int:
        return sum(t.budget for t in self.tasks)

    @property
    def summary(self) -> str:
        """``"N trials in S s"``, which tasks were searched when not all were, and why N is
        not the number asked when it is not.

        >>> print(TuneResult(Path("r"), [TaskResult("a", "accel", budget=2, trials=2),
        ...                              TaskResult("b", "accel")], 2.0, asked=2).summary)
        2 trials in 2.0 s (searched 1 of 2 tasks, the most to gain first: a; 2 trials each: its backend's own schedule and its cheapest candidates by the backend's estimate; the other 1 left at their backend's own schedule: b)
        >>> print(TuneResult(Path("r"), [TaskResult("a", "accel", budget=3, trials=3),
        ...                              TaskResult("b", "accel", budget=2, trials=2)], 2.0, asked=5).summary)
        5 trials in 2.0 s (searched 2 of 2 tasks, the most to gain first: a, b; 2-3 trials each: its backend's own schedule and its cheapest candidates by the backend's estimate)
        >>> print(TuneResult(Path("r"), [TaskResult("a", "accel", budget=8, trials=5)], 2.0, asked=8).summary)
        5 trials in 2.0 s (8 asked; the search found no more new candidates for a)
        """
        text = f"{self.trials} trials in {self.seconds:.1f} s"
        why = []
        shown = _shown_names([t.name for t in self.tasks])
        searched = sorted((t for t in self.tasks if t.budget), key=lambda t: -t.budget)
        left = [t for t in self.tasks if t.budget == 0]
        few = sorted({t.budget for t in searched if t.budget < SEARCH})

        def names(tasks: list, trials: str) -> str:      # a long list is the table's trials column
            return f": {', '.join(shown[t.name] for t in tasks)}" if len(tasks) <= 3 else f" ({trials} trials above)"

        if left or few:
            why.append(f"searched {len(searched)} of {len(self.tasks)} tasks, the most to gain first"
                       f"{names(searched, 'their')}")
        if few:         # (the span of every searched task's trials, those given SEARCH too)
            spread = sorted({t.budget for t in searched})
            span = f"{spread[0]}-{spread[-1]}" if len(spread) > 1 else f"{spread[0]}"
            more = " and its cheapest candidates by the backend's estimate" if spread[-1] > 1 else ""
            why[-1] += f"; {span} trial{'s' if span != '1' else ''} each: its backend's own schedule{more}"
        if left:
            why[-1] += f"; the other {len(left)} left at their backend's own schedule{names(left, '0')}"
        short = [t.name for t in self.tasks if t.trials < t.budget]
        if short:
            why.insert(0, f"{self.asked} asked")
            why.append(f"the search found no more new candidates for {', '.join(short)}")
        return f"{text} ({'; '.join(why)})" if why else text

    def __str__(self) -> str:
        def cost(v):
            return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.3g}"

        rows = [("task", "backend", "trials", "failed", "heuristic", "best", "gain")]
        shown = _shown_names([t.name for t in self.tasks])
        for t in self.tasks:
            gain = "-" if t.gain is None else f"{100 * t.gain:.1f}%"
            name = shown[t.name] + (f" (+{len(t.copies)} identical)" if t.copies else "")
            rows.append((name, t.backend, str(t.trials), str(t.failures), cost(t.heuristic), cost(t.best),
                         gain))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) if c < 2 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.append(f"{self.summary}; records in {self.records}")
        firsts = [f"  {t.name}: {t.first_failure}" for t in self.tasks if t.first_failure]
        if firsts:
            lines += ["first failure per task:"] + firsts
        same = [f"  {t.name}: {', '.join(t.copies)}" for t in self.tasks if t.copies]
        if same:
            lines += ["identical partitions, tuned once (the records serve each):"] + same
        return "\n".join(lines)


def _short(name: str, width: int = 48) -> str:
    """``name`` in at most ``width`` characters, its middle elided (partition names run long)."""
    return name if len(name) <= width else name[:width // 2 - 2] + "..." + name[-(width // 2 - 1):]


def _shown_names(names: list) -> dict:
    """``{name: what the table shows}``: :func:`_short` unless two names would read the same
    (partitions that differ only in the middle of their names), which are shown whole.

    >>> a, b, c = ("conv_" + x * 30 + op + x * 30 for x, op in (("x", "_add_"), ("x", "_sub_"), ("y", "")))
    >>> [_shown_names([a, b, c])[n] == n for n in (a, b, c)]       # a and b would both read conv_xxx...xxx
    [True, True, False]
    """
    short = {name: _short(name) for name in names}
    seen = collections.Counter(short.values())
    return {name: s if seen[s] == 1 else name for name, s in short.items()}


@dataclass(frozen=True)
class Progress:
    """Handed to ``tune(..., progress=)`` after every batch of measurements."""

    trials: int
    total: int
    task: TaskResult


def _tasks(mod, target, params) -> tuple[list, dict]:
    """``[(name, backend, opts, PrimFunc, design space)]`` to tune (see the module
    docstring), and ``{copy: partition}`` for the copies made for a call site's scalar
    constants (``tp.partition_functions``' ``bases``); a partition whose backend has no
    design space for it is not tuned."""
    if isinstance(mod, tirx.PrimFunc):
        mod = ir.IRModule({"main": mod})
    if not isinstance(mod, ir.IRModule):
        raise TypeError(f"tp.tune takes a Relax IRModule, a PrimFunc or an IRModule of PrimFuncs, "
                        f"got {type(mod).__name__}")
    bases: dict = {}
    if any(isinstance(f, relax.Function) for f in mod.functions.values()):
        found = [(name, lookup(backend), opts, func)
                 for name, backend, opts, func in partition_functions(bind_params(mod, params), target, bases=bases)]
    elif params:
        raise ValueError("params binds inputs of a Relax function; this module has only PrimFuncs")
    else:       # each PrimFunc is offered to the target's backends in priority order
        found = [(gv.name_hint, backend, opts, func) for gv, func in mod.functions.items()
                 if isinstance(func, tirx.PrimFunc) for backend, opts in target.backends]
    out, taken = [], set()
    for name, backend, opts, func in found:
        if name in taken:
            continue
        space = backend.tune_space(func, opts)
        if space is not None:
            out.append((name, backend, opts, func, space))
            taken.add(name)
    return out, bases


SEARCH = 4
"""The trials per task from which every task is searched (its backend's own schedule and
three candidates at least)."""

PROBE = 2
"""The trials of a task when not every task can have ``SEARCH``: its backend's own schedule
and its cheapest candidate by the backend's estimate (else the knobs' likeliest under their
priors), so that a small budget reaches many tasks rather than searching a few."""


MATERIAL = 0.01
"""The least share of the tasks' summed estimated gain that makes a task's own gain material:
with a budget short of ``SEARCH`` trials a task, the tasks of material gain are searched
first, up to ``SEARCH`` trials each, before those of smaller gains are probed. The estimate
misranks some candidates (on ppocrv5_det's depthwise convolutions the cheapest by it, blocks
of several channel tiles, measured 11-15% slower than the heuristic, the second cheapest
2.4% faster), while the gains below 1% (7 tasks, 4.5k cycles estimated) measured 1k."""


CLOSE = 0.02
"""How near the cheapest candidate's estimate another's must be for the estimate not to tell
them apart (accel's came within 2% of the measured cycles): a task of a material gain gets a
trial for each such candidate (up to ``SEARCH`` in all). On ppocrv5_det's depthwise
convolutions the cheapest and the next were 0.4-0.5% apart and the next was the faster."""


def _budgets(trials: int, work: list, gain: list | None = None, least: int = SEARCH, probe: int = PROBE,
             close: list | None = None) -> list:
    """Each task's trials (see the module docstring). Enough for all: ``least`` each at
    least, the rest in proportion to their ``work`` (largest remainders). Else the tasks are
    taken in order of their estimated ``gain`` (what their backend's cheapest candidate saves
    on its own schedule, :meth:`~tirpat.Backend.tune_candidates`; None where it has no
    estimate: its ``work`` instead, after those with a gain, and before those estimated to
    gain nothing; of equal gains, the most work first), ``probe`` trials each while the
    budget lasts, but those not of a ``MATERIAL`` gain (smaller, none or not estimated) only
    after each task of a material gain has ``least`` (its next candidates, in the same
    order; with ``close``, per task the number of candidates its estimate cannot tell apart
    from its cheapest, that one included: a trial for each, ``least`` at most); what is left
    goes to them in proportion to the same (largest remainders); the others get 0.

    >>> _budgets(12, [1.0, 3.0])
    [5, 7]
    >>> _budgets(9, [1.0, 100.0, 5.0])
    [2, 5, 2]
    >>> _budgets(2, [5.0, 6.0])
    [0, 2]
    >>> _budgets(4, [5.0, 6.0, 9.0], gain=[2.0, 0.0, 1.0])      # the last gains less, the middle nothing
    [2, 0, 2]
    >>> _budgets(8, [9.0, 9.0, 9.0], gain=[300.0, 100.0, 1.0])  # the last's gain is not material
    [4, 4, 0]
    >>> _budgets(8, [9.0, 9.0, 9.0], gain=[300.0, 100.0, 1.0], close=[1, 3, 1])  # the second's top 3 alike
    [2, 4, 2]
    """
    n = len(work)
    gain = gain or [None] * n
    budgets = [0] * n
    if trials >= least * n:
        chosen, weight = list(range(n)), work
        for i in chosen:
            budgets[i] = least
    else:
        # those with an estimated gain, then those without an estimate, then those gaining nothing
        tier = [0 if g is not None and g > 0 else 1 if g is None else 2 for g in gain]
        weight = [g if g is not None and g > 0 else w if g is None else 0.0 for g, w in zip(gain, work)]
        order = sorted(range(n), key=lambda i: (tier[i], -weight[i], -work[i]))     # of equal gains, most work first
        summed = sum(weight[i] for i in order if tier[i] == 0)
        material = [i for i in order if tier[i] == 0 and weight[i] >= MATERIAL * summed]
        chosen = material[:max(1, trials // probe)]
        for i in chosen:
            budgets[i] = min(probe, trials)
        for i in chosen:        # the next candidates of the material ones: the estimate misranks some
            most = least if close is None else min(least, 1 + close[i])
            budgets[i] += max(0, min(most - budgets[i], trials - sum(budgets)))
        # then the others while the budget lasts (one at least when none is material)
        others = [i for i in order if i not in chosen]
        others = others[:max(0 if chosen else 1, (trials - sum(budgets)) // probe)]
        for i in others:
            budgets[i] = min(probe, trials)
        chosen += others
    rest = trials - sum(budgets)
    total = sum(weight[i] for i in chosen)
    shares = {i: rest * (weight[i] / total if total > 0 else 1 / len(chosen)) for i in chosen}
    for i in chosen:
        budgets[i] += int(shares[i])
    left = rest - sum(int(s) for s in shares.values())
    for i in sorted(chosen, key=lambda i: int(shares[i]) - shares[i])[:left]:
        budgets[i] += 1
    return budgets


def _work(entry, key: ir.IRModule) -> float:
    """A task's work to rank it by: its backend's estimate of its cost
    (:meth:`~tirpat.Backend.tune_work`), else TVM's estimate of its operations."""
    _, backend, opts, func, _ = entry
    estimate = backend.tune_work(func, opts)
    return max(1.0, float(estimate) if estimate is not None else s_tir.analysis.estimate_tir_flops(key))


def _identical(found: list, bases: Mapping[str, str] | None = None) -> list:
    """``found`` (``[(name, backend, opts, PrimFunc, space)]``) grouped by the structure of
    the partition's workload key (names aside), a copy made for a call site's constants
    (``bases``: copy -> partition) with its partition: ``[(entry, workload, [other names],
    [the workload keys of those others whose key is not the group's])]``, the first entry
    met leading its group (its workload is the task's)."""
    keys = {entry[0]: workload(entry[3], entry[1].name, entry[2]) for entry in found}
    families: dict = {}     # hash of a family's key -> [(family key, group)]
    out = []
    for entry in found:
        name = entry[0]
        own = keys[name]
        family = keys.get((bases or {}).get(name, name), own)     # a site's copy goes with its partition
        for known, group in families.setdefault(tvm_ffi.structural_hash(family), []):
            if tvm_ffi.structural_equal(known, family):
                group[2].append(name)
                if not tvm_ffi.structural_equal(own, group[1]):
                    group[3].append(own)
                break
        else:
            group = (entry, own, [], [])
            families[tvm_ffi.structural_hash(family)].append((family, group))
            out.append(group)
    return out


def _share_records(database, groups: list) -> None:
    """Each task's best record written for the copies of its partition made for other call
    sites' constants (their keys differ by those immediates only, and so would their
    records' measurements: the schedule does not depend on the values)."""
    for _, key, _, sites in groups:
        if not sites or not database.has_workload(key):
            continue
        best = [r for r in database.get_top_k(database.commit_workload(key), 1) if r.run_secs]
        if not best:
            continue
        for site in sites:
            database.commit_tuning_record(TuningRecord(best[0].trace, database.commit_workload(site),
                                                       best[0].run_secs, best[0].target, best[0].args_info))


def _context(task: _Task, strategy, host, seed: int, logger: logging.Logger) -> TuneContext:
    """The task's TuneContext, made as ``TuneContext(...)`` makes it but without importing
    every registered tensor intrinsic first (about 14 s), which TVM's built-in schedule rules
    need and knob spaces do not."""
    ctx = TuneContext.__new__(TuneContext)
    ctx.__init_handle_by_constructor__(
        tvm.get_global_func("s_tir.meta_schedule.TuneContext"), task.workload, host, task.space, strategy,
        task.name, 1, seed, get_logging_func(logger))
    tvm.get_global_func("s_tir.meta_schedule.TuneContextInitialize")(ctx)
    return ctx


def _likeliest_trace(trace):
    """``trace`` with each categorical decision set to its likeliest value
    (:func:`~tirpat.model.tune.space.likeliest`), or None when that changes nothing."""
    changed = trace
    for inst in trace.insts:
        if inst.kind.name != "SampleCategorical":
            continue
        decision = int(trace.decisions[inst])
        likely = likeliest([float(p) for p in inst.attrs[1]], decision)
        if likely != decision:
            changed = changed.with_decision(inst, likely, remove_postproc=True)
    return None if changed.same_as(trace) else changed


def _chosen_trace(trace, choice: Mapping):
    """``trace`` (a knob space's) with the decisions of the knobs ``choice`` names set to its
    values (``{(block, annotation key): value}``), or None when that changes nothing or a
    value is none of its knob's."""
    made = {}       # an instruction's outputs -> the instruction
    for inst in trace.insts:
        for out in inst.outputs:
            made[out.__chandle__()] = inst
    changed = trace
    for inst in trace.insts:
        if inst.kind.name != "Annotate" or len(inst.inputs) < 2:
            continue
        block, sample = (made.get(rv.__chandle__()) for rv in inst.inputs[:2])
        if block is None or sample is None or sample.kind.name != "SampleCategorical":
            continue
        key = (str(block.attrs[0]), str(inst.attrs[0]))
        if key not in choice:
            continue
        values = [int(v) for v in sample.attrs[0]]
        if choice[key] not in values:
            return None
        decision = values.index(choice[key])
        if decision != int(trace.decisions[sample]):
            changed = changed.with_decision(sample, decision, remove_postproc=True)
    return None if changed.same_as(trace) else changed


@derived_object
class _HeuristicFirst(PySearchStrategy):
    """A search strategy that measures the design space itself first (the backend's own
    schedule), then the backend's candidates, cheapest first (``task.candidates``; without
    them, if the knobs' priors make another one likeliest, that one), then hands over to
    ``inner`` for the rest of the task's budget (whatever the task scheduler says); every
    candidate goes into ``candidates`` for the builder."""

    def __init__(self, inner: SearchStrategy, task: _Task, candidates: Candidates) -> None:
        super().__init__()
        self.inner, self.task, self.candidates = inner, task, candidates
        self.postprocs, self.first, self.measuring_first, self.inner_done = [], [], 0, False

    def _initialize_with_tune_context(self, context) -> None:
        self.postprocs = list(context.space_generator.postprocs or [])
        self.inner._initialize_with_tune_context(context)

    def _postprocessed(self, sch):
        sch.enter_postproc()
        return sch if all(p.apply(sch) for p in self.postprocs) else None

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None):
        heuristic = self._postprocessed(design_spaces[0].copy())
        self.first = [heuristic] if heuristic is not None else []
        self.task.heuristic = heuristic.mod if heuristic is not None else None
        trace = design_spaces[0].trace
        ranked = self.task.candidates
        if ranked is None:
            likely = _likeliest_trace(trace)
            traces = [] if likely is None else [likely]
        else:
            traces = (_chosen_trace(trace, choice) for choice in ranked)
        for chosen in traces:
            if len(self.first) >= self.task.budget:
                break
            if chosen is None:
                continue
            sch = s_tir.Schedule(self.task.workload)
            chosen.apply_to_schedule(sch, remove_postproc=True)
            sch = self._postprocessed(sch)
            # two choices the scheduler makes the same schedule of (a block it fitted alike) are one trial
            if sch is not None and not any(tvm_ffi.structural_equal(sch.mod, other.mod) for other in self.first):
                self.first.append(sch)
        inner_trials = self.task.budget - len(self.first)
        # the budget in batches of about num_trials_per_iter, none much smaller: each batch's
        # search costs the same whatever its size, a batch of 2 after two of 16 as much as one
        batches = max(1, round(inner_trials / num_trials_per_iter))
        self.inner.pre_tuning(max(inner_trials, 0), max(1, -(-inner_trials // batches)), design_spaces, database,
                              cost_model)
        self.inner_done = inner_trials <= 0

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self):
        found = [] if self.inner_done else list(self.inner.generate_measure_candidates() or [])
        if self.first:      # in the first batch, ahead of the strategy's own
            firsts, self.first, self.measuring_first = self.first, [], len(self.first)
            found[:0] = [MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))
                         for sch in firsts]
        if not found:
            return None
        for candidate in found:
            self.candidates.add(candidate.sch.mod, self.task)
        return found

    def notify_runner_results(self, measure_candidates, results) -> None:
        if self.measuring_first:        # the strategy hears of its own candidates only
            n, self.measuring_first = self.measuring_first, 0
            measure_candidates, results = measure_candidates[n:], results[n:]
        if not self.inner_done:
            self.inner.notify_runner_results(measure_candidates, results)

    def clone(self):
        return _HeuristicFirst(self.inner.clone(), self.task, self.candidates)


@derived_object
class _Report(PyMeasureCallback):
    """Counts trials per task and hands :class:`Progress` to the caller's callback;
    ``check()`` first (it raises to stop the tune)."""

    def __init__(self, tasks: list, results: list, total: int, progress: Callable[[Progress], None] | None,
                 check: Callable[[], None]) -> None:
        super().__init__()
        self.tasks, self.results, self.total, self.progress, self.check = tasks, results, total, progress, check

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.check()
        task = self.results[task_id]
        heuristic = self.tasks[task_id].heuristic
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results):
            task.trials += 1
            error = built.error_msg or ran.error_msg
            if error:
                task.failures += 1
                task.first_failure = task.first_failure or error.strip().splitlines()[-1]
                continue
            cost = float(np.mean([float(s) for s in ran.run_secs]))
            if heuristic is not None and candidate.sch.mod.same_as(heuristic):
                task.heuristic = cost
            task.best = cost if task.best is None else min(task.best, cost)
        if self.progress is not None:
            self.progress(Progress(sum(t.trials for t in self.results), self.total, task))


def _need(modules: list) -> None:
    """meta_schedule imports these where it uses them, deep in a run: fail first, saying how."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(f"tuning needs {', '.join(missing)}: pip install 'tirpat[tune]'")


def _strategy(strategy, batch: int):
    if not isinstance(strategy, str):
        return strategy
    if strategy == "evolutionary":
        # knob spaces are small and every candidate the search looks at runs the backend's
        # scheduler (its post-processor): a population of one batch, one generation
        population = max(batch, 16)
        return EvolutionarySearch(population_size=population, init_measured_ratio=0.2,
                                  init_min_unmeasured=population // 2, genetic_num_iters=1,
                                  genetic_mutate_prob=0.85, eps_greedy=0.05)
    if strategy in ("replay-trace", "replay-func"):
        return SearchStrategy.create(strategy)
    raise ValueError(f"unknown search strategy {strategy!r} (evolutionary, replay-trace, replay-func, "
                     f"or a meta_schedule SearchStrategy)")


def _log(records: Path) -> tuple[logging.Logger, Callable[[], None]]:
    """A logger writing to ``records/logs/tune.log``; meta_schedule's own log goes there too
    while tuning (it would print to the console otherwise). Returns it and the undo."""
    (records / "logs").mkdir(exist_ok=True)
    handler = logging.FileHandler(records / "logs" / "tune.log")
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    logger = logging.getLogger("tirpat.tune")
    ms = logging.getLogger("tvm.s_tir.meta_schedule")
    saved = (logger.level, logger.propagate, ms.level, ms.propagate)
    for lg in (logger, ms):
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False

    def undo():
        for lg in (logger, ms):
            lg.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        ms.setLevel(saved[2])
        ms.propagate = saved[3]
        handler.close()

    return logger, undo


class _Interrupts:
    """Ctrl-C through meta_schedule. While entered (in the main thread), a first SIGINT is
    only noted: :meth:`check` raises ``KeyboardInterrupt`` at the next point that calls it
    (before each local measurement, every 50 ms while waiting for an RPC measurement, after
    each batch), and so does leaving the block (with another exception, or none). Raised
    asynchronously instead, wherever the main thread is, it would unwind through
    meta_schedule's native code from any callback, some of which swallow it or were never
    meant to fail (Python post-processors run on native worker threads, futures half
    joined): the process could abort. A second SIGINT raises at once (the previous
    handler's ``KeyboardInterrupt``), for a tune stuck where nothing checks."""

    def __init__(self) -> None:
        self.came = False
        self._previous = None

    def check(self) -> None:
        if self.came:
            raise KeyboardInterrupt

    def _noted(self, signum, frame) -> None:
        if self.came:
            self._previous(signum, frame)
        self.came = True

    def __enter__(self) -> "_Interrupts":
        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is threading.main_thread() and callable(previous):
            self._previous = previous
            signal.signal(signal.SIGINT, self._noted)
        return self

    def __exit__(self, kind, err, tb) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self.came and (kind is None or issubclass(kind, Exception)):
            raise KeyboardInterrupt from None


def tune(mod, target, *, trials: int, records, rpc=None, params: Mapping[str, np.ndarray] | None = None,
         strategy="evolutionary", cost_model: str = "xgb", batch: int = 16, seed: int = 0,
         timeout: float = 60.0, connect_timeout: float = CONNECT_TIMEOUT,
         progress: Callable[[Progress], None] | None = None) -> TuneResult:
    """Tune the partitions of ``mod`` for ``target`` with ``trials`` measurements in all;
    write the records to the directory ``records`` (see the module docstring).

    - ``rpc``: None (measure here), or ``"HOST:PORT:KEY"`` / a ``tirpat.model.tune.RPC``:
      a tracker and the key of ``tirpat rpc-server``\\ s, measuring as many candidates at
      once as servers are registered;
    - ``params``: as for ``tp.build`` (bound weights change the partitions);
    - ``strategy``: ``"evolutionary"`` (meta_schedule's evolutionary search with
      ``cost_model``: ``"xgb"``, ``"random"`` or a ``CostModel``), ``"replay-trace"``
      (random decisions), or a meta_schedule ``SearchStrategy``; ``batch`` candidates are
      proposed at a time;
    - ``timeout``: seconds one measurement on an RPC server may take; ``connect_timeout``:
      seconds to reach the tracker and for a server to answer the handshake. A server that
      misses a limit is dropped with a warning (its candidate is measured on another); with
      no server left, ``ConnectionError`` (:mod:`tirpat.model.tune.rpc`);
    - ``progress(Progress)`` is called after every batch.

    Identical partitions are one task. With ``SEARCH`` (4) trials per task every task is
    searched; with fewer, the tasks their backend estimates to gain most on first, ``PROBE``
    (2) trials each (the backend's own schedule and its cheapest candidate by its estimate),
    the rest in proportion to that gain; the others keep their backend's own schedule (0
    trials in the table; ``TuneResult.summary`` names the tasks searched). ``trials`` is
    never exceeded.

    Raises ``ValueError`` when nothing in ``mod`` is tunable for ``target``. A
    ``KeyboardInterrupt`` (Ctrl-C) stops the tune within a measurement and leaves the
    records measured so far, which ``tp.build(..., records=)`` applies.

    >>> result = tp.tune(mod, "accel, llvm", trials=32, records="records/")     # doctest: +SKIP
    >>> model = tp.build(mod, "accel, llvm", records="records/")                # doctest: +SKIP
    """
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a positive int, got {trials!r}")
    _need(["psutil", "cloudpickle"] + (["xgboost"] if strategy == "evolutionary" and cost_model == "xgb" else []))
    start = time.perf_counter()
    t = as_target(target)
    found, bases = _tasks(mod, t, params)
    if not found:
        names = ", ".join(b.name for b, _ in t.backends) or "none"
        raise ValueError(f"nothing to tune: no partition of the model has a design space in the target's "
                         f"backends ({names})")
    store = Records(records, create=True)
    groups = _identical(found, bases)
    works = [_work(entry, key) for entry, key, _, _ in groups]
    ranked = [entry[1].tune_candidates(key["main"], entry[2]) for entry, key, _, _ in groups]
    copies_of = [1 + len(copies) for _, _, copies, _ in groups]
    gains = [None if r is None else copies * max(0.0, work - r[0][0]) if r else 0.0
             for r, work, copies in zip(ranked, works, copies_of)]
    # per task, the candidates within CLOSE of its cheapest (which the estimate cannot tell apart)
    close = [sum(1 for cost, _ in r if cost <= r[0][0] * (1 + CLOSE)) if r else 1 for r in ranked]
    budgets = _budgets(trials, [w * c for w, c in zip(works, copies_of)], gains, close=close)
    results, tasks = [], []
    for ((name, backend, opts, _, space), key, copies, _), budget, cands in zip(groups, budgets, ranked):
        results.append(TaskResult(name, backend.name, budget, tuple(copies)))
        if budget:          # the reference (TVM's own build of the workload) of the searched tasks only
            ref = reference(key, t.host, seed)
            tasks.append(_Task(name, backend, opts, key, space, ref, ref.data(), budget,
                               candidates=None if cands is None else [choice for _, choice in cands]))
    searched = [r for r in results if r.budget]
    where = RPC.parse(rpc) if isinstance(rpc, str) else rpc
    interrupts = _Interrupts()
    runner = (LocalRunner(before_each=interrupts.check) if where is None else
              rpc_runner(where, timeout, connect_timeout=connect_timeout, check=interrupts.check))
    candidates = Candidates()
    logger, undo_log = _log(store.path)
    workdir = tempfile.mkdtemp(prefix="tirpat-tune-")
    try:
        contexts = [_context(task, _HeuristicFirst(_strategy(strategy, batch), task, candidates), t.host,
                             seed + n + 1, logger.getChild(task.name)) for n, task in enumerate(tasks)]
        budget = sum(task.budget for task in tasks)
        callbacks = MeasureCallback.create("default") + [_Report(tasks, searched, budget, progress,
                                                                 interrupts.check)]
        with interrupts:
            try:
                tune_tasks(tasks=contexts, task_weights=[1.0] * len(contexts), work_dir=str(store.path),
                           max_trials_global=budget, max_trials_per_task=max(task.budget for task in tasks),
                           num_trials_per_iter=batch, builder=Builder(candidates, workdir), runner=runner,
                           database=store.database, cost_model=cost_model, measure_callbacks=callbacks,
                           task_scheduler="round-robin")
            except RuntimeError:
                # meta_schedule hands an exception raised in the runner on as a bare RuntimeError
                failure = getattr(runner, "failure", None)
                if failure is not None:
                    raise failure from None
                raise
        _share_records(store.database, [g for g, b in zip(groups, budgets) if b])
    finally:
        if where is not None:
            runner.close()
        undo_log()
        shutil.rmtree(workdir, ignore_errors=True)
    return TuneResult(store.path, results, time.perf_counter() - start, trials)
