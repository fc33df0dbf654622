"""Prediction bands for DVH metrics: split-conformal intervals from a model's out-of-fold residuals,
and their observed coverage on patients that took no part in them.

**The residual** of a calibration patient's structure-metric is ``predicted − plan`` (Gy), the
prediction made by the fold that never saw the patient (commissioning's ``plans.csv``). Each was
made by a model that did not train on it: for a new patient drawn from the same population, its
residual and the n calibration patients' are exchangeable, and the rank of the new one among the
n + 1 is uniform (ties aside). That is all a split-conformal band needs (Vovk et al. 2005; Lei et
al. 2018): no normal errors, no constant spread.

**The band** for a nominal coverage 1 − α is equal-tailed: with the residuals sorted
r(1) ≤ … ≤ r(n), m = ⌈(n + 1)(1 − α/2)⌉ and j = n + 1 − m,

    low  = predicted − r(m)        high = predicted − r(j)

so the plan lies below ``low`` with probability at most α/2 and above ``high`` with probability
at most α/2 (the new residual is above r(m) only if its rank is m + 1 or more: (n + 1 − m)/(n + 1)
≤ α/2). Together the band holds the plan with probability at least 1 − α, exactly (m − j)/(n + 1)
for residuals without ties (:func:`exact_coverage`): at most 2/(n + 1) above the nominal. Equal
tails rather than a symmetric band around the prediction (the ⌈(n + 1)(1 − α)⌉-th smallest |r|):
a model's residuals are biased and skewed (it under-predicts a hot spot's Dmax, over-predicts an
organ it cannot see spared), and a symmetric band would be as wide as the larger side on both; and
each side holds on its own (an organ's upper bound is one a planner reads alone). Its cost is
granularity: the guarantee comes in steps of 2/(n + 1) rather than 1/(n + 1).

**Too few patients**: m ≤ n needs α ≥ 2/(n + 1): with n patients the widest coverage a band can
have is (n − 1)/(n + 1) (:func:`largest_coverage`: 90 % needs 19 patients, 95 % 39); above it the
band would be unbounded and there is none (``None``), said with the patients that would be needed.
A dose is never negative: ``low`` is at least 0 Gy (which can only hold the plan more often).

**Is a band calibrated?** A cell (a structure-metric at a nominal level) whose band holds the plan
of each of its n held-out values with probability c holds, if the values are independent, a
Binomial(n, c) count of them: its observed coverage lies in the central 95 % range of
Binomial(n, c)/n (:func:`binomial_range`, from the exact binomial distribution) with probability at
least 95 %. ±5 points cannot be met at 30 patients a cell (the range of a 90 % band is 77 % to
100 % there); the range can. Of many cells about 5 % lie outside by chance (at most 5 % each:
:func:`outside_probability` is the exact chance for a cell, the range's discreteness keeps it
below); many more outside say the bands are not calibrated. c is the band's coverage for
exchangeable patients (:func:`exact_coverage`, the nominal up to 2/(n + 1) above it). The cells of
one validation split share their calibration residuals, which spreads their coverages more than
independent draws would: the count outside the ranges is a screen, not a test.

Pure arithmetic on arrays and tables (pandas DataFrames, imported where they are made: the command
lines read :data:`DEFAULT_COVERAGE` without it): no file I/O.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Mapping

import numpy as np

from provided_code.errors import UserError

METHOD = "split-conformal, equal-tailed, on out-of-fold residuals"
DEFAULT_COVERAGE = 0.9  # a band's nominal coverage unless asked otherwise (--band)
LEVELS = (0.5, 0.68, 0.8, 0.9, 0.95)  # the nominal coverages a reliability table shows
RANGE_LEVEL = 0.95  # the share of a calibrated cell's observed coverages its binomial range holds (binomial_range)


class CoverageError(UserError, ValueError):
    """A nominal coverage that is no fraction strictly between 0 and 1 (``--band``)."""


def open_fraction(value) -> float | None:
    """``value`` as a float strictly between 0 and 1, or None (what a level or a coverage must be)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if 0.0 < value < 1.0 else None


def check_coverage(coverage) -> float:
    """``coverage`` as a float strictly between 0 and 1, or a :class:`CoverageError`."""
    value = open_fraction(coverage)
    if value is None:
        raise CoverageError(f"Invalid `band`. Expected a nominal coverage between 0 and 1 (0.9 for a 90 % band). "
                         f"Received: band={coverage!r}")
    return value


def largest_coverage(n: int) -> float:
    """The widest nominal coverage a band from ``n`` residuals can have: (n − 1)/(n + 1); 0 for n < 2."""
    return (n - 1) / (n + 1) if n >= 2 else 0.0


def patients_needed(coverage: float) -> int:
    """The fewest residuals that give a band of ``coverage``: the least n with (n − 1)/(n + 1) ≥ it."""
    coverage = check_coverage(coverage)
    n = max(2, math.floor((1 + coverage) / (1 - coverage)) - 1)
    while ranks(n, coverage) is None:
        n += 1
    return n


