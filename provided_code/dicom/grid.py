"""The box inside a CT (the site's grid: OpenKBP's 128³), and the resampling between the two grids.

OpenKBP's volumes are a supine axial CT's own axes: axis 0 the image rows (patient y, anterior to
posterior), axis 1 the columns (patient x, right to left), axis 2 the slices from superior to
inferior (descending patient z). In-plane the box spans the CT's whole field of view in 128 × 128
pixels (a 512-matrix CT at 0.98 mm gives 3.9 mm, as OpenKBP's 50 cm field of view does); along
the slice axis it keeps the CT's spacing and takes 128 consecutive slices, padded with air beyond
the scan. (128: a site's ``grid.shape``, which the import records in the sidecar as ``box_shape``.)

The geometry, and everything the export needs to write a dose back onto the CT, is saved in the
patient folder as ``dicom.json`` (:class:`PatientGeometry`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from provided_code.data.resample import linear_taps, sample_centres
from provided_code.dicom.errors import DicomInputError
from provided_code.infra.atomic import write_text_atomic
from provided_code.constants import VOLUME_SHAPE

SIDECAR_FILE = "dicom.json"
SIDECAR_FORMAT = 1
BOX = VOLUME_SHAPE[0]  # 128: OpenKBP's grid along every axis, what a sidecar without box_shape means


def area_weights(source: int, target: int) -> np.ndarray:
    """``(target, source)`` weights averaging pixels over the same field of view: target pixel i
    covers source pixels [i·s/t, (i+1)·s/t), each weighted by its overlap (rows sum to 1)."""
    edges = np.arange(target + 1) * (source / target)
    low, high = edges[:-1, None], edges[1:, None]
    pixel = np.arange(source)[None, :]
    overlap = np.clip(np.minimum(high, pixel + 1) - np.maximum(low, pixel), 0, None)
    return overlap / overlap.sum(axis=1, keepdims=True)


def linear_weights(source: int, target: int) -> np.ndarray:
    """``(target, source)`` weights of linear interpolation between pixel centres over the same
    field of view (beyond the outermost source centres, the edge value)."""
    return linear_matrix(sample_centres(source, target), source)


def linear_matrix(positions: np.ndarray, size: int, inside: np.ndarray | None = None) -> np.ndarray:
    """``(len(positions), size)`` weights of linear interpolation at fractional indices
    ``positions`` (:func:`~provided_code.data.resample.linear_taps`); rows where ``inside`` is
    false are zero."""
    rows = np.arange(len(positions)) if inside is None else np.flatnonzero(inside)
    low, high, fraction = linear_taps(np.asarray(positions, dtype=np.float64)[rows], size)
    weights = np.zeros((len(positions), size))
    np.add.at(weights, (rows, low), 1 - fraction)
    np.add.at(weights, (rows, high), fraction)
    return weights


@dataclasses.dataclass(frozen=True)
class Taps:
    """A ``(target, source)`` weight matrix with few non-zero weights per row (an area average or a
    linear interpolation), kept as ``index`` and ``weight`` arrays of shape ``(target, width)``.

    :meth:`apply` resamples along one axis by gathers and weighted sums in numpy, not by a matrix
    product: on a busy machine BLAS threads wait for each other (a 512 × 512 × 168 import took
    51 s with two BLAS threads, 16 s with one), and a handful of taps per row needs no BLAS.
    """

    index: np.ndarray  # (target, width) int64: source indices (unused taps: weight 0)
    weight: np.ndarray  # (target, width) float64

    @classmethod
    def from_matrix(cls, matrix: np.ndarray) -> "Taps":
        matrix = np.asarray(matrix, dtype=np.float64)
        nonzero = matrix != 0
        width = max(int(nonzero.sum(axis=1).max(initial=0)), 1)
        index = np.argsort(~nonzero, axis=1, kind="stable")[:, :width]  # the non-zero columns first, in order
        return cls(index, np.take_along_axis(matrix, index, axis=1))

    def apply(self, array: np.ndarray, axis: int) -> np.ndarray:
        """``array`` resampled along ``axis`` (float64): ``matrix @ array`` along that axis."""
        array = np.asarray(array)
        shape = [1] * array.ndim
        shape[axis] = -1
        out = None
        for k in range(self.index.shape[1]):
            term = np.take(array, self.index[:, k], axis=axis) * self.weight[:, k].reshape(shape)
            out = term if out is None else out + term
        return out


@dataclasses.dataclass(frozen=True)
class PlaneTaps:
    """A plane resampled along its rows (axis 0), then along its columns (axis 1): the separable
    resampling of every plane between the CT's grid and the box's, either way."""

    rows: Taps
    columns: Taps

    @classmethod
    def from_matrices(cls, rows: np.ndarray, columns: np.ndarray) -> "PlaneTaps":
        return cls(Taps.from_matrix(rows), Taps.from_matrix(columns))

    def apply(self, plane: np.ndarray) -> np.ndarray:
        """``rows @ plane @ columns.T`` (float64), by gathers."""
        return self.columns.apply(self.rows.apply(plane, axis=0), axis=1)


@dataclasses.dataclass
class PatientGeometry:
    """The CT's grid, the box inside it, and the CT's identity (for the export)."""

    rows: int
    columns: int
    pixel_spacing: list[float]  # mm: between rows, between columns (DICOM order)
    origin_xy: list[float]  # mm: patient x, y of the centre of CT pixel (row 0, column 0)
    slice_z: list[float]  # mm: every CT slice's z, descending (superior first)
    first_slice: int  # index into slice_z of box slice 0 (negative: box starts above the scan)
    frame_of_reference_uid: str
    series_instance_uid: str
    sop_instance_uids: list[str]  # per CT slice, in slice_z's order
    tags: dict[str, str]  # patient and study tags of the CT
    structures: dict[str, str] = dataclasses.field(default_factory=dict)  # structure -> ROI name
    possible_dose_mask: str = ""  # how the possible-dose mask was made
    hu_offset: float = 1000.0  # ct.csv value = HU + hu_offset, clipped to [0, 4095]
    format: int = SIDECAR_FORMAT
    site: str = dataclasses.field(kw_only=True)  # the site whose structures and grid the import used
    box_shape: list[int] = dataclasses.field(default_factory=lambda: [BOX, BOX, BOX])  # the site's grid.shape

    @property
    def slice_spacing(self) -> float:
        return float(self.slice_z[0] - self.slice_z[1])

    @property
    def voxel_dimensions(self) -> np.ndarray:
        """mm along OpenKBP's axes 0, 1, 2 (rows, columns, slices)."""
        return np.array([self.rows * self.pixel_spacing[0] / self.box_shape[0],
                         self.columns * self.pixel_spacing[1] / self.box_shape[1], self.slice_spacing])

    def box_y(self) -> np.ndarray:
        """Patient y (mm) of the box's rows."""
        box = self.box_shape[0]
        return self.origin_xy[1] + ((np.arange(box) + 0.5) * self.rows / box - 0.5) * self.pixel_spacing[0]

    def box_x(self) -> np.ndarray:
        """Patient x (mm) of the box's columns."""
        box = self.box_shape[1]
        return self.origin_xy[0] + ((np.arange(box) + 0.5) * self.columns / box - 0.5) * self.pixel_spacing[1]

    def box_z(self) -> np.ndarray:
        """Patient z (mm) of the box's slices (descending; extrapolated where padded)."""
        return self.slice_z[0] - (self.first_slice + np.arange(self.box_shape[2])) * self.slice_spacing

    def ct_y(self) -> np.ndarray:
        """Patient y (mm) of the CT's rows."""
        return self.origin_xy[1] + np.arange(self.rows) * self.pixel_spacing[0]

    def ct_x(self) -> np.ndarray:
        """Patient x (mm) of the CT's columns."""
        return self.origin_xy[0] + np.arange(self.columns) * self.pixel_spacing[1]

    def box_slices(self) -> tuple[np.ndarray, np.ndarray]:
        """(box slice indices, CT slice indices) of the slices both have."""
        ct = self.first_slice + np.arange(self.box_shape[2])
        inside = (ct >= 0) & (ct < len(self.slice_z))
        return np.flatnonzero(inside), ct[inside]

    def write(self, folder: os.PathLike | str) -> Path:
        path = Path(folder) / SIDECAR_FILE
        write_text_atomic(path, json.dumps(dataclasses.asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, folder: os.PathLike | str) -> "PatientGeometry":
        path = Path(folder) / SIDECAR_FILE
        if not path.is_file():
            raise DicomInputError(path, "no DICOM sidecar: export needs a patient folder made by "
                                        "'openkbp-dicom import'")
        try:
            fields = json.loads(path.read_text())
            if isinstance(fields, dict):
                fields.setdefault("site", "openkbp")  # a sidecar written before sites: an OpenKBP import
            geometry = cls(**fields)
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as error:
            raise DicomInputError(path, f"sidecar is unreadable ({error})") from None
        if geometry.format != SIDECAR_FORMAT:
            raise DicomInputError(path, f"sidecar format {geometry.format}, expected {SIDECAR_FORMAT}")
        return geometry


def choose_first_slice(slices: int, centre: float | None, box: int = BOX) -> int:
    """Box slice 0's CT slice: the box of ``box`` slices centred on ``centre`` (a fractional CT
    slice index, None for the scan's middle), moved to lie inside the scan where the scan has
    ``box`` slices or more, and to hold the whole scan where it has fewer."""
    if centre is None:
        centre = (slices - 1) / 2
    first = int(round(centre - (box - 1) / 2))
    if slices >= box:
        return int(np.clip(first, 0, slices - box))
    return int(np.clip(first, slices - box, 0))
