"""``openkbp-dicom predict``: a clinic's DICOM through a trained model to RT Dose, NIfTI and a DVH table."""

import json
import os
import shutil
import zipfile

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

import provided_code.apps.clinic as clinic_module  # noqa: E402
from provided_code.apps.dicom_cli import main  # noqa: E402
from provided_code import inference  # noqa: E402
from provided_code.config import TrainConfig  # noqa: E402
from provided_code.data.csv_io import exact_dose  # noqa: E402
from provided_code.deployed_model import DeployedModel  # noqa: E402
from provided_code.data.split_arrays import SplitArrays  # noqa: E402
from provided_code.data.csv_io import read_dose_csv, read_patient  # noqa: E402
from provided_code.data.phantoms import make_phantom  # noqa: E402
from tests.kit.synthetic import CLINICAL_NAMES, write_patient  # noqa: E402
from provided_code.metrics.dvh_table import CLINICAL_METRICS, clinical_dvh  # noqa: E402
from provided_code.metrics.scoring import score_split, structure_indices  # noqa: E402
from provided_code.run_folder import RunFolder, TrainedModel  # noqa: E402
from provided_code.sites import openkbp  # noqa: E402
from tests.kit.repo import SAMPLE_DIR  # noqa: E402
from tests.kit.skips import requires_sample  # noqa: E402
from tests.kit.tiers import SLOW_FOR_ITS_TIME

STRUCTURES = openkbp().names  # OpenKBP's channel order


def test_clinical_dvh_table_by_hand():
    dose = np.arange(1000, dtype=np.float64).reshape(10, 10, 10) / 10.0
    indices = [np.array([], np.int64)] * len(STRUCTURES)
    indices[STRUCTURES.index("PTV70")] = np.arange(101)  # doses 0.0, 0.1, ..., 10.0
    table = clinical_dvh(dose, indices, openkbp())
    assert list(table) == ["PTV70"] and list(table["PTV70"]) == list(CLINICAL_METRICS)
    assert table["PTV70"] == pytest.approx({"D99": 0.1, "D95": 0.5, "D50": 5.0, "Dmean": 5.0, "D1": 9.9, "Dmax": 10.0})


@pytest.mark.slow
def test_predict_from_dicom_writes_rtdose_nifti_dvh_and_plots(tiny_model, tmp_path):
    volumes = make_phantom(11)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    clinic = write_patient(tmp_path / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"], volumes["dose"],
                           factor=1, extra_slices=(4, 4))
    out = tmp_path / "out"
    # The console script's command, in this process (TensorFlow is loaded already).
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(tiny_model), "--ct",
                                       str(clinic.ct_dir), "--rtstruct", str(clinic.rtstruct), "--rtdose",
                                       str(clinic.rtdose), "--out", str(out), "--tta"])
    assert result.exit_code == 0, result.output
    assert "Predicted with the epoch 1 checkpoint" in result.output and "dose score" in result.output
    for name in ("RD.dcm", "dose.nii.gz", "dvh.csv", "dvh.json", "prediction.csv", "patient/dicom.json",
                 "patient/dose.csv", "dose_dvh.png", "dose_slices.png"):
        assert (out / name).is_file(), name

    patient = read_patient(out / "patient", site=openkbp())
    arrays = SplitArrays.from_patients([patient], site=openkbp())
    predicted = read_dose_csv(out / "prediction.csv")
    assert not predicted[~patient.possible_dose_mask].any() and predicted[patient.possible_dose_mask].max() > 0
    report = json.loads((out / "dvh.json").read_text())
    assert report["model"]["epoch"] == 1 and report["model"]["tta"] is True
    # The table is on the CT's grid; this CT (factor 1) has the box's pixels, so it is the box's table.
    expected = clinical_dvh(predicted, structure_indices(patient.structure_masks, 10), openkbp())
    assert list(report["predicted"]) == list(expected)
    for structure, metrics in expected.items():
        # the table reads the float32 dose, the test its CSV's shortest decimals (half an ulp, 6e-8 relative)
        assert report["predicted"][structure] == pytest.approx(metrics, rel=1e-5)
    # the clinic's RT Dose holds integers × DoseGridScaling and is sampled at the voxel centres: ~1e-3 Gy
    assert report["reference"]["PTV70"]["D50"] == pytest.approx(np.median(volumes["dose"][volumes["PTV70"]]), abs=0.01)
    scores = score_split(arrays, lambda row: predicted)
    # float32 prediction in memory against its CSV decimals read back; the reference through the RT Dose's scaling
    assert report["scores"]["dose_score"] == pytest.approx(scores.dose_score, rel=1e-4)
    table = pd.read_csv(out / "dvh.csv")
    assert table["structure"].tolist() == list(report["predicted"])
    assert table.loc[table.structure == "PTV70", "Dmax_reference"].item() == pytest.approx(
        report["reference"]["PTV70"]["Dmax"], abs=1e-3)  # dvh.csv writes 3 decimals: within 5e-4 Gy

    rd = pydicom.dcmread(out / "RD.dcm")
    assert (rd.Rows, rd.Columns, rd.NumberOfFrames) == (128, 128, 136)
    assert rd.FrameOfReferenceUID == clinic.frame_of_reference_uid
    values = rd.pixel_array * float(rd.DoseGridScaling)
    assert not values[:4].any() and not values[-4:].any()  # CT slices outside the 128³ box: no dose
    # linear interpolation onto the CT's pixels only averages: its maximum is at most the box's, a little lower
    assert values.max() == pytest.approx(float(predicted.max()), rel=0.05)


