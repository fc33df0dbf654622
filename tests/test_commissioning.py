"""Commissioning's figures: residuals, the fit summary, the dosimetric outliers and the goals table,
each against a plain recomputation."""

import math
import statistics

import numpy as np
import pandas as pd
import pytest

from provided_code.metrics.commissioning import (Z_THRESHOLD, dosimetric_outliers, fit_summary, goal_table,
                                                 patients_to_judge, residuals, verdict)
from provided_code.sites import Goal, openkbp

KINDS = {"LeftParotid": "oar", "SpinalCord": "oar", "PTV70": "target"}


def _plans(seed: int = 0, patients: int = 12) -> pd.DataFrame:
    """A long table: three structures, two metrics each, one patient without a SpinalCord; the
    predictions within 2.5 Gy of the plans (uniform: no patient is an outlier by chance)."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(patients):
        for structure, metrics in (("LeftParotid", ("mean", "D_0.1_cc")), ("SpinalCord", ("D_0.1_cc", "D1")),
                                   ("PTV70", ("D_95", "D1"))):
            if structure == "SpinalCord" and p == 3:
                continue
            for metric in metrics:
                plan = rng.uniform(20, 70)
                rows.append({"patient": f"pt_{p}", "structure": structure, "metric": metric, "plan": plan,
                             "predicted": plan + rng.uniform(-1.5, 2.5)})
    return pd.DataFrame(rows)


def _by_hand(plans: pd.DataFrame):
    """Each (structure, metric)'s rows as plain lists of (patient, plan, predicted)."""
    groups = {}
    for row in plans.itertuples():
        groups.setdefault((row.structure, row.metric), []).append((row.patient, row.plan, row.predicted))
    return groups


def test_residuals_are_the_robust_z_of_a_plain_recomputation():
    plans = _plans()
    table = residuals(plans)
    assert list(table.columns[:5]) == list(plans.columns) and len(table) == len(plans)
    for (structure, metric), rows in _by_hand(plans).items():
        differences = [predicted - plan for _, plan, predicted in rows]
        median = statistics.median(differences)
        mad = statistics.median([abs(d - median) for d in differences])
        got = table[(table.structure == structure) & (table.metric == metric)]
        for (patient, _, _), difference, (_, row) in zip(rows, differences, got.iterrows()):
            assert row.patient == patient and row.difference == difference
            # pandas' median and statistics.median of the same floats: the same value, or a
            # mean of the two middle ones summed in another order (one rounding, ~1e-15 relative)
            assert row.z == pytest.approx((difference - median) / max(1.4826 * mad, 1.0), rel=1e-12)  # 1 Gy floor


def test_the_scale_is_at_least_a_gray():
    """A metric that hardly varies across the cohort (an organ's coldest voxels, a tenth of a Gy in
    most patients): a plan a few Gy off is not hundreds of standard deviations off."""
    rows = [(f"pt_{k}", 0.1 * k, 0.1 * k + 0.01 * (k % 3)) for k in range(10)] + [("pt_10", 5.5, 14.2)]
    plans = pd.DataFrame([{"patient": p, "structure": "Esophagus", "metric": "D99", "plan": plan,
                           "predicted": predicted} for p, plan, predicted in rows])
    table = residuals(plans)
    median = statistics.median(predicted - plan for _, plan, predicted in rows)
    assert table.z.iloc[-1] == pytest.approx((14.2 - 5.5 - median) / 1.0, rel=1e-12)


def test_only_the_metrics_a_plan_is_judged_by_are_flagged():
    plans = _plans(seed=1, patients=25)
    planted = (plans.patient == "pt_7") & (plans.structure == "LeftParotid") & (plans.metric == "mean")
    plans.loc[planted, "plan"] = plans.loc[planted, "predicted"] + 15.0
    table = residuals(plans)
    assert [o["patient"] for o in dosimetric_outliers(table, kinds=KINDS, metrics=["mean"])] == ["pt_7"]
    assert dosimetric_outliers(table, kinds=KINDS, metrics=["D_0.1_cc"]) == []


