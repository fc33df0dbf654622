"""``openkbp-dicom import``: a CT series, an RTSTRUCT and optionally an RTDOSE to one patient folder
in the OpenKBP layout, with the sidecar the export needs, for a site (its structures, the DICOM
names they are matched from, its grid).

- CT: Hounsfield units averaged onto the box's 128 × 128 in-plane grid, then stored as OpenKBP
  stores it, HU + 1000 clipped to [0, 4095] (air 0, water 1000; see the README for how the offset
  was found in the OpenKBP data).
- Structures: only the ROIs matched to a structure of the site (or BODY) are parsed; each one's
  contours filled on the CT's own pixels, averaged onto the 128 × 128 grid and kept where at least
  half of a voxel is inside. Targets are made disjoint as in OpenKBP: a voxel in several targets
  belongs to the one of the highest prescription. The CT-grid pixels of each ROI as drawn are
  returned too (``ImportReport.ct_voxels``: what the clinical DVH table counts), and its contours
  by slice (``ImportReport.contours``: what a supersampled table samples). CT slices without
  contours inside an ROI, in runs of up to ``rtstruct.MAX_FILLED_GAP_MM``, take the nearer
  contoured slice's contours (``rtstruct.fill_slice_gaps``), in the masks and the table alike;
  those slices, and a target on the scan's first or last slice, are warned about.
- Possible-dose mask: the BODY/External outline, else the CT above ``BODY_THRESHOLD_HU``.
- Reference dose (``--rtdose``): trilinear at the box's voxel centres, zero outside the dose grid
  and outside the possible-dose mask, to the challenge's three decimals.

The folder is built beside its destination and moved into place whole, so a failed import leaves
nothing behind; an earlier import at the destination (a folder with a sidecar) is replaced. The
patient it holds is returned too (``ImportReport.patient``, with the values of the text written:
what ``read_patient`` reads back), so that one process predicts without reading it again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from provided_code.infra.atomic import new_folder_beside, replace_folder, write_text_atomic
from provided_code.constants import (CT_FILE, CT_HU_OFFSET, CT_MAX, DOSE_FILE, PATIENT_FILES, POSSIBLE_DOSE_MASK_FILE,
                                     VOXEL_DIMENSIONS_FILE)
from provided_code.data import patient_plan
from provided_code.data.csv_io import Patient, as_volume, decimals_of, write_dose_csv, write_sparse_csv
from provided_code.dicom.ct_series import read_ct_series
from provided_code.dicom.errors import DicomInputError, require_site
from provided_code.dicom.grid import SIDECAR_FILE, PatientGeometry, PlaneTaps, area_weights, choose_first_slice
from provided_code.dicom.names import BODY, describe_matching, load_names, match_rois, missing_targets
from provided_code.dicom.rtdose import DoseGrid, read_rtdoses, sample_dose
from provided_code.dicom.rtstruct import (MAX_FILLED_GAP_MM, Gap, filled_slice, left_out_text, read_rtstruct,
                                          roi_planes)
from provided_code.sites import Site, SiteError, openkbp

logger = logging.getLogger(__name__)

HU_OFFSET = CT_HU_OFFSET  # ct.csv = HU + 1000 (constants.CT_HU_OFFSET)
BODY_THRESHOLD_HU = -400.0  # without a BODY contour, the possible-dose mask is the CT above this
# The range of the OpenKBP patients' voxel sizes (mm); an import for OpenKBP outside it is warned about.
OPENKBP_IN_PLANE_MM = (2.0, 5.5)
OPENKBP_SLICE_MM = (1.5, 3.3)


@dataclasses.dataclass
class ImportReport:
    folder: Path
    geometry: PatientGeometry
    lines: list[str]  # what the user should read: the ROI matching, the mask's source, warnings
    has_dose: bool
    # Structure -> flat indices into the CT's grid (slices in geometry.slice_z's order, rows, columns) of
    # the pixels its contours hold, on every CT slice it is drawn on, each ROI as drawn (targets not
    # made disjoint): what a planning system's DVH counts. The clinical DVH table is computed on these.
    ct_voxels: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    dose_grid: DoseGrid | None = dataclasses.field(default=None, repr=False)  # the clinic's RT Dose, as read
    # The patient the folder holds, exactly as read_patient(folder, require_dose=False, site=site) reads
    # it back (every array, dose_decimals, prescriptions, gantry_angles): the clinic predicts from it.
    patient: Patient | None = dataclasses.field(default=None, repr=False)
    # The site's targets the patient lacks (no ROI, or an ROI without contours): optional ones, and
    # required ones imported with allow_missing_targets. Their masks are empty.
    missing_targets: list[str] = dataclasses.field(default_factory=list)
    # Structure -> CT slice index -> its contours there ((points, 2) mm, x and y), slices without contours
    # inside the ROI filled as its masks are (rtstruct.fill_slice_gaps): what a supersampled DVH table samples.
    contours: dict[str, dict[int, list[np.ndarray]]] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def warnings(self) -> list[str]:
        """The lines of ``lines`` that warn (the structures missing among them), without ``warning: ``."""
        return [line.removeprefix("warning: ") for line in self.lines if line.startswith(("warning: ", "missing: "))]


def import_patient(ct_dir, rtstruct: os.PathLike | str, out: os.PathLike | str,
                   rtdose=None, names: os.PathLike | str | dict | None = None,
                   allow_missing_targets: bool = False, *, site: Site, dose_scale: float = 1.0,
                   patient_tags: Mapping[str, str] | None = None,
                   also_write: Callable[[Path, tuple[str, ...]], None] | None = None) -> ImportReport:
    """Import one patient into the folder ``out`` (see the module docstring) for ``site`` (a
    :class:`~provided_code.sites.Site`).

    For the cohort import: ``ct_dir`` may be a list of the series' files; ``rtdose`` a list of RT
    Doses to sum (a plan's per-beam doses), times ``dose_scale`` (the fractions of a per-fraction
    dose); ``names`` a names table already loaded (of ``site``'s structures); ``patient_tags``
    replace the CT's patient tags in the sidecar (a pseudonym); ``also_write(folder, targets)`` adds
    files to the patient folder before it is moved into place (``targets``: the site's targets the
    patient has, whose prescriptions a plan file may name).

    A patient without one of the site's required targets is refused unless ``allow_missing_targets``;
    one without an optional target is imported, the target's mask empty, with a warning."""
    site = require_site(site)
    _check_file_names(site)
    out = Path(out)
    if out.exists() and not (out / SIDECAR_FILE).is_file() and any(out.iterdir()):
        raise DicomInputError(out, "output folder exists and is not an earlier import; choose a new folder")
    table = names if isinstance(names, dict) else load_names(names, site)
    ct = read_ct_series(ct_dir)
    if patient_tags:
        ct.tags = {**ct.tags, **patient_tags}
    structure_set = read_rtstruct(rtstruct, ct.frame_of_reference_uid)
    mapping = match_rois(structure_set.roi_names, table, structure_set.path)
    lines = describe_matching(mapping, structure_set.roi_names, tuple(table))
    absent = missing_targets(mapping, site)
    required = [target for target in absent if target in site.required_targets]
    if required and not allow_missing_targets:
        needs = ("" if required == absent else
                 f", which requires {', '.join(required)} (optional: {', '.join(t for t in absent if t not in required)})")
        raise DicomInputError(structure_set.path, f"no ROI for {', '.join(absent)} (ROIs: "
                                                  f"{', '.join(structure_set.roi_names)}) of site {site.name}{needs}; "
                                                  f"pass --names to map one, --site if the patient is of another "
                                                  f"site, or --allow-missing-targets")
    dose_grid = read_rtdoses(rtdose, ct.frame_of_reference_uid, dose_scale) if rtdose is not None else None

    planes, gaps = {}, {}
    for key, roi in mapping.items():  # only the mapped ROIs are parsed
        planes[key], gaps[key] = roi_planes(structure_set, roi, ct.slice_z, ct.slice_spacing)
        if roi in structure_set.left_out:
            lines.append(f"warning: {key} ({roi!r}): {left_out_text(*structure_set.left_out[roi])}")
    empty_targets = [key for key in site.targets if key in planes and not planes[key]]
    for target in empty_targets:
        if target in site.required_targets and not allow_missing_targets:
            raise DicomInputError(structure_set.path, f"ROI {mapping[target]!r} ({target}) has no contours")
    lacking = [target for target in site.targets if target in absent or target in empty_targets]
    for target in lacking:
        kind = "optional for" if target not in site.required_targets else "required by"
        what = "no ROI" if target in absent else f"ROI {mapping[target]!r} has no contours"
        lines.append(f"warning: {target}: {what} ({kind} site {site.name}): its mask is empty")
    target_slices = [k for key in site.targets if key in planes for k in planes[key]]
    centre = (min(target_slices) + max(target_slices)) / 2 if target_slices else None
    shape = site.volume_shape
    first = choose_first_slice(len(ct.slice_z), centre, shape[2])
    geometry = PatientGeometry(
        rows=ct.hu.shape[1], columns=ct.hu.shape[2], pixel_spacing=ct.pixel_spacing.tolist(),
        origin_xy=ct.origin_xy.tolist(), slice_z=ct.slice_z.tolist(), first_slice=first,
        frame_of_reference_uid=ct.frame_of_reference_uid, series_instance_uid=ct.series_instance_uid,
        sop_instance_uids=ct.sop_instance_uids, tags=ct.tags, structures=dict(mapping), hu_offset=HU_OFFSET,
        site=site.name, box_shape=list(shape))
    box_slices, ct_slices = geometry.box_slices()
    if target_slices and (min(target_slices) < ct_slices[0] or max(target_slices) > ct_slices[-1]):
        lines.append(f"warning: the targets span {max(target_slices) - min(target_slices) + 1} slices, more than the "
                     f"{shape[2]} of the box; the slices beyond it are left out")
    lines += _check_slices(planes, gaps, mapping, ct.slice_z, site)
    if site.same_as(openkbp()):  # the voxel sizes OpenKBP's patients have; other sites' are not known
        lines += _check_voxel_size(geometry)

    # CT-grid planes to the box's 128 × 128 plane: the area average over the same field of view
    to_box = PlaneTaps.from_matrices(area_weights(geometry.rows, shape[0]), area_weights(geometry.columns, shape[1]))
    volume_ct = np.zeros(shape, np.uint16)  # padded slices: air
    for b, k in zip(box_slices, ct_slices):
        volume_ct[:, :, b] = np.clip(np.rint(to_box.apply(ct.hu[k]) + HU_OFFSET), 0, CT_MAX)
    masks, ct_voxels = {}, {}
    for key in mapping:  # the body's CT pixels are not tabulated: only its box mask is kept
        masks[key], voxels = _fill_roi(planes[key], geometry, to_box, box_slices, ct_slices, ct_pixels=key != BODY)
        if key != BODY:
            ct_voxels[key] = voxels
    # Disjoint targets, as OpenKBP's: a voxel in several is the one's of the highest prescription (PTV70 over
    # PTV63 over PTV56; PTV78 over PTV60); of equal prescriptions, the one listed first in the site.
    by_dose = sorted(site.targets, key=lambda name: -site.prescriptions_gy[name])
    for k, higher in enumerate(by_dose):
        for lower in by_dose[k + 1:]:
            if higher in masks and lower in masks:
                masks[lower] &= ~masks[higher]
    if BODY in masks and masks[BODY].any():
        possible_dose_mask = masks.pop(BODY)
        geometry.possible_dose_mask = f"ROI {mapping[BODY]!r}"
    else:
        masks.pop(BODY, None)
        possible_dose_mask = volume_ct > BODY_THRESHOLD_HU + HU_OFFSET  # the CT as stored
        geometry.possible_dose_mask = f"CT above {BODY_THRESHOLD_HU:g} HU (no BODY/External ROI)"
    lines.append(f"possible-dose mask: {geometry.possible_dose_mask}")
    for key in site.names:
        if key in masks and not masks[key].any():
            lines.append(f"warning: {key} ({mapping[key]!r}) covers no voxel of the {'×'.join(map(str, shape))} box")
    dose = None
    if dose_grid is not None:
        dose = sample_dose(dose_grid, geometry.box_y(), geometry.box_x(), geometry.box_z())
        dose = np.round(np.where(possible_dose_mask, dose, 0), 3).astype(np.float32)
    has = tuple(target for target in site.targets if target not in lacking)
    patient = _write_folder(out, geometry, volume_ct, masks, possible_dose_mask, dose, site,
                            None if also_write is None else lambda staging: also_write(staging, has))
    logger.info("Imported %s into %s", ct_dir if not isinstance(ct_dir, (list, tuple)) else geometry.series_instance_uid, out)
    contours = {key: planes[key] for key in ct_voxels}
    return ImportReport(out, geometry, lines, dose is not None, ct_voxels, dose_grid, patient, lacking, contours)


def _check_file_names(site: Site) -> None:
    """Refuse a site whose structure file would be one of a patient folder's own files (``ct.csv``,
    ``dose.csv``, ...; compared without case, as some file systems do)."""
    own = {name.lower(): name for name in PATIENT_FILES}
    for structure, file in zip(site.names, site.structure_files()):
        if file.lower() in own:
            raise SiteError(site.name, "structures", f"structure {structure!r} would be written as {file}, over the "
                                                     f"patient's own {own[file.lower()]}; give it another name")


def _fill_roi(planes: dict[int, list[np.ndarray]], geometry: PatientGeometry, to_box: PlaneTaps,
              box_slices: np.ndarray, ct_slices: np.ndarray, ct_pixels: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """An ROI's mask on the box (each slice's contours filled on the CT's pixels, averaged to the
    box's grid, kept where at least half inside), and, with ``ct_pixels``, its CT-grid pixels (flat
    indices, every slice; without, only the box's slices are filled and no pixels returned)."""
    mask = np.zeros(tuple(geometry.box_shape), bool)
    box_of = dict(zip(ct_slices.tolist(), box_slices.tolist()))
    plane_size = geometry.rows * geometry.columns
    voxels = [np.zeros(0, np.int64)]
    for k in sorted(planes):
        if not ct_pixels and k not in box_of:
            continue
        filled = filled_slice(planes[k], geometry)
        if ct_pixels:
            voxels.append(k * plane_size + np.flatnonzero(filled))
        if k in box_of:
            mask[:, :, box_of[k]] = to_box.apply(filled) >= 0.5
    return mask, np.concatenate(voxels)


def _check_slices(planes: dict[str, dict[int, list]], gaps: dict[str, list[Gap]], mapping: dict[str, str],
                  slice_z: np.ndarray, site: Site) -> list[str]:
    """Warnings about slices: an ROI with CT slices between its first and last contour that have
    none (contoured on every other slice, or a slice forgotten: those runs of up to
    ``MAX_FILLED_GAP_MM`` take the nearer contoured slice's contours, longer ones stay empty in its
    mask), and a scan shorter than the targets need, i.e. a target drawn on the scan's first or
    last slice (the scan may end inside it, and the model sees no anatomy beyond)."""
    lines = []
    for key in (*site.names, BODY):
        runs = gaps.get(key, [])
        if not runs:
            continue
        slices = sorted(planes[key])
        span = slices[-1] - slices[0] + 1
        missing = sum(gap.slices for gap in runs)
        filled = sum(gap.slices for gap in runs if gap.filled)
        what = ("filled from the nearer contoured slice" if filled == missing else
                f"{filled} filled from the nearer contoured slice, the {missing - filled} in runs of more than "
                f"{MAX_FILLED_GAP_MM:g} mm empty in its mask" if filled else
                f"in runs of more than {MAX_FILLED_GAP_MM:g} mm, empty in its mask")
        lines.append(f"warning: {key} ({mapping[key]!r}) has contours on {span - missing} of the {span} CT slices "
                     f"from z = {slice_z[slices[0]]:g} to {slice_z[slices[-1]]:g} mm (none at z = "
                     f"{slice_z[runs[0].first]:g} mm); the {missing} slices without are {what}")
    ends = {0: "first", len(slice_z) - 1: "last"}
    for key in site.targets:
        reached = [f"{ends[k]} (z = {slice_z[k]:g} mm)" for k in sorted(ends) if k in planes.get(key, {})]
        if reached:
            lines.append(f"warning: {key} ({mapping[key]!r}) is drawn on the CT's {' and '.join(reached)} slice: "
                         f"the scan ({len(slice_z)} slices) is shorter than the targets need and may end inside "
                         f"{key}; the model sees no anatomy beyond it")
    return lines


def _check_voxel_size(geometry: PatientGeometry) -> list[str]:
    voxel = geometry.voxel_dimensions
    lines = []
    if not (OPENKBP_IN_PLANE_MM[0] <= min(voxel[:2]) and max(voxel[:2]) <= OPENKBP_IN_PLANE_MM[1]):
        lines.append(f"warning: in-plane voxels of {voxel[0]:.2f} × {voxel[1]:.2f} mm are outside the OpenKBP "
                     f"patients' {OPENKBP_IN_PLANE_MM[0]}-{OPENKBP_IN_PLANE_MM[1]} mm")
    if not OPENKBP_SLICE_MM[0] <= voxel[2] <= OPENKBP_SLICE_MM[1]:
        lines.append(f"warning: slice spacing {voxel[2]:.2f} mm is outside the OpenKBP patients' "
                     f"{OPENKBP_SLICE_MM[0]}-{OPENKBP_SLICE_MM[1]} mm")
    return lines


def _write_folder(out: Path, geometry: PatientGeometry, ct: np.ndarray, masks: dict[str, np.ndarray],
                  possible_dose_mask: np.ndarray, dose: np.ndarray | None, site: Site,
                  also_write: Callable[[Path], None] | None = None) -> Patient:
    """Write the patient folder beside ``out`` and move it into place whole; return the patient it
    holds, with the values of the text written (as ``read_patient`` reads them back)."""
    staging = new_folder_beside(out)  # leftovers of a killed import tidied first
    try:
        flat_ct = ct.reshape(-1)
        write_sparse_csv(staging / CT_FILE, np.flatnonzero(flat_ct), flat_ct[flat_ct != 0])
        write_sparse_csv(staging / POSSIBLE_DOSE_MASK_FILE, np.flatnonzero(possible_dose_mask.reshape(-1)), None)
        structure_masks = np.zeros(ct.shape, site.mask_dtype)
        for bit, key in enumerate(site.names):
            if key in masks and masks[key].any():
                write_sparse_csv(staging / f"{key}.csv", np.flatnonzero(masks[key].reshape(-1)), None)
                structure_masks[masks[key]] |= site.mask_dtype.type(1 << bit)
        voxel_text = "".join(f"{v:.6g}\n" for v in geometry.voxel_dimensions.tolist())
        write_text_atomic(staging / VOXEL_DIMENSIONS_FILE, voxel_text)
        read_dose, dose_decimals = None, -1
        if dose is not None:
            text = write_dose_csv(staging / DOSE_FILE, dose, possible_dose_mask)
            values = text.astype(np.float64)  # the file's values, parsed as read_patient parses them
            read_dose = as_volume(np.flatnonzero(possible_dose_mask.reshape(-1)), values, np.float32).reshape(ct.shape)
            dose_decimals = decimals_of(values)
        geometry.write(staging)
        if also_write is not None:
            also_write(staging)
        # the plan files also_write added (the cohort's), as read_patient reads them
        prescriptions, gantry_angles = patient_plan.read_plan(staging, site)
        patient = Patient(
            patient_id=out.name, ct=ct, structure_masks=structure_masks, possible_dose_mask=possible_dose_mask,
            voxel_dimensions=np.array([float(v) for v in voxel_text.split()]), dose=read_dose,
            dose_decimals=dose_decimals, prescriptions=prescriptions, gantry_angles=gantry_angles)
        replace_folder(staging, out)  # an earlier import is replaced whole
        return patient
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
