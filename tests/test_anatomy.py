"""A patient's anatomy features (volumes, overlap-volume histograms, the body's extent, the CT's HU)
and the in-distribution check: a nonconformity score, its conformal p-value against the cohort's
leave-one-out scores, the flag at alpha, a cohort too small to flag, the reasons in words."""

import json
import math
import time

import numpy as np
import pandas as pd
import pytest

from provided_code.data.csv_io import read_patient
from provided_code.metrics.anatomy import (OVH_DISTANCES_MM, anatomy_features, can_flag, check, cohort_scores,
                                           feature_names, fit_cohort, nonconformity, p_value, too_small)
from provided_code.sites import openkbp, site_from_dict
from tests.kit.repo import SAMPLE_DIR
from tests.kit.skips import requires_sample
from tests.kit.tiers import SLOW_FOR_ITS_TIME

SITE = site_from_dict({"name": "geometry", "beams": {"type": "none"}, "structures": [
    {"name": "Organ", "kind": "oar"}, {"name": "Other", "kind": "oar"},
    {"name": "PTV", "kind": "target", "prescription_gy": 60}]}, "test")


def _grid(shape, spacing):
    return np.meshgrid(*(np.arange(n) * s for n, s in zip(shape, spacing)), indexing="ij")


def _brute_force_fractions(masks: np.ndarray, spacing, organ_bit: int, target_bits: int) -> list[float]:
    """The fraction of the organ's voxels within each distance of a target voxel, every pair measured."""
    organ = np.argwhere(masks & organ_bit) * np.asarray(spacing)
    target = np.argwhere(masks & target_bits) * np.asarray(spacing)
    nearest = np.sqrt(((organ[:, None, :] - target[None, :, :]) ** 2).sum(axis=2).min(axis=1))
    return [float(np.mean(nearest <= distance + 1e-9)) for distance in OVH_DISTANCES_MM]


def test_a_sphere_beside_a_box_target_has_the_closed_form_caps_within_voxel_discretisation():
    """A sphere (radius R, centre x = 16 mm) whose side x ≥ 24 mm lies in a box target reaching
    past it sideways: the voxels within d of the target are those with x ≥ 24 − d, a spherical cap.
    Voxel centres sit at multiples of the 2 mm spacing along x, so the voxels counted are whole
    layers: those from the first layer at or beyond 24 − d, whose lower face is that layer's centre
    − 1 mm; the cap is cut there. What remains is the voxelised sphere's outline (its volume is
    within 1 % of 4/3 π R³ here, checked below at 2 %): the cap and the whole err alike, so the
    fractions are within 0.02 of the closed form (0.006 measured)."""
    spacing, radius, centre = (2.0, 1.5, 2.5), 12.0, (16.0, 24.0, 40.0)
    x, y, z = _grid((32, 32, 32), spacing)
    sphere = (x - centre[0]) ** 2 + (y - centre[1]) ** 2 + (z - centre[2]) ** 2 <= radius ** 2
    box = (x >= 24.0) & (np.abs(z - centre[2]) <= radius + 6)  # its face covers the sphere's shadow
    masks = sphere.astype(np.uint16) | (box.astype(np.uint16) << 2)
    features = anatomy_features(masks, np.ones(masks.shape, bool), spacing, SITE)
    assert features["Organ.volume_cc"] == pytest.approx(4 / 3 * math.pi * radius ** 3 / 1000, rel=0.02)
    assert features["PTV.volume_cc"] == np.count_nonzero(box) * np.prod(spacing) / 1000
    for distance in OVH_DISTANCES_MM:
        first_layer = math.ceil((24.0 - distance) / spacing[0])
        height = min(max(centre[0] + radius - (first_layer * spacing[0] - spacing[0] / 2), 0.0), 2 * radius)
        cap = height ** 2 * (3 * radius - height) / (4 * radius ** 3)
        assert features[f"Organ.within_{distance}mm"] == pytest.approx(cap, abs=0.02), distance
    assert 0 < features["Organ.within_0mm"] < features["Organ.within_5mm"] < features["Organ.within_10mm"] < 1


