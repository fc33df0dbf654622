"""DICOM import and export: round trips through a writer of our own (phantom and real patient),
pydicom's example RT files, an independent reader (SimpleITK) for the exported RT Dose, and the
refused inputs."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from provided_code.constants import VOLUME_SHAPE  # noqa: E402
from provided_code.sites import HERE as SITES_DIR, openkbp  # noqa: E402
from provided_code.data.csv_io import read_patient  # noqa: E402
from provided_code.data.phantoms import make_phantom  # noqa: E402
from provided_code.dicom.ct_series import read_ct_series  # noqa: E402
from provided_code.dicom.errors import DicomInputError  # noqa: E402
from provided_code.dicom.exporter import dose_on_ct_grid, export_dose  # noqa: E402
from provided_code.dicom.grid import PatientGeometry, area_weights, choose_first_slice, linear_weights  # noqa: E402
from provided_code.dicom.importer import import_patient  # noqa: E402
from provided_code.dicom.names import default_names, load_names, match_rois  # noqa: E402
from provided_code.dicom.rtdose import MANUFACTURER, DoseGrid, read_rtdose, sample_dose, written_here  # noqa: E402
from provided_code.dicom.rtstruct import contours_by_slice, fill_polygons, read_rtstruct  # noqa: E402
from tests.kit.synthetic import write_patient  # noqa: E402
from tests.kit.made_once import made_once_with_value  # noqa: E402
from tests.kit.repo import SAMPLE_DIR  # noqa: E402
from tests.kit.skips import requires_sample  # noqa: E402
from tests.kit.tiers import SLOW_FOR_ITS_TIME  # noqa: E402

OPENKBP = openkbp()
STRUCTURES = OPENKBP.names  # OpenKBP's channel order

OPENKBP_DICOM = [sys.executable, "-m", "provided_code.apps.dicom_cli"]


def dice(a, b):
    return 2.0 * np.count_nonzero(a & b) / max(np.count_nonzero(a) + np.count_nonzero(b), 1)


def phantom_volumes(seed=3):
    volumes = make_phantom(seed)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    return volumes, masks


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A phantom written as a clinic's DICOM: 256 × 256 CT at half the voxel size, 128 slices,
    shuffled file order, RTSTRUCT, RTDOSE; and its import. Made once per test run (read-only)."""
    return made_once_with_value(tmp_path_factory, "dicom-phantom", write_and_import_phantom)


