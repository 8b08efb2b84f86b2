"""The Backend API: typed options, the registry, and entry-point discovery."""

import doctest
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tirpat as tp
import tirpat.model.backend as backend_module


@pytest.fixture(autouse=True)
def private_registry(monkeypatch):
    """Backends registered here stay here: other tests list the registered ones."""
    tp.backends()     # entry points loaded into the shared registry first
    monkeypatch.setattr(backend_module, "_REGISTRY", dict(backend_module._REGISTRY))


class Minimal(tp.Backend):
    """Only a name and options: it registers and offloads nothing."""

    name = "backend-test-minimal"
    options = {"lanes": tp.Option(int, 16, help="vector lanes"), "mode": tp.Option(("wrap", "saturate"), "wrap")}


def test_a_backend_with_only_a_name_registers_and_offloads_nothing():
    tp.register_backend(Minimal)
    b = tp.backends()["backend-test-minimal"]
    assert isinstance(b, Minimal)
    opts = b.resolve()
    assert opts == {"lanes": 16, "mode": "wrap"}
    assert b.patterns(opts) == [] and b.rules(opts) is None
    assert all(b.passes(phase, opts) == [] for phase in tp.Phase)
    sentinel = object()
    assert b.schedule(sentinel, opts) is sentinel
    with b.session(opts) as entered:
        assert entered is None
    assert sorted(p.name for p in tp.Phase) == ["AFTER_REWRITE", "BEFORE_REWRITE", "POST_PARTITION", "PRE_PARTITION"]


def test_options_are_typed_and_filled_in():
    b = Minimal()
    assert b.resolve({"lanes": "32", "mode": "saturate"}) == {"lanes": 32, "mode": "saturate"}
    lanes = b.resolve({"lanes": np.int64(8)})["lanes"]
    assert lanes == 8 and type(lanes) is int
    assert tp.Option(float, 1).convert(np.float32(0.5), "scale") == 0.5
    assert tp.Option(bool, True).convert("off", "fast") is False
    assert b.describe_options() == "lanes: int = 16, mode: one of 'wrap', 'saturate' = 'wrap'"


@pytest.mark.parametrize("given, error, message", [
    ({"lanes": 2.5}, TypeError, r"option 'lanes' must be of type int, got float 2.5"),
    ({"lanes": True}, TypeError, r"option 'lanes' must be of type int, got bool True"),
    ({"lanes": "many"}, ValueError, r"option 'lanes' must be of type int, got 'many'"),
    ({"mode": "round"}, ValueError, r"option 'mode' must be one of 'wrap', 'saturate', got 'round'"),
    ({"width": 4}, ValueError, r"backend 'backend-test-minimal' has no option 'width'; its options are "
                               r"lanes: int = 16, mode: one of 'wrap', 'saturate' = 'wrap'"),
])
def test_a_wrong_option_is_a_clear_error_naming_option_and_type(given, error, message):
    with pytest.raises(error, match=message):
        Minimal().resolve(given)


def test_ill_formed_declarations_fail_where_they_are_written():
    with pytest.raises(TypeError, match="type must be int, float, bool, str or a tuple of allowed strings"):
        tp.Option(list, [])
    with pytest.raises(TypeError, match="option 'default' must be of type int"):
        tp.Option(int, "sixteen".encode())
    with pytest.raises(TypeError, match="a choice type must be a non-empty tuple of strings"):
        tp.Option((), "x")
    with pytest.raises(TypeError, match=r"Bad.options\['lanes'\] must be a tp.Option"):
        class Bad(tp.Backend):
            name = "bad"
            options = {"lanes": 16}


