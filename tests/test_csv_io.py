import logging

import numpy as np
import pandas as pd
import pytest

from provided_code.constants import CT_MAX, NUM_VOXELS, VOLUME_SHAPE
from provided_code.sites import openkbp
from provided_code.data.csv_io import (
    PatientDataError,
    SplitError,
    discover_patients,
    read_patient,
    read_sparse_csv,
    write_dose_csv,
    write_sparse_csv,
)
from tests.kit.repo import SAMPLE_DIR
from tests.kit.skips import requires_sample

STRUCTURES = openkbp().names  # OpenKBP's channel order


def test_discover_orders_by_patient_number(tmp_path):
    for name in ["pt_10", "pt_2", "pt_1", "notes", "pt_x"]:
        (tmp_path / name).mkdir()
    assert [p.name for p in discover_patients(tmp_path)] == ["pt_1", "pt_2", "pt_10"]


def test_folders_not_named_pt_n_are_named_in_a_warning_once_per_split(tmp_path, caplog):
    for name in ["pt_1", "pt_x", "Pt_6", ".ipynb_checkpoints"]:
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    with caplog.at_level(logging.WARNING):
        assert [p.name for p in discover_patients(tmp_path)] == ["pt_1"]
        discover_patients(tmp_path)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(tmp_path) in warnings[0]
    assert warnings[0].endswith("skipped 2 folder(s) not named pt_<N> (a patient folder's name is pt_ and its "
                                "number): Pt_6, pt_x")


def test_a_byte_order_mark_is_read_in_voxel_dimensions_as_in_the_other_csvs(phantom_split):
    folder = phantom_split / "pt_1"
    expected = read_patient(folder, site=openkbp())
    for name in ("voxel_dimensions.csv", "ct.csv"):
        path = folder / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as Excel's "CSV UTF-8" writes
    patient = read_patient(folder, site=openkbp())
    assert np.array_equal(patient.voxel_dimensions, expected.voxel_dimensions)
    assert np.array_equal(patient.ct, expected.ct)


def test_empty_or_missing_split_is_an_error(tmp_path):
    with pytest.raises(SplitError, match="holds no pt_<N>"):
        discover_patients(tmp_path)
    with pytest.raises(SplitError, match="does not exist"):
        discover_patients(tmp_path / "nope")


def test_phantom_patient_reads_back(phantom_split):
    patient = read_patient(phantom_split / "pt_1", site=openkbp())
    assert patient.patient_id == "pt_1"
    assert patient.ct.shape == VOLUME_SHAPE and patient.ct.dtype == np.uint16
    assert patient.structure_masks.dtype == np.uint16
    assert patient.possible_dose_mask.dtype == bool
    assert patient.dose.dtype == np.float32
    assert np.all(patient.dose[~patient.possible_dose_mask] == 0)
    assert np.bitwise_or.reduce(patient.structure_masks, axis=None) == (1 << len(STRUCTURES)) - 1


