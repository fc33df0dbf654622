"""Commissioning a model: how its out-of-fold predictions compare with the plans it learned from.

The input is a long table ``plans`` (a pandas DataFrame): one row per patient × structure × DVH
metric the patient has, columns ``patient``, ``structure``, ``metric``, ``plan`` (the achieved
plan's value, Gy) and ``predicted`` (the out-of-fold prediction's, Gy); the caller drops rows with
a NaN. Metric names are the site's (``D_0.1_cc``, ``mean``, ``D_99``, ...) and the clinical DVH
table's (``D99``, ``D95``, ``D50``, ``Dmean``, ``D1``, ``Dmax``).

- :func:`residuals`: each row's ``difference`` (predicted − plan) and its standardised residual ``z``;
- :func:`fit_summary`: per structure and metric, n, bias, SD, MAE and R² of the predictions;
- :func:`dosimetric_outliers`: the plans whose achieved metrics lie far from what the model
  predicts for their anatomy, with the reason in words;
- :func:`goal_table`: per clinical goal, how often the plans and the predictions meet it;
- :func:`dvh_curve`: a structure's cumulative DVH, as the report draws a flagged patient's;
- :func:`verdict`: the physicist's tolerances judged per structure-metric (which pass, which fail,
  which have too few patients to judge) and the model's verdict in words.

Pure arithmetic on tables: no file I/O.

**The verdict.** A tolerance asks that a structure-metric's out-of-fold prediction be within
``within_gy`` of the plan (|predicted − plan| ≤ within_gy) for at least ``fraction`` of the
patients that have it (:mod:`provided_code.tolerances`). A cell passes when the share within is
at least the fraction, and fails when it is less; it is not judged when it has fewer patients than
:func:`patients_to_judge` asks, at least :data:`MIN_PATIENTS_TO_JUDGE` (10) and 1/(1 − fraction)
(20 for 95 %): with fewer, one patient moves the share by more than 10 points, and the share cannot
tell the fraction asked from all the patients (a single miss fails the cell). A model that fails a
cell is "not fit for clinical use"; one with every cell passed is within its tolerances; one with
cells too small to judge and none failing is not judged (never passed).

**The standardised residual** of a row is (difference − median) / scale, the median of that
structure-metric's differences across patients and the scale 1.4826 · MAD (median absolute
deviation from the median): a robust z (Iglewicz and Hoaglin's modified z-score, up to their
0.6745 = 1 / 1.4826), which the outliers it is meant to find do not inflate, as they would a
standard deviation. The scale is at least :data:`MIN_SCALE_GY` (1 Gy): a metric that hardly
varies across the cohort (an organ's D99 far from the targets, a fraction of a Gy in most
patients) would otherwise make a difference of a few Gy, which no physicist would call a
different plan, look like hundreds of standard deviations (an esophagus's D99 5.5 Gy where 14.2
Gy was predicted reached z = 883 on a real cohort). When more than half the patients have the
same difference the MAD is 0: the scale falls back to the sample standard deviation of the
differences (still at least 1 Gy), and to NaN (z NaN: no row of that structure-metric is flagged)
when there is a single patient.

**What is flagged**: a patient's rows of the site's own DVH metrics (those the DVH score judges
plans by; :func:`dosimetric_outliers`' ``metrics``), not the clinical table's every column: the
clinical D99 or D95 of an organ at risk, its least-dosed voxels, says nothing of how well it was
spared and varies most where the dose falls off.

**The threshold** :data:`Z_THRESHOLD` = 3.5 is Iglewicz and Hoaglin's cut for the modified
z-score. For normal differences a |z| above 3.5 has a probability of 1 in 2,150 per row; an
OpenKBP patient has about 83 rows (7 organs × 8 metrics, 3 targets × 9: the site's and the
clinical ones), so about 4 % of ordinary patients would have one by chance (fewer in practice: a
patient's metrics are correlated). A cut of 3 would flag about 20 % of ordinary patients by
chance, burying the real ones; a cut of 4 (0.5 %) would pass a plan 4 robust standard deviations
from its prediction, a difference a physicist would question.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from provided_code.sites import Goal

Z_THRESHOLD = 3.5  # |robust z| above this flags a plan (module docstring)
MAD_SCALE = 1.4826  # 1 / Φ⁻¹(3/4): the MAD of a normal sample times this estimates its standard deviation
MIN_SCALE_GY = 1.0  # the robust z's scale is at least this (module docstring)
COLUMNS = ("patient", "structure", "metric", "plan", "predicted")
MIN_PATIENTS_TO_JUDGE = 10  # the fewest patients a tolerance is judged on (module docstring: the verdict)
VERDICT_HEADS = {"fail": "Not fit for clinical use", "not judged": "Not judged: too few patients",
                 "pass": "Within the tolerances"}  # a verdict's heading (the report's and the model card's)
CELL_VERDICTS = {"fail": "fails", "too few": "too few patients", "pass": "passes"}  # a structure-metric's
DVH_STEP_GY = 0.5  # the dose step of a DVH curve (dvh_curve)
_HOT = ("D1", "Dmax")  # clinical metrics of a target's hottest part (D_<cc>_cc and D_<p> with p < 50 too)
_METRIC_WORDS = {"mean": "mean dose", "Dmean": "mean dose", "Dmax": "maximum dose", "D99": "D99", "D95": "D95",
                 "D50": "D50 (median dose)", "D1": "D1"}


def residuals(plans: pd.DataFrame) -> pd.DataFrame:
    """``plans`` with ``difference`` (predicted − plan, Gy) and ``z`` (the robust standardised
    residual, module docstring) added; the rows and their order as given."""
    table = _checked(plans).copy()
    table["difference"] = table["predicted"] - table["plan"]
    groups = table.groupby(["structure", "metric"], sort=False)["difference"]
    median = groups.transform("median")
    mad = (table["difference"] - median).abs().groupby([table["structure"], table["metric"]], sort=False) \
        .transform("median")
    scale = MAD_SCALE * mad
    deviation = groups.transform(lambda values: values.std(ddof=1))
    scale = scale.where(scale > 0, deviation).clip(lower=MIN_SCALE_GY).where(groups.transform("size") > 1)
    table["z"] = (table["difference"] - median) / scale
    return table


def fit_summary(plans: pd.DataFrame) -> pd.DataFrame:
    """One row per (structure, metric), in the order they first appear: ``n`` (patients), ``bias``
    (mean of predicted − plan, Gy), ``sd`` (sample standard deviation of the differences, Gy; NaN
    for one patient), ``mae`` (mean |predicted − plan|, Gy) and ``r2``, the coefficient of
    determination of the plans by the predictions, 1 − Σ(plan − predicted)² / Σ(plan − mean plan)²
    (NaN when the plans do not vary: nothing to explain)."""
    table = _checked(plans)
    rows = []
    for (structure, metric), group in table.groupby(["structure", "metric"], sort=False):
        plan, predicted = group["plan"].to_numpy(np.float64), group["predicted"].to_numpy(np.float64)
        difference = predicted - plan
        spread = np.sum((plan - plan.mean()) ** 2)
        rows.append({"structure": structure, "metric": metric, "n": int(len(group)), "bias": float(difference.mean()),
                     "sd": float(difference.std(ddof=1)) if len(group) > 1 else math.nan,
                     "mae": float(np.abs(difference).mean()),
                     "r2": float(1.0 - np.sum(difference ** 2) / spread) if np.ptp(plan) > 0 else math.nan})
    return pd.DataFrame(rows, columns=["structure", "metric", "n", "bias", "sd", "mae", "r2"])


def dosimetric_outliers(residual_table: pd.DataFrame, threshold: float = Z_THRESHOLD, *,
                        kinds, metrics: Iterable[str] | None = None) -> list[dict]:
    """The flagged plans: one entry per patient with a row whose |z| exceeds ``threshold``,
    largest score first: ``patient``, ``score`` (its largest |z|), the ``structure``, ``metric``,
    ``plan``, ``predicted`` and ``z`` of that row, ``reason`` (in words: what the plan did, against
    what the model predicts for this anatomy), and ``also``: its other rows beyond the threshold
    (``structure``, ``metric``, ``plan``, ``predicted``, ``z``), by |z|.

    ``residual_table``: :func:`residuals`' table. ``kinds``: the site (a
    :class:`~provided_code.sites.Site`) or ``{structure: "oar" | "target"}``: an organ is spared
    more or less than predicted, a target covered (or made hot) more or less. ``metrics``: the
    metrics a plan is judged by (the site's ``metric_names``: module docstring); None: every row's."""
    kinds = _kinds(kinds)
    table = residual_table.loc[residual_table["z"].abs() > threshold]
    if metrics is not None:
        table = table.loc[table["metric"].isin(list(metrics))]
    table = table.assign(score=table["z"].abs()).sort_values("score", ascending=False, kind="stable")
    flagged = []
    for patient, rows in table.groupby("patient", sort=False):
        top = rows.iloc[0]
        structure = str(top["structure"])
        if structure not in kinds:
            raise ValueError(f"Invalid `kinds`. Expected a kind for every structure of the table. "
                             f"Received no kind for {structure!r}")
        flagged.append({"patient": str(patient), "score": float(top["score"]), "structure": structure,
                        "metric": str(top["metric"]), "plan": float(top["plan"]), "predicted": float(top["predicted"]),
                        "z": float(top["z"]), "reason": reason(structure, str(top["metric"]), kinds[structure],
                                                               float(top["plan"]), float(top["predicted"]), float(top["z"])),
                        "also": [{"structure": str(row["structure"]), "metric": str(row["metric"]),
                                  "plan": float(row["plan"]), "predicted": float(row["predicted"]), "z": float(row["z"])}
                                 for _, row in rows.iloc[1:].iterrows()]})
    return sorted(flagged, key=lambda entry: entry["score"], reverse=True)


def reason(structure: str, metric: str, kind: str, plan: float, predicted: float, z: float) -> str:
    """A flagged row in a physicist's words: the plan's value against the prediction for this
    anatomy, and what that means for an organ (spared less or more) or a target (covered less or
    more; for a metric of its hottest part, hotter or cooler). The meaning follows the sign of ``z``,
    the plan's place among the cohort's plans of similar anatomy, not the sign of plan − predicted:
    a model that predicts a metric lower than most plans (a bias) has a plan above its prediction
    that is still lower than the cohort's plans, and that is what is flagged."""
    said = (f"{structure} {metric_words(metric)} {plan:.1f} Gy where the model predicts {predicted:.1f} Gy for this "
            f"anatomy (z = {z:.1f})")
    higher = z < 0  # z is of predicted − plan: below the cohort's usual difference, the plan is higher than theirs
    if kind == "oar":
        meaning = (f"the plan spared this organ much {'less' if higher else 'more'} than the cohort's plans of "
                   f"similar anatomy")
    elif hot_metric(metric):
        meaning = (f"the target is {'hotter' if higher else 'cooler'} than in the cohort's plans of similar anatomy: "
                   f"its hottest part received {'more' if higher else 'less'} than theirs")
    else:
        meaning = (f"coverage {'higher' if higher else 'lower'} than in the cohort's plans of similar anatomy: the "
                   f"plan covered this target {'better' if higher else 'less well'} than theirs")
    if (plan > predicted) != higher and plan != predicted:
        meaning += (f" (the model predicts this metric {'lower' if not higher else 'higher'} than most plans: this "
                    f"plan is measured against that usual difference)")
    return f"{said}: {meaning}"


def metric_words(metric: str) -> str:
    """``mean`` → ``mean dose``, ``D_0.1_cc`` → ``D0.1cc (the hottest 0.1 cc)``, ``D_95`` → ``D95``."""
    if metric in _METRIC_WORDS:
        return _METRIC_WORDS[metric]
    parts = metric.split("_")
    if len(parts) == 3 and parts[0] == "D" and parts[2] == "cc":
        return f"D{parts[1]}cc (the hottest {parts[1]} cc)"
    if len(parts) == 2 and parts[0] == "D":
        return f"D{parts[1]}"
    return metric


def hot_metric(metric: str) -> bool:
    """Whether a metric reads a structure's hottest part (D1, Dmax, D_<cc>_cc, D_<p> with p < 50)
    rather than its coverage (D99, D95, D50, the mean)."""
    if metric in _HOT:
        return True
    parts = metric.split("_")
    if len(parts) == 3 and parts[2] == "cc":
        return True
    if len(parts) == 2 and parts[0] == "D":
        try:
            return float(parts[1]) < 50
        except ValueError:
            return False
    return False


def goal_table(plans: pd.DataFrame, goals: Iterable) -> list[dict]:
    """Per goal, in order: how often the plans and the predictions meet it.

    ``goals``: the site's :class:`~provided_code.sites.Goal`\\ s, or dicts ``{"structure", "metric",
    "max_gy"}`` or ``{"structure", "metric", "min_gy"}``. Each entry: the goal's ``structure``,
    ``metric`` and bound (``max_gy`` or ``min_gy``), ``goal`` (in words), ``n`` (patients with the
    structure and metric), ``plans_meeting`` and ``predictions_meeting`` (fractions), ``agreement``
    (the fraction where "the plan meets it" equals "the prediction meets it"), ``plan_only`` (the
    plan meets it, the prediction does not) and ``prediction_only`` (the other way round);
    fractions are None when n is 0. A value at the bound meets it (:meth:`Goal.met_by`)."""
    table = _checked(plans)
    entries = []
    for goal in map(_goal, goals):
        rows = table.loc[(table["structure"] == goal.structure) & (table["metric"] == goal.metric)]
        plan_meets = rows["plan"].map(goal.met_by).astype(bool)
        predicted_meets = rows["predicted"].map(goal.met_by).astype(bool)
        n = int(len(rows))

        def fraction(mask):
            return float(mask.mean()) if n else None

        bound, value = goal.bound
        entries.append({"structure": goal.structure, "metric": goal.metric, bound: value,
                        "goal": str(goal), "n": n, "plans_meeting": fraction(plan_meets),
                        "predictions_meeting": fraction(predicted_meets),
                        "agreement": fraction(plan_meets == predicted_meets),
                        "plan_only": int((plan_meets & ~predicted_meets).sum()),
                        "prediction_only": int((predicted_meets & ~plan_meets).sum())})
    return entries


def patients_to_judge(fraction: float) -> int:
    """The fewest patients a tolerance of ``fraction`` is judged on: at least
    :data:`MIN_PATIENTS_TO_JUDGE` and 1/(1 − fraction) (module docstring: the verdict)."""
    if fraction >= 1.0:
        return MIN_PATIENTS_TO_JUDGE
    return max(MIN_PATIENTS_TO_JUDGE, math.ceil(round(1.0 / (1.0 - fraction), 9)))


def verdict(plans: pd.DataFrame, cells) -> dict:
    """The tolerances judged on ``plans`` (the out-of-fold table; module docstring: the verdict).

    ``cells``: ``(structure, metric, within_gy, fraction)`` per structure-metric judged
    (:func:`provided_code.tolerances.cells`). Returns ``status`` (``fail``, ``not judged`` or
    ``pass``), ``words`` (the verdict in a sentence), ``cells`` (per cell, in order: ``structure``,
    ``metric``, ``within_gy``, ``fraction``, ``n`` (patients with it), ``within`` (of them within
    the tolerance), ``observed`` (their share; None for none), ``needed`` (patients to judge it),
    ``worst`` (the largest |predicted − plan|, Gy; None for none) and ``status``: ``pass``,
    ``fail`` or ``too few``), and ``failing`` and ``unjudged``: the cells' names
    (``"PTV70 D95"``) with those statuses."""
    table = _checked(plans)
    entries = []
    for structure, metric, within_gy, fraction in cells:
        rows = table.loc[(table["structure"] == structure) & (table["metric"] == metric)]
        errors = (rows["predicted"] - rows["plan"]).abs().to_numpy(np.float64)
        errors = errors[np.isfinite(errors)]
        n, needed = int(errors.size), patients_to_judge(float(fraction))
        within = int((errors <= float(within_gy) + 1e-9).sum())  # a plans.csv value at the bound is within
        status = "too few" if n < needed else "pass" if within >= float(fraction) * n - 1e-9 else "fail"
        entries.append({"structure": str(structure), "metric": str(metric), "within_gy": float(within_gy),
                        "fraction": float(fraction), "n": n, "within": within, "observed": within / n if n else None,
                        "needed": needed, "worst": float(errors.max()) if n else None, "status": status})
    failing = [f"{e['structure']} {e['metric']}" for e in entries if e["status"] == "fail"]
    unjudged = [f"{e['structure']} {e['metric']}" for e in entries if e["status"] == "too few"]
    status = "fail" if failing else "not judged" if unjudged or not entries else "pass"
    return {"status": status, "words": _verdict_words(status, entries), "cells": entries, "failing": failing,
            "unjudged": unjudged}


def _verdict_words(status: str, entries: list[dict]) -> str:
    def said(entry):
        share = "no patient" if entry["n"] == 0 else f"{entry['within']} of {entry['n']} patients"
        return (f"{entry['structure']} {entry['metric']}: {share} within {entry['within_gy']:g} Gy, "
                f"{100 * entry['fraction']:g} % required")

    failing = [e for e in entries if e["status"] == "fail"]
    unjudged = [e for e in entries if e["status"] == "too few"]
    few = ""
    if unjudged:
        few = (f"{len(unjudged)} of {len(entries)} have too few patients to judge ("
               + "; ".join(f"{e['structure']} {e['metric']}: {e['n']} patients, {e['needed']} needed" for e in unjudged)
               + ")")
    if status == "fail":
        return (f"{VERDICT_HEADS['fail']}: {len(failing)} of {len(entries)} structure-metrics fail the tolerances ("
                + "; ".join(map(said, failing)) + ")" + (f"; {few}" if few else "") + ".")
    if status == "not judged":
        if not entries:
            return "Not judged: the tolerances name no structure-metric of these patients."
        judged = len(entries) - len(unjudged)
        return (f"Not judged: {few}; " + (f"the other {judged} pass" if judged else "no structure-metric could be judged")
                + ". The model is not shown fit for clinical use until every structure-metric is judged on enough "
                  "patients.")
    closest = min(entries, key=lambda e: e["observed"] - e["fraction"])
    return f"{VERDICT_HEADS['pass']}: all {len(entries)} structure-metrics pass (the closest, {said(closest)})."


def dvh_curve(doses, step_gy: float = DVH_STEP_GY) -> list[list[float]]:
    """A structure's cumulative DVH: ``[[Gy, % of its voxels receiving at least Gy], ...]`` at 0,
    ``step_gy``, 2 ``step_gy``, ... up to its highest dose (empty for no voxels); rounded to 0.001
    (as the report's curves are drawn and saved)."""
    values = np.sort(np.asarray(doses, dtype=np.float64).reshape(-1))
    if not values.size:
        return []
    levels = np.arange(0.0, values[-1] + step_gy, step_gy)
    receiving = 100.0 * (1.0 - np.searchsorted(values, levels, side="left") / values.size)
    return [[round(float(level), 3), round(float(percent), 3)] for level, percent in zip(levels, receiving)]


def _goal(goal) -> Goal:
    """A site's Goal as it is, or one from a goal dict."""
    if isinstance(goal, Goal):
        return goal
    bounds = [key for key in ("max_gy", "min_gy") if isinstance(goal, Mapping) and goal.get(key) is not None]
    if len(bounds) != 1 or "structure" not in goal or "metric" not in goal:
        raise ValueError(f"Invalid goal. Expected structure, metric and one of max_gy or min_gy. Received: {goal!r}")
    return Goal(str(goal["structure"]), str(goal["metric"]), **{bounds[0]: float(goal[bounds[0]])})


def _kinds(kinds) -> dict[str, str]:
    if hasattr(kinds, "structures"):  # a Site
        return {structure.name: structure.kind for structure in kinds.structures}
    return dict(kinds)


def _checked(plans: pd.DataFrame) -> pd.DataFrame:
    missing = [column for column in COLUMNS if column not in plans.columns]
    if missing:
        raise ValueError(f"Invalid `plans`. Expected the columns {', '.join(COLUMNS)}. Received: "
                         f"{', '.join(map(str, plans.columns))} (missing {', '.join(missing)})")
    return plans
