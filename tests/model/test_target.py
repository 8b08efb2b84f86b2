"""Composite target strings: TVMC's tokenising cases, typing, errors, and the round trip."""

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tvm.target import Target

import tirpat as tp
import tirpat.model.target as target_module
from tirpat.model.target import TargetSpec, tokenize


class Unit(tp.Backend):
    """A backend with one option of every type a tp.Option can have."""

    name = "target-test-unit"
    options = {
        "lanes": tp.Option(int, 16, help="vector lanes"),
        "scale": tp.Option(float, 1.0),
        "fast": tp.Option(bool, False),
        "label": tp.Option(str, "x"),
        "mode": tp.Option(("wrap", "saturate"), "wrap"),
    }


class Other(tp.Backend):
    name = "target-test-other"


tp.register_backend(Unit)
tp.register_backend(Other)


def names_and_options(text):
    return [(s.name, s.options) for s in tokenize(text)]


# -- TVMC's tokenising cases (tests/python/driver/tvmc/test_target.py before its removal) ------

@pytest.mark.parametrize("text, expected", [
    ("foo -opt1=value1 --flag, bar -opt2=value2",
     [("foo", {"opt1": "value1", "flag": True}), ("bar", {"opt2": "value2"})]),
    ("foo -opt1=+value1 --flag, bar -opt2=test,+v",
     [("foo", {"opt1": "+value1", "flag": True}), ("bar", {"opt2": "test,+v"})]),
    ("foo -opt1=v,a,l,u,e,1 --flag", [("foo", {"opt1": "v,a,l,u,e,1", "flag": True})]),
    ("foo -opt1='v, a, l, u, e', bar", [("foo", {"opt1": "v, a, l, u, e"}), ("bar", {})]),
    ('foo -opt1="v, a, l, u, e", bar', [("foo", {"opt1": "v, a, l, u, e"}), ("bar", {})]),
    ("foo-bar1 -opt-1=t-e-s-t, baz", [("foo-bar1", {"opt-1": "t-e-s-t"}), ("baz", {})]),
    ("foo -option1=+v1.0x,+value,+bar", [("foo", {"option1": "+v1.0x,+value,+bar"})]),
    ("foo -option1='+v1.0x,+value'", [("foo", {"option1": "+v1.0x,+value"})]),
    ('foo -option1="+v1.0x,+value"', [("foo", {"option1": "+v1.0x,+value"})]),
    ("llvm -device=arm_cpu -mattr=+fp", [("llvm", {"device": "arm_cpu", "mattr": "+fp"})]),
    ("compute-library, llvm -device=arm_cpu", [("compute-library", {}), ("llvm", {"device": "arm_cpu"})]),
    ("accel,llvm", [("accel", {}), ("llvm", {})]),
    ("  a  -x='' ,b  ", [("a", {"x": ""}), ("b", {})]),
])
def test_tokenize_tvmc_cases(text, expected):
    assert names_and_options(text) == expected


def test_tokenize_keeps_each_piece_raw_text():
    assert [s.raw for s in tokenize("foo -a='1, 2' --f, bar")] == ["foo -a='1, 2' --f", "bar"]
    assert tokenize("foo") == [TargetSpec("foo")]


@pytest.mark.parametrize("text, message", [
    ("", "the target string is empty"),
    ("   ", "the target string is empty"),
    (", llvm", "empty target before the first comma"),
    ("accel,, llvm", "empty target after target 1 ('accel')"),
    ("accel, ", "a trailing comma"),
    ("accel; llvm", "unexpected ';'"),
    ("-tile=3, llvm", "must start with its name"),
    ("accel vecunit, llvm", "unexpected 'vecunit' after 'accel'"),
    ("accel -tile, llvm", "needs a value (-tile=VALUE), or write --tile for a flag"),
    ("accel -tile=, llvm", "has no value"),
    ("accel -tile='3, llvm", "unterminated ' quote"),
    ("accel -tile='3'x, llvm", "unexpected 'x' after the quoted value"),
    ("accel -tile=a'b', llvm", "a quote may only start the value"),
    ("accel -tile=3 -tile=4, llvm", "option 'tile' given twice"),
    ("accel -=3, llvm", "an option needs a name"),
])
def test_tokenize_errors_say_what_and_where(text, message):
    with pytest.raises(tp.TargetError, match="position|empty") as err:
        tokenize(text)
    assert message in str(err.value)


