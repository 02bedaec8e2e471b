"""The queue estimate's online calibration (slo/predict/calibration.py): exact quantiles
per band of estimate, the newest ratios of any band until a band has its own, priors
before that, and a change of regime in one band that leaves the others alone."""

from __future__ import annotations

import pytest

from slo.predict.calibration import MIN_SAMPLES, PRIOR_P50, PRIOR_P90, QueueCalibration


def test_priors_hold_until_enough_requests_are_served():
    cal = QueueCalibration()
    for _ in range(MIN_SAMPLES - 1):
        cal.observe(0.2, 0.1)
    assert cal.quantiles(0.1) == (0.1 * PRIOR_P50, 0.1 * PRIOR_P90)


def test_a_band_gives_its_exact_median_and_90th_percentile_ratio():
    cal = QueueCalibration()
    for k in range(1, 41):  # ratios 0.1 .. 4.0 on 0.1 s estimates
        cal.observe(k / 100, 0.1)
    # sorted ratios: p50 the 20th of 40 (2.0), p90 the 37th (3.7)
    assert cal.quantiles(0.1) == pytest.approx((0.2, 0.37))
    assert cal.describe()["bands"][0] == {"up_to_s": 0.25, "samples": 40,
                                          "p50_ratio": pytest.approx(2.0),
                                          "p90_ratio": pytest.approx(3.7)}


def test_a_band_without_its_own_ratios_borrows_the_newest_of_any():
    cal = QueueCalibration()
    for _ in range(MIN_SAMPLES):
        cal.observe(0.3, 0.1)  # ratio 3 on small estimates
    assert cal.quantiles(0.5) == pytest.approx((1.5, 1.5))  # mid band: not its own yet
    assert cal.quantiles(5.0) == pytest.approx((15.0, 15.0))


def test_a_queue_regime_in_long_estimates_does_not_inflate_short_ones():
    """Policies off: long queues, estimates of seconds that come out 2x; then policies
    on: 80 ms estimates that come out 1.1x. The short band is calibrated by its own."""
    cal = QueueCalibration()
    for _ in range(200):
        cal.observe(8.0, 4.0)
    for _ in range(MIN_SAMPLES):
        cal.observe(0.088, 0.08)
    assert cal.quantiles(0.08) == pytest.approx((0.088, 0.088))
    assert cal.quantiles(4.0) == pytest.approx((8.0, 8.0))
    assert cal.describe()["samples"] == 200 + MIN_SAMPLES


@pytest.mark.parametrize("ttft, estimate", [(None, 0.1), (0.1, None), (0.0, 0.1),
                                            (0.1, 0.0), (-1.0, 0.1), (0.1, -1.0)])
def test_requests_without_both_figures_are_not_counted(ttft, estimate):
    cal = QueueCalibration()
    for _ in range(MIN_SAMPLES):
        cal.observe(ttft, estimate)
    assert cal.describe()["samples"] == 0
    assert cal.quantiles(1.0) == (PRIOR_P50, PRIOR_P90)
