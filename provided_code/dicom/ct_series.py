"""One CT series from a folder of DICOM files, ordered and checked, in Hounsfield units.

The folder may also hold other objects of the same patient (RTSTRUCT, RTDOSE, RTPLAN, as clinics
export them together): they are left out. A file that is not DICOM is left out with a warning,
unless nothing in the folder is DICOM. Refused, each with one line naming a file and the problem:
no CT image, CT images of two series, slices of different size, spacing or in-plane position, an
orientation other than axial head-first supine (``ImageOrientationPatient`` ``[1, 0, 0, 0, 1, 0]``;
feet-first supine is ``[-1, 0, 0, 0, 1, 0]`` and refused too), two slices at one position, uneven
slice spacing (a missing slice), and compressed pixels without an installed decoder.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np

from provided_code.dicom.errors import DicomInputError
from provided_code.dicom.files import pixel_array, read_dataset

logger = logging.getLogger(__name__)

AXIAL = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
# Copied into the sidecar and from there into an exported RT Dose (patient and study modules).
PATIENT_STUDY_TAGS = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyInstanceUID",
                      "StudyDate", "StudyTime", "StudyID", "StudyDescription", "AccessionNumber",
                      "ReferringPhysicianName")
# Those of them that name or date the patient or the visit (a cohort import blanks them, the name and
# ID becoming the pseudonym); the StudyInstanceUID stays, as the sidecar's other UIDs do.
IDENTIFYING_TAGS = frozenset(PATIENT_STUDY_TAGS) - {"StudyInstanceUID"}


@dataclasses.dataclass
class CTSeries:
    hu: np.ndarray  # (slices, rows, columns) float32 HU; slices superior first (descending z)
    slice_z: np.ndarray  # (slices,) mm, patient z of each slice, descending
    origin_xy: np.ndarray  # (2,) mm, patient x and y of the centre of pixel (row 0, column 0)
    pixel_spacing: np.ndarray  # (2,) mm: between rows (along y), between columns (along x)
    files: list[str]  # per slice
    sop_instance_uids: list[str]  # per slice
    series_instance_uid: str
    frame_of_reference_uid: str
    tags: dict[str, str]  # PATIENT_STUDY_TAGS as text ('' where absent)

    @property
    def slice_spacing(self) -> float:
        return float(self.slice_z[0] - self.slice_z[1]) if len(self.slice_z) > 1 else 0.0


def _text(value) -> str:
    return "" if value is None else str(value)


def scan_folder(folder: os.PathLike | str | list, stop_before_pixels: bool = True) -> list[tuple[Path, object]]:
    """Every DICOM file below ``folder`` with its header (no pixels), sorted by path; ``folder`` may
    also be a list of files (a series found in an archive)."""
    if isinstance(folder, (list, tuple)):
        paths = sorted(Path(p) for p in folder)
        folder = paths[0].parent if paths else Path(".")
    else:
        folder = Path(folder)
        if not folder.is_dir():
            raise DicomInputError(folder, "CT folder does not exist or is not a folder")
        paths = sorted(p for p in folder.rglob("*") if p.is_file())
    if not paths:
        raise DicomInputError(folder, "CT folder is empty")
    headers, not_dicom = [], []
    for path in paths:
        header = read_dataset(path, stop_before_pixels=stop_before_pixels)
        if header is None:
            not_dicom.append(path)
        else:
            headers.append((path, header))
    if not headers:
        raise DicomInputError(folder, f"no DICOM file among its {len(paths)} files (e.g. {paths[0].name} is not DICOM)")
    if not_dicom:
        logger.warning("Left out %d files of %s that are not DICOM: %s", len(not_dicom), folder,
                       ", ".join(p.name for p in not_dicom[:5]) + (" ..." if len(not_dicom) > 5 else ""))
    return headers


def read_ct_series(folder: os.PathLike | str | list) -> CTSeries:
    """The CT series in ``folder``, or of a list of files (see the module docstring for what is
    refused). The files of a list (a series an archive's scan found: CT images only) are read once,
    pixels included; a folder's are read for their headers first (it may hold other objects)."""
    headers = scan_folder(folder, stop_before_pixels=not isinstance(folder, (list, tuple)))
    from pydicom.uid import CTImageStorage  # (pydicom is there: scan_folder read the headers)

    folder = Path(folder) if not isinstance(folder, (list, tuple)) else Path(folder[0]).parent
    images = [(p, h) for p, h in headers
              if _text(h.get("SOPClassUID")) == CTImageStorage or (_text(h.get("Modality")) == "CT" and "Rows" in h)]
    if not images:
        kinds = sorted({_text(h.get("Modality")) or "?" for _, h in headers})
        raise DicomInputError(folder, f"no CT image among its DICOM files (found modality {', '.join(kinds)})")
    by_series: dict[str, list] = {}
    for path, header in images:
        by_series.setdefault(_text(header.get("SeriesInstanceUID")), []).append((path, header))
    if len(by_series) > 1:
        parts = [f"{uid or '(none)'} ({len(items)} files, e.g. {items[0][0].name})" for uid, items in by_series.items()]
        raise DicomInputError(folder, f"holds {len(by_series)} CT series: {'; '.join(parts)}; "
                                      f"give one series per folder")
    return _assemble(images)


def _assemble(images) -> CTSeries:
    first_path, first = images[0]
    for path, header in images:
        for tag in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing", "Rows", "Columns"):
            if header.get(tag) is None:
                raise DicomInputError(path, f"CT slice has no {tag}")
        orientation = np.array(header.ImageOrientationPatient, dtype=np.float64)
        if orientation.shape != (6,) or not np.allclose(orientation, AXIAL, atol=1e-3):
            raise DicomInputError(path, f"ImageOrientationPatient {orientation.round(4).tolist()} is not axial "
                                        f"[1, 0, 0, 0, 1, 0] (supine); other orientations are not supported")
        for tag in ("Rows", "Columns"):
            if header.get(tag) != first.get(tag):
                raise DicomInputError(path, f"{tag} {header.get(tag)} differs from {first.get(tag)} "
                                            f"in {first_path.name}")
        if not np.allclose(np.array(header.PixelSpacing, float), np.array(first.PixelSpacing, float), atol=1e-4):
            raise DicomInputError(path, f"PixelSpacing {list(header.PixelSpacing)} differs from "
                                        f"{list(first.PixelSpacing)} in {first_path.name}")
        if not np.allclose(np.array(header.ImagePositionPatient[:2], float),
                           np.array(first.ImagePositionPatient[:2], float), atol=1e-2):
            raise DicomInputError(path, f"in-plane position {list(header.ImagePositionPatient[:2])} differs from "
                                        f"{list(first.ImagePositionPatient[:2])} in {first_path.name} "
                                        f"(a tilted or mixed series)")
    z = np.array([float(h.ImagePositionPatient[2]) for _, h in images])
    order = np.argsort(-z, kind="stable")  # superior first, as OpenKBP's slice axis runs
    images = [images[i] for i in order]
    z = z[order]
    _check_spacing(z, [p for p, _ in images])

    rows, columns = int(first.Rows), int(first.Columns)
    hu = np.empty((len(images), rows, columns), np.float32)
    for k, (path, header) in enumerate(images):
        dataset = header if "PixelData" in header else read_dataset(path)
        if dataset is None:
            raise DicomInputError(path, "CT slice became unreadable while the series was read")
        pixels = pixel_array(dataset, path, "CT")
        if pixels.shape != (rows, columns):
            raise DicomInputError(path, f"pixel data of shape {pixels.shape}, expected {(rows, columns)}")
        slope = float(dataset.get("RescaleSlope", 1.0) or 1.0)
        intercept = float(dataset.get("RescaleIntercept", 0.0) or 0.0)
        hu[k] = pixels.astype(np.float32) * np.float32(slope) + np.float32(intercept)

    spacing = np.array(first.PixelSpacing, dtype=np.float64)  # DICOM order: row spacing, column spacing
    if np.any(spacing <= 0):
        raise DicomInputError(first_path, f"PixelSpacing {spacing.tolist()} is not positive")
    for_uid = _text(first.get("FrameOfReferenceUID"))
    if not for_uid:
        raise DicomInputError(first_path, "CT slice has no FrameOfReferenceUID")
    return CTSeries(
        hu=hu,
        slice_z=z,
        origin_xy=np.array(first.ImagePositionPatient[:2], dtype=np.float64),
        pixel_spacing=spacing,
        files=[str(p) for p, _ in images],
        sop_instance_uids=[_text(h.get("SOPInstanceUID")) for _, h in images],
        series_instance_uid=_text(first.get("SeriesInstanceUID")),
        frame_of_reference_uid=for_uid,
        tags={tag: _text(first.get(tag)) for tag in PATIENT_STUDY_TAGS},
    )


def _check_spacing(z: np.ndarray, paths: list[Path]) -> None:
    """Equal steps between the (descending) slice positions; names the two files around a gap."""
    if len(z) < 2:
        raise DicomInputError(paths[0].parent, f"the CT series has {len(z)} slice; a volume needs several")
    steps = z[:-1] - z[1:]
    same = np.flatnonzero(steps < 1e-3)
    if same.size:
        k = int(same[0])
        raise DicomInputError(paths[k + 1], f"two CT slices at z = {z[k]:g} mm "
                                            f"({paths[k].name} and {paths[k + 1].name})")
    spacing = float(np.median(steps))
    uneven = np.flatnonzero(np.abs(steps - spacing) > max(0.01 * spacing, 1e-3))
    if uneven.size:
        k = int(uneven[0])
        ratio = steps[k] / spacing
        what = (f"{int(round(ratio)) - 1} missing slice(s)" if abs(ratio - round(ratio)) < 0.02 and ratio > 1.5
                else "uneven slice spacing")
        raise DicomInputError(paths[k + 1], f"{what}: slices at z = {z[k]:g} and {z[k + 1]:g} mm are {steps[k]:g} mm "
                                            f"apart ({paths[k].name}, {paths[k + 1].name}), the series' spacing is "
                                            f"{spacing:g} mm")
