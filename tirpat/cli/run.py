"""``tirpat run MODEL.tirpat``: run a compiled model on inputs, with device statistics.

``--profile`` prints ``model.profile()``; ``--timeline`` draws with what a backend's
statistics (``model.stats[name]``) offer, ``timeline.save_png(path, title=...,
layers=[(label, start, end)])`` (accel's :class:`accel.Stats` has it; see
:func:`tirpat.model.compiled.describe_stats` for the rest of that protocol), or, for a
``.json`` path, writes the timelines' events as trace-event JSON (:mod:`tirpat.device.trace`).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
import zipfile
from pathlib import Path

from .command import Command, CommandError
from .model_file import readable
from .output_file import check_output

_DESCRIPTION = """\
Runs a model written by 'tirpat compile' on the inputs in an .npz keyed by the model's
input names (--inputs), or on seeded random inputs. Prints each output's dtype, shape and
range and writes them with -o as output_0, output_1, ... With --profile it prints each
backend's device statistics for the run (for accel: cycles, the share of the roofline
reached for the model's own MACs and for the MACs the device executed, padding to whole
tiles included, utilisation by unit, the cycles of each layer); --timeline draws the device's
timeline as a PNG labelled by layer or, for a name ending in .json, writes it as Chrome/Perfetto
trace-event JSON (ui.perfetto.dev, chrome://tracing: a track per device unit and one of the
layers; one microsecond there is one device cycle); a --timeline name with another suffix
(t.svg) is refused. An existing file is replaced only if its name ends in .npz (-o) or .png or
.json (--timeline) and it is not an input. The run's wall time (--profile) is of the model's
first call in this process, which records the device's instruction streams as it runs them (a
.tirpat holds none): later calls in one process (Python: tp.load, then model(x)) replay them."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL.tirpat", help="a model written by 'tirpat compile'")
    parser.add_argument("--inputs", metavar="NPZ", help="inputs, an .npz keyed by input name (default: seeded random)")
    parser.add_argument("--seed", type=_seed, default=0, help="the seed of the random inputs (default 0)")
    parser.add_argument("-o", "--output", metavar="NPZ", help="write the outputs to this .npz (output_0, output_1, ...)")
    parser.add_argument("--profile", action="store_true", help="print each backend's device statistics")
    parser.add_argument("--timeline", metavar="PNG|JSON",
                        help="draw the device timeline as a PNG at exactly this path (needs the plot extra: "
                             "pip install 'tirpat[plot]'), or write it as trace-event JSON for ui.perfetto.dev "
                             "if the name ends in .json")


def _seed(text: str) -> int:
    """A seed of numpy's generator: a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _timeline_paths(path: Path, names: list[str]) -> dict[str, Path]:
    """One PNG per backend with a timeline: ``path`` itself when there is one."""
    if len(names) == 1:
        return {names[0]: path}
    return {name: path.with_name(f"{path.stem}.{name}{path.suffix}") for name in names}


def _layers(model, backend: str) -> list[tuple[str, int, int]]:
    """The last call's layers on ``backend``: ``(what it computes, start cycle, end cycle)``."""
    return [(layer.what, layer.start, layer.end) for layer in model.layers if layer.backend == backend]


def _run(args: argparse.Namespace) -> int:
    import tirpat as tp
    from tirpat.model.backend import BackendNotFound

    from .arrays import describe_array, flat_outputs, output_names, random_inputs, read_inputs, write_outputs

    model_path = readable(args.model)
    inputs = {"MODEL": model_path, "--inputs": args.inputs}
    if args.output:
        check_output(args.output, "-o", ".npz", inputs)
    trace = args.timeline is not None and Path(args.timeline).suffix.lower() == ".json"
    if args.timeline:
        if not trace and importlib.util.find_spec("matplotlib") is None:
            raise CommandError("--timeline needs matplotlib: pip install 'tirpat[plot]' (or name a .json "
                               "file for a trace-event timeline)")
        check_output(args.timeline, "--timeline", ".json" if trace else ".png", inputs, {"-o": args.output})
        # a new name of another kind (t.svg) would get a PNG under it (a name without a suffix gets
        # one, at exactly that path; check_output refused an existing file of another kind, and a
        # device, /dev/stdout, takes what it is given)
        timeline = Path(args.timeline)
        if timeline.suffix.lower() not in ("", ".png", ".json") and not timeline.exists():
            raise CommandError(f"{args.timeline}: --timeline writes a .png (drawn) or a .json (trace events): "
                               "name the file so")
    if model_path.suffix.lower() in (".py", ".onnx") and not zipfile.is_zipfile(model_path):
        raise CommandError(f"{model_path}: a model to compile, not one 'tirpat compile' wrote; compile it first: "
                           f"tirpat compile {model_path} -t TARGET (it writes {model_path.with_suffix('.tirpat')})")
    try:
        model = tp.load(args.model)
    except BackendNotFound as err:         # the message says which backend and how to get it
        raise CommandError(str(err)) from err
    if args.timeline and not model.backends:        # said before the run, not after it
        raise CommandError(f"--timeline: nothing of {model_path.name} runs on a device (no partition was "
                           "offloaded when it was compiled), so there is no device timeline")
    if args.inputs:
        arrays = read_inputs(args.inputs, model.inputs)
    else:
        arrays = random_inputs(model.inputs, args.seed)
        shown = ", ".join(f"{spec.name}: {spec.dtype}{list(spec.shape)}" for spec in model.inputs)
        print(f"inputs: seeded random (--seed {args.seed}): {shown}")
    start = time.perf_counter()
    result = model(*arrays)
    seconds = time.perf_counter() - start
    outputs = flat_outputs(result)
    for name, value in zip(output_names(len(outputs)), outputs):
        print(describe_array(name, value))
    if args.output:
        write_outputs(args.output, outputs)
        print(f"wrote {args.output}")
    if args.profile:
        print(f"\nwall time {1e3 * seconds:.1f} ms (a first call: host code, device simulation and the recording "
              "of the device's streams, which later calls in a process replay)")
        print(f"\n{model.profile()}")
    if args.timeline:
        from tirpat.device.trace import has_timeline, save_trace

        drawn = [name for name, stats in model.stats.items()
                 if (has_timeline(stats) if trace else hasattr(getattr(stats, "timeline", None), "save_png"))]
        if not drawn:
            raise CommandError("--timeline: no backend of this model records a timeline "
                               f"(backends: {', '.join(b.name for b, _ in model.backends) or 'none'})")
        if trace:       # one file: a process per backend
            path = save_trace(args.timeline, {name: model.stats[name].timeline for name in drawn},
                              {name: _layers(model, name) for name in drawn}, title=Path(args.model).name)
            print(f"wrote {path}")
            return 0
        for name, path in _timeline_paths(Path(args.timeline), drawn).items():
            model.stats[name].timeline.save_png(path, title=f"{name}: {Path(args.model).name}",
                                                layers=_layers(model, name))
            print(f"wrote {path}")
    return 0


COMMAND = Command(
    name="run",
    help="run a compiled model on inputs (.npz) or random data, with device statistics",
    example="tirpat run mlp.tirpat --inputs in.npz -o out.npz --profile --timeline mlp.png",
    arguments=_arguments,
    run=_run,
    description=_DESCRIPTION,
)
