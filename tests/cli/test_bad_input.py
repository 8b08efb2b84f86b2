"""Bad input to ``tirpat compile``: one clear line on stderr naming the problem, exit 1, no traceback."""

import pytest

TARGET = "accel, llvm"


def onnx_model(path, op_type="Relu", domain=""):
    """A one-node float ONNX model ``y = op(x)`` written to ``path``."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(op_type, ["x"], ["y"], domain=domain)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def test_missing_model(tirpat, error_line, tmp_path):
    error_line(tirpat("compile", "nope.onnx", "-t", TARGET, cwd=tmp_path), "tirpat compile: error: nope.onnx: no such file")


def test_model_that_is_a_directory(tirpat_inline, error_line, tmp_path):
    (tmp_path / "m.onnx").mkdir()
    error_line(tirpat_inline("compile", "m.onnx", "-t", TARGET, cwd=tmp_path), "m.onnx: not a file")


def test_unreadable_onnx_model(tirpat_inline, error_line, tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"\x00\xffthis is not a protobuf" * 10)
    error_line(tirpat_inline("compile", "m.onnx", "-t", TARGET, cwd=tmp_path), "m.onnx: not an ONNX model")


def test_model_of_unknown_kind(tirpat_inline, error_line, tmp_path):
    (tmp_path / "m.txt").write_text("hello")
    error_line(tirpat_inline("compile", "m.txt", "-t", TARGET, cwd=tmp_path),
               "m.txt: a model is an .onnx file or a .py file defining a Relax IRModule named Module")


def test_bad_python_model(tirpat_inline, error_line, tmp_path):
    (tmp_path / "m.py").write_text("x = (\n")
    error_line(tirpat_inline("compile", "m.py", "-t", TARGET, cwd=tmp_path), "m.py:1: '(' was never closed")


@pytest.mark.parametrize("source, fragment", [
    ("raise RuntimeError('weights not found')\n", "m.py: running it raised RuntimeError: weights not found"),
    ("Model = 3\n", "m.py: defines no IRModule named Module"),
    ("Module = 3\n", "m.py: Module is a int, not a tvm.IRModule"),
    ("import tvm\nModule = tvm.IRModule()\n", "m.py: the IRModule has no Relax function 'main'"),
])
def test_bad_python_model_variants(tirpat_here, tmp_path, source, fragment):
    (tmp_path / "m.py").write_text(source)
    status, _, err = tirpat_here("compile", "m.py", "-t", TARGET)
    assert status == 1 and err.count("\n") == 1 and fragment in err, err


def test_malformed_target(tirpat_inline, error_line, example_mlp, tmp_path):
    error_line(tirpat_inline("compile", example_mlp, "-t", "accel -tile=x, llvm", cwd=tmp_path),
               "tirpat compile: error: backend 'accel': option 'tile' must be of type int, got 'x'")
    assert not list(tmp_path.iterdir()), "nothing is written for a bad target"


@pytest.mark.parametrize("target, fragment", [
    ("accel", "the last target must be a TVM target kind"),
    ("accel, nosuch, llvm", "unknown target 'nosuch'; registered backends: accel"),
    ("llvm, llvm", "'llvm' is given twice"),
    ("accel -tiles=32, llvm", "backend 'accel' has no option 'tiles'; its options are tile: int = 16"),
    ("accel,, llvm", "empty target"),
    ("", "the target string is empty"),
])
def test_malformed_target_variants(tirpat_here, example_mlp, target, fragment):
    status, out, err = tirpat_here("compile", example_mlp, "-t", target)
    assert status == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith("tirpat compile: error: ") and fragment in err, err


@pytest.mark.parametrize("target, fragment", [
    ("accel, llvm -mcpu=notacpu", "tirpat compile: error: option 'mcpu' of 'llvm': LLVM knows no CPU 'notacpu'"),
    ("accel -tile=7, llvm", "tirpat compile: error: accel -tile=7: tile must be a power of two, got 7"),
])
def test_a_value_the_host_or_a_backend_cannot_take(tirpat_inline, error_line, example_mlp, tmp_path, target, fragment):
    """TVM used to log a timestamped error for -mcpu and go on; -tile=7 named Config.tile, mid-compile."""
    error_line(tirpat_inline("compile", example_mlp, "-t", target, cwd=tmp_path), fragment)
    assert not list(tmp_path.iterdir()), "nothing is written for a bad target"


def test_an_op_tvm_cannot_import(tirpat_inline, error_line, tmp_path):
    onnx_model(tmp_path / "m.onnx", "FrobnicateTensor", domain="com.example")
    error_line(tirpat_inline("compile", "m.onnx", "-t", TARGET, cwd=tmp_path),
               "m.onnx: TVM cannot import this model", "FrobnicateTensor")


def test_an_op_tvm_cannot_compile(tirpat_inline, error_line, tmp_path):
    (tmp_path / "m.py").write_text(FMA_MODULE)
    error_line(tirpat_inline("compile", "m.py", "-t", TARGET, cwd=tmp_path),
               "tirpat compile: error: m.py: TVM failed to compile it: ", "R.ewise_fma(x, y, z)")
    assert not (tmp_path / "m.tirpat").exists()


# relax.ewise_fma has no legalization: TVM's VM codegen refuses it, and no backend takes it.
FMA_MODULE = """
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 4), "float32"), y: R.Tensor((4, 4), "float32"), z: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            w = R.ewise_fma(x, y, z)
            R.output(w)
        return w
"""


def test_output_in_a_missing_directory(tirpat_inline, error_line, example_mlp, tmp_path):
    error_line(tirpat_inline("compile", example_mlp, "-t", TARGET, "-o", "no/such/dir/m.tirpat", cwd=tmp_path),
               "no/such/dir/m.tirpat: no such directory")


def test_debug_shows_the_traceback(tirpat, tmp_path):
    (tmp_path / "m.py").write_text("raise RuntimeError('weights not found')\n")
    result = tirpat("compile", "m.py", "-t", TARGET, "--debug", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "weights not found" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("tirpat compile: error: m.py: running it raised")


def test_run_of_a_missing_model(tirpat_inline, error_line, tmp_path):
    error_line(tirpat_inline("run", "m.tirpat", cwd=tmp_path), "tirpat run: error: m.tirpat: no such file")


@pytest.mark.parametrize("target, fragment", [
    ("accel, cuda", "target 'accel, cuda': 'cuda' cannot be the host, the last target, which compiles what no "
                    "backend takes and runs the model here: a GPU: it runs the kernels a host launches"),
    ("accel, c", "'c' cannot be the host"),
    ("accel, llvm -mattr=+avx2, cuda", "'llvm' and 'cuda' are TVM target kinds; a composite target names one, last"),
])
def test_a_target_that_cannot_run_here_fails_before_compiling(tirpat_inline, error_line, example_mlp, tmp_path, target,
                                                              fragment):
    """Not at run time, after a compile that seemed to work: and with no TVM log lines."""
    error_line(tirpat_inline("compile", example_mlp, "-t", target, cwd=tmp_path), "tirpat compile: error: ", fragment)
    assert not list(tmp_path.iterdir())
