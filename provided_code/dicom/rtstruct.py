"""An RTSTRUCT's ROIs: names, contours on the CT's slices, and the polygon fill that makes masks;
and what a structure set names of its CT (:func:`structure_set_references`: the one reading of
its references, which the import, the archive's linking and the DICOM node ask).

A closed planar contour is filled by the even-odd rule at pixel centres; all contours of an ROI on
one slice are filled together, so a contour inside another is a hole (as planning systems draw
them). Open contours, points and contours of fewer than three points are left out, and counted for
the import's warnings (:attr:`StructureSet.left_out`). Only the ROIs asked for are parsed. CT
slices without contours between two slices with contours of one ROI, up to
:data:`MAX_FILLED_GAP_MM` apart, take the nearer slice's contours (:func:`fill_slice_gaps`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from provided_code.dicom.errors import DicomInputError
from provided_code.dicom.files import read_required


CONTOUR_DATA = 0x30060050
# The longest run of CT slices without contours inside an ROI that is filled from its neighbours (mm,
# from the last contoured slice before it to the first after it, less one slice): a slice or two left
# out (an ROI contoured on every second or third slice, a slice forgotten) is filled; a longer gap is
# taken for two parts of one ROI (nodal levels drawn apart) and stays empty.
MAX_FILLED_GAP_MM = 10.0


@dataclasses.dataclass(frozen=True)
class References:
    """What a structure set names of the images it was drawn on, each in the order first named,
    each once."""

    frame_uid: str  # the frame of reference the contours are in, the first named ('' when it names none)
    series_uids: tuple[str, ...]  # the image series it names (usually one)
    images: tuple[str, ...]  # SOP Instance UIDs of the images it names
    frame_uids: tuple[str, ...] = ()  # every frame of reference it names (usually one: frame_uid)


def _text(value) -> str:
    return "" if value is None else str(value).strip()


def structure_set_references(dataset, contour_images: bool = True) -> References:
    """The frames of reference, image series and images an RTSTRUCT dataset names:
    ``ReferencedFrameOfReferenceSequence`` (its ``FrameOfReferenceUID`` and, below
    ``RTReferencedStudySequence > RTReferencedSeriesSequence``, each series and its
    ``ContourImageSequence``), each contour's ``ContourImageSequence``, and each ROI's
    ``ReferencedFrameOfReferenceUID`` (after those of the sequence). Without ``contour_images``
    the contours are not looked through (the images of the first place only); a dataset read
    without its contours (an archive's header scan) has none to look through."""
    frames, series, images = [], [], []
    for frame in dataset.get("ReferencedFrameOfReferenceSequence", None) or []:
        frames.append(_text(frame.get("FrameOfReferenceUID")))
        for study in frame.get("RTReferencedStudySequence", None) or []:
            for item in study.get("RTReferencedSeriesSequence", None) or []:
                series.append(_text(item.get("SeriesInstanceUID")))
                images += [_text(image.get("ReferencedSOPInstanceUID"))
                           for image in item.get("ContourImageSequence", None) or []]
    for roi in (dataset.get("ROIContourSequence", None) or []) if contour_images else []:
        for contour in roi.get("ContourSequence", None) or []:
            images += [_text(image.get("ReferencedSOPInstanceUID"))
                       for image in contour.get("ContourImageSequence", None) or []]
    frames += [_text(roi.get("ReferencedFrameOfReferenceUID"))
               for roi in dataset.get("StructureSetROISequence", None) or []]

    def once(values):
        return tuple(dict.fromkeys(v for v in values if v))

    frames = once(frames)
    return References(frames[0] if frames else "", once(series), once(images), frames)


@dataclasses.dataclass
class StructureSet:
    """An RTSTRUCT's ROI names; each ROI's contours are read when asked for (:meth:`contours`), so
    that a malformed contour in an ROI the import does not use (a couch, a marker) is never seen."""

    path: Path
    roi_names: list[str]  # in the file's order
    # ROI name -> its ROIContourSequence items, parsed by contours()
    items: dict[str, list] = dataclasses.field(default_factory=dict, repr=False)
    # ROI name -> the contours contours() left out of it: (fewer than three points, open or point), where any
    left_out: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict, repr=False)

    def contours(self, name: str) -> list[np.ndarray]:
        """The closed planar contours of ROI ``name``, each ``(points, 3)`` mm (x, y, z). Open
        contours, points, and contours of fewer than three points (rt-utils writes one for every
        isolated pixel) are left out, counted in :attr:`left_out` (:func:`left_out_text` says it)."""
        contours, open_or_points, short = [], 0, 0
        for item in self.items.get(name, []):
            for contour in item.get("ContourSequence", []):
                if contour.get("ContourGeometricType", "CLOSED_PLANAR") != "CLOSED_PLANAR":
                    open_or_points += 1
                    continue
                points = _contour_data(contour, name, self.path)
                if points.size % 3:
                    raise DicomInputError(self.path, f"ROI {name!r} has a contour of {points.size} coordinates "
                                                     f"(not 3 per point)")
                if points.size < 9:
                    short += 1
                    continue
                contours.append(points.reshape(-1, 3))
        if open_or_points or short:
            self.left_out[name] = (short, open_or_points)
        return contours


