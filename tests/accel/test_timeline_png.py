"""accel's timeline PNG, with and without layer labels."""

import matplotlib.image

from accel.hw.stats import Event, Timeline


def test_layers_add_a_labelled_row_and_a_key(tmp_path):
    timeline = Timeline([Event(0, "load", "LOAD", 0, 40), Event(1, "gemm", "GEMM", 40, 100),
                         Event(2, "store", "STORE", 100, 120)])
    plain = matplotlib.image.imread(timeline.save_png(tmp_path / "plain.png"))
    labelled = matplotlib.image.imread(timeline.save_png(
        tmp_path / "layers.png", layers=[("conv2d + bias", 0, 70), ("matmul + ReLU", 70, 120)]))
    assert labelled.shape[1] == plain.shape[1]
    # one more row (0.5 inch) and a two-line key (0.56 inch), at 100 dpi
    assert labelled.shape[0] - plain.shape[0] == 106