def write_and_import_phantom(root):
    volumes, masks = phantom_volumes()
    patient = write_patient(root / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"], volumes["dose"])
    report = import_patient(patient.ct_dir, patient.rtstruct, root / "pt_1", rtdose=patient.rtdose, site=OPENKBP)
    return volumes, patient, report


def test_round_trip_gives_back_the_phantom(written):
    volumes, patient, report = written
    imported = read_patient(report.folder, site=openkbp())
    assert np.allclose(imported.voxel_dimensions, volumes["voxel_dimensions"])
    assert np.abs(imported.ct.astype(int) - volumes["ct"].astype(int)).max() <= 1  # within 1 HU
    for bit, name in enumerate(STRUCTURES):
        assert dice((imported.structure_masks >> bit) & 1 == 1, volumes[name]) >= 0.95, name
    assert dice(imported.possible_dose_mask, volumes["possible_dose_mask"]) >= 0.95
    # the RT Dose was 16 bits (0.0012 Gy steps at 70 Gy) and the import keeps 3 decimals
    assert np.abs(imported.dose - volumes["dose"]).max() <= 0.002
    geometry = PatientGeometry.read(report.folder)
    assert geometry.frame_of_reference_uid == patient.frame_of_reference_uid
    assert geometry.rows == geometry.columns == 256 and geometry.first_slice == 0
    assert geometry.structures["PTV70"] == "PTV_7000" and geometry.possible_dose_mask == "ROI 'External'"
    assert any(line.startswith("PTV70") and "PTV_7000" in line for line in report.lines)


def assert_same_patient(kept, read):
    """Two ``Patient``s equal exactly: every array (values and dtype), the decimals, the plan."""
    assert kept.patient_id == read.patient_id and kept.dose_decimals == read.dose_decimals
    assert kept.prescriptions == read.prescriptions and kept.gantry_angles == read.gantry_angles
    for field in ("ct", "structure_masks", "possible_dose_mask", "voxel_dimensions", "dose"):
        a, b = getattr(kept, field), getattr(read, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), field


def test_the_import_returns_the_patient_it_wrote_as_read_patient_reads_it(written, small_clinic, tmp_path):
    _, _, report = written
    assert_same_patient(report.patient, read_patient(report.folder, site=openkbp()))
    assert report.patient.dose_decimals == 3 and report.patient.prescriptions is None  # the challenge's decimals
    without_dose = import_patient(small_clinic / "ct", small_clinic / "RS.dcm", tmp_path / "pt_2", site=OPENKBP)
    assert without_dose.patient.dose is None
    assert_same_patient(without_dose.patient, read_patient(without_dose.folder, require_dose=False, site=openkbp()))


def test_export_lands_on_the_ct_grid_for_an_independent_reader(written, tmp_path):
    sitk = pytest.importorskip("SimpleITK")
    nibabel = pytest.importorskip("nibabel")
    volumes, patient, report = written
    dose = volumes["dose"]
    geometry = export_dose(report.folder, dose, tmp_path / "RD.dcm", nifti=tmp_path / "dose.nii.gz", site=OPENKBP)
    image = sitk.ReadImage(str(tmp_path / "RD.dcm"))
    assert image.GetSize() == (256, 256, 128)
    # positions written as DICOM decimal strings (at most 16 characters): 1e-4 mm
    assert np.allclose(image.GetOrigin(), [*patient.origin_xy, patient.slice_z.min()], atol=1e-4)
    slice_spacing = patient.slice_z[0] - patient.slice_z[1]
    assert np.allclose(image.GetSpacing(), [*patient.pixel_spacing[::-1], slice_spacing], atol=1e-4)
    rd = pydicom.dcmread(tmp_path / "RD.dcm")
    assert rd.SOPClassUID == "1.2.840.10008.5.1.4.1.1.481.2" and rd.DoseUnits == "GY" and rd.BitsAllocated == 32
    assert rd.FrameOfReferenceUID == patient.frame_of_reference_uid and rd.PatientID == "PHANTOM1"
    ct_header = pydicom.dcmread(next(patient.ct_dir.iterdir()), stop_before_pixels=True)
    assert rd.StudyInstanceUID == ct_header.StudyInstanceUID and rd.SeriesInstanceUID != ct_header.SeriesInstanceUID
    values = sitk.GetArrayFromImage(image).astype(np.float64) * float(rd.DoseGridScaling)  # (z ascending, y, x)
    expected = dose_on_ct_grid(dose, geometry)[::-1]
    assert np.abs(values - expected).max() <= float(rd.DoseGridScaling)  # equal within the 32-bit scaling
    # Independently of the export's interpolation: the fine pixel (2i, 2j) lies a quarter voxel
    # before OpenKBP voxel (i, j) on both axes, so it is 9/16, 3/16, 3/16, 1/16 of four voxels.
    k, i, j = 60, 70, 50
    plane = dose[:, :, k].astype(np.float64)
    hand = (9 * plane[i, j] + 3 * plane[i - 1, j] + 3 * plane[i, j - 1] + plane[i - 1, j - 1]) / 16
    assert values[127 - k, 2 * i, 2 * j] == pytest.approx(hand, abs=1e-6)  # float64 by hand, float32 weights in the export
    nifti = nibabel.load(tmp_path / "dose.nii.gz")
    assert nifti.shape == (256, 256, 128)
    world = nifti.affine @ [2 * j, 2 * i, 127 - k, 1]  # RAS: DICOM x and y negated
    assert np.allclose(world[:3], [-(patient.origin_xy[0] + 2 * j * patient.pixel_spacing[1]),
                                   -(patient.origin_xy[1] + 2 * i * patient.pixel_spacing[0]), patient.slice_z[k]])
    assert np.asarray(nifti.dataobj)[2 * j, 2 * i, 127 - k] == pytest.approx(hand, abs=1e-5)  # NIfTI stores float32 Gy


def test_export_with_the_rtstruct_writes_the_dvh_table_of_its_rt_dose(written, tmp_path):
    """``openkbp-dicom export --rtstruct --dvh``: the table ``predict`` writes (the same function, the
    same structures read again from the RTSTRUCT), of the RT Dose as written."""
    from click.testing import CliRunner

    from provided_code.apps.dicom_cli import main
    from provided_code.data.csv_io import read_dose_csv, write_dose_csv
    from provided_code.dicom.dvh import dvh_report

    volumes, patient, report = written
    prediction = tmp_path / "pt_1.csv"
    write_dose_csv(prediction, volumes["dose"], volumes["possible_dose_mask"])
    result = CliRunner().invoke(main, ["export", "--patient", str(report.folder), "--prediction", str(prediction),
                                       "--out", str(tmp_path / "RD.dcm"), "--rtstruct", str(patient.rtstruct),
                                       "--dvh", str(tmp_path / "table.csv")])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"Wrote {tmp_path / 'RD.dcm'}, {tmp_path / 'table.csv'} and {tmp_path / 'table.json'}"
    table = json.loads((tmp_path / "table.json").read_text())
    expected = dvh_report(report.geometry, report.ct_voxels, report.contours,
                          {"predicted": dose_on_ct_grid(read_dose_csv(prediction), report.geometry)})
    assert table == {**json.loads(json.dumps(expected)), "rtdose": str(tmp_path / "RD.dcm")}
    rd = pydicom.dcmread(tmp_path / "RD.dcm")
    held = (rd.pixel_array * float(rd.DoseGridScaling))[::-1].reshape(-1)  # frames ascending in z, the CT's descending
    for structure, voxels in report.ct_voxels.items():
        # the RT Dose's 32-bit pixels hold the dose within its scaling (1e-8 Gy here)
        assert table["predicted"][structure]["Dmax"] == pytest.approx(held[voxels].max(), abs=2 * float(rd.DoseGridScaling))
    rows = (tmp_path / "table.csv").read_text().splitlines()
    assert rows[0] == "structure,volume_cc," + ",".join(f"{m}_predicted" for m in table["metrics"])
    assert [row.split(",")[0] for row in rows[1:]] == list(table["predicted"])


def test_the_export_refuses_half_of_the_dvh_options_and_a_wrong_sampling_in_one_line(written, tmp_path):
    from click.testing import CliRunner

    from provided_code.apps.dicom_cli import main
    from provided_code.data.csv_io import write_dose_csv

    volumes, patient, report = written
    prediction = tmp_path / "pt_1.csv"
    write_dose_csv(prediction, volumes["dose"], volumes["possible_dose_mask"])
    common = ["export", "--patient", str(report.folder), "--prediction", str(prediction), "--out", str(tmp_path / "RD.dcm")]
    result = CliRunner().invoke(main, [*common, "--rtstruct", str(patient.rtstruct)])
    assert result.exit_code == 2 and "--rtstruct and --dvh go together" in result.output
    result = CliRunner().invoke(main, [*common, "--rtstruct", str(patient.rtstruct), "--dvh", str(tmp_path / "t.csv"),
                                       "--dvh-supersample", "9"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "Error: Invalid `--dvh-supersample`. Expected a whole number from 1 to 8" in result.output
    assert not list(tmp_path.glob("*.dcm")) and not list(tmp_path.glob("t.*"))  # refused before anything is written


def test_an_exported_rt_dose_is_told_from_the_clinics_by_its_manufacturer(written, tmp_path):
    volumes, patient, report = written
    export_dose(report.folder, volumes["dose"], tmp_path / "RD.dcm", site=OPENKBP)
    exported, clinics = pydicom.dcmread(tmp_path / "RD.dcm"), pydicom.dcmread(patient.rtdose)
    assert exported.Manufacturer == MANUFACTURER and written_here(exported)
    assert exported.SOPClassUID == pydicom.uid.RTDoseStorage
    assert not written_here(clinics) and clinics.SOPClassUID == pydicom.uid.RTDoseStorage


@requires_sample
def test_real_openkbp_patient_round_trip_with_more_slices_than_the_box(tmp_path):
    source = read_patient(SAMPLE_DIR / "train-pats" / "pt_1", site=openkbp())
    masks = {name: (source.structure_masks >> bit) & 1 == 1 for bit, name in enumerate(STRUCTURES)}
    masks = {name: mask for name, mask in masks.items() if mask.any()}
    masks["BODY"] = source.possible_dose_mask
    patient = write_patient(tmp_path / "clinic", source.ct, masks, source.voxel_dimensions, source.dose,
                            extra_slices=(12, 5), origin=(-248.0, -310.5), top_z=-40.0)
    report = import_patient(patient.ct_dir, patient.rtstruct, tmp_path / "pt_1", rtdose=patient.rtdose, site=OPENKBP)
    imported = read_patient(report.folder, site=OPENKBP)
    # The box is centred on the targets within the 145 written slices; compare where both have the slice.
    targets = np.flatnonzero(((source.structure_masks >> 7) != 0).any(axis=(0, 1)))
    first = choose_first_slice(145, 12 + (targets.min() + targets.max()) / 2)
    assert report.geometry.first_slice == first
    shift = first - 12  # imported box slice b is source slice b + shift
    both = slice(max(0, -shift), 128 - max(0, shift))
    src = slice(both.start + shift, both.stop + shift)
    assert np.abs(imported.ct[:, :, both].astype(int) - source.ct[:, :, src].astype(int)).max() <= 1
    for bit, name in enumerate(STRUCTURES):
        if name in masks:
            assert dice((imported.structure_masks[:, :, both] >> bit) & 1 == 1, masks[name][:, :, src]) >= 0.95, name
    assert np.abs(imported.dose[:, :, both] - source.dose[:, :, src]).max() <= 0.003


def test_fewer_slices_than_the_box_are_padded_with_air(tmp_path):
    volumes, masks = phantom_volumes(seed=5)
    keep = slice(20, 120)  # a 100-slice scan
    patient = write_patient(tmp_path / "clinic", volumes["ct"][:, :, keep], {k: m[:, :, keep] for k, m in masks.items()},
                            volumes["voxel_dimensions"], factor=1)
    report = import_patient(patient.ct_dir, patient.rtstruct, tmp_path / "pt_1", site=OPENKBP)
    imported = read_patient(report.folder, require_dose=False, site=OPENKBP)
    first = report.geometry.first_slice
    assert -28 <= first <= 0
    inside = slice(-first, -first + 100)
    assert np.array_equal(imported.ct[:, :, inside], volumes["ct"][:, :, keep])
    assert not imported.ct[:, :, :-first].any() and not imported.ct[:, :, -first + 100:].any()
    assert imported.dose is None


def test_polygon_fill_by_pixel_centres_with_a_hole():
    square = np.array([[1.5, 1.5], [6.5, 1.5], [6.5, 5.5], [1.5, 5.5]])  # (column, row)
    hole = np.array([[3.5, 2.5], [4.5, 2.5], [4.5, 3.5], [3.5, 3.5]])
    mask = fill_polygons([square, hole], (8, 9))
    expected = np.zeros((8, 9), bool)
    expected[2:6, 2:7] = True
    expected[3, 4] = False
    assert np.array_equal(mask, expected)
    triangle = np.array([[-0.3, -0.3], [10.2, -0.3], [-0.3, 10.2]])  # x + y < 9.9, x > -0.3, y > -0.3
    rows, columns = np.mgrid[0:12, 0:12]
    assert np.array_equal(fill_polygons([triangle], (12, 12)), rows + columns <= 9)
    assert np.array_equal(fill_polygons([triangle + [0, 20]], (12, 12)), np.zeros((12, 12), bool))  # below the image


def test_resampling_weights_average_and_interpolate_over_one_field_of_view():
    assert np.allclose(area_weights(512, 128).sum(axis=1), 1)
    assert np.allclose(area_weights(4, 2), [[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]])
    assert np.allclose(area_weights(3, 2), [[2 / 3, 1 / 3, 0], [0, 1 / 3, 2 / 3]])
    ramp = np.arange(128.0)
    assert np.allclose(linear_weights(128, 256) @ ramp, np.clip((np.arange(256) + 0.5) / 2 - 0.5, 0, 127))


def test_trilinear_dose_sampling_is_exact_for_a_linear_dose():
    x, y, z = np.arange(10) * 2.5 - 20, np.arange(8) * 3.0 + 5, 40 - np.arange(6) * 2.0  # z descending too
    dose = (0.3 * x[None, None, :] + 0.2 * y[None, :, None] + 0.5 * z[:, None, None] + 50).astype(np.float32)
    grid = DoseGrid(dose, x, y, z)
    py, px, pz = np.array([6.1, 20.0, 100.0]), np.array([-19.0, -1.3, 2.0]), np.array([39.0, 31.5])
    sampled = sample_dose(grid, py, px, pz)
    expected = 0.3 * px[None, :, None] + 0.2 * py[:, None, None] + 0.5 * pz[None, None, :] + 50
    assert np.allclose(sampled[:2], expected[:2], atol=1e-4)  # float32 doses of ~60 Gy: ulps of 4e-6, interpolated
    assert not sampled[2].any()  # y = 100 mm is outside the dose grid


def test_names_cover_the_common_forms_and_a_file_overrides():
    contract = {"PTV70": "PTV70", "PTV_70": "PTV70", "PTV_7000": "PTV70", "Parotid_L": "LeftParotid",
                "Parotid_R": "RightParotid", "Brainstem": "Brainstem", "SpinalCord": "SpinalCord",
                "Esophagus": "Esophagus", "Larynx": "Larynx", "Mandible": "Mandible", "BODY": "BODY",
                "External": "BODY", "ptv_56": "PTV56", "L Parotid": "LeftParotid"}
    for roi, structure in contract.items():
        assert match_rois([roi], default_names(OPENKBP), "RS.dcm") == {structure: roi}, roi
        assert match_rois([roi.upper()], default_names(OPENKBP), "RS.dcm") == {structure: roi.upper()}
    with pytest.raises(DicomInputError, match="'PTV70', 'PTV_7000' all match PTV70"):
        match_rois(["PTV70", "PTV_7000"], default_names(OPENKBP), "RS.dcm")


def test_names_file_replaces_lists_and_bad_files_are_named(tmp_path):
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"PTV70": ["PTV_High"], "BODY": "Contour_Ext"}))
    table = load_names(path, OPENKBP)
    assert match_rois(["PTV_High", "PTV70", "contour ext"], table, "RS.dcm") == {"PTV70": "PTV_High", "BODY": "contour ext"}
    path.write_text(json.dumps({"Heart": ["Heart"]}))
    with pytest.raises(DicomInputError, match=r"names.json: unknown structure 'Heart'"):
        load_names(path, OPENKBP)
    path.write_text("{nope")
    with pytest.raises(DicomInputError, match=r"names.json: names file is not JSON"):
        load_names(path, OPENKBP)


