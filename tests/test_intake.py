"""The node's intake checks as plain functions: each C-STORE's size, data set and UIDs, without a socket."""

import copy

import pytest

pytest.importorskip("pynetdicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, MRImageStorage  # noqa: E402

from provided_code.apps.node.intake import (  # noqa: E402
    CANNOT_UNDERSTAND,
    DATA_SET_MISMATCH,
    OUT_OF_RESOURCES,
    SOP_CLASS_NOT_SUPPORTED,
    Refusal,
    check_room,
    examine,
    named_in,
)
from provided_code.dicom.rtdose import MANUFACTURER  # noqa: E402
from tests.kit.node import ct_of, read_patient_files, small_patient, structure_set_of  # noqa: E402


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    """A small phantom's CT images, structure set and the clinic's RT Dose, as datasets."""
    return read_patient_files(small_patient(tmp_path_factory.mktemp("intake") / "clinic", slice_step=8))


def _examine(dataset, syntax=ExplicitVRLittleEndian, **request):
    return examine(dataset, request.get("sop_class", dataset.SOPClassUID),
                   request.get("sop_instance", dataset.SOPInstanceUID), syntax)


def _refusal(call) -> tuple[int, str]:
    with pytest.raises(Refusal) as raised:
        call()
    return raised.value.status, raised.value.comment


def test_an_object_within_the_limits_has_room():
    check_room(size=1000, free=10_000, max_object_bytes=1000, min_free_bytes=9000)


def test_an_object_over_the_size_limit_is_out_of_resources():
    assert _refusal(lambda: check_room(2_000_000, 10**12, 1_000_000, 0)) == (
        OUT_OF_RESOURCES, "object of 2.0 MB over the limit of 1.0 MB")


def test_an_object_that_would_leave_less_than_the_floor_is_out_of_resources():
    assert _refusal(lambda: check_room(2_000_000, 5_000_000, 10**9, 4_000_000)) == (
        OUT_OF_RESOURCES, "free disk 5 MB, floor 4 MB")


def test_a_ct_image_is_taken_with_what_the_node_records(patient):
    image = ct_of(patient)[0]
    received = _examine(image)
    assert (received.modality, received.sop_instance_uid, received.series_uid, received.frame_uid) == (
        "CT", image.SOPInstanceUID, image.SeriesInstanceUID, image.FrameOfReferenceUID)
    assert received.patient_id == image.PatientID and received.references is None and not received.own


def test_a_structure_set_brings_the_images_it_names(patient):
    structures = structure_set_of(patient)
    received = _examine(structures)
    assert received.modality == "RTSTRUCT" and received.frame_uid == ct_of(patient)[0].FrameOfReferenceUID
    assert set(received.references.images) == {image.SOPInstanceUID for image in ct_of(patient)}


def test_a_structure_set_naming_no_frame_of_reference_cannot_be_understood(patient):
    structures = copy.deepcopy(structure_set_of(patient))
    del structures.ReferencedFrameOfReferenceSequence
    for roi in structures.StructureSetROISequence:
        del roi.ReferencedFrameOfReferenceUID
    assert _refusal(lambda: _examine(structures)) == (CANNOT_UNDERSTAND,
                                                      "ValueError: the structure set names no frame of reference")


def test_only_an_rt_dose_this_project_wrote_is_its_own(patient):
    clinic = copy.deepcopy(patient[-1])
    assert clinic.Modality == "RTDOSE" and not _examine(clinic).own
    clinic.Manufacturer = MANUFACTURER
    assert _examine(clinic).own


def test_a_data_set_that_does_not_decode_cannot_be_understood(patient):
    def broken():
        raise ValueError("bytes that are no data set")

    image = ct_of(patient)[0]
    assert _refusal(lambda: examine(broken, image.SOPClassUID, image.SOPInstanceUID, ExplicitVRLittleEndian)) == (
        CANNOT_UNDERSTAND, "cannot decode the data set (ValueError)")


def test_a_data_set_other_than_the_request_says_is_a_mismatch(patient):
    image = ct_of(patient)[0]
    assert _refusal(lambda: _examine(image, sop_instance="1.2.3")) == (
        DATA_SET_MISMATCH, "SOPInstanceUID differs from the request's")
    assert _refusal(lambda: _examine(image, sop_class=MRImageStorage)) == (
        DATA_SET_MISMATCH, "SOPClassUID differs from the request's")


def test_a_class_the_node_does_not_take_is_not_supported(patient):
    image = copy.deepcopy(ct_of(patient)[0])
    image.SOPClassUID = MRImageStorage
    assert _refusal(lambda: _examine(image)) == (SOP_CLASS_NOT_SUPPORTED, "SOP class not supported")


@pytest.mark.filterwarnings("ignore:Invalid value for VR UI:UserWarning")  # pydicom on the UID set below
@pytest.mark.parametrize("keyword", ["SOPInstanceUID", "SeriesInstanceUID", "StudyInstanceUID", "FrameOfReferenceUID"])
def test_a_uid_that_is_not_digits_and_dots_cannot_be_understood(patient, keyword):
    image = copy.deepcopy(ct_of(patient)[0])
    setattr(image, keyword, "../../etc")
    assert _refusal(lambda: _examine(image)) == (CANNOT_UNDERSTAND, f"invalid {keyword} (digits and dots only)")


def test_a_ct_image_without_a_frame_of_reference_cannot_be_understood(patient):
    image = copy.deepcopy(ct_of(patient)[0])
    del image.FrameOfReferenceUID
    assert _refusal(lambda: _examine(image)) == (CANNOT_UNDERSTAND, "CT image without FrameOfReferenceUID")


def test_truncated_pixel_data_cannot_be_understood_unless_compressed(patient):
    image = copy.deepcopy(ct_of(patient)[0])
    expected = len(image.PixelData)
    image.PixelData = image.PixelData[:100]
    assert _refusal(lambda: _examine(image)) == (CANNOT_UNDERSTAND, f"pixel data of 100 bytes, expected {expected}")
    assert _examine(image, syntax=JPEG2000Lossless).modality == "CT"  # its length says nothing when compressed


def test_a_refused_data_set_names_what_it_can(patient):
    image = ct_of(patient)[0]
    assert named_in(image) == {"sop_class_uid": image.SOPClassUID, "modality": "CT", "patient_id": image.PatientID,
                               "series_uid": image.SeriesInstanceUID, "frame_uid": image.FrameOfReferenceUID}

    def broken():
        raise ValueError("bytes that are no data set")

    assert named_in(broken) == {}
