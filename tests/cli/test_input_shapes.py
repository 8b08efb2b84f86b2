"""``--input-shapes`` sets only what an ONNX model leaves open: contradicting a fixed
dimension, a wrong rank, a dimension that is not positive, or two values for one named
dimension is one clear line, before TVM imports anything; an open dimension, once set,
compiles and runs like onnxruntime."""

import numpy as np
import pytest

TARGET = "accel, llvm"


def write_model(path, inputs):
    """``y = Relu(x0 + x1 + ...)`` over float inputs ``{name: dims}`` (ints fixed, strings named)."""
    import onnx
    from onnx import TensorProto, helper

    names = list(inputs)
    nodes, total = [], names[0]
    for n, name in enumerate(names[1:]):
        nodes.append(helper.make_node("Add", [total, name], [f"s{n}"]))
        total = f"s{n}"
    nodes.append(helper.make_node("Relu", [total], ["y"]))
    first = inputs[names[0]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, first)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_contradicting_a_fixed_dimension_is_an_error(tirpat_inline, error_line, tmp_path):
    """It used to compile for the given shape (exit 0): a model onnxruntime refuses to run so."""
    write_model(tmp_path / "m.onnx", {"x": [1, 3, 8]})
    result = tirpat_inline("compile", "m.onnx", "-t", TARGET, "--input-shapes", "x:[1,3,16]", cwd=tmp_path)
    error_line(result, "tirpat compile: error: m.onnx: --input-shapes x:[1,3,16] contradicts the model: dimension 2 "
                       "of input x is 8 in the model, 16 given ([1, 3, 8]: x's shape is fixed: leave it out of "
                       "--input-shapes)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("inputs, shapes, fragment", [
    ({"x": ["N", 3, 8]}, "x:[2,3,9]", "dimension 2 of input x is 8 in the model, 9 given ([N, 3, 8]: only its open "
                                      "dimension (0) can be set)"),
    ({"x": [1, 3, 8]}, "x:[1,3]", "--input-shapes x:[1,3] has 2 dimensions; the model's input x has 3: [1, 3, 8]"),
    ({"x": ["N", 8]}, "x:[1,2,8]", "has 3 dimensions; the model's input x has 2: [N, 8]"),
    ({"x": ["N", 8], "z": ["N", 8]}, "x:[2,8] z:[3,8]",
     "--input-shapes gives the model's dimension 'N' two values: 2 (x dimension 0) and 3 (z dimension 0)"),
])
def test_shapes_the_model_contradicts(tirpat_here, tmp_path, inputs, shapes, fragment):
    write_model(tmp_path / "m.onnx", inputs)
    status, out, err = tirpat_here("compile", "m.onnx", "-t", TARGET, "--input-shapes", shapes)
    assert status == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith("tirpat compile: error: m.onnx: ") and fragment in err, err


@pytest.mark.parametrize("shapes, fragment", [
    ("x:[0,3,8]", "x:[0,3,8]: dimension 0 of x is 0; a dimension is a positive integer"),
    ("x:[1,-3,8]", "x:[1,-3,8]: dimension 1 of x is -3; a dimension is a positive integer"),
])
def test_a_dimension_that_is_not_positive_is_a_usage_error(tirpat_inline, error_line, tmp_path, shapes, fragment):
    write_model(tmp_path / "m.onnx", {"x": ["N", 3, 8]})
    error_line(tirpat_inline("compile", "m.onnx", "-t", TARGET, "--input-shapes", shapes, cwd=tmp_path),
               "tirpat compile: error: argument --input-shapes: ", fragment, status=2)


def test_an_open_dimension_set_compiles_and_runs_like_onnxruntime(tirpat, tmp_path):
    from tirpat.testing.ort_session import exact_session

    write_model(tmp_path / "m.onnx", {"x": ["batch", 5], "z": ["batch", 5]})
    compiled = tirpat("compile", "m.onnx", "-t", TARGET, "--input-shapes", "x:[3,5] z:[3,5]", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    rng = np.random.default_rng(1)
    x, z = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    np.savez(tmp_path / "in.npz", x=x, z=z)
    ran = tirpat("run", "m.tirpat", "--inputs", "in.npz", "-o", "out.npz", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    expected, = exact_session(tmp_path / "m.onnx").run(None, {"x": x, "z": z})
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["output_0"], expected, rtol=1e-6)