def test_pydicom_example_rt_files(tmp_path):
    from pydicom.data import get_testdata_file

    rtstruct = get_testdata_file("rtstruct.dcm")  # no preamble: read as clinical exports without one are
    frame = pydicom.dcmread(rtstruct, force=True).ReferencedFrameOfReferenceSequence[0].FrameOfReferenceUID
    structures = read_rtstruct(rtstruct, frame)
    assert structures.roi_names and all(isinstance(c, np.ndarray) and c.shape[1] == 3
                                        for name in structures.roi_names for c in structures.contours(name))
    with pytest.raises(DicomInputError, match="not the CT's 1.2.3"):
        read_rtstruct(rtstruct, "1.2.3")
    rtdose = get_testdata_file("rtdose.dcm")
    dataset = pydicom.dcmread(rtdose)
    with pytest.raises(DicomInputError, match="rtdose.dcm: DoseUnits 'RELATIVE'; expected GY"):
        read_rtdose(rtdose, dataset.FrameOfReferenceUID)  # pydicom's example is a relative dose
    dataset.DoseUnits = "GY"
    rtdose = tmp_path / "rtdose.dcm"
    dataset.save_as(rtdose)
    grid = read_rtdose(rtdose, dataset.FrameOfReferenceUID)
    assert grid.dose.shape == (dataset.NumberOfFrames, dataset.Rows, dataset.Columns) and grid.dose.max() > 0
    with pytest.raises(DicomInputError, match="rtdose.dcm: dose is in frame of reference"):
        read_rtdose(rtdose, "1.2.3")
    with pytest.raises(DicomInputError, match=r"CT_small.dcm: not an RTSTRUCT \(modality 'CT'\)"):
        read_rtstruct(get_testdata_file("CT_small.dcm"), frame)


