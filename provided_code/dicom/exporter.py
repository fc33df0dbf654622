"""``openkbp-dicom export``: a dose on the box (the site's grid, OpenKBP's 128³; an OpenKBP
prediction CSV) back onto the patient's CT grid, as an RT Dose and optionally NIfTI, and, given the
import's RTSTRUCT, the clinical DVH table of that RT Dose (:mod:`provided_code.dicom.dvh`).

In-plane the box (128 × 128) is interpolated linearly to the CT's pixel centres (the box spans
the CT's field of view); the box's slices are the CT's own; CT slices outside the box get zero dose.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from provided_code.dicom.dvh import check_supersample, dvh_report, structures_of_rtstruct, write_dvh_files
from provided_code.dicom.errors import DicomInputError, require_site
from provided_code.dicom.grid import SIDECAR_FILE, PatientGeometry, PlaneTaps, linear_weights
from provided_code.dicom.rtdose import write_rtdose
from provided_code.infra.atomic import atomic_path
from provided_code.sites import SHIPPED, Site, load_site


def dose_on_ct_grid(dose: np.ndarray, geometry: PatientGeometry) -> np.ndarray:
    """``(CT slices, rows, columns)`` float32 Gy, slices in ``geometry.slice_z``'s (descending) order."""
    rows, columns, _ = geometry.box_shape
    to_ct = PlaneTaps.from_matrices(linear_weights(rows, geometry.rows), linear_weights(columns, geometry.columns))
    out = np.zeros((len(geometry.slice_z), geometry.rows, geometry.columns), np.float32)
    for b, k in zip(*geometry.box_slices()):
        out[k] = np.maximum(to_ct.apply(dose[:, :, b].astype(np.float64)), 0)
    return out


def nifti_affine(geometry: PatientGeometry) -> np.ndarray:
    """The CT's voxel-to-world matrix for an array indexed (column, row, slice ascending in z), in
    NIfTI's RAS+ world (DICOM's patient x and y negated)."""
    dy, dx = geometry.pixel_spacing
    x0, y0 = geometry.origin_xy
    return np.array([[-dx, 0, 0, -x0], [0, -dy, 0, -y0], [0, 0, geometry.slice_spacing, min(geometry.slice_z)],
                     [0, 0, 0, 1]], dtype=np.float64)


def write_nifti(path: os.PathLike | str, dose_ct: np.ndarray, geometry: PatientGeometry) -> Path:
    """``dose_ct`` (as :func:`dose_on_ct_grid` gives it) as a float32 NIfTI with the CT's affine."""
    try:
        import nibabel
    except ImportError:
        raise DicomInputError(path, "writing NIfTI needs nibabel: pip install 'provided_code[dicom]'") from None
    data = np.ascontiguousarray(np.transpose(dose_ct[::-1], (2, 1, 0)), dtype=np.float32)
    affine = nifti_affine(geometry)
    image = nibabel.Nifti1Image(data, affine)
    image.header.set_xyzt_units("mm")
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    path = Path(path)
    with atomic_path(path, suffix=".nii.gz") as tmp:
        nibabel.save(image, tmp)
    return path


def site_of_patient(patient_dir: os.PathLike | str) -> Site:
    """The shipped site an imported patient was imported for (its sidecar's ``site``); a patient of a
    site file is refused in one line: only the file says what that site is."""
    name = PatientGeometry.read(patient_dir).site
    if name not in SHIPPED:
        raise DicomInputError(Path(patient_dir) / SIDECAR_FILE, f"the patient was imported for site {name}, from a "
                                                                f"site file; pass that file as --site")
    return load_site(name)


def export_dose(patient_dir: os.PathLike | str, dose: np.ndarray, out: os.PathLike | str, *, site: Site,
                nifti: os.PathLike | str | None = None, description: str = "Predicted dose",
                rtstruct: os.PathLike | str | None = None, dvh: os.PathLike | str | None = None,
                dvh_supersample: int = 1) -> PatientGeometry:
    """Write the box's ``dose`` of an imported patient as an RT Dose at ``out`` (and NIfTI).
    ``site``: the site the dose is of; a patient imported for another is refused.

    With ``rtstruct`` (the import's RTSTRUCT) and ``dvh`` (a ``.csv`` path), also the clinical DVH
    table of the dose as the RT Dose holds it (:func:`provided_code.dicom.dvh.dvh_report`, with
    ``dvh_supersample``): ``dvh`` and, beside it with the suffix ``.json``, its JSON. The RTSTRUCT is
    read before anything is written."""
    site = require_site(site)
    check_supersample(dvh_supersample)
    if (rtstruct is None) != (dvh is None):
        raise ValueError("Invalid `rtstruct` and `dvh`. Expected both (the DVH table) or neither. "
                         f"Received: rtstruct={rtstruct!r}, dvh={dvh!r}")
    geometry = PatientGeometry.read(patient_dir)
    if site.name != geometry.site:
        raise DicomInputError(Path(patient_dir) / SIDECAR_FILE, f"the patient was imported for site {geometry.site}, "
                                                                f"not {site.name}; import it again with --site "
                                                                f"{site.name}")
    dose = np.asarray(dose)
    box = tuple(geometry.box_shape)
    if dose.shape != box:
        raise ValueError(f"Invalid `dose`. Expected shape {box}. Received: dose.shape={dose.shape}")
    structures = structures_of_rtstruct(rtstruct, geometry) if rtstruct is not None else None
    dose_ct = dose_on_ct_grid(dose, geometry)
    write_dose_on_ct_grid(dose_ct, geometry, out, nifti, description)
    if structures is not None:
        report = dvh_report(geometry, *structures, {"predicted": dose_ct}, dvh_supersample)
        report["rtdose"] = str(out)
        write_dvh_files(dvh, Path(dvh).with_suffix(".json"), report)
    return geometry


def write_dose_on_ct_grid(dose_ct: np.ndarray, geometry: PatientGeometry, out: os.PathLike | str,
                          nifti: os.PathLike | str | None = None, description: str = "Predicted dose",
                          comment: str | None = None) -> None:
    """``dose_ct`` (as :func:`dose_on_ct_grid` gives it) as an RT Dose at ``out`` (and NIfTI);
    ``comment``: its Dose Comment (:func:`~provided_code.dicom.rtdose.write_rtdose`)."""
    write_rtdose(out, dose_ct, geometry, description, comment)
    if nifti is not None:
        write_nifti(nifti, dose_ct, geometry)
