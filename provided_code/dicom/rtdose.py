"""RT Dose: a planning system's dose read onto any points, and a dose written as an RT Dose object.

Written doses are the RT Dose IOD as planning systems and 3D Slicer read it: dose in Gy, physical,
32-bit unsigned pixels times ``DoseGridScaling``, one frame per CT slice (ascending z, offsets from
the first), the CT's frame of reference, orientation, position and pixel spacing, the CT's patient
and study tags, and new series and instance UIDs.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path

import numpy as np

from provided_code.dicom.ct_series import AXIAL
from provided_code.dicom.errors import DicomInputError, require_pydicom
from provided_code.dicom.files import pixel_array, read_required
from provided_code.dicom.grid import PlaneTaps, Taps, linear_matrix
from provided_code.infra.atomic import atomic_path
from provided_code.infra.version import DISTRIBUTION, package_version

MAX_PIXEL = 2**32 - 1
# What every RT Dose this package writes says as its Manufacturer (the product, as a physicist sees it
# in the planning system), its Manufacturer's Model Name (the program that wrote it) and Software
# Versions (the package and its version); and how its own files are told from a planning system's (the
# DICOM node does not predict on a dose it sent itself), with what earlier versions wrote.
MANUFACTURER = "OpenKBP dose prediction"
MODEL_NAME = "openkbp-dicom"
EARLIER_MANUFACTURERS = ("provided_code",)  # what this package wrote as Manufacturer before it named the product

# Dose Summation Type (3004,000A) of a predicted dose. Each Defined Term of PS3.3 C.8.8.3 makes a Type 1C
# reference required: Referenced RT Plan Sequence for PLAN, MULTI_PLAN, FRACTION, BEAM, BRACHY and their
# _SESSION values and CONTROL_POINT (the plan the dose was calculated for), Referenced Treatment Record
# Sequence for RECORD. A prediction is calculated for no plan, so it names none and takes a term of its own
# (Defined Terms may be extended): its 1C conditions hold, and no reader mistakes it for a plan's dose.
DOSE_SUMMATION_TYPE = "PREDICTED"


@dataclasses.dataclass
class DoseGrid:
    dose: np.ndarray  # (frames, rows, columns) float32 Gy
    x: np.ndarray  # (columns,) mm
    y: np.ndarray  # (rows,) mm
    z: np.ndarray  # (frames,) mm


def written_here(dataset) -> bool:
    """Whether ``dataset`` is an RT Dose this package wrote (:func:`write_rtdose`): its Manufacturer
    is :data:`MANUFACTURER` (or what an earlier version wrote)."""
    return str(dataset.get("Modality", "")).strip() == "RTDOSE" and \
        str(dataset.get("Manufacturer", "")).strip() in (MANUFACTURER, *EARLIER_MANUFACTURERS)


def software_versions() -> str:
    """An RT Dose's Software Versions: this package and its version."""
    return f"{DISTRIBUTION} {package_version()}"


def read_rtdose(path: os.PathLike | str, frame_of_reference_uid: str) -> DoseGrid:
    """An RT Dose file's dose in Gy and its grid; refused unless it is axial and on the CT's frame."""
    path = Path(path)
    dataset = read_required(path, "RTDOSE", "RTDOSE")
    if str(dataset.get("FrameOfReferenceUID", "")) != frame_of_reference_uid:
        raise DicomInputError(path, f"dose is in frame of reference {dataset.get('FrameOfReferenceUID')}, "
                                    f"not the CT's {frame_of_reference_uid}")
    orientation = np.array(dataset.get("ImageOrientationPatient", []), dtype=np.float64)
    if orientation.shape != (6,) or not np.allclose(orientation, AXIAL, atol=1e-3):
        raise DicomInputError(path, f"ImageOrientationPatient {orientation.round(4).tolist()} is not axial")
    units = str(dataset.get("DoseUnits", "GY")).upper()
    if units not in ("GY", "CGY"):
        raise DicomInputError(path, f"DoseUnits {units!r}; expected GY")
    pixels = pixel_array(dataset, path, "dose")
    pixels = pixels.reshape(int(dataset.get("NumberOfFrames", 1) or 1), int(dataset.Rows), int(dataset.Columns))
    dose = pixels.astype(np.float64) * float(dataset.get("DoseGridScaling", 1.0))
    if units == "CGY":
        dose /= 100.0
    position = np.array(dataset.ImagePositionPatient, dtype=np.float64)
    spacing = np.array(dataset.PixelSpacing, dtype=np.float64)  # between rows, between columns
    offsets = np.array(dataset.get("GridFrameOffsetVector", [0.0]), dtype=np.float64).reshape(-1)
    if offsets.size != dose.shape[0]:
        raise DicomInputError(path, f"GridFrameOffsetVector has {offsets.size} values for {dose.shape[0]} frames")
    z = position[2] + offsets if offsets[0] == 0 else offsets  # relative offsets, or absolute z (both allowed)
    return DoseGrid(dose=dose.astype(np.float32),
                    x=position[0] + spacing[1] * np.arange(dose.shape[2]),
                    y=position[1] + spacing[0] * np.arange(dose.shape[1]),
                    z=z)