def test_the_registry_takes_classes_and_instances_and_refuses_clashes():
    class Inst(tp.Backend):
        name = "backend-test-instance"

    instance = Inst()
    tp.register_backend(instance)
    assert tp.backends()["backend-test-instance"] is instance
    tp.register_backend(Inst)                      # the same class again: a no-op
    assert tp.backends()["backend-test-instance"] is instance

    class Impostor(tp.Backend):
        name = "backend-test-instance"

    with pytest.raises(ValueError, match="a backend named 'backend-test-instance' is already registered"):
        tp.register_backend(Impostor)
    with pytest.raises(ValueError, match="must be a target-string name"):
        tp.register_backend(type("Spaced", (tp.Backend,), {"name": "two words"}))
    with pytest.raises(ValueError, match="must be a target-string name"):
        tp.register_backend(type("Nameless", (tp.Backend,), {}))
    # a backend named llvm would make every "..., llvm" a target with no host
    with pytest.raises(ValueError, match="Shadow.name 'llvm' is a TVM target kind; a backend needs a name of its own"):
        tp.register_backend(type("Shadow", (tp.Backend,), {"name": "llvm"}))
    assert "llvm" not in tp.backends() and tp.parse_target("llvm").host.kind.name == "llvm"
    with pytest.raises(TypeError, match="takes a tp.Backend subclass or instance"):
        tp.register_backend(object)
    with pytest.raises(KeyError, match="no backend named 'nosuch' is registered"):
        backend_module.lookup("nosuch")


def test_a_scalar_constant_reaches_the_schedule_as_an_immediate_no_block_reads():
    """``x - 5``: the 5 is a 0-d constant Relax passes to the partition; the backend's
    schedule sees ``x[i, j] - 5`` and blocks that read ``x`` alone (a read of the inlined
    parameter would send a schedule's cache_read after a buffer nothing uses)."""
    from tvm import relax, s_tir
    from tvm.relax.dpl import is_op, wildcard

    class Subtract(tp.Backend):
        name = "backend-test-subtract"

        def patterns(self, opts):
            return [("backend-test-subtract.subtract", is_op("relax.subtract")(wildcard(), wildcard()))]

    tp.register_backend(Subtract)
    x = relax.Var("x", relax.TensorType((3, 20), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.subtract(x, relax.const(5, "int8")))
        bb.emit_func_output(out)
    (_, name, _, func), = tp.partition_functions(bb.get(), "backend-test-subtract, llvm")
    assert name == "backend-test-subtract" and "x[v_ax0, v_ax1] - T.int8(5)" in func.script()
    sch = s_tir.Schedule(func)
    (block,) = [b for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert [r.source.name for r in sch.get(block).reads] == ["x"]


_DISCOVER = textwrap.dedent("""
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tirpat as tp
        found = tp.backends()
    print(json.dumps({"names": sorted(found), "options": found["vendor-npu"].resolve(),
                      "warnings": [str(w.message) for w in caught if "tirpat" in str(w.message)]}))
""")


def test_pip_installed_backends_are_found_through_the_entry_point_group(tmp_path):
    """A vendor's distribution on sys.path registers itself; a broken entry point warns and
    hides nothing else."""
    (tmp_path / "vendor_npu.py").write_text(textwrap.dedent("""
        import tirpat as tp

        class VendorNpu(tp.Backend):
            name = "vendor-npu"
            options = {"cores": tp.Option(int, 2)}
    """))
    (tmp_path / "vendor_broken.py").write_text("raise ImportError('the vendor SDK is not installed')\n")
    info = tmp_path / "vendor_npu-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-npu\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tirpat.backends]\n"
        "broken = vendor_broken:Npu\n"
        "missing = vendor_npu:NoSuchClass\n"
        "vendor-npu = vendor_npu:VendorNpu\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _DISCOVER], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"vendor-npu", "accel"} <= set(result["names"])
    assert result["options"] == {"cores": 2}
    assert len(result["warnings"]) == 2
    broken = next(w for w in result["warnings"] if "'broken'" in w)
    assert "vendor_broken:Npu" in broken and "ImportError: the vendor SDK is not installed" in broken
    assert any("'missing'" in w and "AttributeError" in w for w in result["warnings"])


def test_docstring_examples():
    result = doctest.testmod(backend_module, extraglobs={"tp": tp}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
