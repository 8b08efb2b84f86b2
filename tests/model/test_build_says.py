"""What a build says about its tuning records, and the roofline share of a run's profile."""

import math

import numpy as np
import pytest

import tirpat as tp
from models import matmul, mlp, random_inputs, reference


@pytest.fixture(scope="module")
def tuned_mlp(tmp_path_factory):
    records = tmp_path_factory.mktemp("records")
    mod = mlp(batch=16, features=64, hidden=48, classes=10)
    result = tp.tune(mod, "accel, llvm", trials=4, records=records, strategy="replay-trace", batch=2)
    return mod, records, sum(1 for t in result.tasks if t.trials)


def test_the_report_counts_the_partitions_scheduled_from_records(tuned_mlp):
    mod, records, tuned = tuned_mlp
    model = tp.build(mod, "accel, llvm", records=records)
    said = model.report.records
    assert tuned >= 1 and (said["path"], said["applied"], said["partitions"]) == (str(records), tuned, 2)
    assert sum(p.from_records for p in model.report.partitions) == tuned
    assert list(said["misses"].values()) == ["no record of this computation (not tuned, or the records are "
                                             "another model's)"] * (2 - tuned)
    assert f"tuning records {records}: {tuned} of 2 partitions scheduled from a record" in str(model.report)
    assert tp.ModelReport.from_json(model.report.to_json()).records == model.report.records
    args = random_inputs(mod, np.random.default_rng(0))
    for got, want in zip(model(*args), reference(mod, args), strict=True):
        np.testing.assert_array_equal(got, want)
    assert tp.build(mod, "accel, llvm").report.records is None


def test_records_that_apply_nowhere_warn_and_say_why(tuned_mlp):
    mod, records, _ = tuned_mlp
    with pytest.warns(UserWarning, match=r"(?s)no partition was scheduled from the tuning records .*0 of 2 .*"
                      r"its records were tuned for accel -tile=16, this build is for accel -tile=32"):
        model = tp.build(mod, "accel -tile=32, llvm", records=records)
    assert model.report.records["applied"] == 0 and len(model.report.records["misses"]) == 2
    with pytest.warns(UserWarning, match=r"no record of this computation \(not tuned, or the records are another model's\)"):
        tp.build(mlp(batch=4, features=32, hidden=16, classes=8), "accel, llvm", records=records)


def test_the_profile_headline_is_the_share_of_the_models_own_macs():
    """With 32 x 32 tiles an 8 x 64 x 32 MLP is padded: the device executes more MACs than
    the model has; the headline counts the model's, the device line the executed ones."""
    mod = mlp(8, 64, 32, 10)
    model = tp.build(mod, "accel -tile=32, llvm")
    model(*random_inputs(mod, np.random.default_rng(0)))
    stats, macs = model.stats["accel"], model.report.macs["accel"]
    assert stats.macs > macs
    head, device, _ = stats.summary(model_macs=macs).splitlines()
    roof = math.ceil(macs / stats.config.gemm_macs_per_cycle)
    assert head == (f"{stats.cycles} cycles, roofline {roof} ({100 * roof / stats.cycles:.0f}%) for the model's "
                    f"{macs} MACs at {stats.config.gemm_macs_per_cycle} a cycle")
    assert device.startswith(f"device: {stats.macs} MACs executed (padding to whole tiles included), "
                             f"roofline {stats.roofline_cycles} ")


def test_symbolic_shapes_point_at_sizes_not_at_quantisation():
    """Nothing is offloaded from a model with an open batch: the hint is to fix its shapes
    (the model may well be quantised already); a float model of static shapes is told to quantise."""
    from tvm import tirx

    with pytest.warns(tp.OffloadWarning) as caught:
        tp.build(matmul(tirx.Var("n", "int64"), 16, 8, "float32"), "accel, llvm")
    said = "\n".join(str(w.message) for w in caught)
    assert "the model's shapes are symbolic" in said and "--input-shapes" in said and "quantise it first" not in said
    with pytest.warns(tp.OffloadWarning, match="quantise it first"):
        tp.build(matmul(4, 16, 8, "float32"), "accel, llvm")
