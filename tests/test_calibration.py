"""The prediction bands' arithmetic (provided_code/metrics/calibration.py) against a plain
recomputation: the order statistics of a split-conformal band, its coverage on exchangeable
residuals, too few patients, the coverage tables, and the binomial range a calibrated cell's
observed coverage lies in."""

import itertools

import math

import numpy as np
import pandas as pd
import pytest

from provided_code.errors import UserError
from provided_code.metrics.calibration import (
    CoverageError,
    band,
    binomial_counts,
    binomial_range,
    check_coverage,
    coverage_rows,
    coverage_summary,
    exact_coverage,
    largest_coverage,
    outside_probability,
    patients_needed,
    range_check,
    ranks,
    sorted_residuals,
)


def _plain_band(predicted, residuals, coverage):
    """The band by its definition, without the module: the smallest upper residual bound u among the
    residuals such that a new residual exceeds it with probability at most α/2 (its rank among
    n + 1 above the count of residuals ≤ u), and likewise for the lower one."""
    values = sorted(residuals)
    n, alpha = len(values), 1 - coverage
    upper = next((v for k, v in enumerate(values, start=1) if (n + 1 - k) / (n + 1) <= alpha / 2 + 1e-12), None)
    lower = next((v for k, v in reversed(list(enumerate(values, start=1))) if k / (n + 1) <= alpha / 2 + 1e-12), None)
    if upper is None or lower is None:
        return None
    return max(0.0, predicted - upper), predicted - lower


@pytest.mark.parametrize("n", [4, 5, 19, 30, 55, 56, 100])
@pytest.mark.parametrize("coverage", [0.5, 0.6, 0.68, 0.8, 0.9, 0.95])
def test_the_band_is_that_of_its_definition(n, coverage):
    residuals = np.random.default_rng(n).normal(1.0, 3.0, n)
    assert band(40.0, np.sort(residuals), coverage) == _plain_band(40.0, residuals, coverage)


def test_ninety_percent_of_55_patients_takes_the_second_smallest_and_second_largest_residual():
    residuals = np.arange(1.0, 56.0)  # r(k) = k
    assert ranks(55, 0.9) == (2, 54)  # ⌈56 × 0.95⌉ = 54
    assert band(100.0, residuals, 0.9) == (100.0 - 54.0, 100.0 - 2.0)
    assert exact_coverage(55, 0.9) == pytest.approx(52 / 56)  # (m − j)/(n + 1)
    assert ranks(55, 0.68) == (8, 48) and exact_coverage(55, 0.68) == pytest.approx(40 / 56)


def test_neither_bound_is_below_zero_gy():
    assert band(1.0, [-1.0, 0.0, 5.0, 6.0, 7.0], 0.6) == (0.0, 2.0)
    assert band(1.0, [3.0, 4.0, 5.0, 6.0, 7.0], 0.6) == (0.0, 0.0)  # a model that always overdoses here


def test_on_exchangeable_residuals_the_band_holds_as_often_as_it_says():
    """Many draws of n + 1 exchangeable residuals (normal, skewed, with a bias): the new one lies in
    the band of the other n about (m − j)/(n + 1) of the time; never below the nominal."""
    rng = np.random.default_rng(7)
    for n, coverage in ((19, 0.9), (55, 0.9), (55, 0.68), (30, 0.5)):
        draws = 20000
        residuals = rng.gamma(2.0, 2.0, (draws, n + 1)) - 3.0  # skewed, biased
        calibration, new = np.sort(residuals[:, :n], axis=1), residuals[:, n]
        j, m = ranks(n, coverage)
        held = (calibration[:, j - 1] <= new) & (new <= calibration[:, m - 1])
        # 20,000 draws: the binomial standard error is at most 0.0036; 5 of them
        assert held.mean() == pytest.approx(exact_coverage(n, coverage), abs=0.018)
        assert exact_coverage(n, coverage) >= coverage


@pytest.mark.parametrize("coverage", [0.5, 0.68, 0.9, 0.95, 0.99])
def test_too_few_patients_give_no_band_and_the_number_needed_is_the_first_that_does(coverage):
    needed = patients_needed(coverage)
    assert ranks(needed - 1, coverage) is None and band(10.0, np.zeros(needed - 1), coverage) is None
    assert ranks(needed, coverage) is not None
    assert largest_coverage(needed) >= coverage - 1e-12 > largest_coverage(needed - 1)


def test_90_percent_needs_19_patients_and_4_give_at_most_60_percent():
    assert patients_needed(0.9) == 19 and largest_coverage(4) == pytest.approx(0.6)


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1, "x", None, math.nan])
def test_a_coverage_that_is_no_fraction_is_refused_in_one_line(value):
    with pytest.raises(CoverageError, match=r"Invalid `band`\. Expected a nominal coverage between 0 and 1 .*"
                                            r"Received: band=") as caught:
        check_coverage(value)
    assert isinstance(caught.value, UserError) and "\n" not in str(caught.value)


def test_sorted_residuals_group_by_structure_and_metric_in_order_and_leave_nan_out():
    table = pd.DataFrame({"patient": ["a", "b", "c", "a", "b"], "structure": ["PTV70", "PTV70", "PTV70", "Brainstem",
                                                                              "Brainstem"],
                          "metric": ["D99"] * 3 + ["Dmax"] * 2, "difference": [2.0, -1.0, math.nan, 0.5, 0.25]})
    assert sorted_residuals(table) == {"PTV70": {"D99": [-1.0, 2.0]}, "Brainstem": {"Dmax": [0.25, 0.5]}}