def _dicompyler_dvhcalc(monkeypatch):
    """dicompyler-core's DVH calculation; its 0.5.6 imports ``read_file``, which pydicom 3 removed."""
    pytest.importorskip("dicompylercore", reason="dicompyler-core (the dev extra) is not installed")
    import pydicom.dicomio

    monkeypatch.setattr(pydicom.dicomio, "read_file", pydicom.dcmread, raising=False)
    from dicompylercore import dvhcalc

    return dvhcalc


def _tolerance(doses: np.ndarray, metric: str) -> float:
    """How far dicompyler-core's figure may lie from ours when both count the same voxels: its
    histogram has 0.01 Gy bins (Dmax: a bin's upper edge; Dmean: bin centres) and its Dx is the
    (lowest) bin edge whose volume is nearest x %, anywhere in a dose interval that holds no
    voxel, where ours interpolates between the two voxels around that rank: one bin, plus for Dx
    the doses from the next lower to the next higher dose than the voxels beside that rank."""
    bin_gy = 0.01 + 1e-6  # and RD.dcm's 32-bit pixel scaling (1e-8 Gy here) and float rounding
    if metric in ("Dmean", "Dmax"):
        return bin_gy
    rank = (1 - float(metric[1:]) / 100) * (doses.size - 1)
    ordered = np.sort(doses)
    low, high = ordered[max(int(np.floor(rank)) - 1, 0)], ordered[min(int(np.ceil(rank)) + 1, doses.size - 1)]
    below, above = ordered[ordered < low], ordered[ordered > high]
    return bin_gy + float((above[0] if above.size else high) - (below[-1] if below.size else low))


def _model_replaced_by_the_reference_moved(run, monkeypatch) -> list:
    """A run folder whose model's place is taken by the clinic's dose moved 2 voxels (a prediction
    that is not the reference); returns the list each prediction is appended to."""
    (run / "models").mkdir(parents=True)
    (run / "models" / "config.json").write_text("{}")
    with zipfile.ZipFile(run / "models" / "epoch_7.keras", "w") as archive:  # what the deployed model hashes
        archive.writestr("a stand-in", "")  # a complete .keras file is a zip archive
    monkeypatch.setattr(RunFolder, "load_trained_model", lambda folder, epoch: TrainedModel(
        folder, TrainConfig(resolution=128), TrainConfig(resolution=128).spec, 7, None))
    predictions = []

    def predict(model, arrays, *args, **kwargs):
        predictions.append(np.where(arrays.possible_dose_mask[0], np.roll(
            exact_dose(arrays.dose[0], int(arrays.dose_decimals[0])), 2, axis=1), 0).astype(np.float32))
        return predictions

    monkeypatch.setattr(inference, "predict_full_resolution", predict)
    return predictions


