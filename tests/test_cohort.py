"""``openkbp-dicom import-cohort``: archives written by the tests' DICOM writer, with what real
archives hold besides the plans (unapproved plans, plans without a dose, per-beam and per-fraction
doses, an MR, a CBCT, a patient without a structure set, a DICOMDIR, a text file, nested folders of
files without extensions); the real OpenKBP sample through it; reruns, a killed run, the split; a
prostate archive of VMAT plans through import, training, prediction and scores."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")
pytest.importorskip("skimage", reason="the tests' DICOM writer traces contours with scikit-image (the dev extra)")

from provided_code.sites import openkbp  # noqa: E402
from provided_code.data.csv_io import read_patient  # noqa: E402
from provided_code.data.patient_plan import read_beams, read_prescriptions  # noqa: E402
from provided_code.sites import Arc, Beams, load_site, site_from_dict  # noqa: E402
from provided_code.data.phantoms import make_phantom  # noqa: E402
from provided_code.dicom import cohort  # noqa: E402
from provided_code.dicom.cohort import import_cohort  # noqa: E402
from tests.kit.synthetic import (  # noqa: E402
    PROSTATE_CLINICAL_NAMES, scatter_files, write_dicomdir, write_dose, write_patient, write_plan, write_series)
from tests.kit.repo import SAMPLE_DIR  # noqa: E402
from tests.kit.skips import requires_sample  # noqa: E402
from tests.kit.runs import LIGHT_FLAGS
from tests.kit.made_once import made_once_with_value
from tests.kit.tiers import SLOW_FOR_ITS_TIME

PRESCRIPTIONS_GY = openkbp().prescriptions_gy
STRUCTURES = openkbp().names  # OpenKBP's channel order

DICOMPYLER = Path(__file__).parent / "data" / "dicompyler-core"
OPENKBP_DICOM = [sys.executable, "-m", "provided_code.apps.dicom_cli"]
OPENKBP_BEAMS = [("static", float(angle)) for angle in range(0, 360, 40)]
PRESCRIBED = {"PTV_7000": 70.0, "PTV63": 63.0, "PTV_56": 56.0}  # the writer's clinical ROI names
ARCS = [("arc", 181.0, 179.0, "CW"), ("arc", 179.0, 181.0, "CC")]
SITE = dict(PRESCRIPTIONS_GY)
OPENKBP = load_site("openkbp")
NINE = (Beams("static", angles=tuple(float(a) for a in range(0, 360, 40))), (0.0,) * 9)


def volumes_of(seed):
    volumes = make_phantom(seed)
    masks = {name: volumes[name] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"]
    return volumes, masks


# What a clinic's CT says of the patient and the visit besides the name, ID and birth date
STUDY_TAGS = {"PatientSex": "F", "StudyDate": "19990909", "StudyTime": "081517", "StudyID": "STUDY-4242",
              "StudyDescription": "Doe planning CT", "AccessionNumber": "ACC-778899",
              "ReferringPhysicianName": "Referrer^Rita"}


def write_clinic(folder, volumes, masks, patient_id, factor=1, **kwargs):
    return write_patient(folder, volumes["ct"], masks, volumes["voxel_dimensions"], factor=factor,
                         patient_id=patient_id, patient_name=f"Doe^{patient_id}", birth_date="19500505",
                         study_tags=STUDY_TAGS, **kwargs)


def rows(out):
    with open(Path(out) / "manifest.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def identity(out):
    with open(Path(out) / "identity-map.csv", newline="") as handle:
        return {row["patient_id"]: row["pseudonym"] for row in csv.DictReader(handle)}


def folder_of(out, pseudonym):
    found = [p for split in ("train-pats", "validation-pats") for p in [Path(out) / split / pseudonym] if p.is_dir()]
    assert len(found) == 1, (pseudonym, found)
    return found[0]


def snapshot(out):
    """Every file under a data folder (but the journal) and its bytes; the cohort's identifier, drawn
    at random once per data folder, as <cohort> (two folders of one archive have two)."""
    with open(Path(out) / "identity-map.csv", newline="") as handle:
        cohort = next(csv.DictReader(handle))["cohort"].encode()
    assert len(cohort) == 32
    return {str(p.relative_to(out)): p.read_bytes().replace(cohort, b"<cohort>")
            for p in sorted(Path(out).rglob("*")) if p.is_file()}


def write_phantom_archive(root: Path):
    """Four phantom patients scattered into nested folders with the junk of real archives:
    A: an approved plan with a PLAN dose, an older unapproved plan with a dose, an MR and a CBCT;
    B: per-beam (BEAM) doses of an approved plan, and a newer approved plan without a dose;
    C: two VMAT arcs and a FRACTION dose, a couch at 10°;
    D: a plan and a dose whose structure set is not in the archive.
    Plus a DICOMDIR and a text file, under ``root``. Returns (archive, {patient id: its dose}): what the
    tests compare with, and all the fixture keeps (the workers share it through a file)."""
    staging, archive = root / "staging", root / "archive"
    doses = {}
    for seed, patient_id in ((11, "PAT-A"), (12, "PAT-B"), (13, "PAT-C"), (14, "PAT-D")):
        volumes, masks = volumes_of(seed)
        doses[patient_id] = volumes["dose"]
        folder = staging / patient_id
        written = write_clinic(folder, volumes, masks, patient_id, seed=seed)
        dose = volumes["dose"]
        if patient_id == "PAT-A":
            plan = write_plan(folder / "RP1.dcm", written, OPENKBP_BEAMS, PRESCRIBED, label="Final")
            write_dose(folder / "RD1.dcm", dose, written, plan)
            old = write_plan(folder / "RP0.dcm", written, OPENKBP_BEAMS, PRESCRIBED, approval="UNAPPROVED",
                             label="Draft", date="20251201")
            write_dose(folder / "RD0.dcm", dose * 0.5, written, old)
            write_series(folder / "mr", written, "MR")
            write_series(folder / "cbct", written, "CT")
        elif patient_id == "PAT-B":
            plan = write_plan(folder / "RP1.dcm", written, OPENKBP_BEAMS, {"PTV_7000": 66.0, "PTV63": 60.0,
                                                                          "PTV_56": 54.0}, label="Beams")
            for number in range(1, 10):
                write_dose(folder / f"RD{number}.dcm", dose / 9, written, plan, summation="BEAM", beam_number=number)
            write_plan(folder / "RP2.dcm", written, OPENKBP_BEAMS, PRESCRIBED, label="NoDose", date="20260301")
        elif patient_id == "PAT-C":
            plan = write_plan(folder / "RP1.dcm", written, ARCS, PRESCRIBED, fractions=35, label="VMAT", couch=10.0)
            write_dose(folder / "RD1.dcm", dose / 35, written, plan, summation="FRACTION")
        else:
            plan = write_plan(folder / "RP1.dcm", written, OPENKBP_BEAMS, PRESCRIBED, label="Lost")
            write_dose(folder / "RD1.dcm", dose, written, plan)
            written.rtstruct.unlink()
    write_dicomdir(staging / "DICOMDIR")
    (staging / "README.txt").write_text("Exported by the planning system\n")
    scatter_files(staging, archive, seed=5)
    (archive / "DICOMDIR").write_bytes(next(p for p in archive.rglob("*") if p.is_file() and
                                            pydicom.dcmread(p, stop_before_pixels=True, force=True).get(
                                                "DirectoryRecordSequence") is not None).read_bytes())
    return archive, doses


@pytest.fixture(scope="module")
def archive_and_import(tmp_path_factory):
    """The phantom archive (:func:`write_phantom_archive`) and its import (validation half, seed 1),
    made once per test run and shared by the workers: read-only, a test that changes either copies it.
    (archive, {patient id: its dose}, the data folder, the import's report)."""
    def make(root):
        archive, doses = write_phantom_archive(root)
        out = root / "data"
        return archive, doses, out, import_cohort(archive, out, validation=0.5, seed=1, site=OPENKBP)

    return made_once_with_value(tmp_path_factory, "cohort-phantom-archive", make)


@pytest.fixture(scope="module")
def phantom_archive(archive_and_import):
    archive, doses, _, _ = archive_and_import
    return archive, doses


@pytest.fixture(scope="module")
def imported(archive_and_import):
    _, _, out, report = archive_and_import
    return out, report


def test_every_patient_and_every_junk_item_is_a_manifest_row_with_its_reason(phantom_archive, imported):
    out, report = imported
    table = rows(out)
    names = identity(out)
    by = {(names[p], r["plan_label"]) if r["kind"] == "plan" else (names.get(p), r["kind"], r["modality"]): r
          for p in names for r in table if r["pseudonym"] == names[p]}
    assert by[(names["PAT-A"], "Final")]["status"] == "imported"
    assert by[(names["PAT-A"], "Draft")]["reason"] == "not approved (ApprovalStatus UNAPPROVED)"
    assert by[(names["PAT-A"], "series", "MR")]["reason"] == "MR series of 4 images: not a planning CT"
    assert by[(names["PAT-A"], "series", "CT")]["reason"].endswith("not referenced by the chosen plan's structure "
                                                                     "set (a CBCT or another CT)")
    assert by[(names["PAT-B"], "Beams")]["status"] == "imported"
    assert by[(names["PAT-B"], "Beams")]["dose_summation"] == "BEAM (9 summed)"
    assert by[(names["PAT-B"], "NoDose")]["reason"] == "no RT Dose references this plan"
    assert by[(names["PAT-C"], "VMAT")]["dose_summation"] == "FRACTION × 35"
    assert "couch angle 10°" in by[(names["PAT-C"], "VMAT")]["reason"]
    lost = by[(names["PAT-D"], "Lost")]
    assert lost["status"] == "skipped" and "its structure set" in lost["reason"] and "not in the archive" in lost["reason"]
    files = [r for r in table if r["kind"] == "file"]
    assert sorted(r["reason"].split(" (")[0] for r in files) == ["DICOMDIR", "DICOMDIR", "not DICOM"]
    assert all(r["status"] == "skipped" for r in files)
    assert report.counts == {"imported": 3, "unchanged": 0, "skipped": 1, "failed": 0}
    assert {r["status"] for r in table} <= {"imported", "skipped", "failed"}
    # the summary counts the archive's objects, those left included (4 CTs of 128 slices and a CBCT's 4)
    assert report.summary().splitlines()[1] == ("The archive: 542 DICOM objects (CT 516, MR 4, RTDOSE 13, RTPLAN 6, "
                                                "RTSTRUCT 3), 3 other files skipped")


def test_doses_are_summed_and_multiplied_and_the_plan_files_written(phantom_archive, imported):
    out, _ = imported
    _, doses = phantom_archive
    names = identity(out)
    for patient_id in ("PAT-A", "PAT-B", "PAT-C"):
        folder = folder_of(out, names[patient_id])
        dose = read_patient(folder, site=openkbp()).dose
        # 16-bit RT Doses (steps of 1.2 mg at 70 Gy; × 35 for the fraction dose), 3 decimals, 9 summed
        assert np.abs(dose - doses[patient_id]).max() <= (0.05 if patient_id == "PAT-C" else 0.01), patient_id
    b = folder_of(out, names["PAT-B"])
    assert read_prescriptions(b, OPENKBP) == {"PTV56": 54.0, "PTV63": 60.0, "PTV70": 66.0}
    assert read_beams(b) == NINE
    c = folder_of(out, names["PAT-C"])
    assert read_beams(c) == (Beams("arcs", arcs=(Arc(181.0, 179.0, "CW"), Arc(179.0, 181.0, "CC"))), (10.0, 10.0))
    assert (c / "beams.csv").read_text().splitlines()[1] == "arc,181,179,CW,10"
    assert read_prescriptions(c, OPENKBP) == SITE


def test_patient_folders_carry_no_name_id_birth_date_or_other_identifying_tag(imported):
    out, _ = imported
    names = identity(out)
    assert set(names) == {"PAT-A", "PAT-B", "PAT-C", "PAT-D"}
    assert sorted(names.values()) == ["pt_1", "pt_2", "pt_3", "pt_4"]
    identifying = [b"PAT-", b"Doe", b"19500505", *(v.encode() for k, v in STUDY_TAGS.items() if k != "PatientSex")]
    # a date or time where a value begins (a DT or a fraction may follow): inside a random UID or a dose's decimals, chance
    patterns = [re.escape(word) if not word.isdigit() else rb"(?<![\w.])" + word for word in identifying]
    for split in ("train-pats", "validation-pats"):
        for path in (out / split).rglob("*"):
            if path.is_file():
                text = path.read_bytes()
                assert not [pattern for pattern in patterns if re.search(pattern, text)], path
    for folder in out.glob("*-pats/pt_*"):
        tags = json.loads((folder / "dicom.json").read_text())["tags"]
        assert {k: v for k, v in tags.items() if k != "StudyInstanceUID"} == {
            **dict.fromkeys(STUDY_TAGS, ""), "PatientBirthDate": "", "PatientName": folder.name,
            "PatientID": folder.name}
    manifest = (out / "manifest.csv").read_bytes()
    assert b"PAT-" not in manifest and b"Doe" not in manifest
    assert (out / "identity-map.csv").stat().st_mode & 0o077 == 0


def test_a_second_run_imports_nothing(phantom_archive, imported, tmp_path):
    archive, _ = phantom_archive
    out, _ = imported
    copy = Path(shutil.copytree(out, tmp_path / "data"))
    before = snapshot(copy)
    report = import_cohort(archive, copy, validation=0.5, seed=1, site=OPENKBP)
    assert report.counts == {"imported": 0, "unchanged": 3, "skipped": 1, "failed": 0}
    assert snapshot(copy) == before


def test_a_changed_patient_is_imported_again_and_only_it(phantom_archive, imported, tmp_path):
    archive, _ = phantom_archive
    out, _ = imported
    copy_archive = Path(shutil.copytree(archive, tmp_path / "archive"))
    copy = Path(shutil.copytree(out, tmp_path / "data"))
    plan = next(p for p in copy_archive.rglob("*") if p.is_file() and
                pydicom.dcmread(p, stop_before_pixels=True, force=True).get("RTPlanLabel") == "VMAT")
    dataset = pydicom.dcmread(plan)
    dataset.DoseReferenceSequence[0].TargetPrescriptionDose = 72
    dataset.save_as(plan)
    report = import_cohort(copy_archive, copy, validation=0.5, seed=1, site=OPENKBP)
    assert report.counts == {"imported": 1, "unchanged": 2, "skipped": 1, "failed": 0}
    assert read_prescriptions(folder_of(copy, identity(copy)["PAT-C"]), OPENKBP)["PTV70"] == 72.0


@SLOW_FOR_ITS_TIME
def test_an_import_killed_after_its_first_patient_resumes_to_the_same_folders(phantom_archive, imported, tmp_path):
    archive, _ = phantom_archive
    out, _ = imported

    class Killed(BaseException):
        pass

    def kill(pseudonym):
        raise Killed(pseudonym)

    killed = tmp_path / "data"
    with pytest.raises(Killed):
        import_cohort(archive, killed, validation=0.5, seed=1, after_patient=kill, site=OPENKBP)
    assert not (killed / "manifest.csv").exists() and (killed / cohort.JOURNAL_FILE).is_file()
    report = import_cohort(archive, killed, validation=0.5, seed=1, site=OPENKBP)
    assert report.counts["unchanged"] == 1 and report.counts["imported"] == 2
    assert snapshot(killed) == snapshot(out)


DOE = "DOE^JOHN_12345"  # PACS exports name folders after their patients


def add_plan(folder, written, dose, label):
    """An approved plan and its PLAN dose, all of the same date (a second one is equally new)."""
    plan = write_plan(folder / f"{label}.dcm", written, OPENKBP_BEAMS, PRESCRIBED, label=label)
    write_dose(folder / f"RD{label}.dcm", dose, written, plan)


@pytest.fixture(scope="module")
def doe_archive(tmp_path_factory):
    """One patient (60 slices) in a folder named after it, as a PACS exports one: its CT, a
    structure set and a second copy of it ('RS copy.dcm', read first), an approved plan 'One' and
    its dose, and a text file. Returns (archive, the patient written, its dose)."""
    volumes, masks = volumes_of(21)
    keep = slice(40, 100)
    masks = {k: m[:, :, keep] for k, m in masks.items()}
    archive = tmp_path_factory.mktemp("doe") / "archive"
    folder = archive / DOE
    written = write_patient(folder, volumes["ct"][:, :, keep], masks, volumes["voxel_dimensions"], factor=1,
                            patient_id="TIE")
    dose = volumes["dose"][:, :, keep]
    add_plan(folder, written, dose, "One")
    shutil.copy(written.rtstruct, folder / "RS copy.dcm")
    (folder / "notes.txt").write_text("exported for John Doe\n")
    return archive, written, dose


def test_the_manifest_holds_no_path_of_the_archive_the_sources_file_does(doe_archive, tmp_path, caplog):
    archive, _, _ = doe_archive
    out = tmp_path / "data"
    with caplog.at_level("WARNING", logger="provided_code.dicom"):
        report = import_cohort(archive, out, site=PROSTATE)  # no ROI for its targets: fails naming a file
    assert report.counts["failed"] == 1
    assert "DOE" not in (out / "manifest.csv").read_text() and "12345" not in (out / "manifest.csv").read_text()
    sources_file = out / "identity-map.sources.csv"
    assert sources_file.stat().st_mode & 0o077 == 0
    with open(sources_file, newline="") as handle:
        sources = {row["source"]: row["path"] for row in csv.DictReader(handle)}
    source_of = {path: number for number, path in sources.items()}
    table = rows(out)
    [plan] = [r for r in table if r["kind"] == "plan"]
    assert plan["status"] == "failed"
    copy = source_of[DOE + "/RS copy.dcm"]
    assert plan["reason"].startswith(f"{copy}: no ROI for PTV60, PTV78 (ROIs: "), plan["reason"]
    [failure] = [r.getMessage() for r in caplog.records if "import failed" in r.getMessage()]  # the console's line
    assert failure.startswith(f"pt_1: import failed: {copy}: no ROI for PTV60, PTV78") and "DOE" not in failure
    files = {sources[r["source"]]: r["reason"] for r in table if r["kind"] == "file"}
    assert files[DOE + "/notes.txt"] == "not DICOM"
    assert files[DOE + "/RS.dcm"].startswith(f"duplicate of {copy} (SOP Instance UID ")
    with pytest.raises(cohort.CohortError, match=rf"^pt_1: {copy}: no ROI for PTV60, PTV78 \("):
        import_cohort(archive, tmp_path / "strict", site=PROSTATE, strict=True)


def test_a_contour_left_out_is_in_the_manifest_and_the_console_names_no_archive_path(doe_archive, tmp_path, caplog):
    archive = Path(shutil.copytree(doe_archive[0], tmp_path / "archive"))
    structure_set = archive / DOE / "RS copy.dcm"  # (read first; RS.dcm is its copy)
    dataset = pydicom.dcmread(structure_set)
    number = {roi.ROIName: roi.ROINumber for roi in dataset.StructureSetROISequence}["PTV_7000"]
    ptv70 = next(item for item in dataset.ROIContourSequence if item.ReferencedROINumber == number)
    x, y, z = (float(v) for v in ptv70.ContourSequence[0].ContourData[:3])
    lone = pydicom.Dataset()  # two points, as rt-utils writes a lone pixel
    lone.ContourGeometricType, lone.NumberOfContourPoints = "CLOSED_PLANAR", 2
    lone.ContourData = [f"{v:.4f}" for v in (x, y, z, x + 1, y, z)]
    ptv70.ContourSequence.append(lone)
    dataset.save_as(structure_set)
    shutil.copy(structure_set, archive / DOE / "RS.dcm")
    out = tmp_path / "data"
    with caplog.at_level("DEBUG"):
        report = import_cohort(archive, out, site=OPENKBP, identity_map=tmp_path / "ids.csv")
    assert report.counts["imported"] == 1
    [plan] = [r for r in rows(out) if r["kind"] == "plan"]
    assert "PTV70 ('PTV_7000'): left out 1 contour(s) of fewer than three points" in plan["reason"]
    console = [record.getMessage() for record in caplog.records] + report.lines + [report.summary()]
    assert not [line for line in console if "DOE" in line or str(archive / DOE) in line]
    assert [line for line in report.lines if "left out 1 contour(s) of fewer than three points" in line]


def test_an_archive_without_dicom_is_refused_and_leaves_no_data_folder(tmp_path):
    archive = tmp_path / "archive" / "nested"
    archive.mkdir(parents=True)
    (archive / "notes.txt").write_text("not DICOM")
    with pytest.raises(cohort.CohortError, match=r"no DICOM object among its 1 files"):
        cohort.import_cohort(tmp_path / "archive", tmp_path / "data", site=OPENKBP)
    assert not (tmp_path / "data").exists()


def test_garbage_behind_a_valid_file_header_is_a_skipped_file_and_no_patient(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    plan = (DICOMPYLER / "rtplan.dcm").read_bytes()  # a patient of its own (an unapproved plan: skipped)
    (archive / "plan").write_bytes(plan)
    header = plan[:132 + 12 + int.from_bytes(plan[140:144], "little")]  # the preamble and the file meta, as written
    (archive / "damaged").write_bytes(header + np.random.default_rng(7).bytes(4000))
    out = tmp_path / "data"
    report = import_cohort(archive, out, site=OPENKBP)
    assert report.counts == {"imported": 0, "unchanged": 0, "skipped": 1, "failed": 0}
    with open(out / "identity-map.csv", newline="") as handle:
        assert [row["patient_id"] for row in csv.DictReader(handle)] == [pydicom.dcmread(archive / "plan").PatientID]
    [damaged] = [r for r in rows(out) if r["kind"] == "file"]
    assert damaged["pseudonym"] == "" and damaged["status"] == "skipped"
    assert damaged["reason"].startswith("a DICOM file header without a data set")
    assert {r["pseudonym"] for r in rows(out) if r["kind"] != "file"} == {"pt_1"}


@SLOW_FOR_ITS_TIME
def test_equally_new_plans_are_refused_naming_both_and_the_exit_code_says_so(doe_archive, tmp_path):
    archive, written, dose = doe_archive
    archive = Path(shutil.copytree(archive, tmp_path / "archive"))
    data = tmp_path / "data"
    assert import_cohort(archive, data, site=OPENKBP).counts["imported"] == 1  # plan 'One' alone
    [folder] = data.glob("*-pats/pt_1")
    add_plan(archive / DOE, written, dose, "Two")
    result = subprocess.run([*OPENKBP_DICOM, "import-cohort", str(archive), "--out", str(data)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("identity-map.csv (pseudonym -> PatientID) is inside the data folder") == 1
    assert "0 patients imported, 0 unchanged since an earlier import, 0 skipped, 1 failed" in result.stdout
    refused = [r for r in rows(data) if r["kind"] == "plan"]
    assert [r["status"] for r in refused] == ["failed", "failed"]
    assert "plan 'One'" in refused[0]["reason"] and "plan 'Two'" in refused[0]["reason"]
    # the earlier import is no longer in the training set, moved whole out of it
    assert not folder.exists() and not list(data.glob("*-pats/pt_*"))
    [withdrawn] = (data / "withdrawn").iterdir()
    assert withdrawn.name.startswith("pt_1-") and read_patient(withdrawn, site=openkbp()).dose is not None
    moved = f"{folder.parent.name}/pt_1 moved to withdrawn/{withdrawn.name}"
    assert all(r["reason"].endswith(f"; its earlier import was taken out of the training set: {moved}")
               for r in refused)
    assert f"1 earlier import(s) of patients now failed or skipped taken out of the training set: {moved}" \
        in result.stdout
    result = subprocess.run([*OPENKBP_DICOM, "import-cohort", str(archive), "--out", str(tmp_path / "strict"),
                             "--strict"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "Error: pt_1: 2 approved plans with a whole-plan dose, equally new" in result.stderr
    assert not (tmp_path / "strict" / "manifest.csv").exists()
    result = subprocess.run([*OPENKBP_DICOM, "import-cohort", str(archive), "--out", str(tmp_path / "d2"),
                             "--site", "lung"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "Error: --site: invalid `site`: expected openkbp, prostate or a site file (.json)" in result.stderr


@SLOW_FOR_ITS_TIME
@requires_sample
def test_real_patients_through_an_archive_equal_their_csv_originals(tmp_path):
    staging, archive = tmp_path / "staging", tmp_path / "archive"
    sources = {}
    for name in ("pt_1", "pt_2"):
        source = read_patient(SAMPLE_DIR / "train-pats" / name, site=openkbp())
        sources[name] = source
        masks = {s: (source.structure_masks >> bit) & 1 == 1 for bit, s in enumerate(STRUCTURES)}
        masks = {s: m for s, m in masks.items() if m.any()}
        masks["BODY"] = source.possible_dose_mask
        written = write_patient(staging / name, source.ct, masks, source.voxel_dimensions, factor=1,
                                patient_id=f"OPENKBP-{name}")
        plan = write_plan(staging / name / "RP.dcm", written, OPENKBP_BEAMS, PRESCRIBED)
        write_dose(staging / name / "RD.dcm", source.dose, written, plan)
    scatter_files(staging, archive, seed=2)
    out = tmp_path / "data"
    report = import_cohort(archive, out, validation=0, site=OPENKBP)
    assert report.counts["imported"] == 2
    names = identity(out)
    for name, source in sources.items():
        folder = out / "train-pats" / names[f"OPENKBP-{name}"]
        imported = read_patient(folder, site=openkbp())
        assert np.abs(imported.ct.astype(int) - source.ct.astype(int)).max() <= 1  # within 1 HU
        for bit, structure in enumerate(STRUCTURES):
            a, b = (imported.structure_masks >> bit) & 1 == 1, (source.structure_masks >> bit) & 1 == 1
            if b.any():
                assert 2 * (a & b).sum() / (a.sum() + b.sum()) >= 0.95, (name, structure)
        assert np.abs(imported.dose - source.dose).max() <= 0.003
        assert read_beams(folder) == NINE
        assert (folder / "prescriptions.csv").read_text() == "structure,dose_gy\nPTV56,56\nPTV63,63\nPTV70,70\n"


def test_the_import_settings_hold_the_site_and_openkbps_stay_as_before():
    from provided_code.dicom.names import load_names

    table = load_names(None, OPENKBP)
    before_sites = json.dumps([SITE, {k: sorted(v) for k, v in table.items()}, False], sort_keys=True)
    assert cohort._settings(OPENKBP, table) == before_sites  # earlier imports are not imported again
    renamed = site_from_dict({**OPENKBP.to_dict(), "name": "head-and-neck"}, "hn.json")  # the sidecar says its name
    assert cohort._settings(renamed, table) != before_sites
    prostate = load_site("prostate")
    settings = json.loads(cohort._settings(prostate, load_names(None, prostate)))
    assert settings[0] == {"PTV60": 60.0, "PTV78": 78.0} and "Femur_Head_R" in settings[1]["FemoralHead_R"]
    assert settings[3]["site"] == "prostate"


# -- the prostate site: an archive of VMAT plans through import, training, prediction and scores ----
PROSTATE = load_site("prostate")
PROSTATE_PLAN = {"PTV78": 74.0, "PTV_6000": 59.2}  # the plan's dose references, by the clinical ROI names


def write_prostate_archive(root: Path, seeds=(31, 32, 33)) -> Path:
    """Prostate phantoms (64 of their slices, the anatomy's; 128 × 128 CTs) written as a clinic's
    DICOM, each with an approved RT Plan of the site's two arcs (181 -> 179 CW, 179 -> 181 CC,
    control points every 2°) prescribing 74 and 59.2 Gy, and an RT Dose that follows them,
    scattered into nested folders."""
    from provided_code.data.phantoms import make_prostate_phantom

    keep = slice(32, 96)
    for seed in seeds:
        volumes = make_prostate_phantom(seed, prescriptions={"PTV78": 74.0, "PTV60": 59.2}, site=PROSTATE)
        masks = {name: volumes[name][:, :, keep] for name in PROSTATE.names}
        masks["BODY"] = volumes["possible_dose_mask"][:, :, keep]
        folder = root / "staging" / f"PROS-{seed}"
        written = write_patient(folder, volumes["ct"][:, :, keep], masks, volumes["voxel_dimensions"], factor=1,
                                names=PROSTATE_CLINICAL_NAMES, patient_id=f"PROS-{seed}", seed=seed)
        plan = write_plan(folder / "RP.dcm", written, ARCS, PROSTATE_PLAN, fractions=37, label="VMAT")
        write_dose(folder / "RD.dcm", volumes["dose"][:, :, keep], written, plan)
    scatter_files(root / "staging", root / "archive", seed=3)
    return root / "archive"


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_prostate_archive_of_vmat_plans_imports_trains_predicts_and_scores(tmp_path):
    from click.testing import CliRunner

    import provided_code.apps.cli as train_cli
    from provided_code.apps.dicom_cli import main as dicom_main

    archive, data = write_prostate_archive(tmp_path), tmp_path / "data"
    result = CliRunner().invoke(dicom_main, ["import-cohort", str(archive), "--site", "prostate", "--out", str(data),
                                             "--validation", "1"])
    assert result.exit_code == 0, result.output
    assert "3 patients imported, 0 unchanged since an earlier import, 0 skipped, 0 failed" in result.output
    assert [(r["status"], r["beams"]) for r in rows(data)] == [("imported", "181-179 CW; 179-181 CC")] * 3
    folders = sorted(data.glob("*-pats/pt_*"))
    assert [f.parent.name for f in folders].count("validation-pats") == 1 and len(folders) == 3
    for folder in folders:
        assert read_beams(folder) == (PROSTATE.beams, (0.0, 0.0))  # the plan's arcs, the site's here
        assert (folder / "beams.csv").read_text() == ("type,gantry_start,gantry_stop,direction,couch\n"
                                                      "arc,181,179,CW,0\narc,179,181,CC,0\n")
        assert read_prescriptions(folder, PROSTATE) == {"PTV60": 59.2, "PTV78": 74.0}  # the plan's, not 60 and 78
        patient = read_patient(folder, site=PROSTATE)
        assert patient.prescriptions == {"PTV60": 59.2, "PTV78": 74.0}
        assert patient.gantry_angles == PROSTATE.beams.gantry_angles()

    where = ["--site", "prostate", "--data-dir", str(data), "--results-dir", str(tmp_path / "results"),
             "--model-name", "clinic", "--cache-dir", str(tmp_path / "cache")]
    result = CliRunner().invoke(train_cli.main, [*where, *LIGHT_FLAGS, "--filters", "4", "--resolution", "32", "--epochs", "1",
                                                 "--xla", "off", "--batch-size", "1"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(train_cli.main, [*where, "--predict-only"])
    assert result.exit_code == 0, result.output
    predictions = tmp_path / "results" / "clinic" / "validation-predictions"
    validation = next(f.name for f in folders if f.parent.name == "validation-pats")
    assert sorted(p.name for p in predictions.glob("pt_*.csv")) == [f"{validation}.csv"]
    scores = json.loads((predictions / "scores.json").read_text())
    assert scores["patients"] == 1
    assert np.isfinite(scores["dose_score"]) and np.isfinite(scores["dvh_score"]) and scores["dose_score"] > 0


# -- targets a patient lacks, warnings, and the flag that allows a required one to be missing ------
@pytest.fixture(scope="module")
def lacking_archive(tmp_path_factory):
    """Two phantom patients with approved plans: LACK-63 without PTV63 and without a Brainstem
    (head and neck with two dose levels: OpenKBP's PTV63 is optional), LACK-70 without PTV70
    (required) and PTV63. Made once per test run (read-only)."""
    return made_once_with_value(tmp_path_factory, "cohort-lacking-archive", write_lacking_archive)


def write_lacking_archive(root: Path) -> Path:
    """``lacking_archive``'s two patients scattered into ``root / "archive"``; returns that folder."""
    for seed, patient_id, left_out in ((41, "LACK-63", ("PTV63", "Brainstem")), (42, "LACK-70", ("PTV70", "PTV63"))):
        volumes, masks = volumes_of(seed)
        masks = {name: mask for name, mask in masks.items() if name not in left_out}
        folder = root / "staging" / patient_id
        written = write_clinic(folder, volumes, masks, patient_id, seed=seed)
        plan = write_plan(folder / "RP.dcm", written, OPENKBP_BEAMS,
                          {roi: gy for roi, gy in PRESCRIBED.items() if roi != "PTV63"})
        write_dose(folder / "RD.dcm", volumes["dose"], written, plan)
    scatter_files(root / "staging", root / "archive", seed=4)
    return root / "archive"


def plan_row(out, patient_id):
    [row] = [r for r in rows(out) if r["kind"] == "plan" and r["pseudonym"] == identity(out)[patient_id]]
    return row


def test_a_patient_without_an_optional_target_is_imported_saying_so(lacking_archive, tmp_path):
    out = tmp_path / "data"
    report = import_cohort(lacking_archive, out, site=OPENKBP, validation=0)
    assert report.counts == {"imported": 1, "unchanged": 0, "skipped": 0, "failed": 1}
    row = plan_row(out, "LACK-63")
    assert row["status"] == "imported" and row["missing_targets"] == "PTV63"
    assert row["reason"] == ("chosen; missing: Brainstem, PTV63; PTV63: no ROI (optional for site openkbp): its mask "
                             "is empty")
    assert row["prescriptions_gy"] == "PTV56=56 PTV70=70"
    folder = folder_of(out, row["pseudonym"])
    assert (folder / "prescriptions.csv").read_text() == "structure,dose_gy\nPTV56,56\nPTV70,70\n"
    assert not (folder / "PTV63.csv").exists() and (folder / "PTV70.csv").exists()
    assert f"{row['pseudonym']}: imported with warnings: missing: Brainstem, PTV63; PTV63: no ROI" in report.lines[0]
    assert report.summary().splitlines()[-1].startswith("1 of the imported patients with warnings")
    refused = plan_row(out, "LACK-70")
    assert refused["status"] == "failed" and "no ROI for PTV63, PTV70 (ROIs: " in refused["reason"]
    assert "of site openkbp, which requires PTV70 (optional: PTV63); pass --names" in refused["reason"]


@SLOW_FOR_ITS_TIME
def test_the_flag_for_missing_targets_reimports_only_whom_it_concerns(lacking_archive, tmp_path):
    out = tmp_path / "data"
    import_cohort(lacking_archive, out, site=OPENKBP, validation=0)
    allowed = import_cohort(lacking_archive, out, site=OPENKBP, validation=0, allow_missing_targets=True)
    assert allowed.counts == {"imported": 1, "unchanged": 1, "skipped": 0, "failed": 0}  # LACK-70 alone
    row = plan_row(out, "LACK-70")
    assert row["status"] == "imported" and row["missing_targets"] == "PTV63 PTV70"
    assert "PTV70: no ROI (required by site openkbp): its mask is empty" in row["reason"]
    assert plan_row(out, "LACK-63")["reason"].startswith("chosen; missing: Brainstem, PTV63; ")  # kept as it was
    again = import_cohort(lacking_archive, out, site=OPENKBP, validation=0)  # without the flag: LACK-70 refused again
    assert again.counts == {"imported": 0, "unchanged": 1, "skipped": 0, "failed": 1}
    assert plan_row(out, "LACK-70")["status"] == "failed" and len(again.withdrawn) == 1


def test_adding_the_flag_for_missing_targets_imports_nothing_again(phantom_archive, imported, tmp_path):
    archive, _ = phantom_archive
    out, _ = imported
    copy = Path(shutil.copytree(out, tmp_path / "data"))
    before = snapshot(copy)
    report = import_cohort(archive, copy, validation=0.5, seed=1, site=OPENKBP, allow_missing_targets=True)
    assert report.counts == {"imported": 0, "unchanged": 3, "skipped": 1, "failed": 0}
    assert snapshot(copy) == before


def test_another_data_folders_identity_map_is_refused(phantom_archive, imported, doe_archive, tmp_path):
    archive, _ = phantom_archive
    out, _ = imported
    other = tmp_path / "other"
    import_cohort(doe_archive[0], other, site=OPENKBP)  # another cohort: its pt_1 is another patient
    copy = Path(shutil.copytree(out, tmp_path / "data"))
    before = snapshot(copy)
    with pytest.raises(cohort.CohortError, match=rf"^Invalid `identity_map`. Expected the map of {re.escape(str(copy))} "
                                                 rf"\(cohort \w+, .*manifest.csv\). Received: identity_map="):
        import_cohort(archive, copy, validation=0.5, seed=1, site=OPENKBP, identity_map=other / "identity-map.csv")
    assert snapshot(copy) == before


def swap_identity_rows(path, first, second):
    """The identity map at ``path`` with the PatientIDs of two of its lines (the header is line 1)
    swapped, as a hand edit would leave it."""
    lines = Path(path).read_text().splitlines(keepends=True)
    a, b = lines[first - 1].split(","), lines[second - 1].split(",")
    a[1], b[1] = b[1], a[1]
    lines[first - 1], lines[second - 1] = ",".join(a), ",".join(b)
    Path(path).write_text("".join(lines))


@SLOW_FOR_ITS_TIME
def test_an_identity_map_that_moves_pseudonyms_between_patients_is_refused_unless_meant(phantom_archive, imported,
                                                                                        tmp_path):
    archive, _ = phantom_archive
    out, _ = imported
    copy = Path(shutil.copytree(out, tmp_path / "data"))
    series = {patient_id: json.loads((folder_of(copy, pseudonym) / "dicom.json").read_text())["series_instance_uid"]
              for patient_id, pseudonym in identity(copy).items() if list(copy.glob(f"*-pats/{pseudonym}"))}
    swap_identity_rows(copy / "identity-map.csv", 2, 3)  # pt_1's and pt_2's PatientIDs
    before = snapshot(copy)
    with pytest.raises(cohort.CohortError, match=r"^Invalid `identity_map`. Expected each pseudonym kept for the "
                                                 r"archive's patient it was given to .* or --reassign-pseudonyms if "
                                                 r"the change is meant. Received: identity_map='.*identity-map.csv', "
                                                 r"in which pt_1 \(line 2\) was imported from the patient now on line "
                                                 r"3, which gives it pt_2; pt_2 \(line 3\) was imported from the "
                                                 r"patient now on line 2, which gives it pt_1$"):
        import_cohort(archive, copy, validation=0.5, seed=1, site=OPENKBP)
    assert snapshot(copy) == before
    report = import_cohort(archive, copy, validation=0.5, seed=1, site=OPENKBP, reassign_pseudonyms=True)
    assert report.counts["failed"] == 0
    for patient_id, pseudonym in identity(copy).items():  # each imported patient under the pseudonym the map gives
        if patient_id in series:
            assert json.loads((folder_of(copy, pseudonym) / "dicom.json").read_text())["series_instance_uid"] == \
                series[patient_id]


@pytest.mark.parametrize("reassign", [False, True])
def test_an_identity_map_giving_one_pseudonym_twice_is_refused_before_anything_is_written(phantom_archive, tmp_path,
                                                                                          reassign):
    """Two patients would be written into one folder (--reassign-pseudonyms or not)."""
    archive, _ = phantom_archive
    identity_path = tmp_path / "private" / "identity-map.csv"
    identity_path.parent.mkdir()
    identity_path.write_text("pseudonym,patient_id\npt_1,PAT-A\npt_2,PAT-B\npt_3,PAT-C\npt_2,PAT-D\n")
    before = identity_path.read_bytes()
    with pytest.raises(cohort.CohortError, match=rf"^{re.escape(str(identity_path))}, lines 3 and 5: pseudonym pt_2 "
                                                 r"given to two patients \(one pseudonym is one patient's folder: "
                                                 r"give each patient a pseudonym of its own\)$"):
        import_cohort(archive, tmp_path / "data", identity_map=identity_path, validation=0.5, seed=1, site=OPENKBP,
                      reassign_pseudonyms=reassign)
    assert not (tmp_path / "data").exists() and identity_path.read_bytes() == before


def test_a_mistyped_patient_id_is_refused_even_when_reassignment_is_meant(phantom_archive, imported, tmp_path):
    """Its patient would get a new pseudonym, and the old one's import stay: the patient twice."""
    archive, _ = phantom_archive
    out, _ = imported
    copy = Path(shutil.copytree(out, tmp_path / "data"))
    lines = (copy / "identity-map.csv").read_text().splitlines(keepends=True)
    pseudonym, _, rest = lines[1].split(",", 2)  # pt_1, imported
    lines[1] = f"{pseudonym},PAT-TYPO,{rest}"
    (copy / "identity-map.csv").write_text("".join(lines))
    before = snapshot(copy)
    with pytest.raises(cohort.CohortError, match=r"^Invalid `identity_map`. Expected each pseudonym taken off its "
                                                 r"patient given to another patient of the archive, or on the line of "
                                                 r"the PatientID its patient has there .*Received: identity_map='.*identity-map.csv', in which pt_1 "
                                                 r"\(line 2\) was imported from the patient now under a PatientID the "
                                                 r"map does not have \(it would get a new pseudonym\)$"):
        import_cohort(archive, copy, validation=0.5, seed=1, site=OPENKBP, reassign_pseudonyms=True)
    assert snapshot(copy) == before


def test_a_rerun_for_another_site_is_refused_unless_asked_for(phantom_archive, imported, tmp_path):
    archive, _ = phantom_archive
    out, _ = imported
    copy = Path(shutil.copytree(out, tmp_path / "data"))
    before = snapshot(copy)
    with pytest.raises(cohort.CohortError, match=r"^Invalid `site`. Expected the data folder's site, openkbp \(.*"
                                                 r"dicom.json\), or --change-site to import every patient again for "
                                                 r"prostate. Received: site='prostate'$"):
        import_cohort(archive, copy, validation=0.5, seed=1, site=PROSTATE)
    assert snapshot(copy) == before
    report = import_cohort(archive, copy, validation=0.5, seed=1, site=PROSTATE, change_site=True)
    assert report.counts == {"imported": 0, "unchanged": 0, "skipped": 1, "failed": 3} and len(report.withdrawn) == 3


def test_two_patients_under_one_patient_id_are_not_merged(tmp_path):
    staging = tmp_path / "staging"
    for seed, name, birth, date in ((51, "Doe^Jane", "19600101", "20260102"), (52, "Roe^Richard", "19700707", "20260105")):
        volumes, masks = volumes_of(seed)
        keep = slice(40, 100)
        folder = staging / name
        written = write_patient(folder, volumes["ct"][:, :, keep], {k: m[:, :, keep] for k, m in masks.items()},
                                volumes["voxel_dimensions"], factor=1, patient_id="ANON", patient_name=name,
                                birth_date=birth, seed=seed)
        plan = write_plan(folder / "RP.dcm", written, OPENKBP_BEAMS, PRESCRIBED, date=date)
        write_dose(folder / "RD.dcm", volumes["dose"][:, :, keep], written, plan)
    out = tmp_path / "data"
    report = import_cohort(staging, out, site=OPENKBP)
    assert report.counts == {"imported": 0, "unchanged": 0, "skipped": 0, "failed": 1}
    plans = [r for r in rows(out) if r["kind"] == "plan"]
    assert [r["status"] for r in plans] == ["failed", "failed"]
    assert all(r["reason"] == "one PatientID for 2 patients of different names and birth dates; none of them is "
                              "imported: export each with an ID of its own" for r in plans)
    assert report.lines == [f"pt_1: {plans[0]['reason']}"] and not list(out.glob("*-pats/pt_*"))


def write_anonymised(staging, sexes):
    """Two phantom patients as an anonymiser exports them: PatientID ANON, name ANONYMOUS, no birth
    date, each of ``sexes``; each its own study and frame of reference, an approved plan and its dose
    (the second plan the newer)."""
    for seed, sex, date in ((53, sexes[0], "20260102"), (54, sexes[1], "20260105")):
        volumes, masks = volumes_of(seed)
        keep = slice(40, 100)
        folder = staging / f"patient-{seed}"
        written = write_patient(folder, volumes["ct"][:, :, keep], {k: m[:, :, keep] for k, m in masks.items()},
                                volumes["voxel_dimensions"], factor=1, patient_id="ANON", patient_name="ANONYMOUS",
                                birth_date="", study_tags={"PatientSex": sex}, seed=seed)
        plan = write_plan(folder / "RP.dcm", written, OPENKBP_BEAMS, PRESCRIBED, date=date, label=f"Plan{seed}")
        write_dose(folder / "RD.dcm", volumes["dose"][:, :, keep], written, plan)


def test_two_anonymised_patients_differing_only_in_sex_are_not_merged(tmp_path):
    write_anonymised(tmp_path / "staging", ("F", "M"))
    out = tmp_path / "data"
    report = import_cohort(tmp_path / "staging", out, site=OPENKBP)
    assert report.counts == {"imported": 0, "unchanged": 0, "skipped": 0, "failed": 1}
    plans = [r for r in rows(out) if r["kind"] == "plan"]
    assert [r["status"] for r in plans] == ["failed", "failed"]
    assert all(r["reason"] == "one PatientID for 2 patients of different sexes; none of them is imported: export "
                              "each with an ID of its own" for r in plans)
    assert not list(out.glob("*-pats/pt_*"))


@SLOW_FOR_ITS_TIME
def test_patients_refused_under_one_id_then_exported_with_ids_of_their_own_are_imported(tmp_path):
    """What the refusal asks for is no identity map moving a pseudonym: pt_1 was never imported."""
    staging = tmp_path / "staging"
    write_anonymised(staging, ("F", "M"))
    out, ids = tmp_path / "data", tmp_path / "ids.csv"
    assert import_cohort(staging, out, site=OPENKBP, identity_map=ids).counts["failed"] == 1
    for path in (path for path in staging.rglob("*") if path.is_file()):
        dataset = pydicom.dcmread(path)
        dataset.PatientID = f"ANON-{path.relative_to(staging).parts[0]}"
        dataset.save_as(path)
    report = import_cohort(staging, out, site=OPENKBP, identity_map=ids)
    assert report.counts == {"imported": 2, "unchanged": 0, "skipped": 0, "failed": 0}


@pytest.mark.parametrize("other", ["O", ""])
def test_a_patient_whose_objects_say_m_and_another_sex_or_none_is_one_patient(tmp_path, other):
    """Only a definite M against a definite F tells two patients apart: an O, or no PatientSex, on
    one of a patient's objects does not."""
    volumes, masks = volumes_of(55)
    keep = slice(40, 100)
    folder = tmp_path / "staging" / "patient-55"
    written = write_patient(folder, volumes["ct"][:, :, keep], {k: m[:, :, keep] for k, m in masks.items()},
                            volumes["voxel_dimensions"], factor=1, patient_id="MRN55", study_tags={"PatientSex": "M"},
                            seed=55)
    plan = write_plan(folder / "RP.dcm", written, OPENKBP_BEAMS, PRESCRIBED)
    write_dose(folder / "RD.dcm", volumes["dose"][:, :, keep], written, plan)
    header = pydicom.dcmread(folder / "RP.dcm")
    header.PatientSex = other
    header.save_as(folder / "RP.dcm")
    report = import_cohort(tmp_path / "staging", tmp_path / "data", site=OPENKBP)
    assert report.counts == {"imported": 1, "unchanged": 0, "skipped": 0, "failed": 0}, report.lines


def test_a_plan_set_aside_on_a_ct_of_another_study_and_frame_is_named_and_warned_about(tmp_path, caplog):
    write_anonymised(tmp_path / "staging", ("O", "O"))  # nothing tells the two apart but their CTs
    out = tmp_path / "data"
    with caplog.at_level("WARNING", logger="provided_code.dicom"):
        report = import_cohort(tmp_path / "staging", out, site=OPENKBP)
    assert report.counts["imported"] == 1  # the newer plan's patient: which is meant, the physicist tells
    plans = {r["plan_label"]: r for r in rows(out) if r["kind"] == "plan"}
    assert plans["Plan54"]["status"] == "imported"
    set_aside = plans["Plan53"]
    assert set_aside["status"] == "skipped"
    assert set_aside["reason"].startswith("older than the chosen plan 'Plan54' (")
    assert "; its CT shares neither the study nor the frame of reference of the chosen plan 'Plan54'" in \
        set_aside["reason"]
    warning = (f"pt_1: warning: plan 'Plan53' ({set_aside['plan_uid']}), set aside, is on a CT of another study "
               f"and frame of reference")
    assert [line for line in report.lines if line.startswith(warning)]
    assert [r for r in caplog.records if r.levelname == "WARNING" and "set aside, is on a CT of another study" in
            r.getMessage()]
    assert "1 patient(s) with a plan set aside on a CT of another study and frame of reference" in report.summary()


@SLOW_FOR_ITS_TIME
@requires_sample
def test_a_real_patient_without_ptv63_goes_through_with_default_flags(tmp_path):
    """OpenKBP's pt_10 has PTV70 and PTV56 and no PTV63 (as 109 of the 200 training patients),
    written as a clinic exports it with a plan of its two dose levels."""
    source = read_patient(SAMPLE_DIR / "train-pats" / "pt_10", site=openkbp())
    masks = {s: (source.structure_masks >> bit) & 1 == 1 for bit, s in enumerate(STRUCTURES)}
    masks = {s: m for s, m in masks.items() if m.any()}
    assert "PTV63" not in masks and {"PTV56", "PTV70"} <= set(masks)
    masks["BODY"] = source.possible_dose_mask
    written = write_patient(tmp_path / "staging", source.ct, masks, source.voxel_dimensions, factor=1,
                            patient_id="OPENKBP-pt_10")
    plan = write_plan(tmp_path / "staging" / "RP.dcm", written, OPENKBP_BEAMS, {"PTV_7000": 70.0, "PTV_56": 56.0})
    write_dose(tmp_path / "staging" / "RD.dcm", source.dose, written, plan)
    out = tmp_path / "data"
    report = import_cohort(tmp_path / "staging", out, site=OPENKBP, validation=0)
    assert report.counts["imported"] == 1, report.lines
    folder = out / "train-pats" / "pt_1"
    imported = read_patient(folder, site=OPENKBP)
    assert not ((imported.structure_masks >> STRUCTURES.index("PTV63")) & 1).any()
    assert np.abs(imported.dose - source.dose).max() <= 0.003
    assert (folder / "prescriptions.csv").read_text() == "structure,dose_gy\nPTV56,56\nPTV70,70\n"
    assert plan_row(out, "OPENKBP-pt_10")["missing_targets"] == "PTV63"