def test_coverage_rows_and_summary_against_a_plain_count():
    rng = np.random.default_rng(3)
    residuals = {"PTV70": {"D95": sorted(rng.normal(0, 2, 30))}, "Brainstem": {"Dmax": sorted(rng.normal(1, 3, 30))}}
    rows = []
    for patient in range(20):
        for structure, metric in (("PTV70", "D95"), ("Brainstem", "Dmax")):
            plan = rng.uniform(30, 70)
            rows.append({"patient": f"pt_{patient}", "structure": structure, "metric": metric, "plan": plan,
                         "predicted": plan + rng.normal(0, 2.5)})
    rows.append({"patient": "pt_x", "structure": "Larynx", "metric": "Dmax", "plan": 1.0, "predicted": 2.0})
    table = pd.DataFrame(rows)
    covered = coverage_rows(table, residuals, levels=(0.68, 0.9))
    assert "Larynx" not in set(covered.structure)  # no residuals: no band
    summary = coverage_summary(covered, by=("structure", "metric")).set_index(["structure", "metric", "nominal"])
    for (structure, metric), group in table[table.structure != "Larynx"].groupby(["structure", "metric"]):
        for level in (0.68, 0.9):
            bands = [_plain_band(p, residuals[structure][metric], level) for p in group.predicted]
            held = [low <= plan <= high for (low, high), plan in zip(bands, group.plan)]
            found = summary.loc[(structure, metric, level)]
            assert found["n"] == len(group) and found["observed"] == pytest.approx(np.mean(held))
            assert found["median_width"] == pytest.approx(np.median([high - low for low, high in bands]))
    overall = coverage_summary(covered).set_index("nominal")
    assert overall.loc[0.9, "n"] == 40


def test_the_binomial_range_of_20_values_at_90_percent_is_75_to_100_percent():
    """By hand: P(X ≤ 14) = 0.0113 and P(X ≤ 15) = 0.0432 for X ~ Binomial(20, 0.9), so the 2.5 %
    quantile is 15; P(X ≤ 19) = 1 − 0.9²⁰ = 0.878, so the 97.5 % quantile is 20."""
    pmf = [math.comb(20, k) * 0.9 ** k * 0.1 ** (20 - k) for k in range(21)]
    assert sum(pmf[:15]) == pytest.approx(0.0113, abs=5e-5) and sum(pmf[:16]) == pytest.approx(0.0432, abs=5e-5)
    assert binomial_counts(20, 0.9) == (15, 20) and binomial_range(20, 0.9) == (0.75, 1.0)
    assert outside_probability(20, 0.9) == pytest.approx(sum(pmf[:15]), rel=1e-12)  # nothing above 20


def _enumerated(n, coverage, level=0.95):
    """The central range by brute force: every one of the 2ⁿ outcomes of n held-out values, each
    held with probability ``coverage``, weighed; the quantiles read off the sorted counts."""
    mass = {}
    for outcome in itertools.product((0, 1), repeat=n):
        k = sum(outcome)
        mass[k] = mass.get(k, 0.0) + coverage ** k * (1 - coverage) ** (n - k)
    cumulative, low, high = 0.0, None, None
    for k in range(n + 1):
        cumulative += mass.get(k, 0.0)
        if low is None and cumulative >= (1 - level) / 2 - 1e-12:
            low = k
        if high is None and cumulative >= (1 + level) / 2 - 1e-12:
            high = k
    return low, high, sum(p for k, p in mass.items() if not low <= k <= high)


@pytest.mark.parametrize("n", [1, 3, 8, 13])
@pytest.mark.parametrize("coverage", [0.5, 0.68, 0.9, 0.95, 37 / 41])
def test_the_binomial_range_is_that_of_a_brute_force_enumeration(n, coverage):
    low, high, outside = _enumerated(n, coverage)
    assert binomial_counts(n, coverage) == (low, high)
    assert outside_probability(n, coverage) == pytest.approx(outside, abs=1e-12) and outside <= 0.05 + 1e-12


def test_the_cells_outside_their_range_are_counted_with_those_chance_puts_there():
    by_pair = pd.DataFrame({"structure": ["PTV70", "PTV70", "Brainstem", "Brainstem"],
                            "metric": ["D95", "D95", "Dmax", "Dmax"], "nominal": [0.9, 0.68, 0.9, 0.68],
                            "n": [20, 20, 20, 20], "observed": [0.7, 0.7, 0.95, 1.0], "exact": [0.9, 0.68, 0.9, 0.68]})
    table, totals = range_check(by_pair)
    assert list(table["outside"]) == [True, False, False, True]  # 14 of 20 below 15; 20 of 20 above 68 %'s range
    assert (table.loc[0, "range_low"], table.loc[0, "range_high"]) == (0.75, 1.0)
    assert binomial_counts(20, 0.68)[1] < 20
    assert (totals["cells"], totals["outside"], totals["expected"]) == (4, 2, pytest.approx(0.2))
    assert totals["expected_exact"] == pytest.approx(2 * outside_probability(20, 0.9) + 2 * outside_probability(20, 0.68))
    assert [(level["nominal"], level["cells"], level["outside"]) for level in totals["by_level"]] == [(0.9, 2, 1),
                                                                                                     (0.68, 2, 1)]