def _short_scan_patient(folder, seed):
    """A phantom's clinic export (CT, RTSTRUCT, RT Dose) cut to PTV70's slices and two more on each
    side: a short scan, fast."""
    volumes = make_phantom(seed)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    target_slices = np.flatnonzero(volumes["PTV70"].any((0, 1)))
    keep = slice(target_slices.min() - 2, target_slices.max() + 3)
    return write_patient(folder, volumes["ct"][:, :, keep], {k: m[:, :, keep] for k, m in masks.items()},
                         volumes["voxel_dimensions"], volumes["dose"][:, :, keep], factor=1)


def test_a_model_predicting_nan_is_named_and_the_message_says_the_import_was_written(tmp_path, monkeypatch):
    """The clinic's path imports before it predicts: a checkpoint whose doses are not finite is one
    line naming it and its log, which says that the imported patient is on disk and no dose is."""
    clinic = _short_scan_patient(tmp_path / "clinic", seed=3)
    run = tmp_path / "run"
    _model_replaced_by_the_reference_moved(run, monkeypatch)

    def diverged(model, arrays, spec, batch_size, tta, progress, label):
        raise inference.PredictionError(f"{label} predicts NaN or infinite doses for patient")

    monkeypatch.setattr(inference, "predict_full_resolution", diverged)
    out = tmp_path / "out"
    with pytest.raises(inference.PredictionError) as caught:
        clinic_module.predict_dicom_patient(DeployedModel.open(run), clinic.ct_dir, clinic.rtstruct, out, plots=False)
    assert str(caught.value) == (f"Model 'run' at epoch 7 predicts NaN or infinite doses for patient: this checkpoint "
                                 f"is unusable (did training diverge? see {run / 'training_log.csv'}); no dose was "
                                 f"written ({out / 'patient'} holds the imported patient).")
    assert (out / "patient" / "ct.csv").is_file() and not (out / "RD.dcm").exists()


@SLOW_FOR_ITS_TIME
@pytest.mark.filterwarnings("ignore:The 'pydicom.pixel_data_handlers' module:DeprecationWarning")
def test_dvh_table_is_what_dicompyler_core_computes_from_the_rt_dose_and_rtstruct(tmp_path, monkeypatch):
    """Oracle: dicompyler-core (an independent DVH calculator) on the exported RD.dcm, and on the
    clinic's own RT Dose, with the clinic's RTSTRUCT. The CT is 256 × 256 (twice the box's
    in-plane resolution): a table on the 128³ voxels differs by up to 0.8 Gy (Dmax) here."""
    dvhcalc = _dicompyler_dvhcalc(monkeypatch)
    volumes = make_phantom(3)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    target_slices = np.flatnonzero(volumes["PTV70"].any((0, 1)) | volumes["PTV63"].any((0, 1)))
    keep = slice(target_slices.min() - 3, target_slices.max() + 4)  # a short scan: fast, and padded in the box
    clinic = write_patient(tmp_path / "clinic", volumes["ct"][:, :, keep], {k: m[:, :, keep] for k, m in masks.items()},
                           volumes["voxel_dimensions"], volumes["dose"][:, :, keep], factor=2)
    predictions = _model_replaced_by_the_reference_moved(tmp_path / "run", monkeypatch)
    out = tmp_path / "out"
    report = clinic_module.predict_dicom_patient(DeployedModel.open(tmp_path / "run"), clinic.ct_dir, clinic.rtstruct,
                                                 out, rtdose=clinic.rtdose, plots=False)
    table = json.loads((out / "dvh.json").read_text())
    geometry = report.imported.geometry
    assert table["grid"]["rows"] == 256 and table["grid"]["slices"] == len(clinic.slice_z)

    rs = pydicom.dcmread(clinic.rtstruct)
    numbers = {roi.ROIName: int(roi.ROINumber) for roi in rs.StructureSetROISequence}
    voxel_cc = np.prod(geometry.pixel_spacing) * geometry.slice_spacing / 1000
    for source, rtdose in (("predicted", out / "RD.dcm"), ("reference", clinic.rtdose)):
        rd = pydicom.dcmread(rtdose)
        # frames run ascending in z, the CT's slices (and the voxel indices) descending
        dose_ct = (rd.pixel_array * float(rd.DoseGridScaling))[::-1].reshape(-1)
        for structure in ("SpinalCord", "PTV63", "PTV70"):
            oracle = dvhcalc.get_dvh(str(clinic.rtstruct), str(rtdose), numbers[CLINICAL_NAMES[structure]])
            voxels = report.imported.ct_voxels[structure]
            # Contours traced at half-pixel positions pass through no pixel centre: both fills take the same pixels.
            assert voxels.size * voxel_cc == pytest.approx(oracle.volume, rel=1e-9), structure
            theirs = {"Dmean": oracle.mean, "Dmax": oracle.max,
                      **{m: oracle.statistic(m).value for m in ("D99", "D95", "D50", "D1")}}
            for metric, value in theirs.items():
                ours = table[source][structure][metric]
                # dicompyler-core's 0.01 Gy bins, plus (Dx) the dose gap around the percentile's rank: _tolerance
                tolerance = _tolerance(dose_ct[voxels], metric)
                assert ours == pytest.approx(value, abs=tolerance), (source, structure, metric)

    # The challenge's scores stay on the 128³ grid they are defined on.
    arrays = SplitArrays.from_patients([read_patient(out / "patient", site=openkbp())], site=openkbp())
    # the same float32 prediction scored in memory and from its CSV decimals (half an ulp each): under 1e-6
    assert table["scores"]["dose_score"] == pytest.approx(score_split(arrays, lambda row: predictions[0]).dose_score,
                                                          rel=1e-6)