def test_a_zero_mad_falls_back_to_the_standard_deviation_then_to_nan():
    rows = [("a", 10.0, 10.0), ("b", 10.0, 10.0), ("c", 10.0, 10.0), ("d", 10.0, 14.0)]  # 3 of 4 differences 0
    plans = pd.DataFrame([{"patient": p, "structure": "PTV70", "metric": "D1", "plan": plan, "predicted": predicted}
                          for p, plan, predicted in rows] + [
        {"patient": "a", "structure": "SpinalCord", "metric": "D1", "plan": 40.0, "predicted": 41.0}])
    table = residuals(plans)
    ptv = table[table.structure == "PTV70"]
    sd = statistics.stdev([0.0, 0.0, 0.0, 4.0])
    assert ptv.z.tolist() == pytest.approx([0.0, 0.0, 0.0, 4.0 / sd], rel=1e-12)  # the same arithmetic, two routes
    assert math.isnan(table[table.structure == "SpinalCord"].z.iloc[0])  # one patient: no scale


def test_a_planted_outlier_is_the_one_flagged_and_its_reason_says_what_the_plan_did():
    plans = _plans(seed=1, patients=25)
    planted = (plans.patient == "pt_7") & (plans.structure == "LeftParotid") & (plans.metric == "mean")
    plans.loc[planted, "plan"] = plans.loc[planted, "predicted"] + 15.0  # the organ got 15 Gy more than predicted
    outliers = dosimetric_outliers(residuals(plans), kinds=KINDS)
    assert [entry["patient"] for entry in outliers] == ["pt_7"]
    entry = outliers[0]
    assert (entry["structure"], entry["metric"]) == ("LeftParotid", "mean") and entry["z"] < -Z_THRESHOLD
    assert entry["score"] == abs(entry["z"]) and entry["plan"] == plans.loc[planted, "plan"].item()
    assert entry["reason"].startswith(f"LeftParotid mean dose {entry['plan']:.1f} Gy where the model predicts "
                                      f"{entry['predicted']:.1f} Gy for this anatomy (z = {entry['z']:.1f})")
    assert "spared this organ much less than the cohort's plans of similar anatomy" in entry["reason"]
    # the robust scale is not inflated by the outlier, as the standard deviation is: a larger z
    differences = plans[(plans.structure == "LeftParotid") & (plans.metric == "mean")]
    difference = differences.predicted - differences.plan
    assert abs(entry["z"]) > 2 * abs(-15.0 - difference.mean()) / difference.std()


@pytest.mark.parametrize("structure, metric, shift, words", [
    ("LeftParotid", "mean", -9.0, "spared this organ much more than"),
    ("PTV70", "D_95", -9.0, "coverage lower than in the cohort's plans of similar anatomy: the plan covered this "
                            "target less well than theirs"),
    ("PTV70", "D_95", +9.0, "coverage higher than in the cohort's plans"),
    ("PTV70", "D1", +9.0, "the target is hotter than in the cohort's plans"),
    ("PTV70", "D1", -9.0, "the target is cooler than in the cohort's plans"),
])
def test_the_reason_s_words_follow_the_kind_the_metric_and_the_sign(structure, metric, shift, words):
    plans = _plans(seed=2, patients=20)
    planted = (plans.patient == "pt_4") & (plans.structure == structure) & (plans.metric == metric)
    plans.loc[planted, "plan"] = plans.loc[planted, "predicted"] + shift
    (entry,) = dosimetric_outliers(residuals(plans), kinds=openkbp())
    assert entry["patient"] == "pt_4" and words in entry["reason"]


def test_a_plan_below_the_cohort_s_is_said_so_where_a_biased_model_predicts_lower_still():
    """A model that predicts every target's D95 12 Gy below the plans, and a plan scaled by 0.8: the
    plan is still above its prediction, but far below where the cohort's plans stand against theirs."""
    plans = _plans(seed=2, patients=20)
    target = (plans.structure == "PTV70") & (plans.metric == "D_95")
    plans.loc[target, "predicted"] = plans.loc[target, "plan"] - 12.0 + np.linspace(-1, 1, int(target.sum()))
    planted = target & (plans.patient == "pt_4")
    plans.loc[planted, "plan"] = plans.loc[planted, "predicted"] + 3.0  # 9 Gy lower than the cohort's usual +12
    (entry,) = [e for e in dosimetric_outliers(residuals(plans), kinds=openkbp()) if e["patient"] == "pt_4"]
    assert entry["plan"] > entry["predicted"] and entry["z"] > Z_THRESHOLD
    assert "the plan covered this target less well than theirs" in entry["reason"]
    assert "better" not in entry["reason"]
    assert "(the model predicts this metric lower than most plans" in entry["reason"]


