"""The accel Backend: accel as one client of tirpat's Backend API.

Its options are the fields of :class:`accel.Config` (``accel -tile=32`` in a target string);
its hooks hand each level of the flow to the compiler (:mod:`accel.compiler`: graph
patterns, the scheduler, tirpat rules, the scratchpad planner) and the device (:mod:`accel.hw`).

>>> import tirpat as tp
>>> tp.backends()["accel"].resolve({"tile": 32})["tile"]
32
"""

from __future__ import annotations

import dataclasses

import tirpat as tp
from accel.hw.config import Config

_HELP = {
    "tile": "GEMM tile edge (a power of two); a GEMM step is one tile x tile x tile product",
    "gemm_macs_per_cycle": "multiply-accumulates the GEMM array does per cycle",
    "dma_bytes_per_cycle": "DMA bandwidth between host memory and the scratchpads",
    "alu_lanes": "ALU lanes per cycle",
    "issue_overhead": "fixed cycles per instruction",
    "inp_bytes": "INP scratchpad size (int8)",
    "wgt_bytes": "WGT scratchpad size (int8)",
    "acc_bytes": "ACC scratchpad size (int32)",
    "dwmac_macs_per_cycle": "multiply-accumulates the GEMM array does per cycle in DWMAC's per-channel mode",
    "unit_queue": "compute instructions that may wait for each compute unit (GEMM array, ALU, DMA) behind the one it runs",
}


def config_of(opts: dict) -> Config:
    """The :class:`Config` that resolved backend options describe."""
    return Config(**opts)


class AccelBackend(tp.Backend):
    """The bundled simulated int8 NPU."""

    name = "accel"
    options = {f.name: tp.Option(int, f.default, help=_HELP[f.name]) for f in dataclasses.fields(Config)}

    def check_options(self, opts: dict) -> None:
        """What :class:`Config` refuses (a tile that is not a power of two, a scratchpad that
        cannot hold one tile), in the options' names: Config's fields are the options.

        >>> tp.parse_target("accel -tile=7, llvm")
        Traceback (most recent call last):
        ...
        tirpat.model.target.TargetError: accel -tile=7: tile must be a power of two, got 7
        """
        try:
            config_of(opts)
        except ValueError as err:
            raise ValueError(str(err).replace(f"{Config.__name__}.", "")) from None

    def patterns(self, opts: dict) -> list:
        from accel.compiler import elementwise, groups, upsample
        from accel.compiler.patterns import patterns

        return patterns() + elementwise.patterns() + upsample.patterns() + groups.patterns()

    def schedule(self, func, opts: dict):
        from accel.compiler import upsample
        from accel.compiler.pooling import schedule_max_pool
        from accel.compiler.schedule import schedule_partition

        moved = upsample.schedule_partition(func, config_of(opts))
        if moved is not None:
            return moved
        pool = schedule_max_pool(func, config_of(opts))
        return pool if pool is not None else schedule_partition(func, config_of(opts))

    def rules(self, opts: dict):
        from accel.compiler.rules import rules

        return rules(config_of(opts))

    def passes(self, phase: tp.Phase, opts: dict) -> list:
        if phase is tp.Phase.PRE_PARTITION:
            from accel.compiler.elementwise import widen_per_use
            from accel.compiler.groups import split_groups
            from accel.compiler.patterns import narrow_constant_operands, split_operand_permutes
            from accel.compiler.pooling import sums_as_convolutions

            # a quantised (QDQ) model becomes the integer arithmetic accel's patterns take;
            # a grouped convolution is one per group; int32 weights that fit int8 are stored
            # as int8; an average pool's window sums become convolutions with a weight of ones
            # (accel's MAC units sum int8 exactly); an element-wise chain gets its own widening
            # casts; a matmul operand permuted across its batch axes is permuted on the host
            # to the layout the GEMM reads
            return [tp.integerize(), split_groups(), narrow_constant_operands(), split_operand_permutes(),
                    sums_as_convolutions(), widen_per_use()]
        if phase is tp.Phase.POST_PARTITION:
            from accel.compiler.patterns import accumulator_first

            return [accumulator_first()]
        if phase is tp.Phase.AFTER_REWRITE:
            from accel.compiler.chains import merge_chains_pass
            from accel.compiler.planner import plan_pass

            # ALU runs on one block become chains before the planner places their operands
            return [merge_chains_pass(), plan_pass(config_of(opts))]
        return []

    def session(self, opts: dict):
        from accel.hw.runtime import Session

        return Session(config_of(opts))

    def tune_space(self, func, opts: dict):
        from accel.compiler.tuning import tuning_space

        return tuning_space(func, config_of(opts))

    def tune_candidates(self, func, opts: dict) -> list | None:
        """The knob choices the plan's cycle estimate finds cheapest, cheapest first, with
        their estimated cycles (:func:`accel.compiler.tuning.ranked`)."""
        from tvm import ir

        from accel.compiler.tuning import ranked

        return ranked(tp.Schedule(ir.IRModule({"main": func})), config_of(opts))

    def tune_work(self, func, opts: dict) -> float | None:
        """The cycles the heuristic's schedule of ``func`` is estimated to take."""
        from accel.compiler.tuning import work

        return work(func, config_of(opts))

    def measure(self, run, opts: dict) -> float:
        """Simulated cycles of ``run()``."""
        from accel.hw.runtime import Session

        with Session(config_of(opts)) as session:
            run()
        return float(session.stats.cycles)