def test_a_dose_above_the_sites_plausible_ceiling_is_a_warning_in_the_log_the_table_and_the_rt_dose(
        tmp_path, monkeypatch, caplog):
    """A badly trained model's 860 Gy: openkbp-dicom predict writes its outputs, and says so in the log,
    the summary, dvh.json and the RT Dose's Dose Comment (OpenKBP's ceiling: 1.3 × 70 Gy)."""
    import logging

    clinic = _short_scan_patient(tmp_path / "clinic", seed=4)
    _model_replaced_by_the_reference_moved(tmp_path / "run", monkeypatch)
    predictions = []

    def implausible(model, arrays, *args, **kwargs):
        predictions.append(np.where(arrays.possible_dose_mask[0], 12.0 * exact_dose(
            arrays.dose[0], int(arrays.dose_decimals[0])), 0).astype(np.float32))
        return predictions

    monkeypatch.setattr(inference, "predict_full_resolution", implausible)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="provided_code"):
        result = CliRunner().invoke(main, ["predict", "--model-dir", str(tmp_path / "run"), "--ct", str(clinic.ct_dir),
                                           "--rtstruct", str(clinic.rtstruct), "--rtdose", str(clinic.rtdose),
                                           "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    top = float(predictions[0].max())
    assert top > 91
    found = json.loads((out / "dvh.json").read_text())["dose_ceiling"]
    assert found["max_gy"] == pytest.approx(top, abs=1e-3) and found["ceiling_gy"] == pytest.approx(91.0)
    assert found["voxels"] == int(np.count_nonzero(predictions[0] > found["ceiling_gy"]))
    said = f"predicted dose above the plausible ceiling: {top:.1f} Gy at most, over 91 Gy in {found['voxels']} voxel(s)"
    assert f"Warning: {said}" in result.output
    assert [r.getMessage() for r in caplog.records if "plausible ceiling" in r.getMessage()] == [
        f"The prediction from {clinic.ct_dir}: {said} (the ceiling: 1.3 × the site openkbp's highest prescription, "
        f"70 Gy); no plan gives such a dose: the model is likely badly trained, check it before using its predictions"]
    rd = pydicom.dcmread(out / "RD.dcm")
    assert rd.DoseComment == f"Above the plausible ceiling: {top:.0f} Gy > 91 Gy"


def test_predict_with_dvh_supersample_tabulates_sub_voxels_of_the_rt_doses(tmp_path, monkeypatch):
    """``--dvh-supersample 2``: dvh.json says so, and holds the supersampled table of RD.dcm as written
    and of the clinic's RT Dose, over the structures the RTSTRUCT holds."""
    from provided_code.dicom.dvh import dvh_report, structures_of_rtstruct
    from provided_code.dicom.grid import PatientGeometry
    from provided_code.dicom.rtdose import read_rtdose

    clinic = _short_scan_patient(tmp_path / "clinic", seed=5)
    _model_replaced_by_the_reference_moved(tmp_path / "run", monkeypatch)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(tmp_path / "run"), "--ct", str(clinic.ct_dir),
                                       "--rtstruct", str(clinic.rtstruct), "--rtdose", str(clinic.rtdose), "--out",
                                       str(out), "--no-plots", "--dvh-supersample", "2"])
    assert result.exit_code == 0, result.output
    table = json.loads((out / "dvh.json").read_text())
    assert table["grid"]["supersample"] == 2
    geometry = PatientGeometry.read(out / "patient")
    ct_voxels, contours = structures_of_rtstruct(clinic.rtstruct, geometry)
    rd = pydicom.dcmread(out / "RD.dcm")
    held = (rd.pixel_array * float(rd.DoseGridScaling))[::-1]  # frames ascending in z, the CT's slices descending
    expected = dvh_report(geometry, ct_voxels, contours,
                          {"predicted": held, "reference": read_rtdose(clinic.rtdose, geometry.frame_of_reference_uid)},
                          supersample=2)
    assert table["supersampled"] == expected["supersampled"] and set(table["supersampled"].values()) <= {2, 4}
    assert "dose_ceiling" not in table and rd.DoseComment == rd.SeriesDescription  # a plausible dose: no warning
    assert table["volume_cc"] == pytest.approx(expected["volume_cc"], rel=1e-12)
    for source in ("predicted", "reference"):
        assert list(table[source]) == list(expected[source])
        for structure, metrics in expected[source].items():
            # the prediction in memory against RD.dcm's 32-bit pixels: within the scaling (1e-8 Gy here)
            assert table[source][structure] == pytest.approx(metrics, abs=4 * float(rd.DoseGridScaling)), structure


