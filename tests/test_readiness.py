"""When a structure set's patient is ready: the images it names, and the decision."""

import pytest

pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from pydicom.dataset import Dataset  # noqa: E402
from pydicom.sequence import Sequence  # noqa: E402

from provided_code.apps.node.readiness import FAIL, READY, WAIT, SeriesStatus, decide, structure_set_references  # noqa: E402


def _item(**fields) -> Dataset:
    item = Dataset()
    for keyword, value in fields.items():
        setattr(item, keyword, value)
    return item


def structure_set(images=("1.9.1", "1.9.2"), contour_images=("1.9.2", "1.9.3"), frame="1.5") -> Dataset:
    series = _item(SeriesInstanceUID="1.7", ContourImageSequence=Sequence(
        [_item(ReferencedSOPInstanceUID=uid) for uid in images]))
    study = _item(ReferencedSOPInstanceUID="1.6", RTReferencedSeriesSequence=Sequence([series]))
    dataset = Dataset()
    if frame:
        dataset.ReferencedFrameOfReferenceSequence = Sequence(
            [_item(FrameOfReferenceUID=frame, RTReferencedStudySequence=Sequence([study]))])
    contour = _item(ContourImageSequence=Sequence([_item(ReferencedSOPInstanceUID=uid) for uid in contour_images]))
    dataset.ROIContourSequence = Sequence([_item(ReferencedROINumber=1, ContourSequence=Sequence([contour]))])
    dataset.StructureSetROISequence = Sequence([_item(ROINumber=1, ReferencedFrameOfReferenceUID="1.5")])
    return dataset


def test_the_frame_series_and_every_image_named_anywhere_are_found():
    references = structure_set_references(structure_set())
    assert references.frame_uid == "1.5" and references.series_uids == ("1.7",)
    assert references.images == ("1.9.1", "1.9.2", "1.9.3")


def test_the_frame_of_the_rois_stands_in_when_the_sequence_is_missing():
    assert structure_set_references(structure_set(frame="")).frame_uid == "1.5"


def test_a_structure_set_without_any_frame_of_reference_is_refused():
    dataset = structure_set(frame="")
    dataset.StructureSetROISequence[0].ReferencedFrameOfReferenceUID = ""
    with pytest.raises(ValueError, match="names no frame of reference"):
        structure_set_references(dataset)


def status(present=3, expected=3, slices=3, last=100.0, problem="", series="1.7"):
    return SeriesStatus(series, expected, present, slices, last, problem)


def test_complete_and_no_association_still_delivering_is_ready():
    assert decide(status(), now=100.1, timeout=10, busy=False) == (READY, "")


def test_complete_waits_for_its_open_association_until_the_timeout():
    assert decide(status(), now=105, timeout=10, busy=True) == (WAIT, "")
    assert decide(status(), now=111, timeout=10, busy=True) == (READY, "")


def test_incomplete_waits_then_fails_saying_what_is_missing():
    assert decide(status(present=2), now=105, timeout=10, busy=False) == (WAIT, "")
    assert decide(status(present=2), now=111, timeout=10, busy=False) == (
        FAIL, "incomplete after 10 s without a new object: 2 of the 3 CT images it names arrived "
              "(series 1.7: 3 images here)")
    assert decide(status(0, 0, 0, series=""), now=111, timeout=10, busy=False) == (
        FAIL, "incomplete after 10 s without a new object: no CT series of its frame of reference arrived")


def test_a_problem_fails_at_once():
    assert decide(status(problem="two series"), now=100, timeout=10, busy=True) == (FAIL, "two series")


def test_a_failure_names_the_patients_refused_objects():
    refused = ("CT 1.9.3 (status 0xC000: pixel data of 100 bytes, expected 2048)",)
    assert decide(SeriesStatus("1.7", 3, 2, 2, 100.0, refused=refused), now=111, timeout=10, busy=False) == (
        FAIL, "incomplete after 10 s without a new object: 2 of the 3 CT images it names arrived (series 1.7: 2 images "
              "here); 1 refused: CT 1.9.3 (status 0xC000: pixel data of 100 bytes, expected 2048)")