@pytest.fixture(scope="module")
def small_clinic(tmp_path_factory):
    """A 128 × 128 phantom export (factor 1) to break in the error tests."""
    root = tmp_path_factory.mktemp("small-clinic")
    volumes, masks = phantom_volumes(seed=9)
    write_patient(root, volumes["ct"], masks, volumes["voxel_dimensions"], factor=1)
    return root


def _copy(small_clinic, tmp_path):
    return Path(shutil.copytree(small_clinic, tmp_path / "clinic"))


def _refused(tmp_path, ct_dir, rtstruct, match, **kwargs):
    out = tmp_path / "out" / "pt_1"
    with pytest.raises(DicomInputError, match=match) as caught:
        import_patient(ct_dir, rtstruct, out, **kwargs, site=OPENKBP)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing half-written
    return caught.value


def test_refused_inputs_name_the_file_and_leave_nothing(small_clinic, tmp_path):
    clinic = _copy(small_clinic, tmp_path)
    rs = clinic / "RS.dcm"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _refused(tmp_path, empty, rs, "CT folder is empty").path == str(empty)
    text = tmp_path / "text"
    text.mkdir()
    (text / "notes.txt").write_text("not dicom")
    (text / "image.dcm").write_bytes(b"\0" * 300)
    _refused(tmp_path, text, rs, r"no DICOM file among its 2 files")
    _refused(tmp_path, clinic / "ct", tmp_path / "none.dcm", "RTSTRUCT file is missing")

    files = sorted((clinic / "ct").iterdir(), key=lambda p: -float(pydicom.dcmread(p).ImagePositionPatient[2]))
    gap = files[60]
    moved = tmp_path / gap.name
    shutil.move(gap, moved)
    error = _refused(tmp_path, clinic / "ct", rs, r"1 missing slice\(s\): slices at z = ")
    assert files[59].name in str(error) and files[61].name in str(error)
    shutil.move(moved, gap)

    other = pydicom.dcmread(files[10])
    other.SeriesInstanceUID = "1.2.826.0.1.3680043.8.498.1"
    other.SOPInstanceUID = pydicom.uid.generate_uid()
    other.save_as(clinic / "ct" / "other-series.dcm")
    _refused(tmp_path, clinic / "ct", rs, r"holds 2 CT series: .*other-series.dcm")
    (clinic / "ct" / "other-series.dcm").unlink()

    tilted = pydicom.dcmread(files[5])
    tilted.ImageOrientationPatient = [1, 0, 0, 0, 0.866, -0.5]
    tilted.save_as(files[5])
    _refused(tmp_path, clinic / "ct", rs, rf"{files[5].name}: ImageOrientationPatient .* is not axial")


def test_refused_structure_sets(small_clinic, tmp_path):
    clinic = _copy(small_clinic, tmp_path)
    rs = pydicom.dcmread(clinic / "RS.dcm")
    rs.ReferencedFrameOfReferenceSequence[0].FrameOfReferenceUID = "1.2.3.4"
    for roi in rs.StructureSetROISequence:
        roi.ReferencedFrameOfReferenceUID = "1.2.3.4"
    rs.save_as(tmp_path / "other-frame.dcm")
    _refused(tmp_path, clinic / "ct", tmp_path / "other-frame.dcm", r"other-frame.dcm: contours are in frame of reference 1.2.3.4")

    rs = pydicom.dcmread(clinic / "RS.dcm")
    for roi in rs.StructureSetROISequence:
        if roi.ROIName == "PTV_7000":
            roi.ROIName = "GTV"
    rs.save_as(tmp_path / "no-ptv70.dcm")
    _refused(tmp_path, clinic / "ct", tmp_path / "no-ptv70.dcm", r"no-ptv70.dcm: no ROI for PTV70 \(ROIs: .*GTV")
    report = import_patient(clinic / "ct", tmp_path / "no-ptv70.dcm", tmp_path / "allowed", allow_missing_targets=True, site=OPENKBP)
    assert "missing: PTV70" in report.lines and "unused ROIs: 'GTV'" in report.lines
    assert not (tmp_path / "allowed" / "PTV70.csv").exists() and (tmp_path / "allowed" / "PTV63.csv").exists()


def test_without_a_body_contour_the_mask_comes_from_the_ct(small_clinic, tmp_path):
    clinic = _copy(small_clinic, tmp_path)
    rs = pydicom.dcmread(clinic / "RS.dcm")
    for roi in rs.StructureSetROISequence:
        if roi.ROIName == "External":
            roi.ROIName = "Couch"
    rs.save_as(clinic / "RS.dcm")
    report = import_patient(clinic / "ct", clinic / "RS.dcm", tmp_path / "pt_1", site=OPENKBP)
    assert "possible-dose mask: CT above -400 HU (no BODY/External ROI)" in report.lines
    volumes, _ = phantom_volumes(seed=9)
    assert dice(read_patient(report.folder, require_dose=False, site=openkbp()).possible_dose_mask,
                volumes["possible_dose_mask"]) >= 0.95


