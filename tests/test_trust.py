"""What a commissioned model lets a prediction say (provided_code/trust.py): the bands and the
in-distribution check apply to the folds they were made for, and every other model says why it has
none in one line; the band of a table against the arithmetic; the DVH table's columns; the RT
Dose's description. On model folders made of their files (no training)."""

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from provided_code.folds import SPLITS_FILE, Dealing
from provided_code.metrics import anatomy, calibration
from provided_code.run_folder import RunFolder
from provided_code.sites import site_from_dict
from provided_code.metrics.dvh_table import dvh_cell, dvh_columns
from provided_code.trust import (BANDS_FILE, COHORT_FILE, OUTSIDE, TrustError, bands_record, commissioning_folder,
                                 described, flag_line, load_trust)

SITE = site_from_dict({"name": "geometry", "beams": {"type": "none"}, "structures": [
    {"name": "Organ", "kind": "oar"}, {"name": "PTV", "kind": "target", "prescription_gy": 60}]}, "test")
EPOCHS = {1: 7, 2: 9}  # each fold's best epoch


def _residual_table(patients: int = 25) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"patient": f"pt_{p}", "structure": structure, "metric": metric, "difference": rng.normal(0.5, 2.0)}
            for p in range(patients) for structure, metric in (("Organ", "Dmean"), ("PTV", "D95"))]
    rows += [{"patient": f"pt_{p}", "structure": "PTV", "metric": "Dmax", "difference": 1.0} for p in range(3)]
    return pd.DataFrame(rows)


def _box(shape, low, high):
    box = np.zeros(shape, bool)
    box[tuple(slice(a, b) for a, b in zip(low, high))] = True
    return box


def _patient(size: int, organ: int = 5, body: int = 24):
    """Packed masks (Organ bit 0, PTV bit 1) and the body of a 24³ patient: the target ``size``
    voxels wide, the organ ``organ`` wide, the body ``body`` voxels long."""
    shape = (24, 24, 24)
    masks = _box(shape, (2, 2, 2), (2 + organ, 2 + organ, 2 + organ)).astype(np.uint16) | (
        _box(shape, (10, 10, 10), (10 + size, 10 + size, 10 + size)).astype(np.uint16) << 1)
    return masks, _box(shape, (0, 0, 0), (24, 24, body)), (2.0, 2.0, 2.0)


def _cohort(patients: int = 24) -> dict:
    """``patients`` patients, their targets 5 to 7 voxels wide, organs 4 to 6, bodies 20 to 24
    voxels long."""
    features = pd.DataFrame({f"pt_{k}": anatomy.anatomy_features(*_patient(5 + k % 3, 4 + k % 4 // 2 + k // 16,
                                                                           20 + k % 5), SITE)
                             for k in range(patients)}).T
    return anatomy.fit_cohort(features)


@pytest.fixture
def model(tmp_path):
    """A cross-validated model's folder as training and commissioning leave it: splits.json, two
    folds with their best records, commissioning/bands.json and cohort.json."""
    model_dir = tmp_path / "results" / "cv"
    model_dir.mkdir(parents=True)
    (model_dir / SPLITS_FILE).write_text(json.dumps(Dealing(2, 0, (("pt_1",), ("pt_2",))).to_dict()))
    for fold, epoch in EPOCHS.items():
        models = model_dir / f"fold-{fold}" / "models"
        models.mkdir(parents=True)
        (models / "best.json").write_text(json.dumps({"epoch": epoch, "val_dose_score": 3.0 + fold, "val_dvh_score": 5.0}))
        (models / "best.keras").write_bytes(b"")  # a best record is read beside its checkpoint
        for saved in (epoch - 1, epoch):
            (models / f"epoch_{saved}.keras").write_bytes(f"fold {fold} weights at epoch {saved}".encode())
    folds = [{"fold": fold, "epoch": epoch, "sha256": sha256} for fold, (_, epoch, sha256, _) in zip(EPOCHS, _used(model_dir))]
    folder = commissioning_folder(model_dir)
    folder.mkdir()
    (folder / BANDS_FILE).write_text(json.dumps(bands_record(_residual_table(), site_name=SITE.name, folds=folds)))
    (folder / COHORT_FILE).write_text(json.dumps(_cohort()))
    return model_dir


