"""The clinical DVH table a planning system compares with: on the CT's grid, from an RT Dose and
the RTSTRUCT's contours (``openkbp-dicom predict``'s and ``export``'s ``dvh.csv`` and ``dvh.json``).

Sampling. Plain (``supersample`` 1): each structure's CT voxels whose centres its contours hold
(the import's fill, :func:`provided_code.dicom.rtstruct.fill_polygons`), one dose value at each
voxel centre. Supersampled (``N`` ≥ 2): every CT voxel of the structure's slices split into
N × N × N sub-voxels; in-plane the contours are filled at the sub-voxels' centres, along the slice
axis each slice's contours stand for its slab (one slice thick, centred on the slice: DICOM's
reading of a planar contour, and dicompyler-core's), and the dose is trilinear at every
sub-voxel's centre. A structure of fewer than :data:`SMALL_STRUCTURE_VOXELS` CT voxels (none, when
its contours hold no voxel centre) is supersampled at least :data:`SMALL_STRUCTURE_SUPERSAMPLE`
times: with fewer voxels than that, D99 and D1 fall between its two lowest and two highest voxels.
Either way the metrics are :func:`provided_code.metrics.dvh_table.clinical_dvh_of_values`'s, over
samples of one volume each; a structure's volume is its samples' (cm³).

Slices without contours inside an ROI are filled as the import fills them
(:func:`provided_code.dicom.rtstruct.fill_slice_gaps`). Measured against structures of known
volume in doses of known gradient (``python scripts/dvh_analytic.py``, docs/dicom.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from provided_code.dicom.errors import DicomInputError
from provided_code.errors import ConfigError
from provided_code.dicom.names import BODY
from provided_code.dicom.rtdose import DoseGrid, dose_at_ct_voxels, sample_dose
from provided_code.dicom.rtstruct import fill_polygons, filled_slice, pixel_polygons, read_rtstruct, roi_planes
from provided_code.infra.atomic import write_text_atomic
from provided_code.metrics.dvh_table import CLINICAL_METRICS, clinical_dvh_of_values, dvh_csv_text

# Fewer CT voxels than this: D99 (the 1st percentile) lies between the structure's two lowest voxels
SMALL_STRUCTURE_VOXELS = 100
SMALL_STRUCTURE_SUPERSAMPLE = 4  # sub-voxels per axis for such a structure (64 per voxel)
MAX_SUPERSAMPLE = 8  # 512 samples per voxel: a 500 cm³ target at 1 × 1 × 2.5 mm holds 100 million


def check_supersample(supersample) -> int:
    """``supersample`` as an int; a :class:`~provided_code.errors.ConfigError` unless it is a whole
    number from 1 to :data:`MAX_SUPERSAMPLE`."""
    if isinstance(supersample, bool) or not isinstance(supersample, (int, np.integer)) \
            or not 1 <= supersample <= MAX_SUPERSAMPLE:
        raise ConfigError(f"Invalid `--dvh-supersample`. Expected a whole number from 1 to {MAX_SUPERSAMPLE} "
                          f"(sub-voxels per axis). Received: dvh_supersample={supersample!r}")
    return int(supersample)


def ct_dose_grid(dose_ct: np.ndarray, geometry) -> DoseGrid:
    """A dose on the CT's grid (``(slices, rows, columns)``, slices in ``geometry.slice_z``'s order,
    as ``RD.dcm`` holds it) as a :class:`~provided_code.dicom.rtdose.DoseGrid`."""
    return DoseGrid(dose_ct, geometry.ct_x(), geometry.ct_y(), np.asarray(geometry.slice_z, dtype=np.float64))


def supersampled_doses(planes: dict[int, list[np.ndarray]], geometry, grids: list[DoseGrid],
                       supersample: int) -> list[np.ndarray]:
    """One structure's dose samples (float32 Gy, one per sub-voxel inside it) from each of ``grids``.

    ``planes``: CT slice index (of ``geometry.slice_z``) -> the contours drawn on it, each
    ``(points, 2)`` mm (x, y); ``geometry`` a :class:`~provided_code.dicom.grid.PatientGeometry`.
    The sub-voxels' centres are kept within the CT's outermost voxel centres (a slab's outer half
    at the scan's first or last slice takes that slice's dose, as does a sub-voxel beyond the
    outermost pixel centres): a dose on the CT's grid then has a value at every one of them.
    """
    n = check_supersample(supersample)
    rows, columns = geometry.rows, geometry.columns
    dy, dx = geometry.pixel_spacing
    x0, y0 = geometry.origin_xy
    slice_z = np.asarray(geometry.slice_z, dtype=np.float64)
    dz = geometry.slice_spacing if len(slice_z) > 1 else 0.0
    offsets = (np.arange(n) + 0.5) / n - 0.5  # sub-voxel centres, in voxels from the voxel's centre
    out: list[list[np.ndarray]] = [[] for _ in grids]
    for k in sorted(planes):
        polygons = pixel_polygons(planes[k], geometry.origin_xy, geometry.pixel_spacing)  # (column, row)
        points = np.concatenate(polygons)
        c0, r0 = np.maximum(np.floor(points.min(axis=0)).astype(np.int64), 0)
        c1, r1 = np.minimum(np.ceil(points.max(axis=0)).astype(np.int64), [columns - 1, rows - 1])
        if c1 < c0 or r1 < r0:
            continue  # drawn beside the CT's pixels
        # the window's fine pixel i sits at CT row r0 + (i + 0.5) / n - 0.5, so CT row r is fine (r - r0 + 0.5) n - 0.5
        fine = [np.stack([(p[:, 0] - c0 + 0.5) * n - 0.5, (p[:, 1] - r0 + 0.5) * n - 0.5], axis=1) for p in polygons]
        inside = fill_polygons(fine, (int(r1 - r0 + 1) * n, int(c1 - c0 + 1) * n))
        keep_rows, keep_columns = np.flatnonzero(inside.any(axis=1)), np.flatnonzero(inside.any(axis=0))
        if not keep_rows.size:
            continue
        inside = inside[np.ix_(keep_rows, keep_columns)]
        fine_rows = (r0 + np.repeat(np.arange(r1 - r0 + 1), n) + np.tile(offsets, r1 - r0 + 1)).clip(0, rows - 1)
        fine_columns = (c0 + np.repeat(np.arange(c1 - c0 + 1), n) + np.tile(offsets, c1 - c0 + 1)).clip(0, columns - 1)
        z = (slice_z[k] - offsets * dz).clip(slice_z.min(), slice_z.max())
        for values, grid in zip(out, grids):
            block = sample_dose(grid, y0 + dy * fine_rows[keep_rows], x0 + dx * fine_columns[keep_columns], z)
            values.append(block[inside].reshape(-1))  # (points inside, n sub-planes), flattened
    return [np.concatenate(values) if values else np.zeros(0, np.float32) for values in out]


def dvh_report(geometry, ct_voxels: dict[str, np.ndarray], contours: dict[str, dict[int, list[np.ndarray]]],
               doses: dict[str, np.ndarray | DoseGrid], supersample: int = 1) -> dict:
    """The clinical DVH table of each dose of ``doses``, per structure of ``ct_voxels`` (flat
    indices into the CT's grid, as :class:`~provided_code.dicom.importer.ImportReport` holds them)
    with ``contours`` (its contours by slice, the same report's): the ``dvh.json`` content without
    the model and scores. ``doses``: a name (``predicted``, ``reference``) to a dose on the CT's
    grid (``(slices, rows, columns)``, as ``RD.dcm`` holds it) or a :class:`DoseGrid` (an RT Dose
    as read), sampled trilinearly.

    Structures in the order of ``ct_voxels``; a structure without contours is left out (the module
    docstring says which structures are supersampled, and how).
    """
    n = check_supersample(supersample)
    voxel_cc = float(np.prod(geometry.pixel_spacing)) * geometry.slice_spacing / 1000
    sources = list(doses)
    grids = {source: ct_dose_grid(dose, geometry) if isinstance(dose, np.ndarray) else dose
             for source, dose in doses.items()}
    sampled, volumes = {}, {}
    plain = {key: voxels for key, voxels in ct_voxels.items()
             if n == 1 and voxels.size >= SMALL_STRUCTURE_VOXELS}
    samples: dict[str, dict[str, np.ndarray]] = {}
    for source, dose in doses.items():
        if isinstance(dose, np.ndarray):  # on the CT's grid: the voxels' own values
            samples[source] = {key: dose.reshape(-1)[voxels] for key, voxels in plain.items()}
        else:
            samples[source] = dose_at_ct_voxels(dose, geometry, plain) if plain else {}
    for key, voxels in ct_voxels.items():
        if key in plain:
            volumes[key] = voxels.size * voxel_cc
            continue
        if not contours.get(key):
            continue
        factor = max(n, SMALL_STRUCTURE_SUPERSAMPLE) if voxels.size < SMALL_STRUCTURE_VOXELS else n
        values = supersampled_doses(contours[key], geometry, [grids[s] for s in sources], factor)
        if not values[0].size:
            continue
        sampled[key] = factor
        volumes[key] = values[0].size * voxel_cc / factor ** 3
        for source, dose in zip(sources, values):
            samples[source][key] = dose
    order = [key for key in ct_voxels if key in volumes]
    report = {"metrics": list(CLINICAL_METRICS),
              "grid": {"what": "the CT's voxels, N × N × N sub-voxels of each where supersampled; each structure as "
                               "drawn, its slices without contours filled as the import fills them",
                       "slices": len(geometry.slice_z),
                       "rows": geometry.rows, "columns": geometry.columns,
                       "voxel_mm": [*geometry.pixel_spacing, geometry.slice_spacing], "supersample": n},
              "supersampled": sampled, "volume_cc": {key: volumes[key] for key in order}}
    for source in sources:
        report[source] = clinical_dvh_of_values({key: samples[source][key] for key in order})
    return report


def structures_of_rtstruct(rtstruct: os.PathLike | str, geometry) -> tuple[dict[str, np.ndarray], dict]:
    """The ``ct_voxels`` and ``contours`` of :func:`dvh_report` for the structures an imported
    patient's ``geometry`` (its ``dicom.json``) was matched from, read again from ``rtstruct``
    (the import's RTSTRUCT: its frame of reference, those ROI names), as the import fills them."""
    path = Path(rtstruct)
    structure_set = read_rtstruct(path, geometry.frame_of_reference_uid)
    slice_z = np.asarray(geometry.slice_z, dtype=np.float64)
    plane_size = geometry.rows * geometry.columns
    ct_voxels, contours = {}, {}
    for key, roi in geometry.structures.items():
        if key == BODY:
            continue
        if roi not in structure_set.roi_names:
            raise DicomInputError(path, f"no ROI {roi!r}, which {key} was imported from (ROIs: "
                                        f"{', '.join(structure_set.roi_names)}); give the RTSTRUCT of the import")
        contours[key], _ = roi_planes(structure_set, roi, slice_z, geometry.slice_spacing)
        voxels = [np.zeros(0, np.int64)]
        for k, polygons in contours[key].items():
            voxels.append(k * plane_size + np.flatnonzero(filled_slice(polygons, geometry)))
        ct_voxels[key] = np.concatenate(voxels)
    return ct_voxels, contours


def write_dvh_files(csv_path: os.PathLike | str, json_path: os.PathLike | str, report: dict) -> None:
    """``report`` as JSON at ``json_path``, and as CSV at ``csv_path``: one row per structure, its
    volume and each clinical metric of each dose (``predicted``, its band's ``low`` and ``high`` when
    the report has a ``band``, then ``reference`` when there is one: :func:`~provided_code.metrics.
    dvh_table.dvh_csv_text`)."""
    write_text_atomic(Path(json_path), json.dumps(report, indent=2) + "\n")
    write_text_atomic(Path(csv_path), dvh_csv_text(report, CLINICAL_METRICS))