def left_out_text(short: int, open_or_points: int) -> str:
    """What :meth:`StructureSet.contours` left out of an ROI, in words."""
    parts = [f"{short} contour(s) of fewer than three points" if short else "",
             f"{open_or_points} open or point contour(s)" if open_or_points else ""]
    return "left out " + " and ".join(part for part in parts if part)


def _contour_data(contour, name: str, path: Path) -> np.ndarray:
    """A contour's ContourData as float64, parsed from the file's text directly (pydicom's
    per-value conversion took most of the RTSTRUCT's reading time)."""
    element = contour.get_item(CONTOUR_DATA)
    if element is None:
        return np.zeros(0)
    value = element.value
    try:
        if isinstance(value, bytes):
            text = value.decode("ascii").strip(" \0")
            return np.array(text.split("\\"), dtype=np.float64) if text else np.zeros(0)
        return np.asarray([] if value is None else value, dtype=np.float64).reshape(-1)
    except (ValueError, UnicodeDecodeError):
        raise DicomInputError(path, f"ROI {name!r} has a contour whose ContourData is not numbers") from None


def read_rtstruct(path: os.PathLike | str, frame_of_reference_uid: str) -> StructureSet:
    """The ROIs of an RTSTRUCT drawn on the CT whose frame of reference is given."""
    path = Path(path)
    dataset = read_required(path, "RTSTRUCT", "RTSTRUCT")
    if "StructureSetROISequence" not in dataset:
        raise DicomInputError(path, "RTSTRUCT has no StructureSetROISequence")
    frames = structure_set_references(dataset, contour_images=False).frame_uids
    if frames and frame_of_reference_uid not in frames:
        raise DicomInputError(path, f"contours are in frame of reference {', '.join(sorted(frames))}, "
                                    f"not the CT's {frame_of_reference_uid}")
    names = {int(item.ROINumber): str(item.ROIName).strip() for item in dataset.StructureSetROISequence}
    items: dict[str, list] = {name: [] for name in names.values()}
    for item in dataset.get("ROIContourSequence", []):
        name = names.get(int(item.ReferencedROINumber))
        if name is not None:
            items[name].append(item)
    return StructureSet(path, list(names.values()), items)


def contours_by_slice(contours: list[np.ndarray], slice_z: np.ndarray, name: str,
                      path: Path) -> dict[int, list[np.ndarray]]:
    """CT slice index (of descending ``slice_z``) -> the contours (x, y in mm) drawn on it. A contour
    that is not planar, or lies off every slice, is an error naming the ROI."""
    spacing = float(slice_z[0] - slice_z[1])
    planes: dict[int, list[np.ndarray]] = {}
    for points in contours:
        z = points[:, 2]
        if np.ptp(z) > 0.01 * spacing + 1e-3:
            raise DicomInputError(path, f"ROI {name!r} has a contour that is not on one axial plane "
                                        f"(z from {z.min():g} to {z.max():g} mm)")
        k = int(round((slice_z[0] - z.mean()) / spacing))
        if k < 0 or k >= len(slice_z) or abs(slice_z[k] - z.mean()) > 0.25 * spacing:
            raise DicomInputError(path, f"ROI {name!r} has a contour at z = {z.mean():g} mm, on no CT slice "
                                        f"(the CT runs from {slice_z[-1]:g} to {slice_z[0]:g} mm every {spacing:g} mm)")
        planes.setdefault(k, []).append(points[:, :2])
    return planes


@dataclasses.dataclass(frozen=True)
class Gap:
    """A run of CT slices without contours inside an ROI (indices of ``slice_z``, ``first`` to
    ``last``), and whether it was filled from its neighbours."""

    first: int
    last: int
    filled: bool

    @property
    def slices(self) -> int:
        return self.last - self.first + 1


