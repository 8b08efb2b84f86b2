"""``CompiledModel.export`` and ``tp.load`` in Python: TVM's "Scope Saving/Loaded" debug lines
are kept off stderr (other lines pass), a device is refused as an export path, and a call
with the wrong number of inputs says so in good English."""

import os

import numpy as np
import pytest
import tvm
from tvm import relax

import tirpat as tp
from tirpat.model.tvm_noise import filtered_native_stderr


@pytest.fixture(scope="module")
def model_with_scoped_constant():
    """``x + c`` where the constant ``c`` carries a virtual device: TVM's VM executable then
    records its memory scope, and logs one line per scope when it is saved or loaded."""
    vdevice = relax.VDevice(tvm.target.Target("llvm"), 0, "global")
    const = tvm.ir.expr.GenericConst(tvm.runtime.tensor(np.arange(8, dtype=np.float32)),
                                     relax.TensorType([8], "float32", vdevice=vdevice))
    x = relax.Var("x", relax.TensorType([8], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, const))
        bb.emit_func_output(y)
    mod = bb.get()
    mod.update_global_info("vdevice", [vdevice])
    return tp.build(mod, "llvm")


def test_export_and_load_print_no_tvm_scope_lines(model_with_scoped_constant, tmp_path, capfd):
    capfd.readouterr()
    model_with_scoped_constant.export(tmp_path / "m.tirpat")
    loaded = tp.load(tmp_path / "m.tirpat")
    out, err = capfd.readouterr()
    assert "Scope" not in err and out == "", err
    np.testing.assert_array_equal(loaded(np.ones(8, np.float32)), np.arange(8, dtype=np.float32) + 1)


def test_the_filter_passes_every_other_line(capfd):
    with filtered_native_stderr():
        os.write(2, b"[12:00:00] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:global\n")
        os.write(2, b"a line that matters\n")
    assert capfd.readouterr().err == "a line that matters\n"


def test_export_to_a_device_is_refused(model_with_scoped_constant):
    with pytest.raises(ValueError, match="/dev/null: not a regular file, so a model cannot be written there"):
        model_with_scoped_constant.export("/dev/null")


def test_a_call_with_the_wrong_number_of_inputs(model_with_scoped_constant):
    with pytest.raises(TypeError, match=r"^the model takes 1 input \(x\), got 2$"):
        model_with_scoped_constant(np.ones(8, np.float32), np.ones(8, np.float32))
