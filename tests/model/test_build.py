"""tp.build on Relax models: bit-exact against tvm.compile(mod, "llvm"), reports, warnings."""

import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tirpat as tp
from models import epilogue_operand, mlp, random_inputs, reference


def assert_same(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def mlp_model():
    mod = mlp(8, 64, 32, 10)
    return mod, tp.build(mod, "accel, llvm")


def test_mlp_runs_on_accel_bit_exact(mlp_model):
    mod, model = mlp_model
    args = random_inputs(mod, np.random.default_rng(0))
    assert_same(model(*args), reference(mod, args))
    report = model.report.to_json()
    assert report["total_macs"] == 8 * 64 * 32 + 8 * 32 * 10
    assert report["macs"] == {"accel": report["total_macs"], "host": 0}
    assert [p["backend"] for p in report["partitions"]] == ["accel", "accel"]
    assert {tuple(p["epilogue"]) for p in report["partitions"]} == {(), ("bias", "ReLU", "requantise")}
    assert [h["op"] for h in report["on_host"]] == ["relax.sum"]
    assert "no backend" in report["on_host"][0]["reason"]
    json.dumps(report)
    stats = model.stats["accel"]
    assert stats.cycles > 0 and stats.instructions["GEMM"] >= 2
    # the device's MAC count includes the padding to whole tiles, and the report says so
    assert stats.macs > report["total_macs"]
    assert "padded to whole tiles" in str(model.report)


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 40), st.integers(1, 70), st.integers(1, 40), st.integers(1, 20))
def test_mlp_shapes(batch, features, hidden, classes):
    mod = mlp(batch, features, hidden, classes)
    model = tp.build(mod, "accel, llvm")
    args = random_inputs(mod, np.random.default_rng(batch * features))
    assert_same(model(*args), reference(mod, args))
    assert model.report.macs["host"] == 0


def test_constant_weights_are_relaid_out_at_compile_time():
    mod = mlp(8, 64, 32, 10)
    rng = np.random.default_rng(1)
    x, w, b, w2 = random_inputs(mod, rng)
    model = tp.build(mod, "accel, llvm", params={"w": w, "w2": w2})
    assert [i.name for i in model.inputs] == ["x", "b"]
    assert_same(model(x, b), reference(mod, [x, w, b, w2]))
    steps = [s for p in model.report.partitions for s in p.on_host]
    assert steps and all("at compile time" in why for _, why in steps)


def test_float_model_warns_and_strict_raises():
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Float:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 8), "float32")):
            with R.dataflow():
                y = R.matmul(x, w)
                R.output(y)
            return y

    with pytest.warns(tp.OffloadWarning, match=r"(?s)nothing was offloaded to accel:\n  y = relax.matmul: "
                      r"accel: float32 x float32 -> float32.*quantise it first: "
                      r"`tirpat quantize model.onnx --calibration calib.npz`"):  # as typed, quantize wants data
        model = tp.build(Float, "accel, llvm")
    args = random_inputs(Float, np.random.default_rng(2))
    np.testing.assert_allclose(model(*args), args[0] @ args[1], rtol=1e-5)
    assert model.report.macs == {"host": 4 * 16 * 8}
    assert "float32 x float32" in model.report.on_host[0].reason
    with pytest.raises(tp.OffloadError, match="float32 x float32") as error:
        tp.build(Float, "accel, llvm", strict=True)
    # the advice first: the command line shows an error as one line, cut when long
    assert str(error.value).startswith("nothing was offloaded to accel (the model's matmuls and convolutions compute "
                                       "in floating point; for an integer accelerator, quantise it first: ")


def test_params_must_name_an_input_and_match_it(mlp_model):
    mod, _ = mlp_model
    x, w, b, w2 = random_inputs(mod, np.random.default_rng(4))
    with pytest.raises(ValueError, match=r"has no input 'nope' \(its inputs: x, w, b, w2\)"):
        tp.build(mod, "accel, llvm", params={"nope": w})
    with pytest.raises(TypeError, match=r"params\['w'\]: the model's input w is int8, got int32"):
        tp.build(mod, "accel, llvm", params={"w": w.astype(np.int32)})
    with pytest.raises(ValueError, match=r"params\['w'\]: the model's input w has shape \(64, 32\), got \(32, 64\)"):
        tp.build(mod, "accel, llvm", params={"w": w.T})


