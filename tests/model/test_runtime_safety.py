"""A compiled model's runtime under threads, foreign backend options and failed calls."""

import threading

import numpy as np
import pytest

import tirpat as tp
from tirpat import device
from models import in_threads, mlp, random_inputs, reference


@pytest.fixture(scope="module")
def mlp_model():
    mod = mlp(8, 32, 16, 10)
    return mod, tp.build(mod, "accel, llvm")


# ---------------------------------------------------------------------- threads
def test_threads_calling_one_model_get_what_single_threaded_calls_get(mlp_model):
    """4 threads x 25 calls on one CompiledModel, each thread its own inputs, all started
    together: every result equals the single-threaded one (which equals llvm's)."""
    mod, model = mlp_model
    assert model._storages is not None      # each thread's VM allocates its own (tirpat.model.storages)
    inputs = [random_inputs(mod, np.random.default_rng(seed)) for seed in range(4)]
    want = [model(*args) for args in inputs]
    layers = [(layer.function, layer.backend) for layer in model.layers]
    assert [backend for _, backend in layers] == ["accel", "accel"]
    for args, w in zip(inputs, want):
        for got, ref in zip(w, reference(mod, args)):
            np.testing.assert_array_equal(got, ref)
    results = {k: [] for k in range(4)}

    def worker(k):
        for _ in range(25):
            out = model(*inputs[k])
            results[k].append(all(np.array_equal(g, w) for g, w in zip(out, want[k])))
            stats = model.stats["accel"]        # this thread's last call: a whole one
            assert stats.cycles > 0
            # its partitions, heard by the sessions this call entered: not another thread's too
            assert [(layer.function, layer.backend) for layer in model.layers] == layers

    in_threads(worker, 4)
    assert {k: (len(r), all(r)) for k, r in results.items()} == {k: (25, True) for k in range(4)}


def test_a_thread_that_made_no_call_sees_the_last_finished_call(mlp_model):
    mod, model = mlp_model
    args = random_inputs(mod, np.random.default_rng(7))
    worker = threading.Thread(target=model, args=args)
    worker.start()
    worker.join(timeout=120)
    seen = []
    reader = threading.Thread(target=lambda: seen.append((model.stats, model.layers)))
    reader.start()
    reader.join(timeout=60)
    stats, layers = seen[0]
    assert stats["accel"].cycles > 0 and [layer.backend for layer in layers] == ["accel", "accel"]


# ---------------------------------------------------------------------- options travel with code
def test_code_built_for_one_accel_config_refuses_a_session_of_another(mlp_model):
    """tvm.compile with tp.relax_pipeline("accel -tile=32, llvm"), run directly: bit-exact in a
    session of tile=32; refused, naming both tiles, in one of tile=16 or in the default one."""
    import accel
    import tvm
    from tvm import relax

    mod, _ = mlp_model
    args = random_inputs(mod, np.random.default_rng(3))
    executable = tvm.compile(mod, "llvm", relax_pipeline=tp.relax_pipeline("accel -tile=32, llvm"),
                             tir_pipeline=tp.TIR_PIPELINE)
    run = relax.VirtualMachine(executable, tvm.cpu())["main"]
    tensors = [tvm.runtime.tensor(a) for a in args]
    with accel.Session(accel.Config(tile=32)) as s:
        got = run(*tensors)
    for g, want in zip(got, reference(mod, args)):
        np.testing.assert_array_equal(g.numpy(), want)
    assert s.stats.cycles > 0
    with accel.Session() as s:
        with pytest.raises(device.OptionsMismatch, match="built for accel with tile=32, but the current accel "
                                                            "session \\(Session\\) has tile=16"):
            run(*tensors)
    assert s.stats.cycles == 0 and s.pending == 0
    with pytest.raises(device.OptionsMismatch, match="this thread's default accel session"):
        run(*tensors)
    with accel.Session(accel.Config(tile=32, issue_overhead=5)):     # any option the session says counts
        with pytest.raises(device.OptionsMismatch, match="issue_overhead=4, but .* has issue_overhead=5"):
            run(*tensors)


def test_a_partition_begins_its_device_work_by_its_marker_alone():
    """The partition's marker begins accel's session (options checked, a failed call's leftovers
    discarded): the planner's own ``accel.begin()`` is not called as well, one callback less
    per partition and call; the results stay bit-exact."""
    import accel  # noqa: F401 - registers accel's runtime functions
    import tvm

    mod = mlp(4, 32, 16, 10)
    args = random_inputs(mod, np.random.default_rng(4))
    begun = []
    begin = tvm.get_global_func("accel.begin")
    # compiled code finds the function by name at its first call: counted from then on
    tvm.register_global_func("accel.begin", lambda: begun.append(1) or begin(), override=True)
    try:
        model = tp.build(mod, "accel, llvm")
        got = model(*args)
    finally:
        tvm.register_global_func("accel.begin", begin, override=True)
    for g, want in zip(got if isinstance(got, (list, tuple)) else [got], reference(mod, args)):
        np.testing.assert_array_equal(np.asarray(g), want)
    assert model.stats["accel"].cycles > 0 and begun == []


def test_a_model_file_whose_manifest_gives_other_options_is_refused(mlp_model, tmp_path):
    import json
    import zipfile

    mod, model = mlp_model
    args = random_inputs(mod, np.random.default_rng(4))
    good, bad = tmp_path / "m.tirpat", tmp_path / "m8.tirpat"
    model.export(good)
    with zipfile.ZipFile(good) as z:
        files = {name: z.read(name) for name in z.namelist()}
    manifest = json.loads(files["manifest.json"])
    manifest["backends"][0]["options"]["tile"] = 8
    files["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(bad, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    for got, want in zip(tp.load(good)(*args), reference(mod, args)):
        np.testing.assert_array_equal(got, want)
    loaded = tp.load(bad)
    with pytest.raises(device.OptionsMismatch, match=f"{bad}: its manifest gives accel tile=8, but its library "
                                                        f"was compiled for tile=16: the manifest was edited"):
        loaded(*args)