# -- semantics ---------------------------------------------------------------------------

def test_the_design_example():
    t = tp.parse_target("accel -tile=16, target-test-unit, llvm -mcpu=sapphirerapids -mattr=+avx512f,+avx512vnni")
    assert [b.name for b, _ in t.backends] == ["accel", "target-test-unit"]
    assert t.backends[0][1]["tile"] == 16 and t.backends[1][1] == Unit().resolve()
    assert isinstance(t.host, Target)
    host = t.host.export()
    assert host["kind"] == "llvm" and host["mcpu"] == "sapphirerapids"
    assert list(host["mattr"]) == ["+avx512f", "+avx512vnni"]


def test_options_convert_to_their_declared_types():
    t = tp.parse_target("target-test-unit -lanes=32 -scale=0.5 --fast -label='a, b' -mode=saturate, "
                        "llvm -num-cores=4 --fast-math -mattr='+avx2, +fma'")
    assert t.options("target-test-unit") == {"lanes": 32, "scale": 0.5, "fast": True, "label": "a, b",
                                             "mode": "saturate"}
    host = t.host.export()
    assert host["num-cores"] == 4 and host["fast-math"] is True and list(host["mattr"]) == ["+avx2", "+fma"]
    assert tp.parse_target("accel -tile=32, llvm").options("accel")["tile"] == 32
    assert tp.parse_target("target-test-unit -fast=false, llvm").options("target-test-unit")["fast"] is False


def test_dashes_and_underscores_are_one_spelling_in_option_names():
    t = tp.parse_target("accel -dma-bytes-per-cycle=128, llvm -num_cores=2")
    assert t.options("accel")["dma_bytes_per_cycle"] == 128 and t.host.export()["num-cores"] == 2


def test_a_backend_name_that_is_also_a_tvm_kind_is_the_backend(monkeypatch):
    class C(tp.Backend):
        name = "c"

    registered = {**tp.backends(), "c": C()}
    monkeypatch.setattr(target_module, "backends", lambda: registered)
    t = tp.parse_target("c, llvm")
    assert [b.name for b, _ in t.backends] == ["c"] and t.host.kind.name == "llvm"


@pytest.mark.parametrize("text, meant", [
    ("accel, llvm, cuda", "did you mean 'accel, llvm'?"),
    ("accel, llvm -mattr=+avx2, cuda", "did you mean 'accel, llvm -mattr=+avx2'?"),
    ("accel, c, llvm -mcpu=skylake", "did you mean 'accel, llvm -mcpu=skylake'?"),
])
def test_two_tvm_kinds_are_refused_saying_what_tvmc_meant(text, meant):
    """TVMC read 'device, host'; tirpat's devices are backends, so a second kind is a mistake
    (often a typo), never silently a host for something else."""
    with pytest.raises(tp.TargetError) as err:
        tp.parse_target(text)
    device, host = [s.name for s in tokenize(text)][-2:]
    message = str(err.value)
    assert f"'{device}' and '{host}' are TVM target kinds; a composite target names one, last: the host" in message
    assert f"TVMC read two as a device ('{device}') and its host ('{host}'); tirpat does not" in message
    assert message.endswith(meant)


@pytest.mark.parametrize("host, why", [
    ("cuda", "a GPU: it runs the kernels a host launches, it is not one"),
    ("opencl", "a GPU"),
    ("c", "TVM's C source generator has no Relax pipeline"),
    ("hexagon", "a Hexagon DSP"),
    ("composite", "not a CPU target that runs the model's host code here"),
])
def test_a_host_that_cannot_build_and_run_here_is_refused(host, why):
    with pytest.raises(tp.TargetError) as err:
        tp.parse_target(f"accel, {host}")
    assert f"target 'accel, {host}': '{host}' cannot be the host" in str(err.value)
    assert why in str(err.value) and str(err.value).endswith("hosts here: llvm")
    for given in (host, {"kind": host}):           # from Python as well
        with pytest.raises(tp.TargetError, match=f"'{host}' cannot be the host"):
            tp.CompositeTarget(["accel"], host=given)
    with pytest.raises(tp.TargetError, match="'c' cannot be the host"):
        tp.CompositeTarget(host=Target({"kind": "c"}))