def test_an_absent_organ_is_nan_no_target_is_zero_and_the_body_extent_is_first_to_last_voxel():
    spacing = (3.0, 2.0, 2.5)
    masks = np.zeros((20, 24, 16), np.uint16)
    masks[5:9, 6:10, 4:8] = 1  # Organ; no Other, no PTV
    body = np.zeros(masks.shape, bool)
    body[2:18, 1:23, 3:12] = True
    features = anatomy_features(masks, body, spacing, SITE)
    assert list(features) == list(feature_names(SITE))
    assert features["Organ.volume_cc"] == 64 * np.prod(spacing) / 1000
    assert all(math.isnan(features[f"Other.within_{d}mm"]) for d in OVH_DISTANCES_MM)
    assert math.isnan(features["Other.volume_cc"]) and math.isnan(features["PTV.volume_cc"])
    assert [features[f"Organ.within_{d}mm"] for d in OVH_DISTANCES_MM] == [0.0] * 4
    assert [features[f"body.{axis}_mm"] for axis in ("anterior_posterior", "right_left", "superior_inferior")] == \
        [16 * 3.0, 22 * 2.0, 9 * 2.5]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fractions_are_exact_euclidean_distances_with_the_anisotropic_spacing(seed):
    """Random blobs, against every pair of organ and target voxels measured."""
    rng = np.random.default_rng(seed)
    spacing = (2.3, 1.7, 3.1)
    x, y, z = _grid((28, 30, 24), spacing)
    masks = np.zeros(x.shape, np.uint16)
    for bit, blobs in ((1, 3), (4, 2)):  # the organ: three balls; the target: two
        for _ in range(blobs):
            centre, radius = rng.uniform(10, 45, 3), rng.uniform(4, 9)
            masks |= np.where((x - centre[0]) ** 2 + (y - centre[1]) ** 2 + (z - centre[2]) ** 2 <= radius ** 2,
                              bit, 0).astype(np.uint16)
    features = anatomy_features(masks, np.ones(masks.shape, bool), spacing, SITE)
    expected = _brute_force_fractions(masks, spacing, 1, 4)
    assert [features[f"Organ.within_{d}mm"] for d in OVH_DISTANCES_MM] == expected
    assert 0 < expected[1] < expected[3] < 1  # the blobs fall at every distance: the test measures something


@requires_sample
def test_a_real_patient_s_features_take_well_under_a_second_and_are_exact():
    site = openkbp()
    patient = read_patient(SAMPLE_DIR / "train-pats" / "pt_1", site=site)
    started = time.perf_counter()
    features = anatomy_features(patient.structure_masks, patient.possible_dose_mask, patient.voxel_dimensions, site)
    assert time.perf_counter() - started < 0.5  # measured 8 to 28 ms per real patient on the shared 2-core machine
    assert list(features) == list(feature_names(site))
    for organ in ("LeftParotid", "Mandible"):
        expected = _brute_force_fractions(patient.structure_masks, patient.voxel_dimensions, site.bit(organ),
                                          site.target_bits)
        assert [features[f"{organ}.within_{d}mm"] for d in OVH_DISTANCES_MM] == expected


# -- the cohort ------------------------------------------------------------------------------------