def fill_slice_gaps(planes: dict[int, list[np.ndarray]], slice_spacing: float,
                    max_gap_mm: float = MAX_FILLED_GAP_MM) -> tuple[dict[int, list[np.ndarray]], list[Gap]]:
    """``planes`` (as :func:`contours_by_slice` gives them) with every run of slices without
    contours between two slices with contours, of at most ``max_gap_mm`` (its slices times
    ``slice_spacing``), given the contours of the nearer contoured slice (of the superior one,
    the lower index, when both are as near): a planning system's ROI between its contoured planes.
    Returns the planes, sorted, and every gap, filled or not."""
    slices = sorted(planes)
    filled = {k: planes[k] for k in slices}
    gaps = []
    for above, below in zip(slices, slices[1:]):
        if below - above < 2:
            continue
        fill = (below - above - 1) * abs(slice_spacing) <= max_gap_mm + 1e-6
        gaps.append(Gap(above + 1, below - 1, fill))
        if fill:
            for k in range(above + 1, below):
                filled[k] = planes[above] if k - above <= below - k else planes[below]
    return dict(sorted(filled.items())), gaps


def roi_planes(structure_set: StructureSet, roi: str, slice_z: np.ndarray,
               slice_spacing: float) -> tuple[dict[int, list[np.ndarray]], list[Gap]]:
    """An ROI's contours by CT slice, the slices between its contoured ones filled
    (:func:`contours_by_slice`, then :func:`fill_slice_gaps`): the planes its mask is made of, and
    its gaps."""
    drawn = contours_by_slice(structure_set.contours(roi), slice_z, roi, structure_set.path)
    return fill_slice_gaps(drawn, slice_spacing)


def filled_slice(polygons: list[np.ndarray], geometry) -> np.ndarray:
    """A bool ``(rows, columns)`` mask of the CT pixels inside one slice's contours (mm);
    ``geometry``: the CT's (``origin_xy``, ``pixel_spacing``, ``rows``, ``columns``)."""
    return fill_polygons(pixel_polygons(polygons, geometry.origin_xy, geometry.pixel_spacing),
                         (geometry.rows, geometry.columns))


def pixel_polygons(polygons: list[np.ndarray], origin_xy, pixel_spacing) -> list[np.ndarray]:
    """Contours ``(points, 2)`` in mm (x, y) in a CT's pixel units, (column, row), as
    :func:`fill_polygons` takes them: ``origin_xy`` the centre of pixel (row 0, column 0),
    ``pixel_spacing`` between rows, between columns (DICOM's order)."""
    return [np.stack([(p[:, 0] - origin_xy[0]) / pixel_spacing[1], (p[:, 1] - origin_xy[1]) / pixel_spacing[0]], axis=1)
            for p in polygons]


def fill_polygons(polygons: list[np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """A bool ``(rows, columns)`` mask of the pixel centres inside ``polygons`` by the even-odd rule.

    Each polygon is ``(points, 2)`` in pixel units: (column, row), pixel centres at whole numbers.
    """
    rows, columns = shape
    edges = []
    for polygon in polygons:
        start = np.asarray(polygon, dtype=np.float64)
        edges.append(np.concatenate([start, np.roll(start, -1, axis=0)], axis=1))  # x1, y1, x2, y2
    if not edges:
        return np.zeros(shape, bool)
    x1, y1, x2, y2 = np.concatenate(edges).T
    low, high = np.minimum(y1, y2), np.maximum(y1, y2)
    first = np.ceil(low).astype(np.int64)  # rows r with low <= r < high: a crossing, half-open
    count = np.maximum(np.ceil(high).astype(np.int64) - first, 0)
    edge = np.repeat(np.arange(x1.size), count)
    row = first[edge] + (np.arange(edge.size) - np.repeat(np.cumsum(count) - count, count))
    keep = (row >= 0) & (row < rows)
    edge, row = edge[keep], row[keep]
    x_cross = x1[edge] + (row - y1[edge]) * (x2[edge] - x1[edge]) / (y2[edge] - y1[edge])
    column = np.clip(np.floor(x_cross).astype(np.int64) + 1, 0, columns)  # first centre right of the crossing
    toggles = np.zeros((rows, columns + 1), np.int32)
    np.add.at(toggles, (row, column), 1)
    return (np.cumsum(toggles, axis=1)[:, :columns] & 1).astype(bool)