def test_a_patient_s_score_is_its_largest_z_and_its_other_flags_follow():
    plans = _plans(seed=3, patients=20)
    for structure, metric, shift in (("LeftParotid", "mean", 8.0), ("SpinalCord", "D1", 30.0)):
        rows = (plans.patient == "pt_2") & (plans.structure == structure) & (plans.metric == metric)
        plans.loc[rows, "plan"] = plans.loc[rows, "predicted"] + shift
    table = residuals(plans)
    (entry,) = dosimetric_outliers(table, kinds=KINDS)
    beyond = table[(table.patient == "pt_2") & (table.z.abs() > Z_THRESHOLD)].sort_values("z", key=abs, ascending=False)
    assert entry["score"] == beyond.z.abs().max() and (entry["structure"], entry["metric"]) == ("SpinalCord", "D1")
    assert [(a["structure"], a["metric"], a["z"]) for a in entry["also"]] == \
        [(row.structure, row.metric, row.z) for row in beyond.iloc[1:].itertuples()]
    assert dosimetric_outliers(table, threshold=entry["score"] + 1, kinds=KINDS) == []


def test_the_fit_summary_is_a_plain_recomputation():
    plans = _plans(seed=4)
    summary = fit_summary(plans)
    groups = _by_hand(plans)
    assert list(zip(summary.structure, summary.metric)) == list(groups)
    for row in summary.itertuples():
        pairs = groups[(row.structure, row.metric)]
        n = len(pairs)
        differences = [predicted - plan for _, plan, predicted in pairs]
        bias = sum(differences) / n
        sd = math.sqrt(sum((d - bias) ** 2 for d in differences) / (n - 1))
        mae = sum(abs(d) for d in differences) / n
        mean_plan = sum(plan for _, plan, _ in pairs) / n
        r2 = 1 - sum(d * d for d in differences) / sum((plan - mean_plan) ** 2 for _, plan, _ in pairs)
        assert row.n == n
        # numpy's pairwise sums against Python's left-to-right ones over ~12 values: ~1e-15 relative
        assert (row.bias, row.sd, row.mae, row.r2) == pytest.approx((bias, sd, mae, r2), rel=1e-12, abs=1e-12)


def test_r2_is_nan_when_the_plans_do_not_vary_and_sd_for_one_patient():
    plans = pd.DataFrame([{"patient": f"pt_{p}", "structure": "PTV70", "metric": "D_95", "plan": 66.5,
                           "predicted": 66.5 + p} for p in range(4)]
                         + [{"patient": "pt_0", "structure": "SpinalCord", "metric": "D1", "plan": 40.0,
                             "predicted": 42.0}])
    summary = fit_summary(plans).set_index("structure")
    assert math.isnan(summary.loc["PTV70", "r2"]) and summary.loc["PTV70", "mae"] == 1.5
    assert math.isnan(summary.loc["SpinalCord", "sd"]) and summary.loc["SpinalCord", "n"] == 1


