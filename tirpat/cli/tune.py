"""``tirpat tune MODEL -t TARGET --trials N --records DIR``: search the backends' schedules."""

from __future__ import annotations

import argparse
from pathlib import Path

from .command import Command, CommandError

_DESCRIPTION = """\
Tunes the schedule of every partition of MODEL that a backend of the target takes, with
TVM's meta_schedule: the backend's design space (for accel: block sizes, weight residency,
the convolution's gather and pixel grouping). --trials counts every measurement: each
partition first gets its backend's own schedule measured (so the best is never worse and
every partition has a record; with fewer trials than partitions, one each and a warning),
the rest is shared in proportion to the partitions' operations (TVM's estimate); each is
checked bit for bit against the model compiled by TVM alone (a wrong schedule is an error,
never a winner). The cost is the backend's measure
(for accel: simulated cycles). Records go to the --records directory, meta_schedule's JSON
database: 'tirpat compile --records DIR' and tp.build(..., records=DIR) apply the best
schedule of each partition. Tuning again with the same directory adds to it.

With --rpc HOST:PORT:KEY the candidates are measured on the TVM RPC servers registered
with that tracker under KEY ('tirpat rpc-server'), as many at once as there are servers.

MODEL is an .onnx file or a .py file defining a Relax IRModule named Module."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    from .compile import preprocess_argument, shapes_argument

    parser.add_argument("model", metavar="MODEL", help="an .onnx file, or a .py file defining a Relax IRModule `Module`")
    parser.add_argument("-t", "--target", required=True, metavar="TARGET",
                        help='composite target: backends in priority order, then the host, e.g. "accel, llvm"')
    parser.add_argument("--trials", type=_positive, required=True, metavar="N",
                        help="measurements in all: each partition's own schedule (one per partition, at least), "
                             "the rest shared in proportion to the partitions' operations")
    parser.add_argument("--records", required=True, metavar="DIR", help="the tuning records directory (made if missing)")
    parser.add_argument("--rpc", metavar="HOST:PORT:KEY",
                        help="measure on the RPC servers a tracker knows under KEY (default: in this process)")
    parser.add_argument("--batch", type=_positive, default=16, metavar="N",
                        help="candidates the search proposes at a time (default 16)")
    parser.add_argument("--strategy", choices=["evolutionary", "replay-trace"], default="evolutionary",
                        help="meta_schedule's evolutionary search with an XGBoost cost model (default), "
                             "or random decisions")
    parser.add_argument("--seed", type=int, default=0, help="seed of the search and of the test inputs (default 0)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds one measurement on an RPC server may take (default 60)")
    shapes_argument(parser)
    preprocess_argument(parser)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else name[:width // 2 - 1] + "..." + name[-(width // 2 - 2):]


def _run(args: argparse.Namespace) -> int:
    import tirpat as tp
    from tirpat.model.tune import RPC

    from .model_file import load_model
    from .progress import Progress

    target = tp.parse_target(args.target)          # malformed arguments fail before any work
    where = None
    if args.rpc:
        try:
            where = RPC.parse(args.rpc)
        except ValueError as err:
            raise CommandError(str(err)) from None
    if where is None:               # the candidates are measured on this CPU
        from tirpat.model.host_cpu import check_runs_here

        check_runs_here(target.host, what=f"target {args.target!r}",
                        hint="tune on RPC servers whose CPU has them (--rpc)")
    if Path(args.records).exists() and not Path(args.records).is_dir():
        raise CommandError(f"{args.records}: not a directory")
    with Progress() as progress:
        with progress.step(f"reading {args.model}"):
            mod = load_model(args.model, args.input_shapes, preprocess=args.preprocess)
        with progress.step(f"tuning for {target}" + (f" on the servers of {args.rpc}" if where else "")):
            advance, done = None, 0

            def report(p) -> None:
                nonlocal advance, done
                if advance is None:         # the budget tune settled on (one trial per task at least)
                    advance = progress.bar("trials", total=p.total)
                advance(p.trials - done)
                done = p.trials
                best = "-" if p.task.best is None else f"{p.task.best:,.0f}"
                progress.detail(f"{_short(p.task.name)}: best {best}")

            try:
                result = tp.tune(mod, target, trials=args.trials, records=args.records, rpc=where,
                                 strategy=args.strategy, batch=args.batch, seed=args.seed, timeout=args.timeout,
                                 progress=report)
            except ConnectionError as err:
                raise CommandError(str(err)) from None
    print(result)
    return 0


COMMAND = Command(
    name="tune",
    help="tune the schedules of a model's partitions on their backends (meta_schedule), here or over RPC",
    example='tirpat tune examples/models/mlp_int8.py -t "accel, llvm" --trials 32 --records mlp-records',
    arguments=_arguments,
    run=_run,
    description=_DESCRIPTION,
)