def _used(model_dir, epochs=EPOCHS):
    """Each fold's ``(run folder, epoch, SHA-256 of its checkpoint, the checkpoint)``, as a deployed
    model's members name them (provided_code.deployed_model.DeployedModel.trust)."""
    return [(folder, epoch, _sha256(folder.checkpoint(epoch)), folder.checkpoint(epoch))
            for fold, epoch in epochs.items() for folder in [RunFolder(model_dir / f"fold-{fold}")]]


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_folds_at_their_commissioned_checkpoints_have_bands_and_the_check(model):
    trust = load_trust(model, _used(model), 0.8)
    assert trust.bands is not None and trust.cohort is not None and not trust.why_no_bands
    assert trust.lines()[0] == ("Bands: 80 % nominal coverage, split-conformal, equal-tailed, on out-of-fold "
                                "residuals of 25 training patients")
    assert trust.bands["folds"] == [
        {"fold": fold, "epoch": epoch, "sha256": hashlib.sha256(f"fold {fold} weights at epoch {epoch}".encode()).hexdigest()}
        for fold, epoch in EPOCHS.items()]


def test_the_band_of_a_table_is_the_arithmetics_and_says_where_there_is_none(model):
    trust = load_trust(model, _used(model), 0.9)
    residuals = calibration.sorted_residuals(_residual_table())
    found = trust.band({"Organ": {"Dmean": 20.0}, "PTV": {"D95": 58.0, "Dmax": 66.0, "D50": 60.0}})
    assert (found["coverage"], found["patients"]) == (0.9, 25)
    for structure, metric, value in (("Organ", "Dmean", 20.0), ("PTV", "D95", 58.0)):
        low, high = calibration.band(value, residuals[structure][metric], 0.9)
        assert (found["low"][structure][metric], found["high"][structure][metric]) == (low, high)
        assert low < value < high
    assert found["low"]["PTV"]["Dmax"] is None and found["high"]["PTV"]["D50"] is None
    assert found["without"] == [
        {"structure": "PTV", "metric": "Dmax", "patients": 3, "reason": "3 training patients give at most 50 %; 19 needed"},
        {"structure": "PTV", "metric": "D50", "patients": 0, "reason": "no training patient has PTV D50"}]


def test_a_patient_unlike_the_cohort_is_flagged_with_its_p_value_and_the_feature(model):
    trust = load_trust(model, _used(model))
    assert trust.lines()[1] == ("In-distribution check: against the anatomy and CT of the 24 training patients (a "
                                "conformal p-value below 0.05: outside the training cohort)")
    inside = trust.in_distribution(*_patient(6, 5, 22), SITE)
    assert inside["inside"] and inside["p_value"] >= 0.05 and inside["alpha"] == trust.cohort["alpha"] == 0.05
    assert flag_line(inside) == f"In the training cohort (p = {inside['p_value']:.3f}, alpha 0.05)"
    outside = trust.in_distribution(*_patient(12, 5, 22), SITE)
    assert not outside["inside"] and outside["p_value"] == 1 / 25 and outside["feature"] == "PTV.volume_cc"
    assert outside["reasons"][0].startswith("PTV volume 13.8 cc; the training cohort's largest was 2.7 cc")
    assert flag_line(outside).startswith("Outside the training cohort (p = 0.040, alpha 0.05; flagged by "
                                         "PTV.volume_cc): PTV volume 13.8 cc")
    assert described("Predicted dose, cv 2 folds", outside) == f"Outside the training cohort: predicted dose, cv 2 folds"
    assert described("Predicted dose, cv 2 folds", inside) == "Predicted dose, cv 2 folds"
    assert OUTSIDE == "outside the training cohort"
    assert not trust.uncommissioned


