"""A patient's anatomy features (volumes, overlap-volume histograms, the body's extent) and the
cohort's local outlier factor: leave-one-out, the threshold, the reasons in words."""

import json
import math
import time

import numpy as np
import pandas as pd
import pytest

from provided_code.data.csv_io import read_patient
from provided_code.metrics.anatomy import (FAR_SCALES, OVH_DISTANCES_MM, anatomy_features, check, cohort_scores,
                                           feature_names, fit_cohort, outside_range, score)
from provided_code.sites import openkbp, site_from_dict
from tests.kit.repo import SAMPLE_DIR
from tests.kit.skips import requires_sample

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


def test_a_training_patient_is_scored_against_the_others_only():
    features = _cohort(30, seed=0)
    cohort = fit_cohort(features)
    scores = cohort_scores(cohort)
    for row in (0, 7, 29):
        without = dict(cohort, patients=[p for k, p in enumerate(cohort["patients"]) if k != row],
                       vectors=[v for k, v in enumerate(cohort["vectors"]) if k != row])
        alone, reasons = score(without, features.iloc[row].to_dict())
        assert scores["score"].iloc[row] == pytest.approx(alone, rel=1e-9)  # one computation, rows reordered
        assert scores["reasons"].iloc[row] == reasons
    far = features.copy()
    far.loc["pt_far"] = far.iloc[0] * 3
    scored = cohort_scores(fit_cohort(far))
    assert scored.loc["pt_far", "flagged"] and scored["flagged"].sum() <= 2


def test_a_homogeneous_cohort_flags_about_five_percent_and_new_patients_like_it_as_few():
    cohort = fit_cohort(_cohort(120, seed=1))
    flagged = cohort_scores(cohort)["flagged"]
    assert flagged.sum() <= math.ceil(0.05 * len(flagged))
    new = _cohort(200, seed=2)
    rate = np.mean([score(cohort, new.iloc[row].to_dict())[0] > cohort["threshold"] for row in range(len(new))])
    assert rate <= 0.10  # ~5 % expected; 200 patients: a binomial's 95 % range reaches 8 %
    assert json.loads(json.dumps(cohort, allow_nan=False)) == cohort  # JSON-able, as saved with the model


def test_the_reasons_name_the_feature_and_the_cohort_s_range():
    features = _cohort(40, seed=3)
    cohort = fit_cohort(features)
    largest = features["PTV70.volume_cc"].max()
    most = features["Parotid.within_0mm"].max()  # 0 mm: the distance furthest beyond the cohort's, in robust scales
    odd = features.iloc[0].to_dict()
    odd["PTV70.volume_cc"] = 3 * largest
    odd.update({f"Parotid.within_{d}mm": 0.98 for d in OVH_DISTANCES_MM})
    factor, reasons = score(cohort, odd)
    assert factor > cohort["threshold"]
    assert f"PTV70 volume {3 * largest:,.0f} cc; the training cohort's largest was {largest:,.0f} cc" in reasons
    assert (f"Parotid overlaps the targets far more than in any training patient (98 % inside a target; the "
            f"cohort's most was {100 * most:.0f} %)") in reasons  # one reason for the organ's four distances
    assert len(reasons) == len(set(reasons)) <= 3
    usual, none = score(cohort, features.median().to_dict())
    assert usual < cohort["threshold"] and none == []


def test_an_absent_structure_the_cohort_has_is_a_reason_and_its_overlap_is_left_out():
    features = _cohort(30, seed=4)
    features["Larynx.volume_cc"] = features["Larynx.volume_cc"].fillna(20.0)  # everyone has a larynx
    features = features.fillna(0.1)
    cohort = fit_cohort(features)
    lacking = features.iloc[3].to_dict()
    lacking.update({name: math.nan for name in lacking if name.startswith("Larynx.")})
    factor, reasons = score(cohort, lacking)
    assert math.isfinite(factor)
    assert reasons[0] == "Larynx is absent (not contoured); 30 of the 30 training patients have it"


def test_outside_the_range_is_how_many_robust_scales_beyond_the_furthest_training_value():
    features = _cohort(40, seed=5)
    cohort = fit_cohort(features)
    median = features.median().to_dict()
    assert outside_range(cohort, median) == (0.0, None)
    volumes = features["PTV70.volume_cc"]
    scale = 1.4826 * (volumes - volumes.median()).abs().median()
    longer = {**median, "PTV70.volume_cc": volumes.max() + 2.5 * scale, "Larynx.volume_cc": math.nan}
    assert outside_range(cohort, longer) == (pytest.approx(2.5, rel=1e-9), "PTV70.volume_cc")
    shorter = {**median, "body.right_left_mm": features["body.right_left_mm"].min() - 0.5 * (
        1.4826 * (features["body.right_left_mm"] - features["body.right_left_mm"].median()).abs().median())}
    assert outside_range(cohort, shorter) == (pytest.approx(0.5, rel=1e-9), "body.right_left_mm")