def ranks(n: int, coverage: float) -> tuple[int, int] | None:
    """``(j, m)``, the 1-based ranks of the residuals that bound the band (module docstring), or
    None when ``n`` residuals cannot give ``coverage``."""
    coverage = check_coverage(coverage)
    alpha = 1.0 - coverage
    # (n + 1)(1 − α/2), less a hair: a product that is an integer in exact arithmetic stays one
    m = math.ceil((n + 1) * (1.0 - alpha / 2.0) - 1e-9)
    if n < 2 or m > n:
        return None
    return n + 1 - m, m


def exact_coverage(n: int, coverage: float) -> float | None:
    """The band's coverage for exchangeable residuals without ties, (m − j)/(n + 1): between the
    nominal and 2/(n + 1) above it; None without a band."""
    bounds = ranks(n, coverage)
    return None if bounds is None else (bounds[1] - bounds[0]) / (n + 1)


def offsets(sorted_residuals, coverage: float) -> tuple[float, float] | None:
    """``(r(j), r(m))`` of residuals sorted ascending: the band is ``[predicted − r(m), predicted −
    r(j)]``; None when there are too few."""
    values = np.asarray(sorted_residuals, dtype=np.float64)
    bounds = ranks(values.size, coverage)
    if bounds is None:
        return None
    return float(values[bounds[0] - 1]), float(values[bounds[1] - 1])


def band(predicted: float, sorted_residuals, coverage: float) -> tuple[float, float] | None:
    """``(low, high)`` for a prediction of ``predicted`` Gy (module docstring), both at least 0 Gy
    (no dose is below zero: a model that overdoses a near-zero metric has a band of 0 Gy there);
    None when the residuals are too few for ``coverage``."""
    found = offsets(sorted_residuals, coverage)
    if found is None:
        return None
    below, above = found
    return max(0.0, float(predicted) - above), max(0.0, float(predicted) - below)


def sorted_residuals(residual_table) -> dict[str, dict[str, list[float]]]:
    """``{structure: {metric: [residual, ...] ascending}}`` from a table with columns ``structure``,
    ``metric`` and ``difference`` (predicted − plan, commissioning's :func:`residuals`), NaN left
    out; structures and metrics in the order they first appear."""
    result: dict[str, dict[str, list[float]]] = {}
    for (structure, metric), group in residual_table.groupby(["structure", "metric"], sort=False):
        values = np.sort(group["difference"].to_numpy(np.float64))
        values = values[np.isfinite(values)]
        if values.size:
            result.setdefault(str(structure), {})[str(metric)] = [float(v) for v in values]
    return result


def coverage_rows(table, residuals: Mapping[str, Mapping[str, list[float]]], levels=LEVELS):
    """Each row of ``table`` (columns ``patient``, ``structure``, ``metric``, ``plan``,
    ``predicted``: patients that took no part in the residuals) against its band at each nominal
    coverage of ``levels``: one row per (row, level) with a band, columns ``patient``,
    ``structure``, ``metric``, ``nominal``, ``low``, ``high``, ``width`` (Gy) and ``covered``
    (low ≤ plan ≤ high). A structure-metric without residuals, or too few for a level, has no rows there."""
    import pandas as pd

    records = []
    for row in table.itertuples(index=False):
        found = residuals.get(row.structure, {}).get(row.metric)
        if not found or not (np.isfinite(row.plan) and np.isfinite(row.predicted)):
            continue
        for level in levels:
            bounds = band(row.predicted, found, level)
            if bounds is None:
                continue
            low, high = bounds
            records.append((row.patient, row.structure, row.metric, float(level), low, high, high - low,
                            bool(low <= row.plan <= high)))
    return pd.DataFrame(records, columns=["patient", "structure", "metric", "nominal", "low", "high", "width",
                                          "covered"])


def coverage_summary(rows, by: tuple[str, ...] = ()):
    """:func:`coverage_rows`' rows summed up per nominal level (and per the columns ``by``, e.g.
    ``("structure", "metric")``): ``n`` (rows), ``observed`` (the fraction covered) and
    ``median_width`` (Gy)."""
    import pandas as pd

    keys = [*by, "nominal"]
    if rows.empty:
        return pd.DataFrame(columns=[*keys, "n", "observed", "median_width"])
    grouped = rows.groupby(keys, sort=False)
    summary = grouped.agg(n=("covered", "size"), observed=("covered", "mean"), median_width=("width", "median"))
    return summary.reset_index()