@pytest.mark.parametrize(
    "filename, breakage, problem",
    [
        ("ct.csv", None, "file is missing"),
        ("possible_dose_mask.csv", None, "file is missing"),
        ("dose.csv", None, "file is missing"),
        ("ct.csv", ",data\n12,abc\n", "'abc' on line 2 is not a finite number"),
        ("dose.csv", ",data\n12,1.5\n13,nan\n", "value nan or empty on line 3 is not a finite number"),
        ("dose.csv", ",data\n12,1.5\n13,\n", "value nan or empty on line 3 is not a finite number"),
        ("dose.csv", ",data\n12,1.5\n13,inf\n", "value inf on line 3 is not a finite number"),
        ("PTV70.csv", ",data\n7,\n3,\n9,\n7,\n", "index 7 is listed twice (lines 2 and 5)"),
        ("ct.csv", ",data\n1,5\n2,5\n2,6\n", "index 2 is listed twice (lines 3 and 4)"),
        ("ct.csv", f",data\n{NUM_VOXELS},5\n", f"index {NUM_VOXELS} on line 2 is outside"),
        ("Brainstem.csv", ",data\n-1,\n", "index -1 on line 2 is outside"),
        ("PTV70.csv", ",data\n1.5,\n", "not a whole number"),
        ("ct.csv", "", "file is empty"),
        ("ct.csv", "index,value\n1,2\n", "expected ',data'"),
        ("voxel_dimensions.csv", "3.5\n3.5\n", "expected three positive numbers"),
        ("voxel_dimensions.csv", "3.5\n-3.5\n2\n", "expected three positive numbers"),
        ("voxel_dimensions.csv", "3.5\nabc\n2\n", "expected three positive numbers"),
        # A header-only dose would train and score as a zero dose; a negative one is no dose.
        ("dose.csv", ",data\n", "lists no voxel (a header only)"),
        ("dose.csv", ",data\n12,1.5\n13,-0.5\n", "dose -0.5 on line 3 is negative"),
        # The scores assume the reference dose is zero outside the mask: refused when read, not when scored.
        ("dose.csv", ",data\n0,1.5\n", "non-zero in 1 voxel(s) outside the possible-dose mask "
                                                   "(possible_dose_mask.csv), the first index 0 on line 2"),
        # An extra column on every row: pandas would take the first as row labels ("index 1 is listed twice").
        ("ct.csv", ",data\n1,2,3\n4,5,6\n", "line 2 has 3 comma-separated fields ('1,2,3'); expected 2"),
    ],
)
def test_bad_input_names_patient_file_and_problem(phantom_split, filename, breakage, problem):
    path = phantom_split / "pt_2" / filename
    if breakage is None:
        path.unlink()
    else:
        path.write_text(breakage)
    with pytest.raises(PatientDataError) as caught:
        read_patient(phantom_split / "pt_2", require_dose=True, site=openkbp())
    message = str(caught.value)
    assert message.startswith("Patient pt_2: ")
    assert str(path) in message
    assert problem in message


def test_dose_is_optional_when_not_required(phantom_split):
    (phantom_split / "pt_1" / "dose.csv").unlink()
    assert read_patient(phantom_split / "pt_1", require_dose=False, site=openkbp()).dose is None


def test_missing_structure_is_an_empty_channel(phantom_split):
    (phantom_split / "pt_1" / "Larynx.csv").unlink()
    patient = read_patient(phantom_split / "pt_1", site=openkbp())
    bit = STRUCTURES.index("Larynx")
    assert not np.any(patient.structure_masks & (1 << bit))


def test_dose_csv_round_trip_exact(tmp_path):
    rng = np.random.default_rng(0)
    dose = np.zeros(VOLUME_SHAPE, np.float32)
    region = (slice(40, 60), slice(50, 70), slice(30, 50))
    dose[region] = rng.uniform(0, 80, (20, 20, 20)).astype(np.float32)
    write_dose_csv(tmp_path / "dose.csv", dose)
    indices, values = read_sparse_csv(tmp_path / "dose.csv", "pt_0", with_values=True)
    back = np.zeros(NUM_VOXELS, np.float32)
    back[indices] = values
    assert np.array_equal(back.reshape(VOLUME_SHAPE), dose)
    frame = pd.read_csv(tmp_path / "dose.csv", index_col=0)
    assert np.array_equal(frame["data"].to_numpy(np.float32), dose.reshape(-1)[frame.index.to_numpy()])


