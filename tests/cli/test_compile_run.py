"""``tirpat compile`` then ``tirpat run`` on the bundled model, checked against TVM on llvm alone."""

import json
import os
import pty
import re
import runpy
import select
import subprocess
import time

import numpy as np
import pytest
import tvm
from tvm import relax

TARGET = "accel, llvm"


def reference(model_file, *inputs):
    """The module of ``model_file`` compiled by ``tvm.compile(mod, "llvm")`` and run on TVM's VM."""
    mod = runpy.run_path(str(model_file))["Module"]
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return flatten(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]))


def flatten(out) -> list:
    """A VM result (a tensor or nested tuples of them) as numpy arrays in order."""
    return [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [a for o in out for a in flatten(o)]


@pytest.fixture(scope="module")
def compiled(tirpat, workdir, example_mlp):
    result = tirpat("compile", example_mlp, "-t", TARGET, "-o", "mlp.tirpat", "--report", "mlp.json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    return result


def test_compile_prints_the_report_and_writes_it_as_json(compiled, workdir):
    assert compiled.stderr == "", "a compile in a pipe prints no progress"
    assert "accel" in compiled.stdout and "wrote mlp.tirpat and mlp.json" in compiled.stdout
    report = json.loads((workdir / "mlp.json").read_text())
    assert report["total_macs"] == 16 * 64 * 128 + 16 * 128 * 16
    assert sum(report["macs"].values()) == report["total_macs"]
    assert report["macs"]["accel"] == report["total_macs"]
    assert [p["backend"] for p in report["partitions"]] == ["accel", "accel"]
    assert (workdir / "mlp.tirpat").stat().st_size > 0


def test_compile_verbose_prints_every_partition_call(compiled, tirpat_here, workdir, example_mlp):
    """The default report names partitions by pattern; --verbose by function, one line a call, as the JSON."""
    status, out, err = tirpat_here("compile", example_mlp, "-t", TARGET, "-o", workdir / "verbose.tirpat", "--verbose")
    assert status == 0, err
    functions = [p["function"] for p in json.loads((workdir / "mlp.json").read_text())["partitions"]]
    assert [line.split(" (")[0] for line in out.splitlines() if line.startswith("  accel: ")] == \
        [f"  accel: {name}" for name in functions]
    assert not any(name in compiled.stdout for name in functions), compiled.stdout


def test_run_is_exact_against_tvm_on_llvm(compiled, tirpat, workdir, example_mlp):
    x = np.random.default_rng(7).integers(-128, 128, (16, 64), dtype=np.int8)
    np.savez(workdir / "in.npz", x=x)
    result = tirpat("run", "mlp.tirpat", "--inputs", "in.npz", "-o", "out.npz", "--profile", cwd=workdir)
    assert result.returncode == 0, result.stderr
    with np.load(workdir / "out.npz") as out:
        assert out.files == ["output_0"]
        np.testing.assert_array_equal(out["output_0"], reference(example_mlp, x)[0])
    assert "output_0: int32[16, 16]" in result.stdout
    profile = result.stdout.split("wall time")[1]
    assert "accel:" in profile and "cycles" in profile and "roofline" in profile
    for unit in ("load", "gemm", "alu", "store"):
        assert f"{unit} " in profile.split("utilisation:")[1]
    layers = re.findall(r"^\s+\d+\s+(\S.*?)\s+(\d+)$", profile, re.M)
    assert [what for what, _ in layers] == ["matmul + bias + ReLU + requantise", "matmul + bias"]
    total = int(re.search(r"^(\d+) cycles", profile, re.M).group(1))
    assert sum(int(cycles) for _, cycles in layers) == total, "the layers cover the device's cycles"


def test_run_without_inputs_feeds_seeded_random_ones(compiled, tirpat_inline, workdir):
    runs = [tirpat_inline("run", "mlp.tirpat", *seed, "-o", f"r{i}.npz", cwd=workdir)
            for i, seed in enumerate([[], [], ["--seed", "1"]])]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert "seeded random (--seed 0): x: int8[16, 64]" in runs[0].stdout
    outs = [np.load(workdir / f"r{i}.npz")["output_0"] for i in range(3)]
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


def test_timeline_png_labelled_by_layer(compiled, tirpat_inline, workdir):
    import matplotlib.image

    result = tirpat_inline("run", "mlp.tirpat", "--timeline", "t.png", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert (workdir / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # accel's four unit rows, the layer row and a two-line key (Timeline.save_png's layout, 100 dpi)
    assert matplotlib.image.imread(workdir / "t.png").shape[0] == round(100 * (0.5 * 5 + 1.1 + 0.18 * 2 + 0.2))


def test_timeline_json_is_a_trace_with_a_track_per_unit_and_layer(compiled, tirpat_here, workdir):
    """Chrome/Perfetto trace events: each unit's busy cycles are the device's (accel.Stats.busy),
    the layer events are the model's layers and cover the device's cycles."""
    import tirpat as tp

    status, out, err = tirpat_here("run", workdir / "mlp.tirpat", "--timeline", workdir / "t.json")
    assert status == 0 and out.rstrip().endswith(f"wrote {workdir / 't.json'}"), err
    trace = json.loads((workdir / "t.json").read_text())
    meta = {(e["name"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "accel: mlp.tirpat"}
    tracks = {tid: args["name"] for (name, tid), args in meta.items() if name == "thread_name"}
    assert tracks == {0: "layers", 1: "load", 2: "gemm", 3: "alu", 4: "store"}
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["pid"] == 1 and e["dur"] >= 0 for e in events)
    # the same model run here gives the device's own statistics to compare with
    model = tp.load(workdir / "mlp.tirpat")
    model(*[np.random.default_rng(0).integers(-128, 128, spec.shape, dtype=np.int8) for spec in model.inputs])
    stats = model.stats["accel"]
    busy = {tracks[tid]: sum(e["dur"] for e in events if e["tid"] == tid) for tid in range(1, 5)}
    assert busy == stats.busy and all(busy.values())
    layers = [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == 0]
    assert layers == [(layer.what, layer.start, layer.end) for layer in model.layers]
    assert layers[0][1] == 0 and layers[-1][2] == stats.cycles
    assert all(a[2] == b[1] for a, b in zip(layers, layers[1:])), "the layers follow one another"
    assert max(e["ts"] + e["dur"] for e in events) == stats.cycles


def test_timeline_writes_exactly_the_path_given(compiled, tirpat_inline, workdir):
    """A name without .png used to get one added (tl.png) while the command said "wrote tl"."""
    result = tirpat_inline("run", "mlp.tirpat", "--timeline", "tl", cwd=workdir)
    assert result.returncode == 0 and result.stdout.rstrip().endswith("wrote tl"), result.stderr
    assert (workdir / "tl").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (workdir / "tl.png").exists()


def test_a_negative_seed_is_a_usage_error_naming_it(compiled, tirpat_here, workdir):
    status, out, err = tirpat_here("run", workdir / "mlp.tirpat", "--seed", "-1")
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "tirpat run: error: argument --seed: expected a non-negative integer, got '-1'" in err


def test_a_model_whose_backend_is_not_registered_here(tirpat, error_line, tmp_path, monkeypatch):
    """Exported with a backend this process registered (not installed): running it elsewhere
    names the backend and how to get it, without a KeyError's quotes."""
    import warnings

    from tvm.relax.dpl import is_op, wildcard

    import tirpat as tp
    import tirpat.model.backend as backend_module

    class Ghost(tp.Backend):        # takes the add (its code stays TVM's: the backend has no rules)
        name = "ghost"

        def patterns(self, opts):
            return [("ghost.add", is_op("relax.add")(wildcard(), wildcard()))]

    # the registry's entry points loaded first: loaded into the copy, they would leave the real
    # registry marked as loaded yet without them once the copy is restored
    tp.backends()
    monkeypatch.setattr(backend_module, "_REGISTRY", dict(backend_module._REGISTRY))
    tp.register_backend(Ghost)
    mod = runpy.run_path(_write(tmp_path / "two.py", TWO_OUTPUTS))["Module"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)      # none of its rules matched
        tp.build(mod, tp.CompositeTarget([Ghost()], host="llvm")).export(tmp_path / "g.tirpat")
    line = error_line(tirpat("run", "g.tirpat", cwd=tmp_path),
                      "tirpat run: error: g.tirpat was compiled for a backend this process lacks: no backend named "
                      "'ghost' is registered (registered: accel): install the package that provides it (an installed "
                      "backend registers itself through the 'tirpat.backends' entry point), or register it with "
                      "tp.register_backend first")
    assert '"' not in line


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_timeline_without_matplotlib_says_which_extra(compiled, tirpat_here, workdir, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    status, _, err = tirpat_here("run", workdir / "mlp.tirpat", "--timeline", "t.png")
    assert status == 1 and err == ("tirpat run: error: --timeline needs matplotlib: pip install 'tirpat[plot]' "
                                   "(or name a .json file for a trace-event timeline)\n")


@pytest.mark.parametrize("arrays, fragment", [
    ({"x": np.zeros((4, 64), np.int8)}, "in.npz: input 'x' is int8[4, 64]; the model takes x: int8[16, 64]"),
    ({"x": np.zeros((16, 64), np.float32)}, "in.npz: input 'x' is float32[16, 64]; the model takes x: int8[16, 64]"),
    ({"y": np.zeros((16, 64), np.int8)}, "in.npz: no array for input 'x'; the model has no input 'y'"),
])
def test_wrong_inputs(compiled, tirpat_inline, error_line, workdir, monkeypatch, arrays, fragment):
    """In this process (the console script says the same: test_inputs_never_suggest_unpickling)."""
    np.savez(workdir / "in.npz", **arrays)
    monkeypatch.chdir(workdir)
    error_line(tirpat_inline("run", "mlp.tirpat", "--inputs", "in.npz", cwd=workdir), f"tirpat run: error: {fragment}")


def test_inputs_that_are_not_an_npz(compiled, tirpat_here, workdir):
    (workdir / "bad.npz").write_text("no")
    status, _, err = tirpat_here("run", workdir / "mlp.tirpat", "--inputs", workdir / "bad.npz")
    assert status == 1 and "bad.npz: not an .npz of arrays" in err and err.count("\n") == 1, err


def test_run_never_replaces_a_file_of_another_kind(compiled, tirpat_inline, error_line, workdir):
    """It used to turn keep.py into an .npz (-o) or a PNG (--timeline)."""
    (workdir / "keep.py").write_text("x = 1\n")
    error_line(tirpat_inline("run", "mlp.tirpat", "-o", "keep.py", cwd=workdir),
               "tirpat run: error: keep.py: exists and its name does not end in .npz; not replacing it "
               "(remove it, or choose another -o)")
    error_line(tirpat_inline("run", "mlp.tirpat", "--timeline", "keep.py", cwd=workdir),
               "tirpat run: error: keep.py: exists and its name does not end in .png; not replacing it")
    assert (workdir / "keep.py").read_text() == "x = 1\n"


def test_a_timeline_that_is_no_png_or_json_is_refused_before_the_run(compiled, tirpat_inline, error_line, workdir):
    """--timeline t.svg used to write a PNG named t.svg."""
    result = tirpat_inline("run", "mlp.tirpat", "--timeline", "t.svg", cwd=workdir)
    error_line(result, "tirpat run: error: t.svg: --timeline writes a .png (drawn) or a .json (trace events)")
    assert "inputs:" not in result.stdout and not (workdir / "t.svg").exists()


def test_inputs_from_a_zip_of_other_files_are_no_npz(compiled, tirpat_inline, error_line, workdir):
    """A .tirpat is a zip: numpy "loads" it as arrays named after its members (their bytes)."""
    error_line(tirpat_inline("run", "mlp.tirpat", "--inputs", "mlp.tirpat", cwd=workdir),
               "tirpat run: error: mlp.tirpat: a zip archive of other files than .npy arrays (")


@pytest.mark.parametrize("args, fragment", [
    (["-o", "mlp.tirpat"], "mlp.tirpat: -o names MODEL itself; choose another -o"),
    (["--inputs", "in_keep.npz", "-o", "in_keep.npz"], "in_keep.npz: -o names --inputs itself"),
    (["--timeline", "mlp.tirpat"], "mlp.tirpat: --timeline names MODEL itself"),
    (["-o", "same.npz", "--timeline", "same.npz"], "same.npz: --timeline and -o name the same file"),
    (["-o", "."], ".: is a directory; -o names the file to write"),
])
def test_run_outputs_are_checked_before_running(compiled, tirpat_here, workdir, args, fragment):
    np.savez(workdir / "in_keep.npz", x=np.zeros((16, 64), np.int8))
    before = {p.name: p.stat().st_mtime_ns for p in workdir.iterdir()}
    status, out, err = tirpat_here("run", workdir / "mlp.tirpat", *[workdir / a if a.endswith(("npz", "tirpat")) else a
                                                                    for a in args])
    assert status == 1 and out == "" and err.count("\n") == 1 and fragment in err, err
    assert {p.name: p.stat().st_mtime_ns for p in workdir.iterdir()} == before, "nothing is written"


def test_run_of_a_model_not_yet_compiled_says_compile_it(tirpat_inline, error_line, example_mlp, tmp_path):
    (tmp_path / "m.py").write_text(example_mlp.read_text())
    error_line(tirpat_inline("run", "m.py", cwd=tmp_path),
               "tirpat run: error: m.py: a model to compile, not one 'tirpat compile' wrote; compile it first: "
               "tirpat compile m.py -t TARGET (it writes m.tirpat)")


def test_inputs_never_suggest_unpickling(compiled, tirpat, tirpat_here, error_line, workdir):
    """numpy's advice to pass allow_pickle= is not for a user who gave the wrong file."""
    (workdir / "model.onnx").write_bytes(b"\x08\x07\x12\x04onnx" * 8)
    line = error_line(tirpat("run", "mlp.tirpat", "--inputs", "model.onnx", cwd=workdir),
                      "tirpat run: error: model.onnx: not an .npz of arrays (neither a zip archive of .npy arrays "
                      "nor an .npy file); the model takes x: int8[16, 64]")
    assert "pickle" not in line
    np.savez(workdir / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    status, _, err = tirpat_here("run", workdir / "mlp.tirpat", "--inputs", workdir / "objects.npz")
    assert status == 1 and "it holds arrays of Python objects, which are not loaded" in err and "allow_pickle" not in err


def test_run_of_a_file_that_is_not_a_compiled_model(tirpat_inline, error_line, tmp_path):
    (tmp_path / "junk.tirpat").write_text("not a model")
    error_line(tirpat_inline("run", "junk.tirpat", cwd=tmp_path), "tirpat run: error: junk.tirpat", "not a model exported by tirpat")


def test_target_options_reach_the_compiled_model(tirpat_inline, tmp_path, example_mlp):
    import tirpat as tp

    result = tirpat_inline("compile", example_mlp, "-t", "accel -tile=32, llvm -num-cores=1", "-o", "m.tirpat",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    model = tp.load(tmp_path / "m.tirpat")
    assert model.backends[0][1]["tile"] == 32 and model.host.export()["num-cores"] == 1
    x = np.random.default_rng(3).integers(-128, 128, (16, 64), dtype=np.int8)
    np.testing.assert_array_equal(model(x), reference(example_mlp, x)[0])
    stats = model.stats["accel"]
    assert stats.config.tile == 32 and stats.macs % (32 * 32 * 32) == 0, "the device ran with 32 x 32 x 32 tiles"


def read_all(fd: int, seconds: float) -> str:
    """Everything written to the pty ``fd`` until its writer closes it (bounded in time)."""
    chunks, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 1.0)[0]:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:             # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def test_a_compile_on_a_terminal_shows_progress(script, tmp_path, example_mlp):
    command, env = script
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([command, "compile", str(example_mlp), "-t", TARGET, "-o", "m.tirpat"], cwd=tmp_path,
                            env={**env, "TERM": "xterm", "COLUMNS": "160"}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    try:
        shown = read_all(controller, 600)
        stdout = proc.communicate(timeout=60)[0].decode()
    finally:
        proc.kill()
        os.close(controller)
    assert proc.returncode == 0, shown
    for step in ("reading", "compiling for accel, llvm", "writing m.tirpat"):
        assert step in shown, shown
    assert "accel" in stdout and "compiling for" not in stdout, "progress goes to the terminal, the report to stdout"


def matmul_integer_model(path, rng, batch=16):
    """An ONNX int8 layer as the importer meets it: MatMulInteger + bias + ReLU, input ``input.1``
    (``batch`` rows, or a named dynamic dimension)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = rng.integers(-128, 128, (64, 32), dtype=np.int8)
    b = rng.integers(-1000, 1000, (32,), dtype=np.int32)
    nodes = [helper.make_node("MatMulInteger", ["input.1", "W"], ["acc"]),
             helper.make_node("Add", ["acc", "B"], ["biased"]),
             helper.make_node("Relu", ["biased"], ["y"])]
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("input.1", TensorProto.INT8, [batch, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [batch, 32])],
                              initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return model


def test_an_onnx_model_is_exact_against_the_onnx_reference(tirpat, tmp_path):
    """Against onnx's numpy evaluation of the graph, which holds on every CPU (onnxruntime's int8
    MatMulInteger kernel on full-range operands may saturate on an x86 CPU without VNNI)."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(11)
    model = matmul_integer_model(tmp_path / "layer.onnx", rng)
    x = rng.integers(-128, 128, (16, 64), dtype=np.int8)
    np.savez(tmp_path / "in.npz", **{"input.1": x})      # the ONNX graph's own input name
    compiled = tirpat("compile", "layer.onnx", "-t", TARGET, "--report", "r.json", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    assert json.loads((tmp_path / "r.json").read_text())["macs"]["accel"] == 16 * 64 * 32
    result = tirpat("run", "layer.tirpat", "--inputs", "in.npz", "-o", "out.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = ReferenceEvaluator(model).run(None, {"input.1": x})[0]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["output_0"], expected)


def test_input_shapes_fix_an_onnx_models_dynamic_batch(tirpat_inline, tirpat_here, error_line, tmp_path):
    matmul_integer_model(tmp_path / "layer.onnx", np.random.default_rng(5), batch="N")
    status, _, err = tirpat_here("compile", "layer.onnx", "-t", TARGET, "-o", "dynamic.tirpat")
    assert status == 0 and "input.1 [N, 64] has dimensions not fixed" in err, err
    assert 'give them with --input-shapes "input.1:[N,64]", a number in place of each name' in err
    error_line(tirpat_inline("compile", "layer.onnx", "-t", TARGET, "--input-shapes", "x:[16,64]", cwd=tmp_path),
               "layer.onnx: --input-shapes names x, but the model's inputs are input.1")
    result = tirpat_inline("compile", "layer.onnx", "-t", TARGET, "--input-shapes", "input.1:[16,64]", "--report", "r.json",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["macs"]["accel"] == 16 * 64 * 32
    ran = tirpat_inline("run", "layer.tirpat", cwd=tmp_path)
    assert ran.returncode == 0 and "input_1: int8[16, 64]" in ran.stdout, ran.stderr


TWO_OUTPUTS = """
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(a: R.Tensor((3, 4), "float32"), b: R.Tensor((4,), "float32")):
        with R.dataflow():
            s = R.add(a, b)
            m = R.multiply(a, b)
            out = (s, (m, R.sum(s)))
            R.output(out)
        return out
"""


def test_outputs_are_written_in_order_on_a_host_only_target(tirpat_inline, tmp_path):
    (tmp_path / "two.py").write_text(TWO_OUTPUTS)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4), np.float32), rng.standard_normal(4, np.float32)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    compiled = tirpat_inline("compile", "two.py", "-t", "llvm", cwd=tmp_path)
    assert compiled.returncode == 0 and compiled.stderr == "", compiled.stderr
    result = tirpat_inline("run", "two.tirpat", "--inputs", "in.npz", "-o", "out.npz", "--profile", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no backend of this model keeps device statistics" in result.stdout
    with np.load(tmp_path / "out.npz") as out:
        assert out.files == ["output_0", "output_1", "output_2"]
        expected = reference(tmp_path / "two.py", a, b)
        for name, want in zip(out.files, expected):
            np.testing.assert_allclose(out[name], want, rtol=1e-6)


def test_a_timeline_of_a_model_nothing_of_which_was_offloaded_is_refused_before_the_run(
        tirpat, tirpat_inline, error_line, workdir, example_mlp):
    result = tirpat("compile", example_mlp, "-t", "llvm", "-o", "host_only.tirpat", cwd=workdir)
    assert result.returncode == 0, result.stderr
    result = tirpat_inline("run", "host_only.tirpat", "--timeline", "h.png", cwd=workdir)
    error_line(result, "tirpat run: error: --timeline: nothing of host_only.tirpat runs on a device")
    assert "inputs:" not in result.stdout and not (workdir / "h.png").exists()
