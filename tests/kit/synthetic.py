"""An OpenKBP patient (or phantom) written as a clinic would export it: the DICOM the tests and
``scripts/bench_dicom.py`` import (scikit-image traces the contours: the ``dev`` extra).

The CT is written at ``factor`` times the OpenKBP in-plane resolution (each voxel repeated), with a
non-zero origin, extra air slices above and below, int16-style pixels with a rescale intercept, in
shuffled file order under random names. Each structure becomes an RTSTRUCT ROI of clinical name,
its contours traced by scikit-image's marching squares on the fine grid (an implementation
independent of the import's polygon fill). The dose becomes an RT Dose on the fine in-plane grid
(each voxel repeated, so that the OpenKBP voxel centres, midway between fine pixels, sample the
original values), frames ascending in z.

For archives (``openkbp-dicom import-cohort``): an RT Plan (:func:`write_plan`: static beams or arcs
with a control point every 2°, dose references per target, one fraction group) and RT Doses that
reference it (:func:`write_dose`: PLAN, BEAM or FRACTION summation), other image series of the same
patient (:func:`write_series`: an MR, a CBCT), a DICOMDIR (:func:`write_dicomdir`), and
:func:`scatter_files`, which moves files into nested folders under meaningless names without
extensions, as PACS exports have them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from pydicom.datadict import tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence
from pydicom.tag import Tag
from pydicom.uid import (
    CTImageStorage,
    ExplicitVRLittleEndian,
    MediaStorageDirectoryStorage,
    MRImageStorage,
    RTDoseStorage,
    RTPlanStorage,
    RTStructureSetStorage,
    generate_uid,
)

CLINICAL_NAMES = {"Brainstem": "BrainStem", "SpinalCord": "Spinal_Cord", "RightParotid": "Parotid_R",
                  "LeftParotid": "Parotid_L", "Esophagus": "Esophagus", "Larynx": "Larynx", "Mandible": "Mandible",
                  "PTV56": "PTV_56", "PTV63": "PTV63", "PTV70": "PTV_7000", "BODY": "External"}
# A prostate phantom's ROIs (sites/prostate.json), as a clinic might name them
PROSTATE_CLINICAL_NAMES = {"Rectum": "Rectum", "Bladder": "Bladder", "FemoralHead_R": "Femur_Head_R",
                           "FemoralHead_L": "Femur_Head_L", "PTV60": "PTV_6000", "PTV78": "PTV78", "BODY": "External"}
# SOP classes, by the standard's names (pydicom's table)
CT_STORAGE, RTSTRUCT_STORAGE, RTDOSE_STORAGE = CTImageStorage, RTStructureSetStorage, RTDoseStorage
RTPLAN_STORAGE, MR_STORAGE, MEDIA_DIRECTORY_STORAGE = RTPlanStorage, MRImageStorage, MediaStorageDirectoryStorage
ARC_CONTROL_POINT_DEGREES = 2.0  # VMAT plans: a control point every 2° of gantry rotation


@dataclasses.dataclass
class WrittenPatient:
    ct_dir: Path
    rtstruct: Path
    rtdose: Path | None
    frame_of_reference_uid: str
    slice_z: np.ndarray  # descending, every written slice
    origin_xy: np.ndarray
    pixel_spacing: np.ndarray  # rows, columns
    study: Dataset | None = None  # the patient and study tags every object of this patient carries
    series_instance_uid: str = ""  # the CT series
    rtstruct_uid: str = ""  # the RTSTRUCT's SOP Instance UID
    extra_slices: tuple[int, int] = (0, 0)
    factor: int = 2


def _with_file_meta(sop_class: str) -> Dataset:
    """An empty dataset with the file meta of a new ``sop_class`` instance (explicit VR little endian)."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    return ds


def _base(sop_class: str, modality: str, study: Dataset, frame_uid: str) -> Dataset:
    ds = _with_file_meta(sop_class)
    meta = ds.file_meta
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, meta.MediaStorageSOPInstanceUID
    ds.Modality = modality
    for element in study:
        ds.add(element)
    ds.FrameOfReferenceUID = frame_uid
    ds.SeriesInstanceUID = generate_uid()
    return ds