def test_plots_of_a_patient_without_a_reference_show_the_prediction_alone(tmp_path):
    pytest.importorskip("matplotlib")
    from provided_code.plots import plot_patient

    volumes = make_phantom(2)
    patient = read_patient_like(volumes)
    arrays = SplitArrays.from_patients([patient], site=openkbp())
    assert not arrays.has_dose[0]
    paths = plot_patient(tmp_path, "patient", arrays, 0, volumes["dose"], stem="dose")
    assert [p.name for p in paths] == ["dose_dvh.png", "dose_slices.png"] and all(p.stat().st_size > 0 for p in paths)


def read_patient_like(volumes):
    """A :class:`Patient` of a phantom's volumes, without a dose."""
    from provided_code.data.csv_io import Patient

    structure_masks = np.zeros(volumes["ct"].shape, np.uint16)
    for bit, name in enumerate(STRUCTURES):
        structure_masks[volumes[name]] |= np.uint16(1 << bit)
    return Patient("patient", volumes["ct"], structure_masks, volumes["possible_dose_mask"],
                   np.asarray(volumes["voxel_dimensions"], float), None)


# -- the model's site ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_cross_validated_models_folds_predict_a_clinics_patient_together(cv_model, tmp_path):
    """openkbp-dicom predict on a cross-validated model's folder: its folds predict the patient, their
    doses averaged, as the deployed ensemble; the RT Dose and dvh.json say so."""
    import pydicom

    volumes = make_phantom(13)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    clinic = write_patient(tmp_path / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"], None, factor=1)
    doses, outputs = {}, {}
    for model in (cv_model, cv_model / "fold-1", cv_model / "fold-2"):
        out = tmp_path / model.name
        result = CliRunner().invoke(main, ["predict", "--model-dir", str(model), "--ct", str(clinic.ct_dir),
                                           "--rtstruct", str(clinic.rtstruct), "--out", str(out), "--no-plots"])
        assert result.exit_code == 0, result.output
        doses[model.name], outputs[model.name] = read_dose_csv(out / "prediction.csv"), result.output
    assert "Predicted with the 2 folds (cv-fold-1 epoch 1, cv-fold-2 epoch 1) averaged" in outputs["cv"]
    report = json.loads((tmp_path / "cv" / "dvh.json").read_text())
    assert "epoch" not in report["model"]  # each member has its own
    assert [(m["model"], m["epoch"]) for m in report["model"]["members"]] == [("cv-fold-1", 1), ("cv-fold-2", 1)]
    # the mean of the two folds' float32 doses, each written as its shortest decimals: an ulp or two apart
    np.testing.assert_allclose(doses["cv"], (doses["fold-1"] + doses["fold-2"]) / 2, atol=2e-5)
    assert np.abs(doses["fold-1"] - doses["fold-2"]).max() > 1e-3  # the folds differ: the mean is not either
    assert pydicom.dcmread(tmp_path / "cv" / "RD.dcm").SeriesDescription.endswith("cv 2 folds")


def _clinic_patient(folder, seed: int, with_dose: bool = True):
    volumes = make_phantom(seed)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    return write_patient(folder, volumes["ct"], masks, volumes["voxel_dimensions"],
                         volumes["dose"] if with_dose else None, factor=1)


def _predict(model, clinic, out, *options):
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(model), "--ct", str(clinic.ct_dir), "--rtstruct",
                                       str(clinic.rtstruct), "--rtdose", str(clinic.rtdose), "--out", str(out),
                                       "--no-plots", *options])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_a_commissioned_models_dvh_table_carries_its_bands_and_a_patient_outside_its_cohort_is_named(
        commissioned_cv, tmp_path):
    """The band of each clinical metric beside its prediction (dvh.csv, dvh.json, the printed
    summary); a patient whose p-value is below the cohort's alpha (made so here: alpha 0.99, every
    training score -1) is flagged with its p-value and reasons, and its RT Dose's series description says so first."""
    from provided_code.metrics.calibration import band
    from tests.kit.runs import rewrite_commissioning_file

    model = tmp_path / "results" / "cv"
    shutil.copytree(commissioned_cv, model)
    cohort = json.loads((model / "commissioning" / "cohort.json").read_text())
    rewrite_commissioning_file(model, "cohort.json", {**cohort, "alpha": 0.99, "scores": [-1.0] * len(cohort["scores"])})
    bands = json.loads((model / "commissioning" / "bands.json").read_text())
    output = _predict(model, _clinic_patient(tmp_path / "clinic", 14), tmp_path / "out", "--band", "0.5")
    report = json.loads((tmp_path / "out" / "dvh.json").read_text())
    table = pd.read_csv(tmp_path / "out" / "dvh.csv").set_index("structure")
    assert list(table.columns[:5]) == ["volume_cc", "D99_predicted", "D99_low", "D99_high", "D99_reference"]
    assert report["band"]["coverage"] == 0.5 and report["band"]["patients"] == 4
    for structure, values in report["predicted"].items():
        for metric in CLINICAL_METRICS:
            low, high = band(values[metric], bands["residuals"][structure][metric], 0.5)
            assert (report["band"]["low"][structure][metric], report["band"]["high"][structure][metric]) == (low, high)
            # dvh.csv keeps 3 decimals: half a unit of the last
            assert table.loc[structure, [f"{metric}_low", f"{metric}_high"]].tolist() == pytest.approx([low, high],
                                                                                                      abs=5e-4)
    flag = report["in_distribution"]
    assert not flag["inside"] and flag["p_value"] == 1 / 5 and flag["alpha"] == 0.99 and flag["score"] >= 0
    assert flag["cohort_patients"] == 4 and flag["method"] == cohort["method"]
    assert pydicom.dcmread(tmp_path / "out" / "RD.dcm").SeriesDescription == (
        "Outside the training cohort: predicted dose, cv 2 folds")
    assert "Bands (50 % nominal; split-conformal, equal-tailed, on out-of-fold residuals of 4 training" in output
    low, high = report["band"]["low"]["PTV70"]["D95"], report["band"]["high"]["PTV70"]["D95"]
    assert f"D95 {report['predicted']['PTV70']['D95']:.1f} ({low:.1f} to {high:.1f})" in output
    assert "Outside the training cohort (p = 0.200, alpha 0.99" in output