def _cohort(patients: int, seed: int) -> pd.DataFrame:
    """Homogeneous features: log-normal volumes (a larynx absent in a third of the patients), overlap
    fractions rising with distance, normal body extents."""
    rng = np.random.default_rng(seed)
    columns = {}
    for k, name in enumerate(("Parotid", "Larynx", "PTV70")):
        volumes = rng.lognormal(math.log(30 + 150 * k), 0.3, patients)
        if name == "Larynx":
            volumes[rng.random(patients) < 1 / 3] = np.nan
        columns[f"{name}.volume_cc"] = volumes
    for name in ("Parotid", "Larynx"):
        base = rng.beta(2, 5, patients)
        for j, distance in enumerate(OVH_DISTANCES_MM):
            fraction = np.clip(base * (0.3 + 0.25 * j) + rng.normal(0, 0.03, patients), 0, 1)
            columns[f"{name}.within_{distance}mm"] = np.where(np.isnan(columns[f"{name}.volume_cc"]), np.nan, fraction)
    for axis in ("anterior_posterior", "right_left", "superior_inferior"):
        columns[f"body.{axis}_mm"] = rng.normal(250, 20, patients)
    return pd.DataFrame(columns, index=[f"pt_{p}" for p in range(patients)])


def _features_of(cohort_frame: pd.DataFrame, row: int) -> dict:
    return cohort_frame.iloc[row].to_dict()


def test_the_p_value_is_one_plus_the_cohort_scores_at_or_above_over_n_plus_one():
    features = _cohort(30, seed=0)
    cohort = fit_cohort(features)
    scores = np.array(cohort["scores"])
    new = _features_of(_cohort(1, seed=9), 0)
    found = check(cohort, new)
    assert found["p_value"] == (1 + np.count_nonzero(scores >= found["score"])) / (len(scores) + 1)
    assert p_value(scores.max() + 1, scores) == 1 / 31 and p_value(-1.0, scores) == 1.0
    # the training patients' scores are leave-one-out: the same as a new patient's against the other 29
    without = fit_cohort(features.drop(index="pt_7"))
    assert check(without, _features_of(features, 7))["score"] == pytest.approx(scores[7], rel=1e-12)
    assert json.loads(json.dumps(cohort, allow_nan=False)) == cohort  # JSON-able, as saved with the model


@SLOW_FOR_ITS_TIME
def test_patients_exchangeable_with_the_cohort_are_flagged_at_most_alpha_of_the_time():
    """200 simulated cohorts of 39, each with one new patient from the same population: the flag's
    rate is the p-value's, at most 5 % (a binomial's 95 % range at 200 reaches 8 %)."""
    flagged = [not check(fit_cohort(_cohort(40, seed=100 + trial).iloc[:39]),
                         _features_of(_cohort(40, seed=100 + trial), 39))["inside"] for trial in range(200)]
    assert 0.01 <= np.mean(flagged) <= 0.08


def test_a_deleted_organ_and_a_ct_shifted_by_300_hu_are_flagged_and_say_which_feature():
    features = _cohort(40, seed=3)
    features["Larynx.volume_cc"] = features["Larynx.volume_cc"].fillna(20.0)  # everyone has a larynx
    features = features.fillna(0.1)
    rng = np.random.default_rng(3)
    for q, centre in zip((5, 25, 50, 75, 95), (-600, -80, 20, 50, 500)):
        features[f"ct.p{q}_hu"] = rng.normal(centre, 15, len(features))
    cohort = fit_cohort(features)
    usual = features.median().to_dict()
    assert check(cohort, usual)["inside"] and check(cohort, usual)["feature"] is None
    deleted = {**usual, **{name: math.nan for name in usual if name.startswith("Larynx.")}}
    found = check(cohort, deleted)
    assert not found["inside"] and found["p_value"] < 0.05 and found["feature"] == "Larynx.volume_cc"
    assert found["reasons"][0] == "Larynx is absent (not contoured); 40 of the 40 training patients have it"
    brighter = {**usual, **{name: value + 300 for name, value in usual.items() if name.startswith("ct.")}}
    found = check(cohort, brighter)
    assert not found["inside"] and found["feature"].startswith("ct.")
    assert "HU; the training cohort's highest was" in found["reasons"][0]