def _set_decimal_strings(ds: Dataset, keyword: str, values: np.ndarray, decimals: int) -> None:
    """``ds.<keyword>`` (a DS element) = ``values`` with ``decimals`` decimals, as the value bytes
    the file will hold: pydicom would otherwise make and check a number object per value (seconds
    for a patient's contours), only to write the same text back."""
    text = "\\".join(f"{v:.{decimals}f}" for v in values.tolist()).encode("ascii")
    text += b" " * (len(text) % 2)  # even length, padded with a space (PS3.5 6.2)
    tag = Tag(tag_for_keyword(keyword))
    ds[tag] = RawDataElement(tag, "DS", len(text), text, 0, False, True)
    ds.set_original_encoding(False, True, "iso8859")  # as the file is written: its raw bytes go out as they are


def fine_hu(ct: np.ndarray, factor: int) -> np.ndarray:
    """OpenKBP CT values (HU + 1000) to HU, each voxel repeated factor × factor in-plane."""
    return np.repeat(np.repeat(ct.astype(np.float32) - 1000.0, factor, 0), factor, 1)


def new_study(patient_id: str = "PHANTOM1", patient_name: str = "Test^Phantom", birth_date: str = "19700101",
              study_tags: dict[str, str] | None = None) -> Dataset:
    """The patient and study tags every object of one patient carries (a new StudyInstanceUID)."""
    study = Dataset()
    study.PatientName, study.PatientID, study.PatientBirthDate, study.PatientSex = patient_name, patient_id, birth_date, "O"
    study.StudyInstanceUID, study.StudyDate, study.StudyTime, study.StudyID = generate_uid(), "20260101", "120000", "1"
    study.ReferringPhysicianName, study.AccessionNumber = "", ""
    for tag, value in (study_tags or {}).items():
        setattr(study, tag, value)
    return study


def write_ct_series(ct_dir: Path, planes, study: Dataset, frame_uid: str, series_uid: str, origin, spacing,
                    slice_z: np.ndarray, slice_thickness: float, rng: np.random.Generator) -> None:
    """One CT file per slice ``k`` (``planes(k)``: HU, ``(rows, columns)``) at ``slice_z[k]``, in
    shuffled order under random names, int16-style pixels with a rescale intercept."""
    ct_dir = Path(ct_dir)
    ct_dir.mkdir(parents=True, exist_ok=True)
    for k in rng.permutation(len(slice_z)):
        plane = planes(int(k))
        ds = _base(CT_STORAGE, "CT", study, frame_uid)
        ds.SeriesInstanceUID = series_uid
        ds.ImagePositionPatient = [origin[0], origin[1], float(slice_z[k])]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.PixelSpacing = [float(spacing[0]), float(spacing[1])]
        ds.SliceThickness = slice_thickness
        ds.Rows, ds.Columns = plane.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.RescaleIntercept, ds.RescaleSlope = -1024, 1
        ds.InstanceNumber = int(k) + 1
        ds.PixelData = np.round(plane + 1024).astype(np.uint16).tobytes()
        ds.save_as(ct_dir / f"{rng.integers(1 << 40):x}.dcm", enforce_file_format=True)


def write_structure_set(path: Path, study: Dataset, frame_uid: str, series_uid: str,
                        rois: dict[str, list[np.ndarray]]) -> str:
    """An RTSTRUCT on the CT series ``series_uid``: ``rois`` maps an ROI name to its closed planar
    contours, each ``(points, 3)`` mm (x, y, z; not repeating the first point); returns its SOP
    Instance UID."""
    rs = _base(RTSTRUCT_STORAGE, "RTSTRUCT", study, frame_uid)
    rs.StructureSetLabel, rs.StructureSetDate, rs.StructureSetTime = "RS", "20260101", "120000"
    frame = Dataset()
    frame.FrameOfReferenceUID = frame_uid
    referenced_series = Dataset()
    referenced_series.SeriesInstanceUID = series_uid
    referenced_study = Dataset()
    referenced_study.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"  # Detached Study Management (as TPSs write)
    referenced_study.ReferencedSOPInstanceUID = study.StudyInstanceUID
    referenced_study.RTReferencedSeriesSequence = Sequence([referenced_series])
    frame.RTReferencedStudySequence = Sequence([referenced_study])
    rs.ReferencedFrameOfReferenceSequence = Sequence([frame])
    items, roi_contours = [], []
    for number, (name, polygons) in enumerate(rois.items(), start=1):
        roi = Dataset()
        roi.ROINumber, roi.ROIName, roi.ReferencedFrameOfReferenceUID = number, name, frame_uid
        items.append(roi)
        contours = []
        for points in polygons:
            contour = Dataset()
            contour.ContourGeometricType = "CLOSED_PLANAR"
            contour.NumberOfContourPoints = len(points)
            _set_decimal_strings(contour, "ContourData", np.asarray(points, np.float64).reshape(-1), 4)
            contours.append(contour)
        item = Dataset()
        item.ReferencedROINumber = number
        item.ContourSequence = Sequence(contours)
        roi_contours.append(item)
    rs.StructureSetROISequence = Sequence(items)
    rs.ROIContourSequence = Sequence(roi_contours)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rs.save_as(path, enforce_file_format=True)
    return str(rs.SOPInstanceUID)