def test_host_kinds_covers_every_tvm_kind():
    kinds = target_module.host_kinds()
    assert set(kinds) == set(Target.list_kinds())
    assert [k for k, why in kinds.items() if why is None] == ["llvm"]


@pytest.mark.parametrize("text, message", [
    ("llvm, llvm", "'llvm' is given twice"),
    ("accel, accel, llvm", "'accel' is given twice"),
    ("c, opencl, llvm", "'c', 'opencl' and 'llvm' are TVM target kinds; a composite target names one"),
    ("invalidtarget", "unknown target 'invalidtarget'; registered backends: accel, "),
    ("accel", "the last target must be a TVM target kind"),
    ("accel -tile=x, llvm", "option 'tile' must be of type int, got 'x'"),
    ("accel --tile, llvm", "option 'tile' must be of type int, got bool True"),
    ("target-test-unit -mode=fast, llvm", "must be one of 'wrap', 'saturate', got 'fast'"),
    ("target-test-unit -fast=maybe, llvm", "option 'fast' must be of type bool"),
    ("llvm -num-cores=x", "option 'num-cores' of 'llvm' must be of type int, got 'x'"),
    ("llvm -mattr='+a,,+b'", "an empty item"),
    # LLVM ignores a feature it does not know, with a line on stderr per code generator it makes
    ("llvm -mattr=+avx2,+foo", "option 'mattr' of 'llvm': LLVM knows no feature '+foo' for "),
    ("llvm -mattr=+avx512bwx", "LLVM knows no feature '+avx512bwx' for x86_64"),
    ("llvm -mattr=+avx512bwx", "(did you mean 'avx512bw'"),
    ("llvm -host=c", "has no option 'host'"),
])
def test_semantic_errors(text, message):
    with pytest.raises(tp.TargetError) as err:
        tp.parse_target(text)
    assert message in str(err.value)


def test_unknown_names_list_what_is_registered():
    with pytest.raises(tp.TargetError) as err:
        tp.parse_target("nosuch, llvm")
    message = str(err.value)
    assert "registered backends: accel, target-test-other, target-test-unit" in message
    assert "TVM target kinds: " in message and "llvm" in message


def test_unknown_options_list_the_known_ones_with_types():
    with pytest.raises(tp.TargetError, match=r"backend 'target-test-unit' has no option 'width'; its options are "
                       r"lanes: int = 16, scale: float = 1.0, fast: bool = False, label: str = 'x', "
                       r"mode: one of 'wrap', 'saturate' = 'wrap'"):
        tp.parse_target("target-test-unit -width=3, llvm")
    with pytest.raises(tp.TargetError, match=r"TVM target 'llvm' has no option 'mcpus'; its options are .*"
                       r"mattr: list of str, mcpu: str"):
        tp.parse_target("llvm -mcpus=x")


def test_a_value_that_swallowed_the_next_target_gets_a_hint():
    with pytest.raises(tp.TargetError, match=r"write '-tile=16, llvm' to start a new target"):
        tp.parse_target("accel -tile=16,llvm")


def test_target_error_is_a_value_error():
    assert issubclass(tp.TargetError, ValueError)


# -- from Python and back to text ----------------------------------------------------------------

def test_constructed_from_python():
    t = tp.CompositeTarget([("accel", {"tile": 32}), Unit, (Other(), {})], host="llvm -mcpu=skylake")
    assert [b.name for b, _ in t.backends] == ["accel", "target-test-unit", "target-test-other"]
    assert str(t) == "accel -tile=32, target-test-unit, target-test-other, llvm -mcpu=skylake"
    assert t == tp.parse_target(str(t))
    assert tp.CompositeTarget(host={"kind": "llvm", "mattr": ["+avx2"]}).host.export()["mattr"][0] == "+avx2"
    assert tp.parse_target(t) is t
    assert len({t, tp.parse_target(str(t)), tp.parse_target("accel, llvm")}) == 2, "equal targets hash alike"
    with pytest.raises(tp.TargetError, match="no backend named 'nosuch'"):
        tp.CompositeTarget(["nosuch"])
    with pytest.raises(tp.TargetError, match="'accel' is given twice"):
        tp.CompositeTarget(["accel", "accel"])
    with pytest.raises(tp.TargetError, match="the host must be a TVM target kind"):
        tp.CompositeTarget(host="accel")
    with pytest.raises(tp.TargetError, match="must be of type int"):
        tp.CompositeTarget([("accel", {"tile": "big"})])