def _binomial_pmf(n: int, probability) -> list[Fraction]:
    """P(X = k), k = 0..n, of X ~ Binomial(n, ``probability``) in exact rational arithmetic: a float
    probability is taken as the decimal it prints as (0.9 is 9/10, not its binary neighbour)."""
    p = Fraction(repr(float(probability))) if isinstance(probability, float) else Fraction(probability)
    q = 1 - p
    return [math.comb(n, k) * p ** k * q ** (n - k) for k in range(n + 1)]


def _checked_range(n, coverage, level) -> tuple[int, float, Fraction]:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"Invalid `n`. Expected a count of held-out values, at least 1. Received: n={n!r}")
    try:
        value = float(coverage)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Invalid `coverage`. Expected a probability between 0 and 1. Received: coverage={coverage!r}")
    if open_fraction(level) is None:
        raise ValueError(f"Invalid `level`. Expected a fraction strictly between 0 and 1 (0.95). Received: "
                         f"level={level!r}")
    return int(n), value, (1 - Fraction(repr(float(level)))) / 2


def binomial_counts(n: int, coverage: float, level: float = RANGE_LEVEL) -> tuple[int, int]:
    """``(low, high)``: the central ``level`` range of X ~ Binomial(n, ``coverage``), its
    (1 − level)/2 and (1 + level)/2 quantiles: ``low`` the least k with P(X ≤ k) ≥ (1 − level)/2,
    ``high`` the least k with P(X ≤ k) ≥ (1 + level)/2. So P(X < low) < (1 − level)/2,
    P(X > high) ≤ (1 − level)/2 and P(low ≤ X ≤ high) ≥ ``level``; from the exact distribution
    (rational arithmetic: a cumulative probability at a tail's edge is not misjudged by rounding).
    n = 20, coverage 0.9: (15, 20), P(X ≤ 14) = 0.011, P(X ≤ 15) = 0.043."""
    n, coverage, tail = _checked_range(n, coverage, level)
    low = high = None
    cumulative = Fraction(0)
    for k, mass in enumerate(_binomial_pmf(n, coverage)):
        cumulative += mass
        if low is None and cumulative >= tail:
            low = k
        if cumulative >= 1 - tail:
            high = k
            break
    return low, n if high is None else high


def binomial_range(n: int, coverage: float, level: float = RANGE_LEVEL) -> tuple[float, float]:
    """The central ``level`` range of the observed coverage of ``n`` held-out values, each held
    by its band with probability ``coverage``: :func:`binomial_counts` over n (module docstring)."""
    low, high = binomial_counts(n, coverage, level)
    return low / n, high / n


def outside_probability(n: int, coverage: float, level: float = RANGE_LEVEL) -> float:
    """The exact probability that a calibrated cell's observed coverage lies outside its
    :func:`binomial_range`: P(X < low) + P(X > high), at most 1 − ``level``."""
    low, high = binomial_counts(n, coverage, level)
    pmf = _binomial_pmf(int(n), coverage)
    return float(sum(pmf[:low]) + sum(pmf[high + 1:]))


def range_check(by_pair, level: float = RANGE_LEVEL):
    """:func:`coverage_summary`'s rows per structure-metric (columns ``structure``, ``metric``,
    ``nominal``, ``n``, ``observed`` and ``exact``, the coverage of the band for exchangeable
    patients; the nominal where it is missing) with ``range_low`` and ``range_high`` (the observed
    coverage's :func:`binomial_range` at that coverage) and ``outside`` (observed below or above it)
    added; and per nominal level and over all: ``cells``, ``outside``, ``expected`` (``1 − level``
    of the cells: what chance alone puts outside, at most) and ``expected_exact`` (the sum of the
    cells' :func:`outside_probability`)."""
    table = by_pair.copy()
    claimed = table["exact"].where(table["exact"].notna(), table["nominal"]) if "exact" in table else table["nominal"]
    ranges = [binomial_counts(int(n), float(c), level) for n, c in zip(table["n"], claimed)]
    table["range_low"] = [low / n for (low, _), n in zip(ranges, table["n"])]
    table["range_high"] = [high / n for (_, high), n in zip(ranges, table["n"])]
    # the observed coverage is a count over n: compared as counts, no rounding decides a cell
    counts = [round(observed * n) for observed, n in zip(table["observed"], table["n"])]
    table["outside"] = [not low <= k <= high for k, (low, high) in zip(counts, ranges)]
    chance = [outside_probability(int(n), float(c), level) for n, c in zip(table["n"], claimed)]

    def totals(mask) -> dict:
        cells = int(sum(mask))
        return {"cells": cells, "outside": int(sum(o for o, m in zip(table["outside"], mask) if m)),
                "expected": (1 - level) * cells, "expected_exact": float(sum(p for p, m in zip(chance, mask) if m))}

    per_level = [{"nominal": float(nominal), **totals([abs(v - nominal) < 1e-12 for v in table["nominal"]])}
                 for nominal in dict.fromkeys(table["nominal"])]
    return table, {"level": level, **totals([True] * len(table)), "by_level": per_level}