def write_patient(folder: Path, ct: np.ndarray, masks: dict[str, np.ndarray], voxel_dimensions, dose=None,
                  factor: int = 2, extra_slices: tuple[int, int] = (0, 0), origin=(-251.3, -180.7), top_z=95.0,
                  seed: int = 0, names: dict[str, str] = CLINICAL_NAMES, series_uid: str | None = None,
                  patient_id: str = "PHANTOM1", patient_name: str = "Test^Phantom",
                  birth_date: str = "19700101", study_tags: dict[str, str] | None = None) -> WrittenPatient:
    """Write ``ct`` (128³ OpenKBP values), ``masks`` (structure or BODY -> bool 128³) and ``dose``
    (a PLAN dose referencing no plan; :func:`write_dose` writes others). ``study_tags``: patient
    and study tags in place of the defaults (``{"AccessionNumber": ...}``)."""
    from skimage.measure import find_contours

    rng = np.random.default_rng(seed)
    folder = Path(folder)
    study = new_study(patient_id, patient_name, birth_date, study_tags)
    frame_uid = generate_uid()
    d0, d1, d2 = (float(v) for v in voxel_dimensions)
    spacing = np.array([d0 / factor, d1 / factor])  # rows (y), columns (x)
    above, below = extra_slices
    slices = above + ct.shape[2] + below
    slice_z = top_z - np.arange(slices) * d2
    hu = fine_hu(ct, factor)
    series = series_uid or generate_uid()
    write_ct_series(folder / "ct", lambda k: np.full(hu.shape[:2], -1000.0, np.float32)
                    if not above <= k < above + ct.shape[2] else hu[:, :, k - above],
                    study, frame_uid, series, origin, spacing, slice_z, d2, rng)

    rois = {}
    for key, mask in masks.items():
        contours = []
        for b in range(mask.shape[2]):
            if not mask[:, :, b].any():
                continue
            fine = np.pad(np.repeat(np.repeat(mask[:, :, b], factor, 0), factor, 1), 1).astype(np.float32)
            for line in find_contours(fine, 0.5):
                row, column = line[:, 0] - 1, line[:, 1] - 1
                contours.append(np.stack([origin[0] + column * spacing[1], origin[1] + row * spacing[0],
                                          np.full(row.size, slice_z[above + b])], axis=1)[:-1])  # closed: last = first
        rois[names.get(key, key)] = contours
    rtstruct = folder / "RS.dcm"
    rtstruct_uid = write_structure_set(rtstruct, study, frame_uid, series, rois)

    written = WrittenPatient(folder / "ct", rtstruct, None, frame_uid, slice_z, np.array(origin), spacing, study, series,
                             rtstruct_uid, (above, below), factor)
    if dose is not None:
        written.rtdose = write_dose(folder / "RD.dcm", dose, written)
    return written


