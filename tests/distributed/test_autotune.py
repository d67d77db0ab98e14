"""The bucket-size tuner (distnn.distributed.autotune): which sizes it tries on a real
model's layout, in which order and for how many steps, and that it keeps the size with the
lowest median step time (one process: the agreement is the identity)."""
from __future__ import annotations

import pytest

from distnn.distributed import BucketTuner, LocalComm, make_buckets
from distnn.models import get_model


@pytest.fixture(scope="module")
def resnet_layout():
    model = get_model("resnet20", input_shape=(3, 32, 32), num_classes=10, rng=0)
    ranges = list(model.layer_ranges())
    return lambda mb: make_buckets(ranges, 4, mb)


def drive(tuner: BucketTuner, step_ms: dict[float, float], noisy_step: int | None = None):
    """Steps whose duration is that of the size in use; returns the sizes it switched to
    and the number of steps until the choice."""
    now, size, switches, n = 0.0, tuner.trials[0], [], 0
    while not tuner.done:
        n += 1
        now += step_ms[size] / 1e3 * (50 if n == noisy_step else 1)
        change = tuner.step(now)
        if change is not None:
            switches.append(change)
            size = change
        assert n < 1000
    return switches, n


def test_each_distinct_layout_is_tried_once_starting_with_the_current_size(resnet_layout):
    tuner = BucketTuner(resnet_layout, LocalComm(), start_mb=4.0)
    layouts = [tuple((lo, hi) for lo, hi, _ in resnet_layout(mb)) for mb in tuner.trials]
    assert tuner.trials[0] == 4.0 and len(set(layouts)) == len(layouts)
    # resnet20 holds 0.27 M parameters (1.1 MB in float32): 4, 16 and 64 MiB are one bucket
    assert 16.0 not in tuner.trials and 64.0 not in tuner.trials
    assert tuner.buckets[tuner.trials.index(0.0)] == 12  # one per top-level layer (block)


def test_the_fastest_size_is_kept_and_the_steps_are_counted(resnet_layout):
    tuner = BucketTuner(resnet_layout, LocalComm(), start_mb=4.0, steps=4, warmup_steps=2)
    times = {mb: 100.0 - 10 * i for i, mb in enumerate(tuner.trials)}
    fastest = min(times, key=times.get)
    times[tuner.trials[1]] = 10.0  # the fastest, tried second: the tuner must come back
    switches, steps = drive(tuner, times, noisy_step=5)  # one slow step in the warm-up
    assert switches == [*tuner.trials[1:], tuner.trials[1]]
    assert tuner.chosen == tuner.trials[1] != fastest
    assert steps == tuner.steps_needed == 2 + len(tuner.trials) * 5
    assert tuner.medians[1] == pytest.approx(0.010)
    line = tuner.report()
    assert line.startswith(f"autotune: bucket_size_mb {tuner.trials[1]:g} (") and "10.0 ms" in line
    assert tuner.step(1e9) is None  # done: no more changes


def test_a_median_ignores_one_slow_step(resnet_layout):
    tuner = BucketTuner(resnet_layout, LocalComm(), start_mb=4.0, steps=3, warmup_steps=0)
    times = {mb: 50.0 for mb in tuner.trials}
    times[tuner.trials[-1]] = 40.0
    drive(tuner, times, noisy_step=2)  # the start size's first timed step: 50x slower
    assert tuner.chosen == tuner.trials[-1]


def test_bad_arguments_are_named(resnet_layout):
    with pytest.raises(ValueError, match="steps >= 1"):
        BucketTuner(resnet_layout, LocalComm(), start_mb=4.0, steps=0)
