import json
import logging
import shutil

import numpy as np
import pandas as pd
import pytest

from provided_code.apps.score_folder import score_prediction_folder, write_score_reports
from provided_code.data.cache import load_split
from provided_code.data.csv_io import PatientDataError, exact_dose, write_dose_csv, write_sparse_csv
from provided_code.metrics.scoring import dvh_metrics, score_split
from provided_code.sites import openkbp
from tests.kit.repo import SAMPLE_DIR
from tests.kit.skips import requires_sample
from tests.kit.score_loop import score_folders_loop

STRUCTURES = openkbp().names  # OpenKBP's channel order


def reference(arrays, row):
    return exact_dose(arrays.dose[row], int(arrays.dose_decimals[row]))


def test_uniform_offset_of_one_gray_scores_exactly_one(phantom_split, tmp_path):
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    scores = score_split(arrays, lambda row: reference(arrays, row) + arrays.possible_dose_mask[row])
    assert scores.dose_errors.tolist() == [1.0, 1.0, 1.0]
    assert scores.dose_score == 1.0


def test_absent_structure_is_left_out_of_the_dvh_mean(phantom_split, tmp_path):
    (phantom_split / "pt_2" / "Larynx.csv").unlink()
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    scores = score_split(arrays, lambda row: reference(arrays, row) * 1.1)
    larynx = STRUCTURES.index("Larynx")
    assert np.isnan(scores.reference[1, larynx]).all() and np.isnan(scores.predicted[1, larynx]).all()
    entries = [abs(r - p) for r, p in zip(scores.reference.ravel(), scores.predicted.ravel()) if not np.isnan(r)]
    assert len(entries) == 3 * (7 * 2 + 3 * 3) - 2  # pt_2 lacks Larynx's two metrics
    assert scores.dvh_score == pytest.approx(np.mean(entries), abs=1e-12)  # float64 means of ~60 values, two orders
    summary = scores.summary()
    assert summary["patients"] == 3 and set(summary["dvh_by_metric"]) == set(openkbp().metric_names)


def _write_perturbed(arrays, folder, seed):
    rng = np.random.default_rng(seed)
    for row, pid in enumerate(arrays.patient_ids):
        dose = arrays.dose[row] * rng.uniform(0.9, 1.1, arrays.dose[row].shape).astype(np.float32) + 0.5
        write_dose_csv(folder / f"{pid}.csv", dose, arrays.possible_dose_mask[row])