def write_dose(path: Path, dose: np.ndarray, patient: WrittenPatient, plan_uid: str | None = None,
               summation: str = "PLAN", beam_number: int | None = None) -> Path:
    """Write ``dose`` (Gy on the 128³ box of ``patient``) as an RT Dose on the fine in-plane grid,
    referencing the RT Plan ``plan_uid`` (and, for a BEAM dose, its beam ``beam_number``)."""
    factor = patient.factor
    fine_dose = np.repeat(np.repeat(np.asarray(dose, np.float32), factor, 0), factor, 1)  # (rows, columns, box slices)
    frames = fine_dose[:, :, ::-1].transpose(2, 0, 1)  # ascending z
    scaling = max(float(frames.max()), 1e-6) / 60000.0
    rd = _base(RTDOSE_STORAGE, "RTDOSE", patient.study, patient.frame_of_reference_uid)
    above = patient.extra_slices[0]
    box_z = patient.slice_z[above:above + dose.shape[2]]
    rd.ImagePositionPatient = [float(patient.origin_xy[0]), float(patient.origin_xy[1]), float(box_z[-1])]
    rd.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    rd.PixelSpacing = [float(patient.pixel_spacing[0]), float(patient.pixel_spacing[1])]
    rd.NumberOfFrames = frames.shape[0]
    rd.GridFrameOffsetVector = [float(v) for v in box_z[::-1] - box_z[-1]]
    rd.Rows, rd.Columns = frames.shape[1:]
    rd.SamplesPerPixel, rd.PhotometricInterpretation = 1, "MONOCHROME2"
    rd.BitsAllocated, rd.BitsStored, rd.HighBit, rd.PixelRepresentation = 16, 16, 15, 0
    rd.DoseUnits, rd.DoseType, rd.DoseSummationType = "GY", "PHYSICAL", summation
    rd.ContentDate, rd.ContentTime = "20260101", "120000"
    if plan_uid is not None:
        plan = Dataset()
        plan.ReferencedSOPClassUID, plan.ReferencedSOPInstanceUID = RTPLAN_STORAGE, plan_uid
        if summation in ("BEAM", "FRACTION"):
            group = Dataset()
            group.ReferencedFractionGroupNumber = 1
            if beam_number is not None:
                beam = Dataset()
                beam.ReferencedBeamNumber = beam_number
                group.ReferencedBeamSequence = Sequence([beam])
            plan.ReferencedFractionGroupSequence = Sequence([group])
        rd.ReferencedRTPlanSequence = Sequence([plan])
    rd.DoseGridScaling = f"{scaling:.8e}"
    rd.PixelData = np.round(frames / float(rd.DoseGridScaling)).astype(np.uint16).tobytes()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rd.save_as(path, enforce_file_format=True)
    return path


def _control_point(index: int, gantry: float, direction: str, couch: float, weight: float) -> Dataset:
    point = Dataset()
    point.ControlPointIndex = index
    point.GantryAngle = f"{gantry % 360:g}"
    point.GantryRotationDirection = direction
    if index == 0:
        point.PatientSupportAngle = f"{couch:g}"
        point.PatientSupportRotationDirection = "NONE"
        point.BeamLimitingDeviceAngle = 0
        point.NominalBeamEnergy = 6
    point.CumulativeMetersetWeight = f"{weight:.6g}"
    return point


def write_plan(path: Path, patient: WrittenPatient, beams, prescriptions: dict[str, float], fractions: int = 35,
               approval: str = "APPROVED", label: str = "Plan1", date: str = "20260102", time: str = "090000",
               couch: float = 0.0) -> str:
    """Write an RT Plan of ``patient`` referencing its RTSTRUCT; return its SOP Instance UID.

    ``beams``: ``("static", angle)`` or ``("arc", start, stop, "CW"|"CC")`` items (arcs get a
    control point every :data:`ARC_CONTROL_POINT_DEGREES`). ``prescriptions``: ROI name -> Gy, each
    a TARGET dose reference of structure type VOLUME referencing that ROI (by its number in the
    RTSTRUCT) and described by its name; the fraction group's beam doses add up to the highest over
    ``fractions`` fractions."""
    from pydicom import dcmread

    rs = dcmread(patient.rtstruct, stop_before_pixels=True)
    numbers = {str(roi.ROIName): int(roi.ROINumber) for roi in rs.StructureSetROISequence}
    plan = _base(RTPLAN_STORAGE, "RTPLAN", patient.study, patient.frame_of_reference_uid)
    plan.RTPlanLabel, plan.RTPlanName, plan.RTPlanDate, plan.RTPlanTime = label, label, date, time
    plan.RTPlanGeometry = "PATIENT"
    plan.ApprovalStatus = approval
    if approval == "APPROVED":
        plan.ReviewDate, plan.ReviewTime, plan.ReviewerName = date, time, "Physicist^A"
    referenced = Dataset()
    referenced.ReferencedSOPClassUID, referenced.ReferencedSOPInstanceUID = RTSTRUCT_STORAGE, patient.rtstruct_uid
    plan.ReferencedStructureSetSequence = Sequence([referenced])
    references = []
    for number, (roi, gy) in enumerate(prescriptions.items(), start=1):
        item = Dataset()
        item.DoseReferenceNumber = number
        item.DoseReferenceUID = generate_uid()
        item.DoseReferenceStructureType = "VOLUME"
        item.DoseReferenceDescription = roi
        if roi in numbers:
            item.ReferencedROINumber = numbers[roi]
        item.DoseReferenceType = "TARGET"
        item.TargetPrescriptionDose = f"{gy:g}"
        references.append(item)
    plan.DoseReferenceSequence = Sequence(references)
    per_fraction = max(prescriptions.values(), default=0.0) / fractions
    beam_items, referenced_beams = [], []
    for number, beam in enumerate(beams, start=1):
        item = Dataset()
        item.BeamNumber, item.BeamName = number, f"B{number}"
        item.BeamType = "STATIC" if beam[0] == "static" else "DYNAMIC"
        item.RadiationType, item.TreatmentDeliveryType = "PHOTON", "TREATMENT"
        if beam[0] == "static":
            points = [_control_point(0, beam[1], "NONE", couch, 0.0), _control_point(1, beam[1], "NONE", couch, 1.0)]
            del points[1].GantryRotationDirection  # unchanged attributes are not repeated
        else:
            _, start, stop, direction = beam
            sweep = ((stop - start) if direction == "CW" else (start - stop)) % 360 or 360
            steps = int(np.ceil(sweep / ARC_CONTROL_POINT_DEGREES))
            sign = 1 if direction == "CW" else -1
            angles = [start + sign * min(k * ARC_CONTROL_POINT_DEGREES, sweep) for k in range(steps + 1)]
            points = [_control_point(k, angle, direction if k < steps else "NONE", couch, k / steps)
                      for k, angle in enumerate(angles)]
        item.NumberOfControlPoints = len(points)
        item.ControlPointSequence = Sequence(points)
        beam_items.append(item)
        reference = Dataset()
        reference.ReferencedBeamNumber = number
        reference.BeamDose = f"{per_fraction / max(len(beams), 1):.6g}"
        reference.BeamMeterset = 100
        referenced_beams.append(reference)
    plan.BeamSequence = Sequence(beam_items)
    group = Dataset()
    group.FractionGroupNumber = 1
    group.NumberOfFractionsPlanned = fractions
    group.NumberOfBeams = len(beams)
    group.NumberOfBrachyApplicationSetups = 0
    group.ReferencedBeamSequence = Sequence(referenced_beams)
    plan.FractionGroupSequence = Sequence([group])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plan.save_as(path, enforce_file_format=True)
    return str(plan.SOPInstanceUID)


