"""``tirpat compile MODEL -t TARGET -o OUT``: a model to one file that ``tirpat run`` runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .command import Command, CommandError
from .model_file import ENTRY
from .output_file import check_output

_DESCRIPTION = """\
Compiles MODEL for a composite target: the backends named in -t take the operators their
patterns match (an earlier backend wins an overlap), the last target, the host (llvm),
compiles the rest. Prints the offload report: MACs by backend, the partitions grouped by
pattern with their calls and MACs, the operators left on the host grouped by reason, the
largest first (--verbose: every partition call and host operator, as --report's JSON has).

MODEL is an .onnx file (TVM's Relax ONNX frontend) or a .py file defining a Relax
IRModule named Module; its Relax function main is compiled, or the one --entry names.
An ONNX model is pre-processed first (--no-preprocess skips it): the dims --input-shapes
gives are fixed, onnxruntime's basic graph optimisation computes the shapes the graph
computes (Shape/Gather/Concat feeding a Reshape) and folds BatchNormalization, and onnx's
shape inference annotates the result.
The compiled model goes next to MODEL (sub/m.onnx -> sub/m.tirpat, as 'tirpat quantize'
writes sub/m_int8.onnx) unless -o says where; an existing file is replaced only if its name
ends in .tirpat (--report: .json). 'tirpat targets' lists the backends, their options and the host. With
--records DIR (written by 'tirpat tune'), each partition with a tuning record is scheduled
by its best one. The host's -mcpu and -mattr must be ones this CPU runs, unless
--cross-compile says the model is for another machine."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an .onnx file, or a .py file defining a Relax IRModule `Module`")
    parser.add_argument("-t", "--target", required=True, metavar="TARGET",
                        help='composite target: backends in priority order, then the host, e.g. "accel -tile=16, llvm"')
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="the compiled model file (default: next to MODEL, its name with .tirpat)")
    parser.add_argument("--report", metavar="JSON", help="also write the offload report as JSON (every operator)")
    parser.add_argument("--verbose", action="store_true",
                        help="print every partition call and host operator, not the summary")
    parser.add_argument("--records", metavar="DIR",
                        help="tuning records ('tirpat tune' writes them): each partition gets its best schedule")
    parser.add_argument("--entry", default=ENTRY, metavar="NAME",
                        help=f"the Relax function to compile (default {ENTRY}; relax.frontend.nn's export_tvm "
                             "names it after the method, e.g. forward)")
    shapes_argument(parser)
    parser.add_argument("--cross-compile", action="store_true",
                        help="compile for another machine's CPU: the host's -mcpu and -mattr may then name features "
                             "this CPU lacks (the model runs only where they are; by default they are refused, "
                             "as its code would stop here with an illegal instruction)")
    preprocess_argument(parser)
    parser.add_argument("--strict", action="store_true",
                        help="fail when nothing is offloaded, or a matmul, a convolution or an operator a backend declined stays on the host (default: a warning naming each)")


def shapes_argument(parser: argparse.ArgumentParser) -> None:
    """``--input-shapes``, shared by the commands that read a MODEL."""
    parser.add_argument("--input-shapes", type=_shapes, metavar="SHAPES",
                        help="set the dimensions an ONNX model's inputs leave open, e.g. \"x:[1,3,16,16] y:[8]\" "
                             "(accelerators need static shapes; a dimension the model fixes must be given as it is)")


def preprocess_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-preprocess``, shared by the commands that read a MODEL."""
    parser.add_argument("--no-preprocess", dest="preprocess", action="store_false",
                        help="hand an ONNX model to TVM's frontend as it is (default: first fix the input dims, "
                             "run onnxruntime's basic graph optimisation, which computes the shapes the graph "
                             "computes and folds BatchNormalization, and onnx's shape inference)")


def _shapes(text: str) -> dict:
    from .model_file import parse_shapes

    try:
        return parse_shapes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _run(args: argparse.Namespace) -> int:
    import tirpat as tp

    from tirpat.model.onnx_import import tvm_failure

    from .model_file import load_model, readable
    from .progress import Progress, pass_names

    target = tp.parse_target(args.target)          # malformed arguments fail before any work
    if not args.cross_compile:                     # 'tirpat run' runs the model here
        from tirpat.model.host_cpu import check_runs_here

        check_runs_here(target.host, what=f"target {args.target!r}",
                        hint="give --cross-compile to compile it for another machine")
    model_path = readable(args.model)
    output = Path(args.output) if args.output else model_path.with_suffix(".tirpat")
    report = Path(args.report) if args.report else None
    check_output(output, "-o", ".tirpat", {"MODEL": model_path}, stream=False,
                 why="a .tirpat is a zip archive, written and read back")
    if report is not None:          # a JSON report streams: /dev/stdout takes it
        check_output(report, "--report", ".json", {"MODEL": model_path}, {"-o": output})
    records = tp.Records(args.records) if args.records else None
    with Progress() as progress:
        with progress.step(f"reading {args.model}"):
            mod = load_model(model_path, args.input_shapes, args.entry, preprocess=args.preprocess)
        with progress.step(f"compiling for {target}"), pass_names(progress):
            try:
                # the streams a build records stay in this process: the file holds none
                model = tp.build(mod, target, strict=args.strict, records=records, entry=args.entry,
                                 record_streams=False)
            except Exception as err:  # noqa: BLE001 - one raised inside TVM gets the file's name
                failure = tvm_failure(err, model_path)
                if failure is None:
                    raise
                raise CommandError(str(failure)) from err
        with progress.step(f"writing {output}"):
            model.export(output)
    print(model.report.text(verbose=args.verbose))
    if report is not None:
        try:
            report.write_text(json.dumps(model.report.to_json(), indent=1) + "\n")
        except OSError as err:
            raise CommandError(f"{report}: cannot write the report ({err.strerror})") from err
    print(f"\nwrote {output}" + (f" and {report}" if report else ""))
    return 0


COMMAND = Command(
    name="compile",
    help="compile a model (.onnx, or .py with a Relax IRModule) for a composite target",
    example='tirpat compile examples/models/mlp_int8.py -t "accel, llvm" -o mlp.tirpat --report mlp.json',
    arguments=_arguments,
    run=_run,
    description=_DESCRIPTION,
)