def test_the_goal_table_counts_match_a_plain_loop():
    plans = _plans(seed=5)
    goals = [{"structure": "LeftParotid", "metric": "mean", "max_gy": 45.0},
             Goal("PTV70", "D_95", min_gy=40.0), {"structure": "SpinalCord", "metric": "D_0.1_cc", "max_gy": 50},
             {"structure": "Larynx", "metric": "mean", "max_gy": 44}]
    table = goal_table(plans, goals)
    assert [(entry["structure"], entry["metric"]) for entry in table] == \
        [("LeftParotid", "mean"), ("PTV70", "D_95"), ("SpinalCord", "D_0.1_cc"), ("Larynx", "mean")]
    for entry, goal in zip(table, goals):
        goal = goal if isinstance(goal, dict) else goal.to_dict()
        meets = (lambda v: v <= goal["max_gy"]) if "max_gy" in goal else (lambda v: v >= goal["min_gy"])
        pairs = _by_hand(plans).get((goal["structure"], goal["metric"]), [])
        plan_meets = [meets(plan) for _, plan, _ in pairs]
        predicted_meets = [meets(predicted) for _, _, predicted in pairs]
        n = len(pairs)
        assert entry["n"] == n
        if not n:
            assert entry["plans_meeting"] is entry["agreement"] is None and entry["plan_only"] == 0
            continue
        assert entry["plans_meeting"] == sum(plan_meets) / n
        assert entry["predictions_meeting"] == sum(predicted_meets) / n
        assert entry["agreement"] == sum(a == b for a, b in zip(plan_meets, predicted_meets)) / n
        assert entry["plan_only"] == sum(a and not b for a, b in zip(plan_meets, predicted_meets))
        assert entry["prediction_only"] == sum(b and not a for a, b in zip(plan_meets, predicted_meets))
        assert 0 < entry["plans_meeting"] < 1  # the goals were chosen to split the plans: the counts are tested


def test_a_value_at_the_goal_s_bound_meets_it():
    plans = pd.DataFrame([{"patient": "a", "structure": "PTV70", "metric": "D_95", "plan": 66.5, "predicted": 66.4},
                          {"patient": "b", "structure": "PTV70", "metric": "D_95", "plan": 66.4, "predicted": 66.5}])
    (entry,) = goal_table(plans, [Goal("PTV70", "D_95", min_gy=66.5)])
    assert (entry["plans_meeting"], entry["predictions_meeting"], entry["agreement"]) == (0.5, 0.5, 0.0)
    assert (entry["plan_only"], entry["prediction_only"]) == (1, 1) and entry["goal"] == "PTV70 D_95 ≥ 66.5 Gy"