def test_a_ct_shifted_by_300_hu_is_flagged_by_the_ct(model):
    ct = np.full((24, 24, 24), 1000, np.uint16)  # HU 0 everywhere: the cohort below has 0 to 20 HU
    features = pd.DataFrame({f"pt_{k}": anatomy.anatomy_features(*_patient(5 + k % 3, 5, 22), SITE, ct + k)
                             for k in range(24)}).T
    (commissioning_folder(model) / COHORT_FILE).write_text(json.dumps(anatomy.fit_cohort(features)))
    trust = load_trust(model, _used(model))
    assert trust.in_distribution(*_patient(6, 5, 22), SITE, ct + 10)["inside"]
    shifted = trust.in_distribution(*_patient(6, 5, 22), SITE, ct + 310)
    assert not shifted["inside"] and shifted["feature"].startswith("ct.p")
    assert shifted["reasons"][0].startswith("the CT's")
    assert "inside the body is 310 HU; the training cohort's highest was 23 HU" in shifted["reasons"][0]


def test_a_cohort_too_small_to_flag_says_so_once_and_at_every_prediction(model):
    (commissioning_folder(model) / COHORT_FILE).write_text(json.dumps(_cohort(12)))
    trust = load_trust(model, _used(model))
    small = ("a cohort of 12 training patients cannot flag at alpha 0.05: its smallest p-value is 1/13 = 0.077; 20 "
             "patients are needed, or a larger alpha")
    assert trust.lines()[1] == f"In-distribution check: never flags: {small}"
    assert f"In-distribution check: never flags: {small}" in trust.missing_lines()
    found = trust.in_distribution(*_patient(12, 5, 22), SITE)  # far outside, yet p = 1/13
    assert found["inside"] and found["too_small"] == small
    assert flag_line(found) == f"In the training cohort (p = 0.077, alpha 0.05); the check cannot flag: {small}"


def test_a_cohort_of_the_earlier_check_asks_for_commissioning_again(model):
    earlier = {**_cohort(), "format": 1}
    (commissioning_folder(model) / COHORT_FILE).write_text(json.dumps(earlier))
    trust = load_trust(model, _used(model))
    assert trust.cohort is None and trust.bands is not None
    assert trust.lines()[1] == (f"No in-distribution check: {model}/commissioning/cohort.json is of an earlier check "
                                f"(format 1, not 2: no calibrated p-value): run openkbp-commission {model} again")


def test_a_coverage_no_metric_has_patients_enough_for_is_said_once_with_the_widest_that_has(model):
    trust = load_trust(model, _used(model), coverage=0.97)
    needed = calibration.patients_needed(0.97)
    assert trust.lines()[0] == (f"No prediction bands at 97 % nominal coverage: a metric's residuals come from 25 "
                                f"training patients at most, {needed} are needed (--band 0.92 or lower gives bands)")
    assert load_trust(model, _used(model), coverage=0.92).band({"Organ": {"Dmean": 20.0}})["low"]["Organ"]["Dmean"] \
        is not None  # the widest it names gives one


def test_other_checkpoints_than_the_commissioned_have_the_check_but_no_bands(model):
    trust = load_trust(model, _used(model, {1: 7, 2: 8}))
    assert trust.bands is None and trust.cohort is not None
    assert trust.why_no_bands == (f"the bands were calibrated on other checkpoints than those predicting (fold 2 at "
                                  f"epoch 8 (commissioned at epoch 9)): predict with each fold's commissioned checkpoint "
                                  f"(the default), or run openkbp-commission {model} again")


def test_a_checkpoint_replaced_since_the_commissioning_is_named_with_both_sha256(model):
    checkpoint = model / "fold-2" / "models" / "epoch_9.keras"
    then = _sha256(checkpoint)
    checkpoint.write_bytes(b"fold 2 trained again")
    assert (f"fold 2 at epoch 9 ({checkpoint}: SHA-256 {_sha256(checkpoint)[:12]}…, not the {then[:12]}… its "
            f"commissioning measured)" in load_trust(model, _used(model)).why_no_bands)