@pytest.mark.slow
def test_without_commissioning_the_clinics_outputs_are_the_commissioned_ones_without_bands(
        cv_model, commissioned_cv, tmp_path):
    """The same folds with and without commissioning predict the same dose and table; without, the
    table has no band columns or keys, the RT Dose's description says "Uncommissioned model" first, and
    one line says why."""
    clinic = _clinic_patient(tmp_path / "clinic", 14)
    plain, commissioned = tmp_path / "plain" / "cv", tmp_path / "commissioned" / "cv"
    shutil.copytree(cv_model, plain)
    shutil.copytree(commissioned_cv, commissioned)
    output = _predict(plain, clinic, tmp_path / "without")
    _predict(commissioned, clinic, tmp_path / "with", "--band", "0.5")
    for name in ("prediction.csv", "dose.nii.gz"):
        assert (tmp_path / "without" / name).read_bytes() == (tmp_path / "with" / name).read_bytes()
    without, banded = (json.loads((tmp_path / case / "dvh.json").read_text()) for case in ("without", "with"))
    assert "band" in banded and "in_distribution" in banded
    del banded["band"], banded["in_distribution"]
    without["model"]["folder"] = banded["model"]["folder"]
    assert without == banded
    table = pd.read_csv(tmp_path / "with" / "dvh.csv", dtype=str)
    unbanded = table[[c for c in table.columns if not c.endswith(("_low", "_high"))]]
    assert (tmp_path / "without" / "dvh.csv").read_text() == unbanded.to_csv(index=False, lineterminator="\n")
    assert pydicom.dcmread(tmp_path / "without" / "RD.dcm").SeriesDescription == (
        "Uncommissioned model: predicted dose, cv 2 folds")
    assert (f"No prediction bands or in-distribution check: cv is not commissioned (no {plain}/commissioning/"
            f"bands.json): run openkbp-commission {plain}") in output.splitlines()