def test_agrees_with_the_plain_loop_on_phantoms(phantom_data, tmp_path):
    split = phantom_data / "validation-pats"
    arrays = load_split(split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    _write_perturbed(arrays, tmp_path / "pred", seed=1)
    scores = score_prediction_folder(split, tmp_path / "pred", cache_dir=tmp_path / "c", site=openkbp())
    dose_score, dvh_score = score_folders_loop(split, tmp_path / "pred", arrays.patient_ids)
    # float64 both, different summation orders and pandas' text parser against the cache's exact doses: ~1e-12 Gy;
    # 1e-6 Gy is the bound the challenge's own loop is held to.
    assert abs(scores.dose_score - dose_score) < 1e-6 and abs(scores.dvh_score - dvh_score) < 1e-6
    assert scores.dose_score > 0.5 and scores.dvh_score > 0.1


@requires_sample
def test_agrees_with_the_plain_loop_on_real_patients(tmp_path):
    split = SAMPLE_DIR / "validation-pats"
    arrays = load_split(split, cache_dir=tmp_path / "c", site=openkbp())
    _write_perturbed(arrays, tmp_path / "pred", seed=2)
    scores = score_prediction_folder(split, tmp_path / "pred", cache_dir=tmp_path / "c", site=openkbp())
    dose_score, dvh_score = score_folders_loop(split, tmp_path / "pred", arrays.patient_ids)
    # as on phantoms: float64 both ways, the reference loop parses the CSVs with pandas (~1e-12 Gy apart)
    assert abs(scores.dose_score - dose_score) < 1e-6, (scores.dose_score, dose_score)
    assert abs(scores.dvh_score - dvh_score) < 1e-6, (scores.dvh_score, dvh_score)


def test_all_zero_prediction_writes_reads_back_and_scores(phantom_split, tmp_path):
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    for pid in arrays.patient_ids:
        write_dose_csv(tmp_path / "zero" / f"{pid}.csv", np.zeros((128, 128, 128), np.float32))
    scores = score_prediction_folder(phantom_split, tmp_path / "zero", cache_dir=tmp_path / "c", site=openkbp())
    expected = [reference(arrays, r).sum() / arrays.possible_dose_mask[r].sum() for r in range(3)]
    assert np.allclose(scores.dose_errors, expected)  # float64 sums against the float32 references restored: 1e-8 Gy
    assert np.all(np.nan_to_num(scores.predicted) == 0) and np.isfinite(scores.dvh_score)
    write_score_reports(scores, tmp_path / "s.json", tmp_path / "s.csv")
    assert json.loads((tmp_path / "s.json").read_text())["patients"] == 3


def test_prediction_folder_problems_name_patients_and_files(phantom_split, tmp_path, caplog):
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    folder = tmp_path / "pred"
    _write_perturbed(arrays, folder, seed=3)
    (folder / "pt_2.csv").unlink()
    shutil.copy(folder / "pt_1.csv", folder / "pt_9.csv")
    with pytest.raises(PatientDataError, match=r"no prediction for pt_2 \(expected pt_2\.csv\).*not in the reference: pt_9\.csv"):
        score_prediction_folder(phantom_split, folder, cache_dir=tmp_path / "c", site=openkbp())
    (folder / "pt_9.csv").unlink()
    shutil.copy(folder / "pt_1.csv", folder / "pt_2.csv")
    (folder / "pt_3.csv").write_text(",data\n")  # a header only
    (folder / "pt_1.csv").write_text(",data\n5,-2.5\n6,1\n")
    with caplog.at_level(logging.WARNING):
        score_prediction_folder(phantom_split, folder, cache_dir=tmp_path / "c", site=openkbp())
    assert "Patient pt_3: " in caplog.text and "pt_3.csv lists no voxel (a header only)" in caplog.text
    assert "Patient pt_1: " in caplog.text and "pt_1.csv has 1 negative doses (down to -2.5 Gy)" in caplog.text
    (folder / "pt_3.csv").write_text(",data\n5,abc\n")
    with pytest.raises(PatientDataError, match=r"Patient pt_3: .*pt_3\.csv: value 'abc' on line 2"):
        score_prediction_folder(phantom_split, folder, cache_dir=tmp_path / "c", site=openkbp())


def test_a_prediction_outside_the_possible_dose_mask_is_counted_and_named(phantom_split, tmp_path, caplog):
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    folder = tmp_path / "pred"
    for row, pid in enumerate(arrays.patient_ids):
        dose = arrays.dose[row].copy()
        if pid == "pt_2":
            dose.reshape(-1)[np.flatnonzero(~arrays.possible_dose_mask[row])[:1000]] = 1.0
        write_dose_csv(folder / f"{pid}.csv", dose)  # every non-zero voxel, mask or not
    with caplog.at_level(logging.WARNING):
        scores = score_prediction_folder(phantom_split, folder, cache_dir=tmp_path / "c", site=openkbp())
    assert ("Patient pt_2: the prediction is non-zero in 1000 voxel(s) outside the possible-dose mask (1000 Gy in "
            "all); the dose score counts them, as the challenge's does") in caplog.text
    assert "pt_1" not in caplog.text and "pt_3" not in caplog.text
    assert scores.dose_errors[1] == pytest.approx(1000 / arrays.possible_dose_mask[1].sum())  # as the challenge


def test_a_split_where_only_some_patients_have_reference_doses_scores_those(phantom_split, tmp_path, caplog):
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    _write_perturbed(arrays, tmp_path / "pred", seed=4)
    everyone = score_prediction_folder(phantom_split, tmp_path / "pred", cache_dir=tmp_path / "c", site=openkbp())
    (phantom_split / "pt_2" / "dose.csv").unlink()
    with caplog.at_level(logging.WARNING):
        scores = score_prediction_folder(phantom_split, tmp_path / "pred", cache_dir=tmp_path / "c", site=openkbp())
    assert f"Only 2 of 3 patients of {phantom_split} have a reference dose.csv: scoring those 2; no reference " \
           f"for pt_2" in caplog.text
    assert scores.patient_ids == ["pt_1", "pt_3"] and scores.without_reference == ["pt_2"]
    assert scores.dose_errors.tolist() == everyone.dose_errors[[0, 2]].tolist()
    summary = scores.summary()
    assert summary["patients"] == 2 and summary["patients_without_reference_dose"] == ["pt_2"]
    (tmp_path / "pred" / "pt_2.csv").unlink()  # a patient without reference needs no prediction
    scored = score_prediction_folder(phantom_split, tmp_path / "pred", cache_dir=tmp_path / "c", site=openkbp())
    assert scored.patient_ids == ["pt_1", "pt_3"]
    for pid in ("pt_1", "pt_3"):
        (phantom_split / pid / "dose.csv").unlink()
    with pytest.raises(PatientDataError, match="no patient has a reference dose.csv: nothing to score against"):
        score_prediction_folder(phantom_split, tmp_path / "pred", cache_dir=tmp_path / "c", site=openkbp())


def test_a_structure_no_larger_than_its_dvh_volume_has_its_least_dose_as_that_metric():
    """D_0.1_cc of an organ of 1 or 2 voxels (under 0.1 cc: 3 voxels of 3.9 x 3.9 x 2.5 mm) is its
    least dose: the hottest 0.1 cc hold all of it. The formula asked numpy for a negative percentile."""
    site = openkbp()
    larynx, d01 = site.names.index("Larynx"), site.metric_names.index("D_0.1_cc")
    doses = np.array([30.0, 20.0, 25.0, 40.0])
    for voxels in (1, 2, 3):
        indices = [np.arange(voxels) if name == "Larynx" else np.arange(0) for name in site.names]
        table = dvh_metrics(lambda v: doses[v], indices, np.array([3.9, 3.9, 2.5]), site)
        assert table[larynx, d01] == doses[:voxels].min()
        assert table[larynx, site.metric_names.index("mean")] == doses[:voxels].mean()
    indices = [np.arange(4) if name == "Larynx" else np.arange(0) for name in site.names]  # 4 voxels: as before
    table = dvh_metrics(lambda v: doses[v], indices, np.array([3.9, 3.9, 2.5]), site)
    assert table[larynx, d01] == np.percentile(doses, 100 - 3 / 4 * 100)


def test_a_patient_with_a_one_voxel_organ_is_scored(phantom_split, tmp_path):
    larynx = pd.read_csv(phantom_split / "pt_2" / "Larynx.csv", index_col=0).index.to_numpy()
    write_sparse_csv(phantom_split / "pt_2" / "Larynx.csv", larynx[len(larynx) // 2:][:1], None)  # about 0.04 cc
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    scores = score_split(arrays, lambda row: reference(arrays, row) * 1.1)
    row, column = openkbp().names.index("Larynx"), openkbp().metric_names.index("D_0.1_cc")
    voxel = reference(arrays, 1).reshape(-1)[larynx[len(larynx) // 2]]
    assert voxel > 0 and scores.reference[1, row, column] == voxel and scores.predicted[1, row, column] == voxel * 1.1
    assert np.isfinite(scores.dvh_score)

