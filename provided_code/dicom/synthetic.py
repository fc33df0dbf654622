"""An OpenKBP patient (or phantom) written as a clinic would export it: the DICOM the tests and
``scripts/bench_dicom.py`` import (scikit-image traces the contours: the ``dev`` extra).

The CT is written at ``factor`` times the OpenKBP in-plane resolution (each voxel repeated), with a
non-zero origin, extra air slices above and below, int16-style pixels with a rescale intercept, in
shuffled file order under random names. Each structure becomes an RTSTRUCT ROI of clinical name,
its contours traced by scikit-image's marching squares on the fine grid (an implementation
independent of the import's polygon fill). The dose becomes an RT Dose on the fine in-plane grid
(each voxel repeated, so that the OpenKBP voxel centres, midway between fine pixels, sample the
original values), frames ascending in z.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

CLINICAL_NAMES = {"Brainstem": "BrainStem", "SpinalCord": "Spinal_Cord", "RightParotid": "Parotid_R",
                  "LeftParotid": "Parotid_L", "Esophagus": "Esophagus", "Larynx": "Larynx", "Mandible": "Mandible",
                  "PTV56": "PTV_56", "PTV63": "PTV63", "PTV70": "PTV_7000", "BODY": "External"}
# A prostate phantom's ROIs (sites/prostate.json), as a clinic might name them
PROSTATE_CLINICAL_NAMES = {"Rectum": "Rectum", "Bladder": "Bladder", "FemoralHead_R": "Femur_Head_R",
                           "FemoralHead_L": "Femur_Head_L", "PTV60": "PTV_6000", "PTV78": "PTV78", "BODY": "External"}
CT_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
RTSTRUCT_STORAGE = "1.2.840.10008.5.1.4.1.1.481.3"
RTDOSE_STORAGE = "1.2.840.10008.5.1.4.1.1.481.2"


@dataclasses.dataclass
class WrittenPatient:
    ct_dir: Path
    rtstruct: Path
    rtdose: Path | None
    frame_of_reference_uid: str
    slice_z: np.ndarray  # descending, every written slice
    origin_xy: np.ndarray
    pixel_spacing: np.ndarray  # rows, columns


def _base(sop_class: str, modality: str, study: Dataset, frame_uid: str) -> Dataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, meta.MediaStorageSOPInstanceUID
    ds.Modality = modality
    for element in study:
        ds.add(element)
    ds.FrameOfReferenceUID = frame_uid
    ds.SeriesInstanceUID = generate_uid()
    return ds


def fine_hu(ct: np.ndarray, factor: int) -> np.ndarray:
    """OpenKBP CT values (HU + 1000) to HU, each voxel repeated factor × factor in-plane."""
    return np.repeat(np.repeat(ct.astype(np.float32) - 1000.0, factor, 0), factor, 1)


def write_patient(folder: Path, ct: np.ndarray, masks: dict[str, np.ndarray], voxel_dimensions, dose=None,
                  factor: int = 2, extra_slices: tuple[int, int] = (0, 0), origin=(-251.3, -180.7), top_z=95.0,
                  seed: int = 0, names: dict[str, str] = CLINICAL_NAMES, series_uid: str | None = None) -> WrittenPatient:
    """Write ``ct`` (128³ OpenKBP values), ``masks`` (structure or BODY -> bool 128³) and ``dose``."""
    from skimage.measure import find_contours

    rng = np.random.default_rng(seed)
    folder = Path(folder)
    ct_dir = folder / "ct"
    ct_dir.mkdir(parents=True, exist_ok=True)
    study = Dataset()
    study.PatientName, study.PatientID, study.PatientBirthDate, study.PatientSex = "Test^Phantom", "PHANTOM1", "19700101", "O"
    study.StudyInstanceUID, study.StudyDate, study.StudyTime, study.StudyID = generate_uid(), "20260101", "120000", "1"
    study.ReferringPhysicianName, study.AccessionNumber = "", ""
    frame_uid = generate_uid()
    d0, d1, d2 = (float(v) for v in voxel_dimensions)
    spacing = np.array([d0 / factor, d1 / factor])  # rows (y), columns (x)
    above, below = extra_slices
    slices = above + ct.shape[2] + below
    slice_z = top_z - np.arange(slices) * d2
    hu = fine_hu(ct, factor)
    series = series_uid or generate_uid()
    for k in rng.permutation(slices):
        plane = np.full(hu.shape[:2], -1000.0, np.float32) if not above <= k < above + ct.shape[2] else hu[:, :, k - above]
        ds = _base(CT_STORAGE, "CT", study, frame_uid)
        ds.SeriesInstanceUID = series
        ds.ImagePositionPatient = [origin[0], origin[1], float(slice_z[k])]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.PixelSpacing = [float(spacing[0]), float(spacing[1])]
        ds.SliceThickness = d2
        ds.Rows, ds.Columns = plane.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.RescaleIntercept, ds.RescaleSlope = -1024, 1
        ds.InstanceNumber = int(k) + 1
        ds.PixelData = np.round(plane + 1024).astype(np.uint16).tobytes()
        ds.save_as(ct_dir / f"{rng.integers(1 << 40):x}.dcm", enforce_file_format=True)

    rs = _base(RTSTRUCT_STORAGE, "RTSTRUCT", study, frame_uid)
    frame = Dataset()
    frame.FrameOfReferenceUID = frame_uid
    rs.ReferencedFrameOfReferenceSequence = Sequence([frame])
    rois, roi_contours = [], []
    for number, (key, mask) in enumerate(masks.items(), start=1):
        roi = Dataset()
        roi.ROINumber, roi.ROIName, roi.ReferencedFrameOfReferenceUID = number, names.get(key, key), frame_uid
        rois.append(roi)
        contours = []
        for b in range(mask.shape[2]):
            if not mask[:, :, b].any():
                continue
            fine = np.pad(np.repeat(np.repeat(mask[:, :, b], factor, 0), factor, 1), 1).astype(np.float32)
            for line in find_contours(fine, 0.5):
                row, column = line[:, 0] - 1, line[:, 1] - 1
                points = np.stack([origin[0] + column * spacing[1], origin[1] + row * spacing[0],
                                   np.full(row.size, slice_z[above + b])], axis=1)[:-1]  # closed: last = first
                contour = Dataset()
                contour.ContourGeometricType = "CLOSED_PLANAR"
                contour.NumberOfContourPoints = len(points)
                contour.ContourData = [f"{v:.4f}" for v in points.reshape(-1)]
                contours.append(contour)
        item = Dataset()
        item.ReferencedROINumber = number
        item.ContourSequence = Sequence(contours)
        roi_contours.append(item)
    rs.StructureSetROISequence = Sequence(rois)
    rs.ROIContourSequence = Sequence(roi_contours)
    rtstruct = folder / "RS.dcm"
    rs.save_as(rtstruct, enforce_file_format=True)

    rtdose = None
    if dose is not None:
        fine_dose = np.repeat(np.repeat(dose.astype(np.float32), factor, 0), factor, 1)  # (rows, columns, box slices)
        frames = fine_dose[:, :, ::-1].transpose(2, 0, 1)  # ascending z
        scaling = max(float(frames.max()), 1e-6) / 60000.0
        rd = _base(RTDOSE_STORAGE, "RTDOSE", study, frame_uid)
        box_z = slice_z[above:above + dose.shape[2]]
        rd.ImagePositionPatient = [origin[0], origin[1], float(box_z[-1])]
        rd.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        rd.PixelSpacing = [float(spacing[0]), float(spacing[1])]
        rd.NumberOfFrames = frames.shape[0]
        rd.GridFrameOffsetVector = [float(v) for v in box_z[::-1] - box_z[-1]]
        rd.Rows, rd.Columns = frames.shape[1:]
        rd.SamplesPerPixel, rd.PhotometricInterpretation = 1, "MONOCHROME2"
        rd.BitsAllocated, rd.BitsStored, rd.HighBit, rd.PixelRepresentation = 16, 16, 15, 0
        rd.DoseUnits, rd.DoseType, rd.DoseSummationType = "GY", "PHYSICAL", "PLAN"
        rd.DoseGridScaling = f"{scaling:.8e}"
        rd.PixelData = np.round(frames / float(rd.DoseGridScaling)).astype(np.uint16).tobytes()
        rtdose = folder / "RD.dcm"
        rd.save_as(rtdose, enforce_file_format=True)
    return WrittenPatient(ct_dir, rtstruct, rtdose, frame_uid, slice_z, np.array(origin), spacing)