def test_the_folds_best_checkpoints_are_named_as_the_files_the_bands_were_not_calibrated_on(model):
    """--ensemble cv --epoch best: each fold's best.keras, at the epoch commissioned (its final was
    its best here) but another file than the one the commissioning measured: named, with its SHA-256."""
    used = [(folder, epoch, _sha256(folder.best_checkpoint), folder.best_checkpoint)
            for folder, epoch, _, _ in _used(model)]
    best = model / "fold-1" / "models" / "best.keras"
    assert (f"fold 1 at epoch 7 ({best}: SHA-256 {_sha256(best)[:12]}…, not the "
            f"{_sha256(model / 'fold-1' / 'models' / 'epoch_7.keras')[:12]}… its commissioning measured)"
            in load_trust(model, used).why_no_bands)


@pytest.mark.parametrize("case, expected", [
    ("single run", "m is a single run, not a cross-validated model: bands and the check are calibrated on the "
                   "out-of-fold predictions of a model's folds (train it with --folds N --fold K, then run "
                   "openkbp-commission)"),
    ("one fold", "fold-1 is one fold of cv: its commissioning assesses the folds together (predict with {model})"),
    ("some folds", "the prediction is made with 1 model(s), not the 2 folds of cv together: its commissioning "
                   "assesses those"),
    ("not commissioned", "cv is not commissioned (no {model}/commissioning/bands.json): run "
                         "openkbp-commission {model}"),
])
def test_a_model_without_bands_says_why_in_one_line(model, case, expected):
    if case == "single run":
        single = model.parent / "m"
        (single / "models").mkdir(parents=True)
        trust = load_trust(single, [(RunFolder(single), 3, "0" * 64, single / "models" / "epoch_3.keras")])
    elif case == "one fold":
        trust = load_trust(model / "fold-1", _used(model, {1: 7})[:1])
    elif case == "some folds":
        trust = load_trust(model, _used(model, {1: 7}))
    else:
        for path in commissioning_folder(model).iterdir():
            path.unlink()
        trust = load_trust(model, _used(model))
    assert trust.bands is None and trust.cohort is None and trust.uncommissioned
    assert trust.lines() == [f"No prediction bands or in-distribution check: {expected.format(model=model)}"]
    assert described("Predicted dose, m epoch 3", None, trust.uncommissioned) == (
        "Uncommissioned model: predicted dose, m epoch 3")


def test_a_model_commissioned_before_bands_has_the_check_and_says_why_it_has_no_bands(model):
    (commissioning_folder(model) / BANDS_FILE).unlink()
    trust = load_trust(model, _used(model))
    assert not trust.uncommissioned  # it has the check
    assert trust.cohort is not None and trust.lines()[0] == (
        f"No prediction bands: cv was commissioned before bands existed (no {model}/commissioning/bands.json): "
        f"run openkbp-commission {model} again")


def test_an_unreadable_bands_file_is_one_line_naming_it(model):
    (commissioning_folder(model) / BANDS_FILE).write_text("{not json")
    with pytest.raises(TrustError, match=r"bands\.json: unreadable .*; run openkbp-commission again"):
        load_trust(model, _used(model))


def test_the_bands_columns_come_right_after_each_predicted_one_and_empty_cells_stay_empty():
    assert dvh_columns(["D99", "Dmax"], ["predicted", "reference"], True) == [
        ("D99", "predicted"), ("D99", "low"), ("D99", "high"), ("D99", "reference"),
        ("Dmax", "predicted"), ("Dmax", "low"), ("Dmax", "high"), ("Dmax", "reference")]
    assert dvh_columns(["D99"], ["predicted"], False) == [("D99", "predicted")]
    report = {"predicted": {"PTV": {"D99": 55.12345}}, "band": {"low": {"PTV": {"D99": None}}, "high": {"PTV": {}}}}
    assert [dvh_cell(report, "PTV", "D99", source) for source in ("predicted", "low", "high")] == ["55.123", "", ""]
