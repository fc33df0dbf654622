"""The intake: the checks a C-STORE passes before its object is written, as plain functions of the
request and its data set (no socket, no store). Each refusal is a :class:`Refusal`: the DICOM
failure status the node answers with and a short comment.

- :func:`check_room`: the object's size against ``--max-object-mb`` and the store's free disk
  against ``--min-free-mb`` (status A700, out of resources), before the data set is decoded;
- :func:`examine`: the data set decodes; its SOP class and instance are the request's (A900); it
  is of a class the node takes; its UIDs are digits and dots, as files are named by them (C000);
  a CT image has its frame of reference and whole pixel data (C000); a structure set names a frame
  of reference (C000). Returns what the node records of the object (:class:`Received`);
- :func:`named_in`: what a refused data set names (its patient, series, frame), as far as it decodes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from pydicom.dataset import Dataset
from pydicom.uid import UID, CTImageStorage, RTDoseStorage, RTPlanStorage, RTStructureSetStorage

from provided_code.apps.node.readiness import References, structure_set_references
from provided_code.apps.node.store import InvalidUIDError, check_uid
from provided_code.apps.node.text import one_line, text_of
from provided_code.dicom.rtdose import written_here

SOP_CLASSES = {CTImageStorage: "CT", RTStructureSetStorage: "RTSTRUCT", RTPlanStorage: "RTPLAN",
               RTDoseStorage: "RTDOSE"}  # the storage classes the node takes, and their modality
SUCCESS = 0x0000
OUT_OF_RESOURCES = 0xA700
DATA_SET_MISMATCH = 0xA900
CANNOT_UNDERSTAND = 0xC000
SOP_CLASS_NOT_SUPPORTED = 0x0122
PROCESSING_FAILURE = 0x0110


class Refusal(Exception):
    """A C-STORE answered with a failure status: ``status`` and a short ``comment``."""

    def __init__(self, status: int, comment: str):
        super().__init__(comment)
        self.status, self.comment = status, comment


@dataclasses.dataclass(frozen=True)
class Received:
    """What the node records of an object it takes."""

    modality: str  # CT, RTSTRUCT, RTPLAN or RTDOSE
    sop_class_uid: str
    sop_instance_uid: str
    series_uid: str
    study_uid: str
    frame_uid: str  # a structure set's: the frame of reference its contours are in
    patient_id: str
    own: bool  # an RT Dose this project wrote (a node's answer sent back), not the clinic's
    references: References | None = None  # a structure set's: the images it names


def check_room(size: int, free: int, max_object_bytes: int, min_free_bytes: int) -> None:
    """An object of ``size`` bytes fits the size limit and leaves the free-disk floor (``free``:
    the store's free bytes now); else a :class:`Refusal` A700."""
    if size > max_object_bytes:
        raise Refusal(OUT_OF_RESOURCES, f"object of {size / 1e6:.1f} MB over the limit of "
                                        f"{max_object_bytes / 1e6:.1f} MB")
    if free - size < min_free_bytes:
        raise Refusal(OUT_OF_RESOURCES, f"free disk {free / 1e6:.0f} MB, floor {min_free_bytes / 1e6:.0f} MB")


def examine(dataset: Dataset | Callable[[], Dataset], sop_class_uid: str, sop_instance_uid: str,
            transfer_syntax: str) -> Received:
    """The checks of the module docstring on a C-STORE's data set (or the callable that decodes
    it), against the request's affected SOP class and instance UIDs and the presentation
    context's transfer syntax. Returns the object's :class:`Received`, or raises a :class:`Refusal`."""
    try:
        dataset = dataset() if callable(dataset) else dataset
        sop_class, sop_instance = text_of(dataset.get("SOPClassUID")), text_of(dataset.get("SOPInstanceUID"))
        series, study = text_of(dataset.get("SeriesInstanceUID")), text_of(dataset.get("StudyInstanceUID"))
        frame, patient_id = text_of(dataset.get("FrameOfReferenceUID")), text_of(dataset.get("PatientID"))
        own = written_here(dataset)
    except Exception as error:  # noqa: BLE001 - pydicom fails in many ways on broken bytes
        raise Refusal(CANNOT_UNDERSTAND, f"cannot decode the data set ({type(error).__name__})") from None
    if sop_class != text_of(sop_class_uid):
        raise Refusal(DATA_SET_MISMATCH, "SOPClassUID differs from the request's")
    if sop_instance != text_of(sop_instance_uid):
        raise Refusal(DATA_SET_MISMATCH, "SOPInstanceUID differs from the request's")
    modality = SOP_CLASSES.get(sop_class)
    if modality is None:  # only if a context was accepted for another class; pynetdicom refuses those
        raise Refusal(SOP_CLASS_NOT_SUPPORTED, "SOP class not supported")
    for value, what in ((sop_instance, "SOPInstanceUID"), (series, "SeriesInstanceUID"),
                        (study, "StudyInstanceUID"), (frame, "FrameOfReferenceUID")):
        try:
            if value or what != "FrameOfReferenceUID":
                check_uid(value, what)
        except InvalidUIDError:
            raise Refusal(CANNOT_UNDERSTAND, f"invalid {what} (digits and dots only)") from None
    if modality == "CT":
        if not frame:
            raise Refusal(CANNOT_UNDERSTAND, "CT image without FrameOfReferenceUID")
        check_pixel_data(dataset, transfer_syntax)
    references = None
    if modality == "RTSTRUCT":
        try:
            references = structure_set_references(dataset)
            check_uid(references.frame_uid, "FrameOfReferenceUID")
        except (ValueError, InvalidUIDError) as error:
            raise Refusal(CANNOT_UNDERSTAND, one_line(error)) from None
        frame = references.frame_uid
    return Received(modality, sop_class, sop_instance, series, study, frame, patient_id,
                    own=modality == "RTDOSE" and own, references=references)


def check_pixel_data(dataset: Dataset, transfer_syntax: str) -> None:
    """A CT image's pixel data is there and, uncompressed, as long as its rows, columns and bits say
    (a truncated object is refused now rather than failing its patient later)."""
    try:
        pixels = dataset.get("PixelData")
        shape = [int(dataset.get(tag) or 0) for tag in ("Rows", "Columns", "BitsAllocated")]
        frames, samples = int(dataset.get("NumberOfFrames") or 1), int(dataset.get("SamplesPerPixel") or 1)
    except (TypeError, ValueError):
        raise Refusal(CANNOT_UNDERSTAND, "CT image with unreadable image attributes") from None
    if not pixels or not all(shape):
        raise Refusal(CANNOT_UNDERSTAND, "CT image without pixel data, rows, columns or bits")
    if not UID(transfer_syntax).is_compressed:
        expected = shape[0] * shape[1] * (shape[2] // 8) * frames * samples
        if not expected <= len(pixels) <= expected + 1:
            raise Refusal(CANNOT_UNDERSTAND, f"pixel data of {len(pixels)} bytes, expected {expected}")


def named_in(dataset: Dataset | Callable[[], Dataset]) -> dict[str, str]:
    """What a (refused) data set names, each as far as it decodes ('' where it does not): its
    ``sop_class_uid``, ``modality``, ``series_uid``, ``frame_uid`` and ``patient_id``."""
    try:
        dataset = dataset() if callable(dataset) else dataset
    except Exception:  # noqa: BLE001 - it did not decode: it names nothing
        return {}
    names = {}
    for key, keyword in (("sop_class_uid", "SOPClassUID"), ("series_uid", "SeriesInstanceUID"),
                         ("frame_uid", "FrameOfReferenceUID"), ("patient_id", "PatientID")):
        try:
            names[key] = text_of(dataset.get(keyword))
        except Exception:  # noqa: BLE001 - this element does not decode; the others may
            names[key] = ""
    names["modality"] = SOP_CLASSES.get(names["sop_class_uid"], "")
    return names