@SLOW_FOR_ITS_TIME
def test_command_line_import_and_export_and_a_one_line_error(small_clinic, tmp_path):
    clinic = _copy(small_clinic, tmp_path)
    result = subprocess.run([*OPENKBP_DICOM, "import", "--ct", str(clinic / "ct"), "--rtstruct", str(clinic / "RS.dcm"),
                             "--out", str(tmp_path / "pt_1")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "PTV70        <- 'PTV_7000'" in result.stdout and "possible-dose mask: ROI 'External'" in result.stdout
    prediction = tmp_path / "pt_1.csv"
    shutil.copy(tmp_path / "pt_1" / "ct.csv", prediction)  # any sparse 128³ volume will do
    result = subprocess.run([*OPENKBP_DICOM, "export", "--patient", str(tmp_path / "pt_1"), "--prediction", str(prediction),
                             "--out", str(tmp_path / "RD.dcm")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert pydicom.dcmread(tmp_path / "RD.dcm").Rows == 128
    result = subprocess.run([*OPENKBP_DICOM, "import", "--ct", str(tmp_path / "nowhere"), "--rtstruct",
                             str(clinic / "RS.dcm"), "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "nowhere: CT folder does not exist" in result.stderr and not (tmp_path / "x").exists()


def test_pydicoms_warning_about_a_value_is_said_once_on_the_import_console(small_clinic, tmp_path):
    """pydicom logs a value that breaks its VR's rules and raises it as a UserWarning too: the console
    shows the log line, not also the raw warning with the installation's file path."""
    clinic = _copy(small_clinic, tmp_path)
    long_uid = "1.2." + "9" * 62  # 66 characters: a UI is at most 64
    with pydicom.config.disable_value_validation():
        for path in [*(clinic / "ct").iterdir(), clinic / "RS.dcm"]:
            dataset = pydicom.dcmread(path)
            dataset.StudyInstanceUID = long_uid  # an archive's own slip, kept on every object of the patient
            dataset.save_as(path)
    result = subprocess.run([*OPENKBP_DICOM, "import", "--ct", str(clinic / "ct"), "--rtstruct", str(clinic / "RS.dcm"),
                             "--out", str(tmp_path / "pt_1")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "maximum length of 64 allowed for VR UI" in line]
    assert len(said) == 1 and " WARNING " in said[0], result.stderr
    assert "UserWarning" not in result.stderr and "site-packages" not in result.stderr


def test_read_ct_series_orders_slices_and_applies_the_rescale(written):
    volumes, patient, _ = written
    series = read_ct_series(patient.ct_dir)
    assert np.all(np.diff(series.slice_z) < 0) and series.hu.shape == (128, 256, 256)
    assert np.array_equal(series.hu[40, ::2, ::2], volumes["ct"][:, :, 40].astype(np.float32) - 1000)
    assert VOLUME_SHAPE == (128, 128, 128)


def test_heart_rasterised_on_the_dose_grid_matches_dicompyler_core():
    """Oracle: dicompyler-core's test case (tests/data/dicompyler-core/README.md). The heart's
    contours filled on the dose grid give dicompyler-core's own voxel volume and mean dose, and
    the planning system's volume within 1 %."""
    data = Path(__file__).parent / "data" / "dicompyler-core"
    frame = pydicom.dcmread(data / "heart_rtdose.dcm", stop_before_pixels=True).FrameOfReferenceUID
    grid = read_rtdose(data / "heart_rtdose.dcm", frame)
    structures = read_rtstruct(data / "heart_rtss.dcm", frame)
    assert structures.roi_names == ["Heart"]
    z_descending = grid.z[::-1]
    planes = contours_by_slice(structures.contours("Heart"), z_descending, "Heart", data)
    spacing = (grid.x[1] - grid.x[0], grid.y[1] - grid.y[0], grid.z[1] - grid.z[0])
    doses = []
    for k, polygons in planes.items():
        pixels = [np.stack([(p[:, 0] - grid.x[0]) / spacing[0], (p[:, 1] - grid.y[0]) / spacing[1]], axis=1)
                  for p in polygons]
        doses.append(grid.dose[::-1][k][fill_polygons(pixels, grid.dose.shape[1:])])
    doses = np.concatenate(doses).astype(np.float64)
    volume_cc = doses.size * np.prod(spacing) / 1000
    assert volume_cc == pytest.approx(440.23125, abs=1e-6)
    # dicompyler-core's figures as printed by its own test (7 digits; its bins 0.01 Gy for max and min)
    assert doses.mean() == pytest.approx(0.6475329, abs=1e-4)
    assert doses.max() == pytest.approx(3.1, abs=0.01) and doses.min() == pytest.approx(0.03, abs=0.01)
    planning_system = pydicom.dcmread(data / "heart_rtdose.dcm").DVHSequence[0]
    assert volume_cc == pytest.approx(float(planning_system.DVHData[1]), rel=0.01)  # the planning system's own rasteriser


def test_an_earlier_import_is_replaced_and_a_foreign_folder_refused(small_clinic, tmp_path):
    clinic = _copy(small_clinic, tmp_path)
    out = tmp_path / "pt_1"
    import_patient(clinic / "ct", clinic / "RS.dcm", out, site=OPENKBP)
    (out / "stale.csv").write_text("left over\n")
    import_patient(clinic / "ct", clinic / "RS.dcm", out, site=OPENKBP)
    assert not (out / "stale.csv").exists() and (out / "dicom.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folders left
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DicomInputError, match="mine: output folder exists and is not an earlier import"):
        import_patient(clinic / "ct", clinic / "RS.dcm", foreign, site=OPENKBP)
    assert (foreign / "notes.txt").read_text() == "keep me"


def _contour(points_mm) -> "pydicom.Dataset":
    contour = pydicom.Dataset()
    contour.ContourGeometricType = "CLOSED_PLANAR"
    contour.NumberOfContourPoints = len(points_mm) // 3
    contour.ContourData = [f"{v:.4f}" for v in points_mm]
    return contour


def test_short_contours_are_left_out_and_unmapped_rois_are_not_parsed(small_clinic, tmp_path):
    clinic = _copy(small_clinic, tmp_path)
    expected = read_patient(import_patient(clinic / "ct", clinic / "RS.dcm", tmp_path / "clean", site=OPENKBP).folder,
                            require_dose=False, site=OPENKBP)
    rs = pydicom.dcmread(clinic / "RS.dcm")
    number = {roi.ROIName: roi.ROINumber for roi in rs.StructureSetROISequence}
    ptv70 = next(item for item in rs.ROIContourSequence if item.ReferencedROINumber == number["PTV_7000"])
    x, y, z = (float(v) for v in ptv70.ContourSequence[0].ContourData[:3])
    ptv70.ContourSequence.append(_contour([x, y, z, x + 1, y, z]))  # two points, as rt-utils writes for a lone pixel
    ptv70.ContourSequence.append(_contour([x, y, z]))  # a point written as a closed contour
    couch = pydicom.Dataset()
    couch.ROINumber, couch.ROIName = 99, "Couch"
    couch.ReferencedFrameOfReferenceUID = rs.StructureSetROISequence[0].ReferencedFrameOfReferenceUID
    rs.StructureSetROISequence.append(couch)
    item = pydicom.Dataset()
    item.ReferencedROINumber = 99
    item.ContourSequence = pydicom.Sequence([_contour([x, y, z]), _contour([x, y, z, x])])  # one point; malformed
    rs.ROIContourSequence.append(item)
    rs.save_as(clinic / "RS.dcm")
    # Couch's malformed contour (4 coordinates) stops the import were Couch parsed: its going through is the check
    report = import_patient(clinic / "ct", clinic / "RS.dcm", tmp_path / "pt_1", site=OPENKBP)
    imported = read_patient(report.folder, require_dose=False, site=OPENKBP)
    assert np.array_equal(imported.structure_masks, expected.structure_masks)
    assert "unused ROIs: 'Couch'" in report.lines
    assert "PTV70 ('PTV_7000'): left out 2 contour(s) of fewer than three points" in report.warnings


def test_a_structure_contoured_on_every_third_slice_is_filled_between_and_warned_about(small_clinic, tmp_path):
    """Two slices without contours after each one with (5 mm, under MAX_FILLED_GAP_MM): each takes
    the contours of the nearer contoured slice (the superior one when both are as near), in the
    CT-grid pixels the DVH table counts and in the box's mask the model sees."""
    clinic = _copy(small_clinic, tmp_path)
    rs = pydicom.dcmread(clinic / "RS.dcm")
    number = {roi.ROIName: roi.ROINumber for roi in rs.StructureSetROISequence}
    ptv70 = next(item for item in rs.ROIContourSequence if item.ReferencedROINumber == number["PTV_7000"])
    z = sorted({float(c.ContourData[2]) for c in ptv70.ContourSequence}, reverse=True)
    kept = set(z[::3])
    ptv70.ContourSequence = pydicom.Sequence([c for c in ptv70.ContourSequence if float(c.ContourData[2]) in kept])
    rs.save_as(clinic / "RS.dcm")
    report = import_patient(clinic / "ct", clinic / "RS.dcm", tmp_path / "pt_1", site=OPENKBP)
    warned = [line for line in report.lines if line.startswith("warning: PTV70 ('PTV_7000') has contours on")]
    span = len(z) - (len(z) - 1) % 3
    assert warned == [f"warning: PTV70 ('PTV_7000') has contours on {len(kept)} of the {span} CT slices from "
                      f"z = {z[0]:g} to {max(kept, key=lambda v: -v):g} mm (none at z = {z[1]:g} mm); the "
                      f"{span - len(kept)} slices without are filled from the nearer contoured slice"]
    geometry = report.geometry
    plane = geometry.rows * geometry.columns
    slice_z = list(geometry.slice_z)
    voxels = report.ct_voxels["PTV70"]
    pixels = {k: set((voxels[voxels // plane == k] % plane).tolist()) for k in np.unique(voxels // plane).tolist()}
    drawn = sorted(slice_z.index(value) for value in kept)
    assert sorted(pixels) == list(range(drawn[0], drawn[-1] + 1))
    for k in pixels:
        nearer = min(drawn, key=lambda d: (abs(d - k), d))
        assert pixels[k] == pixels[nearer], k
    mask = read_patient(report.folder, require_dose=False, site=OPENKBP).structure_masks & (1 << STRUCTURES.index("PTV70"))
    box, ct_slices = geometry.box_slices()
    for b, k in zip(box.tolist(), ct_slices.tolist()):
        if drawn[0] <= k <= drawn[-1]:
            nearer = ct_slices.tolist().index(min(drawn, key=lambda d: (abs(d - k), d)))
            assert np.array_equal(mask[:, :, b] > 0, mask[:, :, box[nearer]] > 0), k


def test_a_scan_ending_inside_the_targets_is_warned_about(tmp_path):
    volumes, masks = phantom_volumes(seed=9)
    centre = int(np.flatnonzero(volumes["PTV70"].any(axis=(0, 1))).mean())
    keep = slice(centre - 2, centre + 3)  # a 5-slice CT through the middle of PTV70
    patient = write_patient(tmp_path / "clinic", volumes["ct"][:, :, keep],
                            {k: m[:, :, keep] for k, m in masks.items()}, volumes["voxel_dimensions"], factor=1)
    report = import_patient(patient.ct_dir, patient.rtstruct, tmp_path / "pt_1", allow_missing_targets=True, site=OPENKBP)
    z = patient.slice_z
    assert (f"warning: PTV70 ('PTV_7000') is drawn on the CT's first (z = {z[0]:g} mm) and last (z = {z[-1]:g} mm) "
            f"slice: the scan (5 slices) is shorter than the targets need and may end inside PTV70; the model sees "
            f"no anatomy beyond it") in report.lines


def test_a_jpeg_2000_ct_imports_and_without_a_decoder_is_refused_in_one_line(small_clinic, tmp_path, monkeypatch):
    pytest.importorskip("openjpeg", reason="pylibjpeg-openjpeg (the dicom extra) is not installed")
    from pydicom.pixels import get_decoder
    from pydicom.uid import JPEG2000Lossless

    clinic = _copy(small_clinic, tmp_path)
    expected = read_patient(import_patient(clinic / "ct", clinic / "RS.dcm", tmp_path / "plain", site=OPENKBP).folder,
                            require_dose=False, site=OPENKBP)
    files = sorted((clinic / "ct").iterdir())
    for path in files[:3]:
        dataset = pydicom.dcmread(path)
        dataset.compress(JPEG2000Lossless)  # pylibjpeg-openjpeg encodes
        dataset.save_as(path)
    assert pydicom.dcmread(files[0]).file_meta.TransferSyntaxUID == JPEG2000Lossless
    imported = read_patient(import_patient(clinic / "ct", clinic / "RS.dcm", tmp_path / "pt_1", site=OPENKBP).folder,
                            require_dose=False, site=OPENKBP)
    assert np.array_equal(imported.ct, expected.ct)  # lossless

    decoder = get_decoder(JPEG2000Lossless)  # as if neither pylibjpeg-openjpeg nor Pillow nor GDCM were installed
    monkeypatch.setattr(decoder, "_available", {})
    monkeypatch.setattr(decoder, "_unavailable", {"pylibjpeg": ("pylibjpeg>=2.0", "pylibjpeg-openjpeg>=2.0"),
                                                  "pillow": ("pillow>=10.0",)})
    error = _refused(tmp_path, clinic / "ct", clinic / "RS.dcm",
                     r": CT pixels are compressed as JPEG 2000 Image Compression \(Lossless Only\) "
                     r"\(1.2.840.10008.1.2.4.90\) and no decoder for it is installed: "
                     r"pip install 'provided_code\[dicom\]' installs one")
    assert Path(error.path).name in {p.name for p in files[:3]}


class _NoMatrixProducts(np.ndarray):
    """An array that fails on any matrix product (the BLAS calls whose threads contend under load)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.matmul:
            raise AssertionError("a matrix product")
        inputs = tuple(np.asarray(x) if isinstance(x, _NoMatrixProducts) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func in (np.dot, np.einsum, np.tensordot, np.matmul, np.inner, np.vdot):
            raise AssertionError(f"a matrix product ({func.__name__})")
        return super().__array_function__(func, types, args, kwargs)


def test_resampling_needs_no_matrix_products_and_equals_them(monkeypatch):
    from provided_code.dicom.grid import PlaneTaps

    rng = np.random.default_rng(0)
    for rows, columns in ((512, 512), (300, 420)):
        plane = rng.normal(0, 500, (rows, columns)).astype(np.float32)
        by_matrices = area_weights(rows, 128) @ plane.astype(np.float64) @ area_weights(columns, 128).T
        to_box = PlaneTaps.from_matrices(area_weights(rows, 128), area_weights(columns, 128))  # as the import does
        resampled = to_box.apply(plane.view(_NoMatrixProducts))
        assert np.allclose(np.asarray(resampled), by_matrices, rtol=1e-6, atol=1e-4)  # float32 sums of ~500 HU: ulps of 3e-5
    geometry = PatientGeometry(rows=300, columns=420, pixel_spacing=[1.2, 1.1], origin_xy=[-200.0, -150.0],
                               slice_z=(50 - 2.5 * np.arange(128)).tolist(), first_slice=0, frame_of_reference_uid="1",
                               series_instance_uid="2", sop_instance_uids=[""] * 128, tags={}, site="openkbp")
    dose = rng.uniform(0, 70, VOLUME_SHAPE).astype(np.float32)
    on_ct = dose_on_ct_grid(dose.view(_NoMatrixProducts), geometry)
    k = 40
    by_matrices = linear_weights(128, 300) @ dose[:, :, k].astype(np.float64) @ linear_weights(128, 420).T
    assert np.allclose(np.asarray(on_ct[k]), by_matrices, rtol=1e-6, atol=1e-5)  # float32 doses to 70 Gy: ulps of 4e-6
    grid = DoseGrid(dose[:, :, :20].transpose(2, 0, 1).copy().view(_NoMatrixProducts), np.arange(128) * 3.0 - 100,
                    np.arange(128) * 3.0 - 80, 10 - np.arange(20) * 2.5)
    y, x, z = np.linspace(-90, 300, 64), np.linspace(-120, 250, 48), np.linspace(15, -45, 16)
    sampled = sample_dose(grid, y, x, z)
    from provided_code.dicom.rtdose import _linear_at

    by_frame = np.einsum("frc,ir,jc->ijf", np.asarray(grid.dose, np.float64), _linear_at(grid.y, y),
                         _linear_at(grid.x, x), optimize=True)
    by_matrices = np.einsum("ijf,kf->ijk", by_frame, _linear_at(grid.z, z), optimize=True)
    assert np.allclose(np.asarray(sampled), by_matrices, rtol=1e-6, atol=1e-5)  # as above, float32 against float64


# -- the prostate site ------------------------------------------------------------------------------
from provided_code.data.phantoms import make_prostate_phantom  # noqa: E402
from tests.kit.synthetic import PROSTATE_CLINICAL_NAMES  # noqa: E402
from provided_code.sites import load_site  # noqa: E402

PROSTATE = load_site("prostate")


def structure_mask(patient, name):
    return (patient.structure_masks & PROSTATE.bit(name)) != 0


@pytest.fixture(scope="module")
def prostate_written(tmp_path_factory):
    """A prostate phantom written as a clinic's DICOM (256 × 256 CT at half the voxel size, shuffled
    files, ROIs under clinical names, RTDOSE), and its import for the prostate site. Made once per
    test run (read-only)."""
    return made_once_with_value(tmp_path_factory, "dicom-prostate-phantom", write_and_import_prostate_phantom)


def write_and_import_prostate_phantom(root):
    volumes = make_prostate_phantom(3, site=PROSTATE)
    masks = {name: volumes[name] for name in PROSTATE.names}
    masks["BODY"] = volumes["possible_dose_mask"]
    patient = write_patient(root / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"], volumes["dose"],
                            names=PROSTATE_CLINICAL_NAMES)
    report = import_patient(patient.ct_dir, patient.rtstruct, root / "pt_1", rtdose=patient.rtdose, site=PROSTATE)
    return volumes, patient, report


def test_prostate_round_trip_with_the_sites_names(prostate_written):
    volumes, patient, report = prostate_written
    imported = read_patient(report.folder, site=PROSTATE)
    assert np.allclose(imported.voxel_dimensions, volumes["voxel_dimensions"])
    assert np.abs(imported.ct.astype(int) - volumes["ct"].astype(int)).max() <= 1  # within 1 HU
    for name in PROSTATE.names:
        assert dice(structure_mask(imported, name), volumes[name]) >= 0.95, name
    assert not (structure_mask(imported, "PTV78") & structure_mask(imported, "PTV60")).any()  # PTV78 wins
    assert dice(imported.possible_dose_mask, volumes["possible_dose_mask"]) >= 0.95
    assert np.abs(imported.dose - volumes["dose"]).max() <= 0.002  # 16-bit RT Dose, 3 decimals: as OpenKBP's test
    geometry = PatientGeometry.read(report.folder)
    assert geometry.site == "prostate" and geometry.box_shape == [128, 128, 128]
    assert geometry.structures == {**{name: PROSTATE_CLINICAL_NAMES[name] for name in PROSTATE.names}, "BODY": "External"}
    assert "FemoralHead_R <- 'Femur_Head_R'" in report.lines and not any("missing" in line for line in report.lines)
    assert not any("OpenKBP" in line for line in report.lines)  # OpenKBP's voxel-size ranges are not a prostate's


def test_a_prostate_patient_with_its_own_plan_files_is_returned_as_read_patient_reads_it(prostate_written, tmp_path):
    from provided_code.data.patient_plan import write_beams, write_prescriptions

    _, patient, _ = prostate_written

    def plan_files(folder, targets):  # as the cohort import adds them: the plan's prescriptions and beams
        assert targets == ("PTV60", "PTV78")  # the site's targets the patient has
        write_prescriptions(folder, {"PTV60": 59.2, "PTV78": 74.0 + 1e-9})  # the file holds 74
        write_beams(folder, [{"type": "static", "gantry_start": 0.1 + 0.2}, {"type": "arc", "gantry_start": 181.0,
                                                                           "gantry_stop": 179.0, "direction": "CW"}])

    report = import_patient(patient.ct_dir, patient.rtstruct, tmp_path / "pt_1", rtdose=patient.rtdose,
                            site=PROSTATE, also_write=plan_files)
    read = read_patient(report.folder, site=PROSTATE)
    assert read.prescriptions == {"PTV60": 59.2, "PTV78": 74.0} and read.gantry_angles[:3] == (0.3, 190.0, 200.0)
    assert read.structure_masks.dtype == PROSTATE.mask_dtype and read.dose_decimals == 3
    assert_same_patient(report.patient, read)


def test_prostate_export_lands_on_the_ct_grid_and_another_site_is_refused(prostate_written, tmp_path):
    volumes, patient, report = prostate_written
    geometry = export_dose(report.folder, volumes["dose"], tmp_path / "RD.dcm", site=PROSTATE)
    rd = pydicom.dcmread(tmp_path / "RD.dcm")
    assert rd.FrameOfReferenceUID == patient.frame_of_reference_uid and (rd.Rows, rd.Columns, rd.NumberOfFrames) == \
        (256, 256, 128)
    values = rd.pixel_array.astype(np.float64) * float(rd.DoseGridScaling)  # (z ascending, y, x)
    assert np.abs(values - dose_on_ct_grid(volumes["dose"], geometry)[::-1]).max() <= float(rd.DoseGridScaling)
    with pytest.raises(DicomInputError, match="pt_1/dicom.json: the patient was imported for site prostate, not "
                                              "openkbp") as caught:
        export_dose(report.folder, volumes["dose"], tmp_path / "other.dcm", site=OPENKBP)
    assert "\n" not in str(caught.value) and not (tmp_path / "other.dcm").exists()


def test_a_prostate_structure_set_is_not_an_openkbp_patient(prostate_written, tmp_path):
    _, patient, _ = prostate_written
    with pytest.raises(DicomInputError, match=r"RS.dcm: no ROI for PTV56, PTV63, PTV70 \(ROIs: Rectum, Bladder"):
        import_patient(patient.ct_dir, patient.rtstruct, tmp_path / "pt_1", site=OPENKBP)  # OpenKBP's names


def test_the_dicom_layer_takes_a_site_and_assumes_none(small_clinic, tmp_path):
    with pytest.raises(TypeError, match="site"):
        import_patient(small_clinic / "ct", small_clinic / "RS.dcm", tmp_path / "pt_1")
    with pytest.raises(TypeError, match=r"Invalid `site`. Expected a Site .* Received: site='openkbp'"):
        load_names(None, "openkbp")
    assert not (tmp_path / "pt_1").exists()


def test_a_site_structure_named_as_a_patient_file_is_refused_before_it_overwrites_it(small_clinic, tmp_path):
    import dataclasses

    from provided_code.sites import SiteError, Structure

    for name in ("ct", "Dose", "possible_dose_mask", "prescriptions"):  # (Dose.csv is dose.csv where case is not told)
        site = dataclasses.replace(OPENKBP, structures=(*OPENKBP.structures, Structure(name, "oar", None, ("External",))))
        with pytest.raises(SiteError, match=rf"structure '{name}' would be written as {name}.csv, over the patient's own"):
            import_patient(small_clinic / "ct", small_clinic / "RS.dcm", tmp_path / "pt_1", site=site)
        assert not (tmp_path / "pt_1").exists()


def test_exporting_a_patient_of_a_site_file_needs_that_file(prostate_written, tmp_path):
    from click.testing import CliRunner

    from provided_code.apps.dicom_cli import main

    _, patient, _ = prostate_written
    site_file = tmp_path / "pelvis.json"
    site_file.write_text(json.dumps({**PROSTATE.to_dict(), "name": "pelvis"}))
    result = CliRunner().invoke(main, ["import", "--site", str(site_file), "--ct", str(patient.ct_dir), "--rtstruct",
                                       str(patient.rtstruct), "--out", str(tmp_path / "pt_1")])
    assert result.exit_code == 0, result.output
    shutil.copy(tmp_path / "pt_1" / "ct.csv", tmp_path / "pt_1.csv")  # any sparse 128³ volume will do
    export = ["export", "--patient", str(tmp_path / "pt_1"), "--prediction", str(tmp_path / "pt_1.csv"), "--out",
              str(tmp_path / "RD.dcm")]
    result = CliRunner().invoke(main, export)
    assert result.exit_code == 1 and not (tmp_path / "RD.dcm").exists()
    assert "dicom.json: the patient was imported for site pelvis, from a site file; pass that file as --site" \
        in result.output
    result = CliRunner().invoke(main, [*export, "--site", str(site_file)])
    assert result.exit_code == 0, result.output
    assert pydicom.dcmread(tmp_path / "RD.dcm").Modality == "RTDOSE"


def test_command_line_import_and_export_by_site(prostate_written, tmp_path):
    from click.testing import CliRunner

    from provided_code.apps.dicom_cli import main

    volumes, patient, _ = prostate_written
    result = CliRunner().invoke(main, ["import", "--site", "prostate", "--ct", str(patient.ct_dir), "--rtstruct",
                                       str(patient.rtstruct), "--out", str(tmp_path / "pt_1")])
    assert result.exit_code == 0, result.output
    assert "PTV78         <- 'PTV78'" in result.output and "PTV60         <- 'PTV_6000'" in result.output
    assert dice(structure_mask(read_patient(tmp_path / "pt_1", require_dose=False, site=PROSTATE), "Bladder"),
                volumes["Bladder"]) >= 0.95
    prediction = tmp_path / "pt_1.csv"
    shutil.copy(tmp_path / "pt_1" / "ct.csv", prediction)  # any sparse 128³ volume will do
    export = ["export", "--patient", str(tmp_path / "pt_1"), "--prediction", str(prediction), "--out"]
    result = CliRunner().invoke(main, [*export, str(tmp_path / "RD.dcm"), "--site", "prostate"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, [*export, str(tmp_path / "RD2.dcm"), "--site", "openkbp"])
    assert result.exit_code == 1 and not (tmp_path / "RD2.dcm").exists()
    assert "the patient was imported for site prostate, not openkbp; import it again with --site openkbp" in result.output
    result = CliRunner().invoke(main, ["import", "--site", "pelvis", "--ct", str(patient.ct_dir), "--rtstruct",
                                       str(patient.rtstruct), "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and not (tmp_path / "x").exists()
    assert "Error: --site: invalid `site`: expected openkbp, prostate or a site file (.json). Received: 'pelvis'" \
        in result.output


def test_names_come_from_the_site_and_a_names_file_overrides_them(tmp_path):
    shipped = json.loads((SITES_DIR / "openkbp.json").read_text())
    assert load_names(None, OPENKBP) == {**{s["name"]: tuple(s["dicom_names"]) for s in shipped["structures"]},
                                         "BODY": tuple(shipped["body"]["dicom_names"])}  # OpenKBP's table is its file's
    table = load_names(None, PROSTATE)
    assert list(table) == [*PROSTATE.names, "BODY"]
    for roi, structure in {"PTV_7800": "PTV78", "ptv 60": "PTV60", "Femur_Head_L": "FemoralHead_L",
                           "Rt_Femoral_Head": "FemoralHead_R", "Bladder": "Bladder", "Skin": "BODY"}.items():
        assert match_rois([roi], table, "RS.dcm") == {structure: roi}, roi
    assert match_rois(["PTV70", "Parotid_L"], table, "RS.dcm") == {}  # OpenKBP's structures are not the prostate's
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"PTV78": ["PTV_Boost"]}))
    assert match_rois(["PTV_Boost", "PTV78"], load_names(path, PROSTATE), "RS.dcm") == {"PTV78": "PTV_Boost"}
    path.write_text(json.dumps({"PTV70": ["PTV_High"]}))
    with pytest.raises(DicomInputError, match=r"names.json: unknown structure 'PTV70'; expected one of Rectum, "):
        load_names(path, PROSTATE)