def test_a_scalar_input():
    """A 0-d input reaches the VM as 0-d (np.ascontiguousarray made it 1-d)."""
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Scalar:
        @R.function
        def main(x: R.Tensor((16, 16), "int8"), w: R.Tensor((16, 16), "int8"), s: R.Tensor((), "int32")):
            with R.dataflow():
                y = R.right_shift(R.matmul(x, w, out_dtype="int32"), s)
                R.output(y)
            return y

    x, w = random_inputs(Scalar, np.random.default_rng(5))[:2]
    args = [x, w, np.array(3, np.int32)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)     # the scalar shift stays on the host
        for target in ("llvm", "accel, llvm"):
            assert_same(tp.build(Scalar, target)(*args), reference(Scalar, args))


def test_symbolic_shapes_leave_the_macs_unknown():
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Dynamic:
        @R.function
        def main(x: R.Tensor(("n", 16), "float32"), w: R.Tensor((16, 8), "float32")):
            with R.dataflow():
                y = R.matmul(x, w)
                R.output(y)
            return y

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)
        report = tp.build(Dynamic, "accel, llvm").report
    assert report.to_json()["uncounted"] == 1 and report.total_macs == 0
    assert "multiply-accumulates: unknown (1 matmul or convolution operators have symbolic shapes" in str(report)
    assert "no matmul" not in str(report)
    assert tp.ModelReport.from_json(report.to_json()) == report


def test_a_declined_reason_stays_with_its_operator():
    """FuseOpsByPattern tries conv + add, then the conv alone: the conv's reason is not the add's,
    nor is a uint8 matmul's the reason of the adds after it; the warning lists one per line."""
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Declined:
        @R.function
        def main(x: R.Tensor((1, 16, 8, 8), "int8"), w: R.Tensor((16, 2, 3, 3), "int8"),
                 r: R.Tensor((1, 16, 8, 8), "int32"), a: R.Tensor((8, 32), "uint8"), b: R.Tensor((32, 16), "uint8"),
                 c: R.Tensor((8, 16), "int32")):
            with R.dataflow():
                d = R.nn.conv2d(x, w, padding=1, groups=8, out_dtype="int32")       # grouped: accel declines
                e = R.add(d, r)
                u = R.matmul(a, b, out_dtype="int32")                               # uint8: accel declines
                s = R.add(R.add(u, c), c)
                R.output(e, s)
            return (e, s)

    with pytest.raises(tp.OffloadError) as error:
        tp.build(Declined, "accel, llvm", strict=True)
    lines = str(error.value).splitlines()
    assert lines[0] == "nothing was offloaded to accel:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["d = relax.nn.conv2d", "u = relax.matmul"]
    with pytest.warns(tp.OffloadWarning):
        report = tp.build(Declined, "accel, llvm").report
    reasons = {h.var: h.reason for h in report.on_host}
    assert "grouped convolution" in reasons["d"] and "uint8 x uint8" in reasons["u"]
    assert all("accel:" not in reasons[v] for v in reasons if v not in ("d", "u"))
    # the adds were part of the matches accel declined: they say so and point to the operator to blame
    assert reasons["e"] == "part of accel.conv2d, which accel declined: see d"
    assert [reasons[v] for v in reasons if v not in ("d", "e", "u")] == ["part of accel.matmul, which accel declined: see u"] * 2


