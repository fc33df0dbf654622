import filecmp

import numpy as np

from provided_code.constants import PRESCRIPTIONS_GY, STRUCTURES, TARGETS
from provided_code.data.csv_io import read_patient
from provided_code.data.phantoms import make_phantom, write_phantom_patient


def test_phantom_is_deterministic_by_seed(tmp_path):
    a = write_phantom_patient(tmp_path / "a" / "pt_1", seed=5)
    b = write_phantom_patient(tmp_path / "b" / "pt_1", seed=5)
    c = write_phantom_patient(tmp_path / "c" / "pt_1", seed=6)
    names = sorted(p.name for p in a.iterdir())
    assert filecmp.cmpfiles(a, b, names, shallow=False)[0] == names
    assert not filecmp.cmp(a / "dose.csv", c / "dose.csv", shallow=False)


def test_phantom_dose_is_plausible():
    volumes = make_phantom(11)
    dose, body = volumes["dose"], volumes["possible_dose_mask"]
    assert np.all(dose[~body] == 0)
    for name in TARGETS:
        assert volumes[name].any()
        assert abs(np.median(dose[volumes[name]]) - PRESCRIPTIONS_GY[name]) < 1.0
    assert not (volumes["PTV70"] & volumes["PTV63"]).any() and not (volumes["PTV63"] & volumes["PTV56"]).any()
    assert dose[volumes["Brainstem"]].mean() < 0.3 * PRESCRIPTIONS_GY["PTV70"]
    assert dose[body].mean() < dose[volumes["PTV56"]].mean()
    assert all(volumes[name].any() for name in STRUCTURES)


def test_phantom_reads_as_an_openkbp_patient(tmp_path):
    folder = write_phantom_patient(tmp_path / "pt_3", seed=3, with_dose=False)
    patient = read_patient(folder, require_dose=False)
    assert patient.dose is None and patient.ct.max() > 1000
    assert len(list(folder.glob("*.csv"))) == 13