def test_a_new_patient_is_outside_above_the_threshold_or_a_robust_scale_beyond_the_range():
    features = _cohort(40, seed=6)
    cohort = fit_cohort(features)
    median = features.median().to_dict()
    found = check(cohort, median)
    assert found["inside"] and found["score"] == score(cohort, median)[0] and found["outside_scales"] == 0.0
    volumes = features["PTV70.volume_cc"]
    scale = 1.4826 * (volumes - volumes.median()).abs().median()
    lenient = {**cohort, "threshold": 1e9}  # the range alone decides
    for beyond, inside in ((FAR_SCALES * 0.9, True), (FAR_SCALES * 1.1, False)):
        found = check(lenient, {**median, "PTV70.volume_cc": volumes.max() + beyond * scale})
        assert found["inside"] is inside and found["outside_feature"] == "PTV70.volume_cc"
    strict = check({**cohort, "threshold": 0.5}, median)  # the score alone decides
    assert not strict["inside"] and strict["outside_scales"] == 0.0
    odd = {**median, **{f"Parotid.within_{d}mm": 0.98 for d in OVH_DISTANCES_MM}, "PTV70.volume_cc": 3 * volumes.max()}
    assert not check(cohort, odd)["inside"] and check(cohort, odd)["reasons"] == score(cohort, odd)[1]


def test_an_overlap_a_fraction_of_a_percent_beyond_a_cohort_that_has_almost_none_is_not_far_beyond():
    """Most patients' organ is clear of the targets (fractions of 0 to 0.2 %): 1 % is beyond their
    range by many of their robust scales, but by a fraction of the 0.05 floor that both the rule
    (outside_range) and the reasons measure in: more than in any training patient, not far more."""
    features = _cohort(40, seed=7)
    rng = np.random.default_rng(7)
    for distance in OVH_DISTANCES_MM:
        features[f"Parotid.within_{distance}mm"] = rng.uniform(0, 0.002, len(features))
    cohort = fit_cohort(features)
    slightly = {**features.median().to_dict(), **{f"Parotid.within_{d}mm": 0.01 for d in OVH_DISTANCES_MM}}
    assert outside_range(cohort, slightly)[0] < 1.0
    said = [reason for reason in score(cohort, slightly)[1] if reason.startswith("Parotid overlaps")]
    assert len(said) == 1 and said[0].startswith("Parotid overlaps the targets more than in any training patient")
    far = {**slightly, **{f"Parotid.within_{d}mm": 0.5 for d in OVH_DISTANCES_MM}}
    assert any(reason.startswith("Parotid overlaps the targets far more") for reason in score(cohort, far)[1])


def test_within_the_range_a_feature_is_said_against_the_cohort_s_median_not_its_range():
    """An overlap the cohort has from 0 % to 100 %: "more than most (…; the cohort's 0 % to 100 %)"
    says nothing; the median does."""
    features = _cohort(40, seed=3)
    rng = np.random.default_rng(3)
    for distance in OVH_DISTANCES_MM:
        column = rng.uniform(0.15, 0.25, len(features))
        column[:2] = (0.0, 1.0)
        features[f"Parotid.within_{distance}mm"] = column
    cohort = fit_cohort(features)
    odd = {**features.median().to_dict(), **{f"Parotid.within_{d}mm": 0.8 for d in OVH_DISTANCES_MM}}
    (said,) = [reason for reason in score(cohort, odd)[1] if reason.startswith("Parotid overlaps")]
    median = features["Parotid.within_20mm"].median()
    assert said == (f"Parotid overlaps the targets more than most training patients (80 % within 20 mm of a target; "
                    f"the cohort's median {100 * median:.0f} %)")


def test_a_fraction_is_never_said_as_minus_zero_percent():
    features = _cohort(40, seed=3)
    cohort = fit_cohort(features)
    none = {**features.median().to_dict(), **{f"Parotid.within_{d}mm": -0.0 for d in OVH_DISTANCES_MM}}
    reasons = score(cohort, none)[1]
    assert any(reason.startswith("Parotid overlaps the targets") for reason in reasons)
    assert not any("-0 %" in reason for reason in reasons)


def test_a_patient_flagged_by_one_feature_names_that_feature_first():
    """Structures no other training patient has say more (they sort first) but do not flag; the
    volume far beyond the others' range flags the patient, and is named first."""
    features = _cohort(40, seed=8)
    features.loc["pt_0", "PTV70.volume_cc"] = 10 * features["PTV70.volume_cc"].max()
    for name in ("Brainstem", "Cord", "Mandible"):  # contoured in pt_0 alone
        features[f"{name}.volume_cc"] = math.nan
        features.loc["pt_0", f"{name}.volume_cc"] = 20.0
    scored = cohort_scores(fit_cohort(features))
    entry = scored.loc["pt_0"]
    assert entry["flagged"] and entry["outside_feature"] == "PTV70.volume_cc" and entry["outside_scales"] >= FAR_SCALES
    assert entry["reasons"][0].startswith("PTV70 volume ")