@pytest.mark.slow
def test_predict_from_dicom_predicts_the_imported_patient_kept_in_memory(tiny_model, tmp_path, monkeypatch):
    """The import's patient is predicted and scored as it was written, without reading the folder
    back: with its CSVs removed right after the import, the outputs are those of the folder as read."""
    import_patient = clinic_module.import_patient
    volumes = make_phantom(12)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    clinic = write_patient(tmp_path / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"], volumes["dose"],
                           factor=1)
    read_back = {}

    def import_then_remove_the_csvs(*args, **kwargs):
        report = import_patient(*args, **kwargs)
        read_back["patient"] = read_patient(report.folder, site=openkbp())
        for path in report.folder.glob("*.csv"):
            path.unlink()
        return report

    monkeypatch.setattr(clinic_module, "import_patient", import_then_remove_the_csvs)
    report = clinic_module.predict_dicom_patient(DeployedModel.open(tiny_model), clinic.ct_dir, clinic.rtstruct,
                                                 tmp_path / "out", rtdose=clinic.rtdose, plots=False)
    predicted = read_dose_csv(tmp_path / "out" / "prediction.csv")  # the float32 prediction, exactly
    arrays = SplitArrays.from_patients([read_back["patient"]], site=openkbp())
    assert not predicted[~arrays.possible_dose_mask[0]].any()
    expected = score_split(arrays, lambda row: predicted).summary()
    assert report.dvh["scores"] == {key: expected[key] for key in ("dose_score", "dvh_score")}


@pytest.mark.slow
def test_predict_refuses_a_site_that_contradicts_the_model_before_importing(tiny_model, tmp_path):
    """An OpenKBP model (its config.json's site, or none: OpenKBP) with --site prostate: one line
    naming both, before the import (nothing written)."""
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(tiny_model), "--site", "prostate", "--ct",
                                       str(tmp_path / "ct"), "--rtstruct", str(tmp_path / "RS.dcm"), "--out",
                                       str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (f"Invalid `site`. Expected the model's own site, openkbp ({tiny_model / 'models' / 'config.json'}), or no "
            f"--site. Received: site='prostate'") in result.output
    assert not (tmp_path / "out").exists()
    assert RunFolder(tiny_model).spec("openkbp").site.name == "openkbp"


