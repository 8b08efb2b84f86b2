"""``tirpat quantize MODEL.onnx -o OUT.onnx [--calibration calib.npz] [--per-channel]``: a
float ONNX model to int8 QDQ form (:func:`tirpat.quantize`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .command import Command, CommandError
from .output_file import check_output

_DESCRIPTION = """\
Quantises a float ONNX model to int8 with onnxruntime's quantize_static: QDQ form, int8
activations and weights, symmetric (zero points 0), MinMax calibration by default.
'tirpat compile' turns the result into integer arithmetic for an int8 backend (accel runs
tirpat's integerize pass itself).

Calibration data is an .npz keyed by input name whose arrays have a leading axis of
samples, each of the input's shape (16 samples of a [1, 3, 16, 16] input: [16, 1, 3, 16,
16]), finite, of the input's dtype (float64 serves a float32 input; integers for a float
input are refused).
Without --calibration, seeded random inputs are used and the scales are then meaningless
for real data (a warning says so). An open input dimension (a name, ? or -1) takes the
calibration data's size. --per-channel upgrades a model older than opset 13 with onnx's
version converter (DequantizeLinear's axis needs it), so the output loads in onnxruntime.
--exclude, --exclude-op-types and --float-outputs keep nodes in float: by name, by
operator type, or the nodes that produce the named graph outputs (e.g. a detector's head,
whose boxes and scores one int8 scale cannot both hold: a warning names each Concat whose
scale leaves one of its inputs a few steps, with the nodes to --exclude, the element moves
after it included). A model already quantised (QDQ
pairs, QLinear* or *Integer operators) is refused: compile it as it is. An existing OUT
is replaced only if its name ends in .onnx and it is not MODEL."""

_METHODS = ("minmax", "entropy", "percentile")     # tirpat.model.quantize.METHODS, without importing it


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a float .onnx model")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="the int8 .onnx model to write (default: MODEL's name + _int8.onnx); "
                             "an existing file is replaced only if it is an .onnx other than MODEL")
    parser.add_argument("--calibration", metavar="NPZ",
                        help="calibration data: an .npz keyed by input name, leading axis of samples")
    parser.add_argument("--per-channel", action="store_true", help="one weight scale per output channel")
    parser.add_argument("--method", choices=_METHODS, default="minmax", help="calibration method (default: minmax)")
    parser.add_argument("--exclude", nargs="+", action="extend", default=[], metavar="NODE",
                        help="keep these nodes (by name) in float")
    parser.add_argument("--exclude-op-types", nargs="+", action="extend", default=[], metavar="OP",
                        help="keep every node of these operator types (e.g. Concat Sigmoid) in float")
    parser.add_argument("--float-outputs", nargs="+", action="extend", default=[], metavar="NAME",
                        help="keep these graph outputs in float: the nodes that produce them are not quantised")


def _run(args: argparse.Namespace) -> int:
    model = Path(args.model)
    if not model.is_file():
        raise CommandError(f"{model}: no such file" if not model.exists() else f"{model}: not a file")
    if model.suffix.lower() != ".onnx":
        raise CommandError(f"{model}: tirpat quantize takes a float .onnx model")
    output = Path(args.output) if args.output else model.with_name(model.stem + "_int8.onnx")
    check_output(output, "-o", ".onnx", {"MODEL": model, "--calibration": args.calibration})
    try:
        import onnx

        from tirpat.model.quantize import CalibrationError, quantize
    except ImportError as err:
        raise CommandError(f"tirpat quantize needs onnx and onnxruntime: pip install 'tirpat[model]' ({err})") from None
    try:
        qdq = quantize(model, args.calibration, per_channel=args.per_channel, method=args.method,
                       exclude=args.exclude, exclude_op_types=args.exclude_op_types,
                       float_outputs=args.float_outputs)
    except (CalibrationError, FileNotFoundError, ValueError) as err:
        raise CommandError(str(err)) from err
    try:
        onnx.save(qdq, str(output))
    except OSError as err:
        raise CommandError(f"{output}: cannot write the model ({err.strerror})") from err
    quantised = sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node)
    scales = "per output channel" if args.per_channel else "per tensor"
    print(f"wrote {output}: {quantised} tensors quantised to int8 (symmetric, weights {scales}, {args.method})")
    return 0


COMMAND = Command(
    name="quantize",
    help="quantise a float ONNX model to int8 (QDQ form, by onnxruntime)",
    example="tirpat quantize cnn.onnx -o cnn_int8.onnx --calibration calib.npz --per-channel",
    arguments=_arguments,
    run=_run,
    description=_DESCRIPTION,
)
