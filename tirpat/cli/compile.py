"""``tirpat compile MODEL -t TARGET -o OUT``: a model to one file that ``tirpat run`` runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .command import Command, CommandError

_DESCRIPTION = """\
Compiles MODEL for a composite target: the backends named in -t take the operators their
patterns match (an earlier backend wins an overlap), the last target, a TVM target kind,
compiles the rest. Prints the offload report: the partitions with their backend, operators
and MACs, and each operator left on the host with the reason.

MODEL is an .onnx file (TVM's Relax ONNX frontend) or a .py file defining a Relax
IRModule named Module. 'tirpat targets' lists the backends and their options. With
--records DIR (written by 'tirpat tune'), each partition with a tuning record is scheduled
by its best one."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an .onnx file, or a .py file defining a Relax IRModule `Module`")
    parser.add_argument("-t", "--target", required=True, metavar="TARGET",
                        help='composite target: backends in priority order, then the host, e.g. "accel -tile=16, llvm"')
    parser.add_argument("-o", "--output", metavar="OUT", help="the compiled model file (default: MODEL's name + .tirpat)")
    parser.add_argument("--report", metavar="JSON", help="also write the offload report as JSON")
    parser.add_argument("--records", metavar="DIR",
                        help="tuning records ('tirpat tune' writes them): each partition gets its best schedule")
    shapes_argument(parser)
    parser.add_argument("--strict", action="store_true",
                        help="fail when less is offloaded than the backends could take (default: a warning)")


def shapes_argument(parser: argparse.ArgumentParser) -> None:
    """``--input-shapes``, shared by the commands that read a MODEL."""
    parser.add_argument("--input-shapes", type=_shapes, metavar="SHAPES",
                        help="fix an ONNX model's input shapes, e.g. \"x:[1,3,16,16] y:[8]\" (accelerators "
                             "need static shapes)")


def _shapes(text: str) -> dict:
    from .model_file import parse_shapes

    try:
        return parse_shapes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _run(args: argparse.Namespace) -> int:
    import tirpat as tp

    from .model_file import load_model
    from .progress import Progress, pass_names
    from .tvm_noise import filtered_native_stderr

    target = tp.parse_target(args.target)          # a malformed target fails before any work
    output = Path(args.output) if args.output else Path(Path(args.model).stem + ".tirpat")
    for path in (output, args.report):
        if path is not None and not Path(path).parent.is_dir():
            raise CommandError(f"{path}: no such directory {str(Path(path).parent)!r}")
    records = tp.Records(args.records) if args.records else None     # a wrong directory fails first too
    with Progress() as progress:
        with progress.step(f"reading {args.model}"):
            mod = load_model(args.model, args.input_shapes)
        with progress.step(f"compiling for {target}"), pass_names(progress):
            model = tp.build(mod, target, strict=args.strict, records=records)
        with progress.step(f"writing {output}"), filtered_native_stderr():
            model.export(output)
    print(model.report)
    if args.report:
        try:
            Path(args.report).write_text(json.dumps(model.report.to_json(), indent=1) + "\n")
        except OSError as err:
            raise CommandError(f"{args.report}: cannot write the report ({err.strerror})") from err
    print(f"\nwrote {output}" + (f" and {args.report}" if args.report else ""))
    return 0


COMMAND = Command(
    name="compile",
    help="compile a model (.onnx, or .py with a Relax IRModule) for a composite target",
    example='tirpat compile examples/models/mlp_int8.py -t "accel, llvm" -o mlp.tirpat --report mlp.json',
    arguments=_arguments,
    run=_run,
    description=_DESCRIPTION,
)
