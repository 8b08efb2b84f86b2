"""``tirpat tune MODEL -t TARGET --trials N --records DIR``: search the backends' schedules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .command import Command, CommandError

_DESCRIPTION = """\
Tunes the schedule of every partition of MODEL that a backend of the target takes, with
TVM's meta_schedule: the backend's design space (for accel: block sizes, weight residency,
the convolution's gather and pixel grouping). Identical partitions are one task, tuned
once; its records serve each. --trials counts every measurement and is never exceeded: the
tasks of most operations (TVM's estimate) are searched, 4 trials each at least, the first
their backend's own schedule (so the best is never worse), the rest shared in proportion
to their operations; with fewer trials than 4 per task, the tasks left over keep their
backend's own schedule (0 trials in the table), and the summary names the tasks searched.
Every candidate is checked bit for bit against the model compiled by TVM alone (a wrong
schedule is an error, never a winner). The cost is the backend's measure (for accel:
simulated cycles). Records go to the --records directory, meta_schedule's JSON database:
'tirpat compile --records DIR' and tp.build(..., records=DIR) apply the best schedule of
each partition. Tuning again with the same directory adds to it.

With --rpc HOST:PORT:KEY the candidates are measured on the TVM RPC servers registered
with that tracker under KEY ('tirpat rpc-server'), as many at once as there are servers.
A server that does not answer the handshake within --connect-timeout seconds, or a request
within --timeout plus that, is dropped with a warning and its candidate measured on another;
with no server left the tune stops with an error.

Ctrl-C stops the tune at its next check (a measurement, a batch; a second Ctrl-C at once);
the records measured so far stay in DIR and compile.

MODEL is an .onnx file or a .py file defining a Relax IRModule named Module."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    from .compile import preprocess_argument, shapes_argument

    parser.add_argument("model", metavar="MODEL", help="an .onnx file, or a .py file defining a Relax IRModule `Module`")
    parser.add_argument("-t", "--target", required=True, metavar="TARGET",
                        help='composite target: backends in priority order, then the host, e.g. "accel, llvm"')
    parser.add_argument("--trials", type=_positive, required=True, metavar="N",
                        help="measurements in all, never exceeded: 4 at least to each task searched, the tasks of "
                             "most operations first, the rest in proportion to their operations; tasks left over "
                             "keep their backend's own schedule")
    parser.add_argument("--records", required=True, metavar="DIR", help="the tuning records directory (made if missing)")
    parser.add_argument("--rpc", metavar="HOST:PORT:KEY",
                        help="measure on the RPC servers a tracker knows under KEY (default: in this process)")
    parser.add_argument("--batch", type=_positive, default=16, metavar="N",
                        help="candidates the search proposes at a time (default 16)")
    parser.add_argument("--strategy", choices=["evolutionary", "replay-trace"], default="evolutionary",
                        help="meta_schedule's evolutionary search with an XGBoost cost model (default), "
                             "or random decisions")
    parser.add_argument("--seed", type=int, default=0, help="seed of the search and of the test inputs (default 0)")
    parser.add_argument("--timeout", type=_seconds, default=60.0, metavar="S",
                        help="seconds one measurement on an RPC server may take (default 60)")
    parser.add_argument("--connect-timeout", type=_seconds, default=10.0, metavar="S",
                        help="seconds to reach the RPC tracker and for a server to answer the handshake (default 10)")
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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _measured(records: Path) -> int:
    """How many measurements the records directory holds (a line each)."""
    try:
        with open(records / "database_tuning_record.json", "rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


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
                if advance is None:         # the budget of the searched tasks: --trials
                    advance = progress.bar("trials", total=p.total)
                advance(p.trials - done)
                done = p.trials
                best = "-" if p.task.best is None else f"{p.task.best:,.0f}"
                progress.detail(f"{_short(p.task.name)}: best {best}")

            try:
                result = tp.tune(mod, target, trials=args.trials, records=args.records, rpc=where,
                                 strategy=args.strategy, batch=args.batch, seed=args.seed, timeout=args.timeout,
                                 connect_timeout=args.connect_timeout, progress=report)
            except ConnectionError as err:
                raise CommandError(str(err)) from None
            except KeyboardInterrupt:       # said once the progress display is gone
                result = None
    if result is None:
        print(f"tirpat tune: interrupted; {_measured(Path(args.records))} record(s) in {args.records} "
              f"('tirpat compile --records {args.records}' applies them)", file=sys.stderr)
        return 130
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