plain_text = st.text(st.characters(codec="ascii", exclude_characters="\x00\r\n\t\x0b\x0c"), max_size=12)
unit_options = st.fixed_dictionaries({}, optional={
    "lanes": st.integers(-2**40, 2**40),
    "scale": st.floats(allow_nan=False, width=64),
    "fast": st.booleans(),
    "label": plain_text.filter(lambda s: not ("'" in s and '"' in s)),
    "mode": st.sampled_from(["wrap", "saturate"]),
})
host_options = st.fixed_dictionaries({}, optional={
    "mcpu": st.sampled_from(["skylake", "sapphirerapids", "x86-64"]),
    "mattr": st.lists(st.sampled_from(["+avx2", "+fma", "-sse4.1", "+bmi2"]), min_size=1, max_size=3, unique=True),
    "num-cores": st.integers(1, 64),
    "fast-math": st.booleans(),
})


@given(unit_options, host_options, st.booleans())
def test_printing_round_trips(unit, host, unit_first):
    entries = [(Unit, unit), "accel"] if unit_first else ["accel", (Unit, unit)]
    t = tp.CompositeTarget(entries, host={"kind": "llvm", **host})
    again = tp.parse_target(str(t))
    assert again == t
    assert again.options("target-test-unit") == Unit().resolve(unit)
    assert str(again) == str(t)


def test_docstring_examples():
    result = doctest.testmod(target_module, extraglobs={"tp": tp}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# -- values each of the right type that the host or a backend cannot take -------------------------

def test_an_mcpu_llvm_does_not_know_is_refused():
    """TVM takes any -mcpu, logs an error line and generates code for a generic CPU."""
    from tvm.target import codegen

    with pytest.raises(tp.TargetError, match=r"option 'mcpu' of 'llvm': LLVM knows no CPU 'notacpu' for "):
        tp.parse_target("accel, llvm -mcpu=notacpu")
    with pytest.raises(tp.TargetError, match=r"did you mean 'skylake-avx512'"):
        tp.parse_target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx")
    assert tp.parse_target(f"llvm -mcpu={codegen.llvm_get_system_cpu()}").host.export()["mcpu"]
    assert tp.parse_target("llvm -mcpu=native").host.export()["mcpu"] == "native"
    assert tp.parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72").host.export()["mcpu"] == "cortex-a72"


class Checked(tp.Backend):
    """A backend whose options must agree: lanes a multiple of width."""

    name = "target-test-checked"
    options = {"lanes": tp.Option(int, 16), "width": tp.Option(int, 4)}

    def check_options(self, opts):
        if opts["lanes"] % opts["width"]:
            raise ValueError(f"Device.lanes={opts['lanes']} is not a multiple of width={opts['width']}")


def test_check_options_errors_name_the_options_given():
    with pytest.raises(tp.TargetError, match=r"^target-test-checked -lanes=6: Device.lanes=6 is not a multiple"):
        tp.CompositeTarget([(Checked(), {"lanes": 6})])
    with pytest.raises(tp.TargetError, match=r"^target-test-checked -lanes=6 -width=4: "):
        tp.CompositeTarget([(Checked(), {"lanes": 6, "width": 4})])
    with pytest.raises(tp.TargetError, match=r"^accel -tile=7: tile must be a power of two, got 7$"):
        tp.parse_target("accel -tile=7, llvm")
    with pytest.raises(tp.TargetError, match=r"^accel -acc_bytes=100: acc_bytes=100 must be a multiple of 64 bytes"):
        tp.parse_target("accel -acc-bytes=100, llvm")
    assert tp.CompositeTarget([(Checked(), {"lanes": 8})]).options("target-test-checked")["lanes"] == 8
