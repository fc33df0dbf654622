"""RT Plans: dicompyler-core's clinical example (a plan no one here wrote) and the tests' writer's
static beams, arcs, dose references and fraction groups."""

import shutil
from pathlib import Path

import pytest

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from provided_code.sites import openkbp  # noqa: E402
from provided_code.dicom.archive import link_patients, scan_archive  # noqa: E402
from provided_code.dicom.cohort import import_cohort  # noqa: E402
from provided_code.dicom.names import default_names  # noqa: E402
from provided_code.dicom.rtplan import BeamRow, plan_prescriptions, read_plan  # noqa: E402

OPENKBP = openkbp()
PRESCRIPTIONS_GY = OPENKBP.prescriptions_gy

DICOMPYLER = Path(__file__).parent / "data" / "dicompyler-core"
SITE = dict(PRESCRIPTIONS_GY)


def test_dicompyler_cores_plan_gives_its_beams_and_prescription():
    plan = read_plan(pydicom.dcmread(DICOMPYLER / "rtplan.dcm"), DICOMPYLER / "rtplan.dcm")
    assert plan.label == "B1" and plan.approval == "UNAPPROVED"
    # four static (sliding-window IMRT) fields; the couch written as 8.47e-10° is zero
    assert plan.beams == tuple(BeamRow("static", angle) for angle in (327.0, 0.0, 56.0, 150.0))
    assert [(r.description, r.dose_gy) for r in plan.dose_references] == [("Breast", 14.0),
                                                                         ("CALC POINT", 11.3113869239676)]
    assert plan.fractions == 7 and plan.total_dose_gy == pytest.approx(14.0)  # 4 beams × 0.5 Gy × 7
    prescriptions, lines = plan_prescriptions(plan, SITE, default_names(OPENKBP), {})
    assert prescriptions == SITE  # "Breast" names no target of the OpenKBP site: the site's own
    assert lines[0] == "dose references matching no target of the site: 'Breast' 14 Gy, 'CALC POINT' 11.3114 Gy"
    prescriptions, lines = plan_prescriptions(plan, {"PTV_Breast": 50.0}, {"PTV_Breast": ("Breast",)}, {})
    assert prescriptions == {"PTV_Breast": 14.0} and "PTV_Breast: 14 Gy (dose reference 'Breast')" in lines


def test_dicompyler_cores_example_as_an_archive_links_and_is_refused_as_unapproved(tmp_path):
    archive = tmp_path / "archive"
    for number, name in enumerate(("ct.0.dcm", "heart_rtss.dcm", "rtplan.dcm", "heart_rtdose.dcm")):
        folder = archive / f"{number:02d}" / "x"
        folder.mkdir(parents=True)
        shutil.copy(DICOMPYLER / name, folder / f"IM{number}")  # as it is, without an extension
    index = scan_archive(archive)
    assert sorted(index.counts().items()) == [("CT", 1), ("RTDOSE", 1), ("RTPLAN", 1), ("RTSTRUCT", 1)]
    [patient] = link_patients(index)
    [candidate] = patient.candidates
    assert [d.path.name for d in candidate.doses] == ["IM3"] and candidate.dose_summation == "PLAN"
    assert candidate.structure_set.path.name == "IM1" and [c.path.name for c in candidate.ct_files] == ["IM0"]
    assert candidate.reason == "not approved (ApprovalStatus UNAPPROVED)" and patient.chosen is None
    report = import_cohort(archive, tmp_path / "data", site=OPENKBP)
    assert report.counts == {"imported": 0, "unchanged": 0, "skipped": 1, "failed": 0}
    [row] = [r for r in report.rows if r["kind"] == "plan"]
    assert row["status"] == "skipped" and row["reason"] == "not approved (ApprovalStatus UNAPPROVED)"
    assert row["beams"] == "327; 0; 56; 150" and row["plan_label"] == "B1"


def test_arcs_static_beams_and_a_plan_without_dose_references(tmp_path):
    from provided_code.data.phantoms import make_phantom
    from tests.kit.synthetic import write_patient, write_plan

    volumes = make_phantom(2)
    keep = slice(60, 64)
    written = write_patient(tmp_path, volumes["ct"][:, :, keep], {"PTV70": volumes["PTV70"][:, :, keep]},
                            volumes["voxel_dimensions"], factor=1)
    path = tmp_path / "RP.dcm"
    write_plan(path, written, [("arc", 181.0, 179.0, "CW"), ("arc", 179.0, 181.0, "CC"), ("static", 90.0)],
               {}, fractions=30, couch=270.0)
    dataset = pydicom.dcmread(path)
    dataset.FractionGroupSequence[0].ReferencedBeamSequence[0].BeamDose = 1.0
    dataset.FractionGroupSequence[0].ReferencedBeamSequence[1].BeamDose = 1.0
    dataset.FractionGroupSequence[0].ReferencedBeamSequence[2].BeamDose = 0.2
    assert len(dataset.BeamSequence[0].ControlPointSequence) == 180  # every 2° over 358°, both ends
    plan = read_plan(dataset, path)
    assert plan.beams == (BeamRow("arc", 181.0, 179.0, "CW", 270.0), BeamRow("arc", 179.0, 181.0, "CC", 270.0),
                          BeamRow("static", 90.0, couch=270.0))
    assert len(plan.warnings) == 3 and "couch angle 270°" in plan.warnings[0]
    prescriptions, lines = plan_prescriptions(plan, SITE, default_names(OPENKBP), {})
    assert prescriptions == {"PTV56": 56.0, "PTV63": 63.0, "PTV70": 66.0}  # 30 × 2.2 Gy to the highest target
    assert "PTV70: 66 Gy (fraction group: 30 × 2.2 Gy)" in lines