def test_all_zero_dose_round_trips(tmp_path):
    zero = np.zeros(VOLUME_SHAPE, np.float32)
    write_dose_csv(tmp_path / "a.csv", zero)
    assert pd.read_csv(tmp_path / "a.csv", index_col=0).empty
    indices, values = read_sparse_csv(tmp_path / "a.csv", "pt_0", with_values=True)
    assert indices.size == 0 and values.size == 0
    mask = np.zeros(VOLUME_SHAPE, bool)
    mask[10:12, 10:12, 10:12] = True
    write_dose_csv(tmp_path / "b.csv", zero, possible_dose_mask=mask)
    indices, values = read_sparse_csv(tmp_path / "b.csv", "pt_0", with_values=True)
    assert np.array_equal(indices, np.flatnonzero(mask)) and np.all(values == 0)


def test_sparse_csv_lines_are_each_voxels_index_and_shortest_value(tmp_path):
    """Integers as they are (a sign, no padding, 0 as 0), floats as the shortest decimal of their
    dtype, masks with an empty value, and no line at all for no voxel."""
    write_sparse_csv(tmp_path / "ct.csv", [0, 7, 2097151], np.array([0, -305, 4095], np.int32))
    assert (tmp_path / "ct.csv").read_text() == ",data\n0,0\n7,-305\n2097151,4095\n"
    text = write_sparse_csv(tmp_path / "dose.csv", [3, 12, 40], np.array([7.675, 0, 1e-7], np.float32))
    assert (tmp_path / "dose.csv").read_text() == ",data\n3,7.675\n12,0.0\n40,1e-07\n"
    assert text.tolist() == ["7.675", "0.0", "1e-07"]
    assert write_sparse_csv(tmp_path / "mask.csv", [5, 10], None) is None
    assert (tmp_path / "mask.csv").read_text() == ",data\n5,\n10,\n"
    write_sparse_csv(tmp_path / "none.csv", np.array([], np.int64), np.array([], np.uint16))
    assert (tmp_path / "none.csv").read_text() == ",data\n"
    with pytest.raises(ValueError, match="Expected one value an index"):
        write_sparse_csv(tmp_path / "bad.csv", [1, 2], np.array([1], np.uint16))
    assert not (tmp_path / "bad.csv").exists()


def test_write_dose_rejects_bad_shape_and_nan(tmp_path):
    with pytest.raises(ValueError, match="Expected shape"):
        write_dose_csv(tmp_path / "x.csv", np.zeros((64, 64, 64)))
    bad = np.zeros(VOLUME_SHAPE, np.float32)
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        write_dose_csv(tmp_path / "x.csv", bad)
    assert not (tmp_path / "x.csv").exists()


@requires_sample
def test_real_broken_patients_are_rejected_with_the_file_named():
    with pytest.raises(PatientDataError, match=r"Patient pt_8: .*pt_8/ct\.csv: file is missing"):
        read_patient(SAMPLE_DIR / "broken" / "pt_8", site=openkbp())
    with pytest.raises(PatientDataError, match=r"Patient pt_38: .*pt_38/possible_dose_mask\.csv: file is missing"):
        read_patient(SAMPLE_DIR / "broken" / "pt_38", site=openkbp())


@requires_sample
def test_real_patient_ct_is_clipped_and_float32_dose_is_exact_enough():
    folder = SAMPLE_DIR / "train-pats" / "pt_6"  # its CT reaches 19798
    patient = read_patient(folder, site=openkbp())
    raw = pd.read_csv(folder / "ct.csv", index_col=0)
    assert raw["data"].max() > CT_MAX
    assert patient.ct.max() == CT_MAX
    frame = pd.read_csv(folder / "dose.csv", index_col=0)
    stored = patient.dose.reshape(-1)[frame.index.to_numpy()]
    error = np.abs(stored.astype(np.float64) - frame["data"].to_numpy())
    # float32 carries 24 bits: below 128 Gy the error is at most 2**-18 Gy (3.8e-6), far below the
    # CSV's 1e-3 Gy resolution, and the shortest float32 decimal recovers the CSV text exactly.
    assert error.max() <= 2.0 ** -18
    assert np.array_equal(stored.astype(str).astype(np.float64), frame["data"].to_numpy())