def test_a_structure_some_training_patients_lack_counts_by_how_many_lack_it():
    features = _cohort(30, seed=4).fillna(0.1)
    names = list(features.columns)
    row = features.iloc[0].to_numpy(float)
    lacking = row.copy()
    lacking[names.index("Larynx.volume_cc")] = math.nan
    others = features.iloc[1:].to_numpy(float).copy()
    part = nonconformity(names, lacking, others)[names.index("Larynx.volume_cc")]
    assert part == pytest.approx(math.log(30 / 1))  # none of the 29 lacks it
    others[:4, names.index("Larynx.volume_cc")] = math.nan
    assert nonconformity(names, lacking, others)[names.index("Larynx.volume_cc")] == pytest.approx(math.log(30 / 5))


def test_a_cohort_too_small_to_flag_at_alpha_says_so_and_flags_no_one():
    small = fit_cohort(_cohort(19, seed=5))
    assert small["threshold"] is None and not can_flag(19, 0.05) and can_flag(20, 0.05)
    odd = {**_cohort(19, seed=5).median().to_dict(), "PTV70.volume_cc": 1e5}
    found = check(small, odd)
    assert found["inside"] and found["p_value"] == 1 / 20
    assert found["too_small"] == too_small(19, 0.05) == (
        "a cohort of 19 training patients cannot flag at alpha 0.05: its smallest p-value is 1/20 = 0.050; "
        "20 patients are needed, or a larger alpha")
    assert not check(fit_cohort(_cohort(20, seed=5)), odd)["inside"]
    assert check(fit_cohort(_cohort(19, seed=5), alpha=0.1), odd)["too_small"] == ""


def test_training_patients_are_each_scored_against_the_others_and_flagged_as_rarely():
    features = _cohort(55, seed=6)
    scored = cohort_scores(fit_cohort(features))
    assert scored["flagged"].sum() <= 2  # p < 0.05 among 54 others: the two highest scores at most
    far = features.copy()
    far.loc["pt_far"] = far.iloc[0] * 3
    scored = cohort_scores(fit_cohort(far))
    assert scored.loc["pt_far", "flagged"] and scored.loc["pt_far", "p_value"] == 1 / 56
    assert scored.loc["pt_far", "feature"] is not None


def test_the_reasons_name_the_feature_and_the_cohort_s_range():
    features = _cohort(40, seed=3)
    cohort = fit_cohort(features)
    largest = features["PTV70.volume_cc"].max()
    most = features["Parotid.within_0mm"].max()  # 0 mm: the distance furthest beyond the cohort's, in robust scales
    odd = features.iloc[0].to_dict()
    odd["PTV70.volume_cc"] = 3 * largest
    odd.update({f"Parotid.within_{d}mm": 0.98 for d in OVH_DISTANCES_MM})
    found = check(cohort, odd)
    reasons = found["reasons"]
    assert not found["inside"]
    assert f"PTV70 volume {3 * largest:,.0f} cc; the training cohort's largest was {largest:,.0f} cc" in reasons
    assert (f"Parotid overlaps the targets far more than in any training patient (98 % inside a target; the "
            f"cohort's most was {100 * most:.0f} %)") in reasons  # one reason for the organ's four distances
    assert len(reasons) == len(set(reasons)) <= 3
    usual = check(cohort, features.median().to_dict())
    assert usual["inside"] and usual["reasons"] == []


def test_an_overlap_a_fraction_of_a_percent_beyond_a_cohort_that_has_almost_none_is_not_far_beyond():
    """Most patients' organ is clear of the targets (fractions of 0 to 0.2 %): 1 % is beyond their
    range by many of their robust scales, but by a fraction of the 0.05 floor that both the score
    (nonconformity) and the reasons measure in: more than in any training patient, not far more."""
    features = _cohort(40, seed=7)
    rng = np.random.default_rng(7)
    for distance in OVH_DISTANCES_MM:
        features[f"Parotid.within_{distance}mm"] = rng.uniform(0, 0.002, len(features))
    cohort = fit_cohort(features)
    names = list(features.columns)
    slightly = {**features.median().to_dict(), **{f"Parotid.within_{d}mm": 0.01 for d in OVH_DISTANCES_MM}}
    parts = nonconformity(names, np.array([slightly[name] for name in names], float), features.to_numpy(float))
    assert all(parts[names.index(f"Parotid.within_{d}mm")] < 1.0 for d in OVH_DISTANCES_MM)
    said = [reason for reason in check(cohort, slightly)["reasons"] if reason.startswith("Parotid overlaps")]
    assert len(said) == 1 and said[0].startswith("Parotid overlaps the targets more than in any training patient")
    far = {**slightly, **{f"Parotid.within_{d}mm": 0.5 for d in OVH_DISTANCES_MM}}
    assert any(reason.startswith("Parotid overlaps the targets far more") for reason in check(cohort, far)["reasons"])