def test_host_op_names_are_those_the_partitioned_module_prints():
    """A rewrite repeats names (lv5 five times); the report numbers them as TVMScript prints them."""
    import tvm
    from tvm import relax
    from tvm.script import relax as R

    ty = R.Tensor((4, 4), "int32")
    x, a, b, c = relax.Var("x", ty), relax.DataflowVar("t", ty), relax.DataflowVar("t", ty), relax.Var("t", ty)
    bindings = [relax.VarBinding(a, relax.op.add(x, x)), relax.VarBinding(b, relax.op.multiply(a, a)),
                relax.VarBinding(c, relax.op.subtract(b, x))]      # BlockBuilder would rename them t1, t2
    func = relax.Function([x], relax.SeqExpr([relax.DataflowBlock(bindings)], c), ty)
    mod = relax.transform.Normalize()(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    with pytest.warns(tp.OffloadWarning, match="nothing was offloaded to accel"):
        report = tp.build(mod, "accel, llvm").report
    assert [h.var for h in report.on_host] == ["t", "t_1", "t_2"]
    script = tp.partition(mod, "accel, llvm")["main"].script()
    assert all(f"{h.var}: R.Tensor" in script for h in report.on_host)


def test_wrong_inputs_are_named(mlp_model):
    mod, model = mlp_model
    args = random_inputs(mod, np.random.default_rng(3))
    with pytest.raises(TypeError, match="input x: expected dtype int8, got int32"):
        model(args[0].astype(np.int32), *args[1:])
    with pytest.raises(ValueError, match=r"input w: expected shape \(64, 32\), got \(32, 64\)"):
        model(args[0], args[1].T.copy(), *args[2:])
    with pytest.raises(TypeError, match="takes 4 inputs"):
        model(args[0])
    x, w, b, w2 = args
    assert_same(model(x, w2=w2, b=b, w=w), model(*args))
    with pytest.raises(TypeError, match=r"has no input 'y' \(its inputs: x, w, b, w2\)"):
        model(x, w, b, y=w2)
    with pytest.raises(TypeError, match="input 'x' given twice"):
        model(x, w, b, x=x)
    with pytest.raises(TypeError, match="missing input w2"):
        model(x, w=w, b=b)


def test_export_and_load_in_a_fresh_process(mlp_model, tmp_path):
    mod, model = mlp_model
    args = random_inputs(mod, np.random.default_rng(4))
    path = model.export(tmp_path / "mlp.tirpat")
    np.savez(tmp_path / "in.npz", *args)
    want = reference(mod, args)
    script = textwrap.dedent(f"""
        import numpy as np, tirpat as tp
        model = tp.load({str(path)!r})
        data = np.load({str(tmp_path / 'in.npz')!r})
        out = model(*[data[f"arr_{{n}}"] for n in range(len(data.files))])
        np.savez({str(tmp_path / 'out.npz')!r}, *out)
        print(model.stats["accel"].cycles, model.report.to_json()["macs"]["accel"])
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    cycles, macs = map(int, run.stdout.split())
    assert cycles > 0 and macs == model.report.total_macs
    got = np.load(tmp_path / "out.npz")
    assert_same(tuple(got[f"arr_{n}"] for n in range(2)), want)


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.tirpat"
    bad.write_text("not a model")
    with pytest.raises(ValueError, match="not a model exported by tirpat"):
        tp.load(bad)
    with pytest.raises(FileNotFoundError):
        tp.load(tmp_path / "missing.tirpat")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_resnet_style_cnn_bit_exact(layout):
    """conv + bias + requantise (ReLU folded into the clip), a residual block, a dense head."""
    from models import cnn

    mod = cnn(layout=layout)
    model = tp.build(mod, "accel, llvm")
    args = random_inputs(mod, np.random.default_rng(5))
    assert_same(model(*args), reference(mod, args))
    report = model.report.to_json()
    assert report["macs"]["host"] == 0 and report["macs"]["accel"] == report["total_macs"]
    epilogues = sorted(tuple(p["epilogue"]) for p in report["partitions"])
    assert epilogues == [(), ("bias", "requantise", "ReLU"), ("bias", "residual add", "ReLU", "requantise")]


@settings(max_examples=4, deadline=None)
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_batch_matmul(batch, m, n, k):
    from models import batch_matmul

    mod = batch_matmul(batch, m, n, k)
    model = tp.build(mod, "accel, llvm")
    args = random_inputs(mod, np.random.default_rng(m * n * k))
    assert_same(model(*args), reference(mod, args))
    assert model.report.macs == {"accel": batch * m * n * k, "host": 0}


def test_relax_frontend_nn_module():
    from models import nn_mlp

    mod = nn_mlp()
    model = tp.build(mod, "accel, llvm", entry="forward")
    args = random_inputs(mod, np.random.default_rng(6), "forward")
    vm_ref = __import__("tvm").relax.VirtualMachine(__import__("tvm").compile(mod, "llvm"), __import__("tvm").cpu())
    want = vm_ref["forward"](*[__import__("tvm").runtime.tensor(a) for a in args]).numpy()
    np.testing.assert_array_equal(model(*args), want)
    assert model.report.macs["host"] == 0
    assert any(p.epilogue == ["ReLU", "saturate to int8"] for p in model.report.partitions)


def test_onnx_matmulinteger_mlp_runs_on_accel():
    from tvm.relax.frontend.onnx import from_onnx
    from models import onnx_mlp

    mod = from_onnx(onnx_mlp(8, 64, 48, 10))
    model = tp.build(mod, "accel, llvm", strict=True)
    args = random_inputs(mod, np.random.default_rng(7))
    assert_same(model(*args), reference(mod, args))
    assert model.report.macs == {"accel": 8 * 64 * 48 + 8 * 48 * 10, "host": 0}
    # the int8 weights were transposed once, at compile time, not on every call
    steps = [why for p in model.report.partitions for _, why in p.on_host]
    assert steps and all("at compile time" in why for why in steps)


def test_ops_no_backend_takes_run_on_the_host_and_say_so():
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Mixed:
        @R.function
        def main(x: R.Tensor((16, 32), "int8"), w: R.Tensor((32, 16), "int8")):
            with R.dataflow():
                y = R.matmul(x, w, out_dtype="int32")
                f = R.astype(y, "float32")
                e = R.exp(R.multiply(f, R.const(0.001, "float32")))
                R.output(e)
            return e

    model = tp.build(Mixed, "accel, llvm")
    args = random_inputs(Mixed, np.random.default_rng(8))
    np.testing.assert_allclose(model(*args), reference(Mixed, args), rtol=1e-6)
    host = {h.op: h.reason for h in model.report.on_host}
    assert "relax.exp" in host and "no backend of the target takes relax.exp" in host["relax.exp"]
    assert model.report.macs == {"accel": 16 * 32 * 16, "host": 0}
    assert "on the host:" in str(model.report) and "exp" in str(model.report)


@pytest.mark.parametrize("op", ["add", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("left", [False, True])
def test_an_epilogue_operand_on_either_side(op, left):
    """bias + acc runs on accel as acc + bias does; an operand broadcast across the channels is
    declined on either side, with the reason."""
    mod = epilogue_operand(op, (40,), left)
    model = tp.build(mod, "accel, llvm", strict=True)
    args = random_inputs(mod, np.random.default_rng(3))
    assert_same(model(*args), reference(mod, args))
    assert model.report.macs["host"] == 0 and len(model.report.partitions[0].ops) == 2
    with pytest.raises(tp.OffloadError, match="broadcast across the channels"):
        tp.build(epilogue_operand(op, (20, 1), left), "accel, llvm", strict=True)


def test_partition_tags_each_group_with_its_backend():
    mod = mlp(8, 64, 32, 10)
    parts = tp.partition(mod, tp.parse_target("accel -tile=16, llvm"))
    tagged = [f for f in parts.functions.values() if (f.attrs or {}).get("tirpat.backend") == "accel"]
    assert len(tagged) == 2
    assert all(json.loads(str(f.attrs["tirpat.options"]))["tile"] == 16 for f in tagged)


def test_patterns_of_operators_the_model_does_not_call_are_not_tried(monkeypatch):
    # FuseOpsByPattern walks the model once per pattern: an MLP (matmuls, no convolution) is
    # partitioned without accel's convolution patterns, into the module all of them make
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_op, wildcard

    from tirpat.model import partition

    mod = mlp(8, 64, 32, 10)
    tried = []
    fuse = relax.transform.FuseOpsByPattern
    monkeypatch.setattr(relax.transform, "FuseOpsByPattern",
                        lambda patterns, **options: tried.append({p.name for p in patterns}) or fuse(patterns, **options))
    parts = tp.partition(mod, "accel, llvm")
    assert "accel.matmul" in tried[0] and "accel.conv2d" not in tried[0]
    # an alternative requires what both of its sides call
    add, mul = (is_op(op)(wildcard(), wildcard()) for op in ("relax.add", "relax.multiply"))
    assert partition._required_ops(is_op("relax.nn.relu")(add | mul), {}) == {"relax.nn.relu"}
    monkeypatch.setattr(partition, "_required_ops", lambda pattern, memo: frozenset())     # every pattern tried
    tvm.ir.assert_structural_equal(tp.partition(mod, "accel, llvm"), parts)


def test_model_demo_runs_and_labels_layers(capsys):
    from accel.demo import main

    assert main(["--model", "--size", "8", "--channels", "16", "--blocks", "1"]) == 0
    out = capsys.readouterr().out
    assert "bit-exact vs tvm.compile(mod, 'llvm'): yes" in out
    assert "on accel: " in out and "(100.0%)" in out
    assert "layer |" in out and "conv2d + bias + residual add" in out


def test_layers_cover_the_device_cycles():
    from accel.demo import resnet_model

    model = tp.build(resnet_model(8, 16, 1), "accel, llvm")
    model(np.zeros((1, 8, 8, 3), np.int8))
    layers = model.layers
    assert [l.what.split(" + ")[0] for l in layers] == ["conv2d", "conv2d", "conv2d", "matmul"]
    assert layers[0].start == 0 and layers[-1].end == model.stats["accel"].cycles
    assert all(a.end == b.start for a, b in zip(layers, layers[1:]))


def test_the_demo_models_head_is_a_gemm_accel_runs_in_whole_tiles():
    # a flattened image as one row of a dense head was padded to a tile's height (25x the
    # MACs); the head is one dense layer per pixel, its logits summed on the host
    from accel.demo import resnet_model

    mod = resnet_model(size=8, channels=16, blocks=0, classes=16)
    model = tp.build(mod, "accel, llvm", strict=True)
    args = random_inputs(mod, np.random.default_rng(2))
    assert_same(model(*args), reference(mod, args))
    (head,) = [p for p in model.report.partitions if p.pattern == "accel.matmul"]
    assert head.macs == 8 * 8 * 16 * 16 and head.device_macs == head.macs
