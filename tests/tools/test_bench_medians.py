"""bench/paramserver.py's medians of times to the target: a run that never reached it is the slowest."""

import math
import statistics

from bench.paramserver_parts.common import median_to_target, ratio_of


def test_a_run_that_never_reached_the_target_counts_as_slower_than_any_that_did():
    times = [5.0, float("nan"), float("nan"), 3.0, 4.0]
    assert median_to_target(times) == 5.0
    assert median_to_target([float("nan"), 2.0, 1.0]) == 2.0
    assert median_to_target([float("nan"), float("nan"), 1.0]) == math.inf
    assert (
        median_to_target([1.0, float("nan")]) == math.inf
    )  # the mean of the middle two: one never got there
    assert median_to_target([3.0, math.inf, 1.0, 2.0]) == 2.5


def test_the_raw_median_over_nan_can_come_out_below_the_true_median():
    times = [float("nan"), float("nan"), 1.0, 2.0, 3.0]  # sorted by time: 1, 2, 3, never, never
    assert statistics.median(times) == 1.0
    assert median_to_target(times) == 3.0
    assert median_to_target([*times, float("nan")]) == math.inf  # the middle two: 3 and never


def test_a_ratio_of_medians_where_one_side_never_got_there():
    assert ratio_of(2.0, 4.0) == 0.5
    assert ratio_of(math.inf, 4.0) == math.inf and not ratio_of(math.inf, 4.0) <= 0.75
    assert ratio_of(2.0, math.inf) == 0.0
    assert ratio_of(math.inf, math.inf) == math.inf
