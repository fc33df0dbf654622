"""Scanning an archive (any tree of files, headers only, in threads) and choosing a plan's dose."""

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from provided_code.dicom import archive  # noqa: E402
from provided_code.dicom.archive import DicomObject, _choose_dose, scan_archive  # noqa: E402
from provided_code.dicom.rtplan import PlanInfo  # noqa: E402
from tests.kit.synthetic import write_dicomdir  # noqa: E402

DICOMPYLER = Path(__file__).parent / "data" / "dicompyler-core"


def test_scan_skips_and_names_what_is_not_an_object(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    shutil.copy(DICOMPYLER / "rtplan.dcm", deep / "0001")  # no extension, nested
    (deep / "d").mkdir()
    shutil.copy(DICOMPYLER / "rtplan.dcm", deep / "d" / "copy.dcm")  # the same object twice
    write_dicomdir(tmp_path / "DICOMDIR")
    (tmp_path / "notes.txt").write_text("not DICOM")
    (tmp_path / "empty").write_bytes(b"")
    seen = []

    def progress(iterable, length, label):
        seen.append((length, label))
        return iterable

    index = scan_archive(tmp_path, progress=progress, workers=2)
    assert seen == [(5, "Reading headers")]
    assert [o.path.relative_to(tmp_path).as_posix() for o in index.objects] == ["a/b/c/0001"]
    skipped = {p.relative_to(tmp_path).as_posix(): why for p, why in index.skipped_files}
    assert skipped["DICOMDIR"].startswith("DICOMDIR") and skipped["notes.txt"] == "not DICOM"
    assert skipped["empty"] == "not DICOM"
    assert skipped["a/b/c/d/copy.dcm"].startswith("duplicate of a/b/c/0001 (SOP Instance UID ")


def _plan(beams=(1, 2, 3), fractions=30):
    return PlanInfo("1.2", "P", "APPROVED", "", "1.3", fractions, 2.0, (), (), tuple(beams))


def _dose(summation, beams=(), when="20260101"):
    return DicomObject(Path("x"), 1, 1, "RTDOSE", "", f"1.{summation}.{beams}.{when}", "", "", "", when,
                       summation=summation, plan_uid="1.2", beam_numbers=tuple(beams))


def test_a_plans_whole_dose_plan_beam_or_fraction():
    plan_dose = _dose("PLAN")
    assert _choose_dose(_plan(), [_dose("BEAM", (1,)), plan_dose])[:3] == ([plan_dose], 1.0, "PLAN")
    newer = _dose("PLAN", when="20260202")
    assert _choose_dose(_plan(), [plan_dose, newer])[0] == [newer]
    assert "equally new" in _choose_dose(_plan(), [plan_dose, _dose("PLAN", (9,))])[3]
    beams = [_dose("BEAM", (n,)) for n in (3, 1, 2)]
    assert _choose_dose(_plan(), beams)[:3] == ([beams[1], beams[2], beams[0]], 1.0, "BEAM")
    assert "do not cover the plan's beams [1, 2, 3] once each" in _choose_dose(_plan(), beams[:2])[3]
    fraction = _dose("FRACTION")
    assert _choose_dose(_plan(), [fraction])[:3] == ([fraction], 30.0, "FRACTION")
    assert "no NumberOfFractionsPlanned" in _choose_dose(_plan(fractions=None), [fraction])[3]
    assert _choose_dose(_plan(), [])[3] == "no RT Dose references this plan"


def test_an_error_while_scanning_stops_it_without_reading_the_other_files(tmp_path, monkeypatch):
    for k in range(200):
        (tmp_path / f"f{k:03d}").write_bytes(b"not DICOM")
    calls = []

    def slow_reader(path):
        calls.append(path)
        time.sleep(0.005)
        if path.name == "f000" and failing:
            raise RuntimeError("a bug on the first file")
        return None, "not DICOM"

    def interrupted(iterable, length, label):  # Ctrl-C while the progress bar draws its second step
        for k, item in enumerate(iterable):
            if k == 1:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(archive, "_read_header", slow_reader)
    failing = False
    with pytest.raises(KeyboardInterrupt):
        scan_archive(tmp_path, progress=interrupted, workers=2)
    assert len(calls) < 20
    calls.clear()
    failing = True
    with pytest.raises(RuntimeError, match="a bug on the first file"):
        scan_archive(tmp_path, workers=2)
    assert len(calls) < 20


def test_the_scan_does_not_read_a_structure_sets_contours(tmp_path):
    dataset = pydicom.dcmread(DICOMPYLER / "heart_rtss.dcm")
    dataset["ROIContourSequence"].is_undefined_length = True  # as planning systems write it: parsed to find its end
    path = tmp_path / "RS"
    dataset.save_as(path)
    data = path.read_bytes()
    path.write_bytes(data[:data.index(b"\x06\x30\x39\x00") + 5000])  # cut short inside the contours
    [item] = scan_archive(tmp_path).objects
    assert item.modality == "RTSTRUCT" and item.roi_names == tuple(
        (int(roi.ROINumber), roi.ROIName) for roi in dataset.StructureSetROISequence)
    frame = dataset.ReferencedFrameOfReferenceSequence[0]
    assert item.referenced_series and item.frame_of_reference_uid == frame.FrameOfReferenceUID


def test_a_structure_set_naming_its_frame_only_on_its_rois_is_in_that_frame(tmp_path):
    """Its frame of reference as the import and the DICOM node read it (one reading of the references):
    the ROIs' ``ReferencedFrameOfReferenceUID`` when the structure set has no frame of its own."""
    pytest.importorskip("skimage", reason="the tests' DICOM writer traces contours with scikit-image (the dev extra)")
    from tests.kit.synthetic import write_patient

    mask = np.zeros((16, 16, 4), bool)
    mask[4:10, 5:11, 1:3] = True
    written = write_patient(tmp_path / "clinic", np.full((16, 16, 4), 1000, np.uint16), {"PTV70": mask},
                            (3.0, 3.0, 2.5), factor=1)
    dataset = pydicom.dcmread(written.rtstruct)
    del dataset.ReferencedFrameOfReferenceSequence, dataset.FrameOfReferenceUID
    dataset.save_as(written.rtstruct)
    [item] = [o for o in scan_archive(tmp_path).objects if o.modality == "RTSTRUCT"]
    assert item.frame_of_reference_uid == written.frame_of_reference_uid


def test_garbage_after_a_dicom_preamble_is_a_skipped_file_not_a_patient(tmp_path):
    rng = np.random.default_rng(7)
    (tmp_path / "garbage").write_bytes(b"\0" * 128 + b"DICM" + rng.bytes(4000))
    shutil.copy(DICOMPYLER / "rtplan.dcm", tmp_path / "plan")
    index = scan_archive(tmp_path, workers=2)
    assert [o.path.name for o in index.objects] == ["plan"]
    assert {p.name: why for p, why in index.skipped_files} == {"garbage": "not DICOM"}


def test_large_files_that_are_not_dicom_are_skipped_from_their_first_bytes(tmp_path):
    size = 64 << 20  # a sparse file: no disk; pydicom alone walks zeros 8 bytes at a time (35 s at this size)
    with open(tmp_path / "zeros", "wb") as handle:
        handle.truncate(size)
    with open(tmp_path / "preamble-then-zeros", "wb") as handle:
        handle.write(b"\0" * 128 + b"DICM")
        handle.truncate(size)
    meta = (DICOMPYLER / "rtplan.dcm").read_bytes()
    meta = meta[:132 + 12 + int.from_bytes(meta[140:144], "little")]  # the preamble and the file meta, as written
    with open(tmp_path / "meta-then-zeros", "wb") as handle:
        handle.write(meta)
        handle.truncate(size)
    start = time.perf_counter()
    index = scan_archive(tmp_path, workers=2)
    assert time.perf_counter() - start < 5  # well under a second here; the files' whole length would take minutes
    assert not index.objects and {why for _, why in index.skipped_files} == {"not DICOM"}


def test_one_patients_objects_whose_names_differ_only_past_the_given_name_are_one_patient(tmp_path):
    """Planning systems keep or drop the middle name, prefix and suffix: the family and given names
    (and the birth date) tell two patients under one PatientID apart, not those."""
    pytest.importorskip("skimage", reason="the tests' DICOM writer traces contours with scikit-image (the dev extra)")
    from provided_code.dicom.archive import link_patients
    from tests.kit.synthetic import write_dose, write_patient, write_plan

    mask = np.zeros((16, 16, 4), bool)
    mask[4:10, 5:11, 1:3] = True
    written = write_patient(tmp_path, np.full((16, 16, 4), 1000, np.uint16), {"PTV70": mask}, (3.0, 3.0, 2.5),
                            factor=1, patient_id="ANON", patient_name="Doe^Jane")
    plan = write_plan(tmp_path / "RP.dcm", written, [("static", 0.0)], {"PTV70": 70.0})
    write_dose(tmp_path / "RD.dcm", np.full((16, 16, 4), 2.0, np.float32), written, plan)
    dataset = pydicom.dcmread(tmp_path / "RP.dcm")
    dataset.PatientName = "DOE^JANE^Marie^Dr"
    dataset.save_as(tmp_path / "RP.dcm")
    [patient] = link_patients(scan_archive(tmp_path))
    assert patient.chosen is not None and not patient.refusal
    dataset.PatientName = "Roe^Jane"
    dataset.save_as(tmp_path / "RP.dcm")
    [patient] = link_patients(scan_archive(tmp_path))
    assert patient.chosen is None and patient.refusal.startswith("one PatientID for 2 patients of different names;")