def write_series(folder: Path, patient: WrittenPatient, modality: str = "MR", slices: int = 4, size: int = 32,
                 same_frame: bool = False) -> str:
    """A small image series of ``patient`` (an MR, or a CBCT as a second CT series; its own frame
    of reference unless ``same_frame``); returns its SeriesInstanceUID."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    frame_uid = patient.frame_of_reference_uid if same_frame else generate_uid()
    series = generate_uid()
    for k in range(slices):
        ds = _base(MR_STORAGE if modality == "MR" else CT_STORAGE, modality, patient.study, frame_uid)
        ds.SeriesInstanceUID = series
        ds.ImagePositionPatient = [-100.0, -100.0, float(10 - 3 * k)]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.PixelSpacing = [6.25, 6.25]
        ds.SliceThickness = 3.0
        ds.Rows = ds.Columns = size
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        if modality == "CT":
            ds.RescaleIntercept, ds.RescaleSlope = -1024, 1
        ds.InstanceNumber = k + 1
        ds.PixelData = np.full((size, size), 1000, np.uint16).tobytes()
        ds.save_as(folder / f"{modality}{k}.dcm", enforce_file_format=True)
    return series


def write_dicomdir(path: Path) -> Path:
    """A DICOMDIR (Media Storage Directory) with no records: what media exports put at their root."""
    ds = _with_file_meta(MEDIA_DIRECTORY_STORAGE)
    ds.FileSetID = "ARCHIVE"
    ds.OffsetOfTheFirstDirectoryRecordOfTheRootDirectoryEntity = 0
    ds.OffsetOfTheLastDirectoryRecordOfTheRootDirectoryEntity = 0
    ds.FileSetConsistencyFlag = 0
    ds.DirectoryRecordSequence = Sequence([])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def scatter_files(source: Path, archive: Path, seed: int = 0, depth: int = 3) -> list[Path]:
    """Move every file below ``source`` into nested folders of ``archive`` under meaningless names
    without extensions (as a PACS export names them); returns the new paths."""
    import shutil

    rng = np.random.default_rng(seed)
    moved = []
    for path in sorted(p for p in Path(source).rglob("*") if p.is_file()):
        folder = Path(archive).joinpath(*(f"{rng.integers(1 << 16):04X}" for _ in range(int(rng.integers(1, depth + 1)))))
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{rng.integers(1 << 48):012X}"
        shutil.move(path, target)
        moved.append(target)
    return moved