def test_within_the_range_a_feature_is_said_against_the_cohort_s_median_not_its_range():
    """An overlap the cohort has from 0 % to 100 %: "more than most (…; the cohort's 0 % to 100 %)"
    says nothing; the median does. So for a volume, the body's extent and the CT."""
    features = _cohort(40, seed=3)
    rng = np.random.default_rng(3)
    for distance in OVH_DISTANCES_MM:
        column = rng.uniform(0.15, 0.25, len(features))
        column[:2] = (0.0, 1.0)
        features[f"Parotid.within_{distance}mm"] = column
    features["ct.p50_hu"] = rng.normal(20, 15, len(features))
    features.loc["pt_0", "ct.p50_hu"] = 400.0  # the range reaches far above the median
    cohort = fit_cohort(features)
    odd = {**features.median().to_dict(), **{f"Parotid.within_{d}mm": 0.8 for d in OVH_DISTANCES_MM}}
    found = check(cohort, odd)
    assert found["inside"]  # within every range: said, not flagged
    (said,) = [reason for reason in found["reasons"] if reason.startswith("Parotid overlaps")]
    median = features["Parotid.within_20mm"].median()
    assert said == (f"Parotid overlaps the targets more than most training patients (80 % within 20 mm of a target; "
                    f"the cohort's median {100 * median:.0f} %)")
    brighter = {**features.median().to_dict(), "ct.p50_hu": 300.0}
    (said,) = [reason for reason in check(cohort, brighter)["reasons"] if reason.startswith("the CT's")]
    assert said == (f"the CT's median inside the body is 300 HU, higher than most of the training cohort's (their "
                    f"median {round(features['ct.p50_hu'].median())} HU)")


def test_a_fraction_is_never_said_as_minus_zero_percent():
    features = _cohort(40, seed=3)
    cohort = fit_cohort(features)
    none = {**features.median().to_dict(), **{f"Parotid.within_{d}mm": -0.0 for d in OVH_DISTANCES_MM}}
    reasons = check(cohort, none)["reasons"]
    assert any(reason.startswith("Parotid overlaps the targets") for reason in reasons)
    assert not any("-0 %" in reason for reason in reasons)


def test_a_patient_flagged_by_one_feature_names_that_feature_first():
    """Structures no other training patient has add to the score, and would come first by the
    reasons' own order (none of the others has them), but the volume far beyond the others' range
    adds most: it is the flagged patient's feature, and its reason is said first."""
    features = _cohort(40, seed=8)
    features.loc["pt_0", "PTV70.volume_cc"] = 10 * features["PTV70.volume_cc"].max()
    for name in ("Brainstem", "Cord", "Mandible"):  # contoured in pt_0 alone
        features[f"{name}.volume_cc"] = math.nan
        features.loc["pt_0", f"{name}.volume_cc"] = 20.0
    scored = cohort_scores(fit_cohort(features))
    entry = scored.loc["pt_0"]
    assert entry["flagged"] and entry["p_value"] < 0.05 and entry["feature"] == "PTV70.volume_cc"
    assert entry["reasons"][0].startswith("PTV70 volume ")
    assert any(reason.startswith("Brainstem is present") for reason in entry["reasons"][1:])