def _out_of_fold(patients: int = 30, target_error: float = 1.0, seed: int = 1) -> pd.DataFrame:
    """Out-of-fold numbers of three organs' Dmean and two targets' D95: each prediction within 2 Gy
    of its plan, the targets' D95 off by ``target_error`` Gy more (every patient, alternating sign)."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(patients):
        for structure, metric in (("Brainstem", "Dmean"), ("LeftParotid", "Dmean"), ("SpinalCord", "Dmean"),
                                  ("PTV63", "D95"), ("PTV70", "D95")):
            plan = rng.uniform(20, 70)
            error = rng.uniform(-2.0, 2.0) + (target_error * (-1) ** p if metric == "D95" else 0.0)
            rows.append({"patient": f"pt_{p}", "structure": structure, "metric": metric, "plan": plan,
                         "predicted": plan + error})
    return pd.DataFrame(rows)


CELLS = [(s, m, 3.0, 0.9) for s, m in (("Brainstem", "Dmean"), ("LeftParotid", "Dmean"), ("SpinalCord", "Dmean"),
                                       ("PTV63", "D95"), ("PTV70", "D95"))]


def test_a_model_inside_its_tolerances_passes_every_cell():
    found = verdict(_out_of_fold(target_error=0.0), CELLS)
    assert found["status"] == "pass" and found["failing"] == found["unjudged"] == []
    assert [(c["n"], c["within"], c["status"]) for c in found["cells"]] == [(30, 30, "pass")] * 5
    assert found["words"].startswith("Within the tolerances: all 5 structure-metrics pass")
    assert "not fit" not in found["words"].lower()


def test_a_model_whose_target_d95_errors_exceed_them_is_not_fit_for_clinical_use_naming_the_cells():
    plans = _out_of_fold(target_error=8.0)  # 6 to 10 Gy off: none within 3 Gy
    plans.loc[(plans.structure == "PTV63") & (plans.patient.isin(["pt_0", "pt_1"])), "predicted"] = \
        plans.loc[(plans.structure == "PTV63") & (plans.patient.isin(["pt_0", "pt_1"])), "plan"] + 0.5
    found = verdict(plans, CELLS)
    assert found["status"] == "fail" and found["failing"] == ["PTV63 D95", "PTV70 D95"]
    by_cell = {(c["structure"], c["metric"]): c for c in found["cells"]}
    assert (by_cell[("PTV63", "D95")]["within"], by_cell[("PTV70", "D95")]["within"]) == (2, 0)
    errors = (plans.predicted - plans.plan).abs()[plans.structure == "PTV70"]
    assert by_cell[("PTV70", "D95")]["worst"] == pytest.approx(errors.max())
    assert all(by_cell[(s, "Dmean")]["status"] == "pass" for s in ("Brainstem", "LeftParotid", "SpinalCord"))
    assert found["words"] == ("Not fit for clinical use: 2 of 5 structure-metrics fail the tolerances (PTV63 D95: 2 of "
                              "30 patients within 3 Gy, 90 % required; PTV70 D95: 0 of 30 patients within 3 Gy, 90 % "
                              "required).")


def test_the_share_within_is_compared_with_the_fraction_as_a_count_at_its_edge():
    plans = _out_of_fold(patients=20, target_error=0.0)
    far = (plans.structure == "PTV70") & plans.patient.isin(["pt_0", "pt_1"])
    plans.loc[far, "predicted"] = plans.loc[far, "plan"] + 3.5
    plans.loc[(plans.structure == "PTV63") & (plans.patient == "pt_0"), "predicted"] = \
        plans.loc[(plans.structure == "PTV63") & (plans.patient == "pt_0"), "plan"] + 3.0  # at the bound: within
    by_cell = {c["structure"]: c for c in verdict(plans, CELLS)["cells"]}
    assert (by_cell["PTV70"]["within"], by_cell["PTV70"]["status"]) == (18, "pass")  # 18 of 20: 90 % exactly
    assert (by_cell["PTV63"]["within"], by_cell["PTV63"]["status"]) == (20, "pass")
    plans.loc[(plans.structure == "PTV70") & (plans.patient == "pt_2"), "predicted"] += 5.0
    assert verdict(plans, CELLS)["failing"] == ["PTV70 D95"]  # 17 of 20


def test_a_cell_with_too_few_patients_is_said_so_not_passed():
    assert [patients_to_judge(f) for f in (0.5, 0.9, 0.95, 0.99, 1.0)] == [10, 10, 20, 100, 10]
    plans = _out_of_fold(patients=12, target_error=0.0)
    plans = plans[~((plans.structure == "PTV63") & (plans.patient.isin([f"pt_{k}" for k in range(4)])))]
    found = verdict(plans, CELLS[:3] + [("PTV63", "D95", 3.0, 0.9), ("PTV70", "D95", 3.0, 0.95),
                                        ("PTV56", "D95", 3.0, 0.9)])
    assert found["status"] == "not judged" and found["failing"] == []
    assert found["unjudged"] == ["PTV63 D95", "PTV70 D95", "PTV56 D95"]  # 8 patients; 12 of the 20 95 % needs; none
    assert [c["status"] for c in found["cells"][:3]] == ["pass"] * 3
    assert found["words"].startswith("Not judged: 3 of 6 have too few patients to judge (PTV63 D95: 8 patients, 10 "
                                     "needed; PTV70 D95: 12 patients, 20 needed; PTV56 D95: 0 patients, 10 needed); "
                                     "the other 3 pass. The model is not shown fit for clinical use")
    plans.loc[plans.structure == "Brainstem", "predicted"] += 10.0
    alone = verdict(plans.iloc[:0], CELLS[:1])["words"]
    assert alone.startswith("Not judged: 1 of 1 have too few patients to judge (Brainstem Dmean: 0 patients, 10 "
                            "needed); no structure-metric could be judged.")
    failing = verdict(plans, CELLS[:3] + [("PTV56", "D95", 3.0, 0.9)])
    assert failing["status"] == "fail" and failing["words"].startswith("Not fit for clinical use: 1 of 4")
    assert failing["words"].endswith("; 1 of 4 have too few patients to judge (PTV56 D95: 0 patients, 10 needed).")