def read_rtdoses(paths, frame_of_reference_uid: str, scale: float = 1.0) -> DoseGrid:
    """The sum of several RT Doses on one grid (a plan's per-beam doses), times ``scale`` (the
    fractions of a per-fraction dose); doses on different grids are refused naming both files."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    total = read_rtdose(paths[0], frame_of_reference_uid)
    dose = total.dose.astype(np.float64)
    for path in paths[1:]:
        grid = read_rtdose(path, frame_of_reference_uid)
        if grid.dose.shape != dose.shape or not all(np.allclose(a, b, atol=1e-3) for a, b in
                                                    ((grid.x, total.x), (grid.y, total.y), (grid.z, total.z))):
            raise DicomInputError(path, f"dose grid differs from that of {Path(paths[0]).name}; doses to be summed "
                                        f"must share one grid")
        dose += grid.dose
    if len(paths) == 1 and scale == 1.0:
        return total
    return DoseGrid((dose * scale).astype(np.float32), total.x, total.y, total.z)


def _linear_at(source: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``(points, source)`` weights of linear interpolation at ``points`` along an evenly spaced
    coordinate axis; zero rows for points outside it."""
    if source.size == 1:
        weights = np.zeros((points.size, 1))
        weights[np.abs(points - source[0]) < 1e-3, 0] = 1.0
        return weights
    position = (points - source[0]) / (source[1] - source[0])
    inside = (position > -1e-6) & (position < source.size - 1 + 1e-6)
    return linear_matrix(position, source.size, inside)


