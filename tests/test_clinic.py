"""``openkbp-dicom predict``: a clinic's DICOM through a trained model to RT Dose, NIfTI and a DVH table."""

import json

import keras
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from provided_code.config import TrainConfig  # noqa: E402
from provided_code.constants import STRUCTURES  # noqa: E402
from provided_code.data.cache import SplitArrays  # noqa: E402
from provided_code.data.csv_io import read_patient  # noqa: E402
from provided_code.data.phantoms import make_phantom  # noqa: E402
from provided_code.dicom_cli import main  # noqa: E402
from provided_code.dicom.exporter import read_dose_csv  # noqa: E402
from provided_code.metrics.dvh_table import CLINICAL_METRICS, clinical_dvh  # noqa: E402
from provided_code.metrics.scoring import score_split, structure_indices  # noqa: E402
from provided_code.training.train import train  # noqa: E402
from tests.dicom_writer import write_patient  # noqa: E402


def test_clinical_dvh_table_by_hand():
    dose = np.arange(1000, dtype=np.float64).reshape(10, 10, 10) / 10.0
    indices = [np.array([], np.int64)] * len(STRUCTURES)
    indices[STRUCTURES.index("PTV70")] = np.arange(101)  # doses 0.0, 0.1, ..., 10.0
    table = clinical_dvh(dose, indices)
    assert list(table) == ["PTV70"] and list(table["PTV70"]) == list(CLINICAL_METRICS)
    assert table["PTV70"] == pytest.approx({"D99": 0.1, "D95": 0.5, "D50": 5.0, "Dmean": 5.0, "D1": 9.9, "Dmax": 10.0})


@pytest.mark.slow
def test_predict_from_dicom_writes_rtdose_nifti_dvh_and_plots(phantom_data, tmp_path):
    config = TrainConfig(filters=4, resolution=32, epochs=1, xla="off", score_every=0, data_dir=str(phantom_data),
                         results_dir=str(tmp_path / "results"), model_name="m", cache_dir=str(tmp_path / "cache"))
    train(config)
    keras.backend.clear_session()
    volumes = make_phantom(11)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    clinic = write_patient(tmp_path / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"], volumes["dose"],
                           factor=1, extra_slices=(4, 4))
    out = tmp_path / "out"
    # The console script's command, in this process (TensorFlow is loaded already).
    result = CliRunner().invoke(main, ["predict", "--model-dir", str(tmp_path / "results" / "m"), "--ct",
                                       str(clinic.ct_dir), "--rtstruct", str(clinic.rtstruct), "--rtdose",
                                       str(clinic.rtdose), "--out", str(out), "--tta"])
    assert result.exit_code == 0, result.output
    assert "Predicted with the epoch 1 checkpoint" in result.output and "dose score" in result.output
    for name in ("RD.dcm", "dose.nii.gz", "dvh.csv", "dvh.json", "prediction.csv", "patient/dicom.json",
                 "patient/dose.csv", "dose_dvh.png", "dose_slices.png"):
        assert (out / name).is_file(), name

    patient = read_patient(out / "patient")
    arrays = SplitArrays.from_patients([patient])
    predicted = read_dose_csv(out / "prediction.csv")
    assert not predicted[~patient.possible_dose_mask].any() and predicted[patient.possible_dose_mask].max() > 0
    report = json.loads((out / "dvh.json").read_text())
    assert report["model"]["epoch"] == 1 and report["model"]["tta"] is True
    expected = clinical_dvh(predicted, structure_indices(patient.structure_masks))
    assert list(report["predicted"]) == list(expected)
    for structure, metrics in expected.items():
        assert report["predicted"][structure] == pytest.approx(metrics, rel=1e-5)
    assert report["reference"]["PTV70"]["D50"] == pytest.approx(np.median(volumes["dose"][volumes["PTV70"]]), abs=0.01)
    scores = score_split(arrays, lambda row: predicted)
    assert report["scores"]["dose_score"] == pytest.approx(scores.dose_score, rel=1e-4)
    table = pd.read_csv(out / "dvh.csv")
    assert table["structure"].tolist() == list(report["predicted"])
    assert table.loc[table.structure == "PTV70", "Dmax_reference"].item() == pytest.approx(
        report["reference"]["PTV70"]["Dmax"], abs=1e-3)

    rd = pydicom.dcmread(out / "RD.dcm")
    assert (rd.Rows, rd.Columns, rd.NumberOfFrames) == (128, 128, 136)
    assert rd.FrameOfReferenceUID == clinic.frame_of_reference_uid
    values = rd.pixel_array * float(rd.DoseGridScaling)
    assert not values[:4].any() and not values[-4:].any()  # CT slices outside the 128³ box: no dose
    assert values.max() == pytest.approx(float(predicted.max()), rel=0.05)


def test_plots_of_a_patient_without_a_reference_show_the_prediction_alone(tmp_path):
    pytest.importorskip("matplotlib")
    from provided_code.plots import plot_patient

    volumes = make_phantom(2)
    patient = read_patient_like(volumes)
    arrays = SplitArrays.from_patients([patient])
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