def test_a_wrong_model_dir_is_named_in_one_line_and_no_folder_is_made(tmp_path):
    """--model-dir of a folder that does not exist (a typo): one line naming it, before any lock
    (a lock would create the folder) and before the import."""
    wrong = tmp_path / "results" / "mdoel"
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(wrong), "--ct", str(tmp_path / "ct"),
                                       "--rtstruct", str(tmp_path / "RS.dcm"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (f"{wrong} is not a trained model's folder: {wrong / 'models' / 'config.json'} is missing"
            in result.output)
    assert not wrong.exists() and not (tmp_path / "results").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_predict_refuses_a_model_being_trained_in_one_line_before_importing(tiny_model, tmp_path):
    """The model's folder is read under its lock, shared: a training run on it (which holds it) is
    named, and nothing is written."""
    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    with RunFolder(model).lock("training"):
        result = CliRunner().invoke(main, ["predict", "--model-dir", str(model), "--ct", str(tmp_path / "ct"),
                                           "--rtstruct", str(tmp_path / "RS.dcm"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{model} is in use by another run (pid {os.getpid()}" in result.output and "training since" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@requires_sample
def test_a_real_patient_without_ptv63_is_predicted_with_default_flags(tiny_model, tmp_path):
    """OpenKBP's pt_10 (PTV70 and PTV56, no PTV63, as 109 of the 200 training patients) written as a
    clinic exports it: the OpenKBP model's site says PTV63 is optional, so no flag is needed."""
    source = read_patient(SAMPLE_DIR / "train-pats" / "pt_10", site=openkbp())
    masks = {name: (source.structure_masks >> bit) & 1 == 1 for bit, name in enumerate(STRUCTURES)}
    masks = {name: mask for name, mask in masks.items() if mask.any()}
    assert "PTV63" not in masks
    masks["BODY"] = source.possible_dose_mask
    clinic = write_patient(tmp_path / "clinic", source.ct, masks, source.voxel_dimensions, source.dose, factor=1)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(tiny_model), "--ct", str(clinic.ct_dir),
                                       "--rtstruct", str(clinic.rtstruct), "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "PTV63: no ROI (optional for site openkbp): its mask is empty" in result.output
    rd = pydicom.dcmread(out / "RD.dcm")
    assert rd.Modality == "RTDOSE" and rd.FrameOfReferenceUID == clinic.frame_of_reference_uid
    assert (rd.pixel_array * float(rd.DoseGridScaling)).max() > 0


@pytest.mark.slow
def test_predict_from_dicom_with_a_prostate_model_imports_by_its_site(prostate_model, tmp_path):
    from provided_code.data.phantoms import make_prostate_phantom
    from tests.kit.synthetic import PROSTATE_CLINICAL_NAMES
    from provided_code.sites import load_site

    site = load_site("prostate")
    volumes = make_prostate_phantom(21, site=load_site("prostate"))
    masks = {name: volumes[name] for name in site.names}
    masks["BODY"] = volumes["possible_dose_mask"]
    clinic = write_patient(tmp_path / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"], volumes["dose"],
                           factor=1, names=PROSTATE_CLINICAL_NAMES)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(prostate_model), "--ct", str(clinic.ct_dir),
                                       "--rtstruct", str(clinic.rtstruct), "--rtdose", str(clinic.rtdose), "--out",
                                       str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "PTV78         <- 'PTV78'" in result.output and "dose score" in result.output
    assert json.loads((out / "patient" / "dicom.json").read_text())["site"] == "prostate"
    report = json.loads((out / "dvh.json").read_text())
    assert list(report["predicted"]) == list(site.names) and (out / "RD.dcm").is_file()
    refused = CliRunner().invoke(main, ["predict", "--model-dir", str(prostate_model), "--site", "openkbp", "--ct",
                                        str(clinic.ct_dir), "--rtstruct", str(clinic.rtstruct), "--out",
                                        str(tmp_path / "other")])
    assert refused.exit_code == 1 and "Expected the model's own site, prostate" in refused.output
    assert not (tmp_path / "other").exists()