def sample_dose(grid: DoseGrid, y: np.ndarray, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Trilinear dose (Gy) at every (y[i], x[j], z[k]): a ``(len(y), len(x), len(z))`` float32
    array, zero outside the dose grid."""
    along_z = Taps.from_matrix(_linear_at(grid.z, np.asarray(z, dtype=np.float64)))
    in_plane = PlaneTaps.from_matrices(_linear_at(grid.y, np.asarray(y, dtype=np.float64)),
                                       _linear_at(grid.x, np.asarray(x, dtype=np.float64)))
    out = np.zeros((len(y), len(x), len(z)), np.float32)
    for k in range(len(z)):  # one output plane at a time: two dose frames, then rows, then columns
        taps = np.flatnonzero(along_z.weight[k])
        if not taps.size:
            continue  # outside the dose grid
        frame = sum(along_z.weight[k, t] * grid.dose[along_z.index[k, t]].astype(np.float64) for t in taps)
        out[:, :, k] = in_plane.apply(frame)
    return out


def dose_at_ct_voxels(grid: DoseGrid, geometry, voxels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Trilinear dose (Gy, float32) at CT voxels: ``voxels`` maps a name to flat indices into the
    CT's grid ``(slices in geometry.slice_z's order, rows, columns)`` of a
    :class:`~provided_code.dicom.grid.PatientGeometry`; zero outside the dose grid. Only the CT
    slices that hold such voxels are sampled."""
    plane_size = geometry.rows * geometry.columns
    slice_z = np.asarray(geometry.slice_z, dtype=np.float64)
    y, x = geometry.ct_y(), geometry.ct_x()
    wanted = np.unique(np.concatenate([np.zeros(0, np.int64), *(v // plane_size for v in voxels.values())]))
    sampled = sample_dose(grid, y, x, slice_z[wanted])  # (rows, columns, wanted slices), one set of weights
    return {name: sampled[(flat % plane_size) // geometry.columns, flat % geometry.columns,
                          np.searchsorted(wanted, flat // plane_size)]
            for name, flat in voxels.items()}


def write_rtdose(path: os.PathLike | str, dose: np.ndarray, geometry, description: str = "Predicted dose",
                 comment: str | None = None) -> Path:
    """Write ``dose`` (``(slices, rows, columns)`` Gy on the CT's grid, slices in the order of
    ``geometry.slice_z``, descending) as an RT Dose on the CT of ``geometry`` (a
    :class:`~provided_code.dicom.grid.PatientGeometry`), atomically. Its series description is
    ``description``, its Dose Comment ``comment`` (a warning about the dose) or, without one, the same."""
    pydicom = require_pydicom()
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, PYDICOM_IMPLEMENTATION_UID, RTDoseStorage, generate_uid

    dose = np.asarray(dose, dtype=np.float64)
    slice_z = np.asarray(geometry.slice_z, dtype=np.float64)
    expected = (len(slice_z), geometry.rows, geometry.columns)
    if dose.shape != expected:
        raise ValueError(f"Invalid `dose`. Expected shape {expected}. Received: dose.shape={dose.shape}")
    if not np.all(np.isfinite(dose)) or dose.min() < 0:
        raise ValueError("Invalid `dose`. Expected finite, non-negative values. Received: NaN, infinity or < 0")
    frames = dose[::-1]  # ascending z
    z = slice_z[::-1]
    # DoseGridScaling is a decimal string of at most 16 characters: quantise with the value it reads back as.
    top = float(frames.max())
    scaling = float(f"{top / MAX_PIXEL:.8e}") if top > 0 else 1.0
    while top > 0 and np.round(top / scaling) > MAX_PIXEL:
        scaling = float(f"{scaling * 1.0000001:.8e}")
    pixels = np.round(frames / scaling).astype(np.uint32)

    now = datetime.datetime.now()
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = RTDoseStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = RTDoseStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.SpecificCharacterSet = "ISO_IR 192"
    for tag, value in geometry.tags.items():  # patient and study modules, as the CT has them
        setattr(ds, tag, value)
    ds.Modality = "RTDOSE"
    ds.Manufacturer = MANUFACTURER
    ds.ManufacturerModelName = MODEL_NAME
    ds.SoftwareVersions = software_versions()
    ds.SeriesInstanceUID = generate_uid()
    ds.SeriesNumber = 9001
    ds.OperatorsName = ""  # RT Series, Type 2: no one operated anything; present, empty
    ds.SeriesDescription = description[:64]
    ds.InstanceNumber = 1
    ds.ContentDate = now.strftime("%Y%m%d")
    ds.ContentTime = now.strftime("%H%M%S")
    ds.InstanceCreationDate, ds.InstanceCreationTime = ds.ContentDate, ds.ContentTime
    ds.FrameOfReferenceUID = geometry.frame_of_reference_uid
    ds.PositionReferenceIndicator = ""
    ds.ImagePositionPatient = [f"{geometry.origin_xy[0]:.6g}", f"{geometry.origin_xy[1]:.6g}", f"{z[0]:.6g}"]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.PixelSpacing = [f"{geometry.pixel_spacing[0]:.10g}", f"{geometry.pixel_spacing[1]:.10g}"]
    ds.SliceThickness = f"{geometry.slice_spacing:.6g}"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.NumberOfFrames = len(z)
    ds.FrameIncrementPointer = pydicom.tag.Tag("GridFrameOffsetVector")
    ds.Rows, ds.Columns = geometry.rows, geometry.columns
    ds.BitsAllocated = ds.BitsStored = 32
    ds.HighBit = 31
    ds.PixelRepresentation = 0
    ds.DoseUnits = "GY"
    ds.DoseType = "PHYSICAL"
    ds.DoseComment = (description if comment is None else comment)[:64]
    ds.DoseSummationType = DOSE_SUMMATION_TYPE
    ds.GridFrameOffsetVector = [f"{value:.6g}" for value in z - z[0]]
    ds.DoseGridScaling = f"{scaling:.8e}"
    ds.PixelData = pixels.tobytes()
    path = Path(path)
    with atomic_path(path, suffix=".dcm") as tmp:
        ds.save_as(tmp, enforce_file_format=True)
    return path
