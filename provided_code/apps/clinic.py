"""``openkbp-dicom predict``: a clinic's DICOM patient in, a predicted RT Dose out, in one call.

Import (CT, RTSTRUCT, optional RTDOSE) into ``OUT_DIR/patient/`` for the model's own site (its
``config.json``'s ``site``: structures, DICOM names, grid; none there means OpenKBP), predict the
patient the import returns (its folder is not read back) with the model at its own resolution
(from its ``config.json``), write the prediction in the challenge's CSV format, export it as
``RD.dcm`` and ``dose.nii.gz`` on the CT's grid, and tabulate the DVH (with the clinic's own dose
beside it and the challenge's scores when ``--rtdose`` is given). The DVH table is computed on the
CT's grid, as a planning system computes it from ``RD.dcm`` and the RTSTRUCT; the challenge's
scores on the 128³ grid they are defined on.

A commissioned cross-validated model's prediction also says how far to trust it
(:mod:`provided_code.trust`): ``dvh.json`` gains ``band`` and ``in_distribution``, ``dvh.csv`` the
columns ``<metric>_low`` and ``<metric>_high`` beside each ``<metric>_predicted``, and the RT
Dose's series description begins "Outside the training cohort" when the patient is flagged. The
bands are calibrated on DVH metrics on the 128³ grid and applied, as offsets from the prediction,
to the CT grid's table. Another model predicts as before and says why it has no bands.

A prediction above the site's plausible ceiling (:mod:`provided_code.metrics.ceiling`) is a warning
in the log and the summary, ``dvh.json``'s ``dose_ceiling``, and the RT Dose's Dose Comment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np

from provided_code.data.split_arrays import SplitArrays
from provided_code.data.csv_io import write_dose_csv
from provided_code.deployed_model import DeployedModel
from provided_code.dicom.dvh import check_supersample
from provided_code.dicom.dvh import dvh_report as ct_dvh_report
from provided_code.dicom.dvh import write_dvh_files as write_dvh_tables
from provided_code.dicom.exporter import dose_on_ct_grid, write_dose_on_ct_grid
from provided_code.dicom.importer import ImportReport, import_patient
from provided_code.dicom.rtdose import DoseGrid
from provided_code.infra.atomic import write_text_atomic
from provided_code.infra.progress import Progress, no_progress
from provided_code.metrics.calibration import DEFAULT_COVERAGE
from provided_code.metrics.ceiling import AboveCeiling, above_ceiling
from provided_code.metrics.scoring import score_split
from provided_code.trust import Trust, band_lines, described, flag_line

logger = logging.getLogger(__name__)

PATIENT_FOLDER = "patient"
OUTPUTS = {"rtdose": "RD.dcm", "nifti": "dose.nii.gz", "dvh_csv": "dvh.csv", "dvh_json": "dvh.json",
           "prediction": "prediction.csv"}


@dataclasses.dataclass
class ClinicReport:
    out_dir: Path
    model: DeployedModel  # what predicted the patient
    imported: ImportReport
    dvh: dict  # the dvh.json content
    plots: list[Path]
    trust: Trust | None = None  # what the model's commissioning lets the prediction say

    def summary(self) -> str:
        lines = [*self.imported.lines, f"Predicted with {self.model.used()}.",
                 f"RT Dose: {self.out_dir / OUTPUTS['rtdose']}", f"NIfTI: {self.out_dir / OUTPUTS['nifti']}",
                 f"DVH table: {self.out_dir / OUTPUTS['dvh_csv']} and {OUTPUTS['dvh_json']}"]
        lines += [f"Plot: {path}" for path in self.plots]
        if "scores" in self.dvh:
            lines.append(f"Against the clinic's dose: dose score {self.dvh['scores']['dose_score']:.3f} Gy, "
                         f"DVH score {self.dvh['scores']['dvh_score']:.3f} Gy")
        lines += trust_lines(self.dvh, self.trust)
        if "dose_ceiling" in self.dvh:
            lines.append(f"Warning: {AboveCeiling(**self.dvh['dose_ceiling']).line()}")
        return "\n".join(lines)


def trust_lines(dvh: dict, trust: Trust | None) -> list[str]:
    """The band of each structure, and the in-distribution check, as ``openkbp-dicom predict``
    prints them (or why there are none)."""
    lines = band_lines(dvh["band"], dvh["predicted"], dvh["metrics"]) if "band" in dvh else []
    if "in_distribution" in dvh:
        lines.append(flag_line(dvh["in_distribution"]))
    if trust is not None:
        lines += trust.missing_lines()
    return lines


def predict_dicom_patient(model: DeployedModel, ct_dir: os.PathLike | str, rtstruct: os.PathLike | str,
                          out_dir: os.PathLike | str, rtdose: os.PathLike | str | None = None, tta: bool = False,
                          names: os.PathLike | str | None = None, allow_missing_targets: bool = False,
                          plots: bool = True, progress: Progress = no_progress, dvh_supersample: int = 1,
                          trust: Trust | None = None) -> ClinicReport:
    """Import, predict, export and tabulate one patient (see the module docstring) with ``model``
    (:meth:`DeployedModel.locked`'s; a node's kept :meth:`~DeployedModel.loaded`): a run, or a cross-validated
    model's folds, whose 128³ doses are averaged. ``dvh_supersample``: sub-voxels per axis of the
    DVH table's sampling (:mod:`provided_code.dicom.dvh`; 1: the CT's voxels, and sub-voxels for
    small structures only). ``trust``: what :meth:`DeployedModel.trust` read for the bands'
    nominal coverage (the node's, read once; None: read here at the default coverage).
    """
    out_dir = Path(out_dir)
    check_supersample(dvh_supersample)
    if trust is None:  # before predicting: a damaged commissioning is said before the work
        trust = model.trust(DEFAULT_COVERAGE)
    site = model.site
    imported = import_patient(ct_dir, rtstruct, out_dir / PATIENT_FOLDER, rtdose=rtdose, names=names,
                              allow_missing_targets=allow_missing_targets, site=site)
    arrays = SplitArrays.from_patients([imported.patient], site=site)  # the folder's patient, in memory
    arrays.folder = out_dir  # (its files: out_dir/patient/...)
    from provided_code.inference import PredictionError

    try:
        predicted = model.predict(arrays, batch_size=1, tta=tta, progress=progress)[0]
    except PredictionError as error:  # the import is written; no dose is
        said = f"{error}; no dose was written ({imported.folder} holds the imported patient)."
        raise PredictionError(said) from None
    checked = trust.in_distribution(arrays.structure_masks[0], arrays.possible_dose_mask[0],
                                    arrays.voxel_dimensions[0], site, arrays.ct[0])
    ceiling = above_ceiling(predicted, site)
    if ceiling is not None:
        logger.warning("The prediction from %s: %s", ct_dir, ceiling.line())
    write_dose_csv(out_dir / OUTPUTS["prediction"], predicted, arrays.possible_dose_mask[0])
    dose_ct = dose_on_ct_grid(predicted, imported.geometry)
    write_dose_on_ct_grid(dose_ct, imported.geometry, out_dir / OUTPUTS["rtdose"], nifti=out_dir / OUTPUTS["nifti"],
                          description=described(f"Predicted dose, {model.name} {model.label}", checked,
                                                uncommissioned=trust.uncommissioned),
                          comment=ceiling.comment() if ceiling is not None else None)
    dvh = dvh_report(arrays, predicted, imported, dose_ct, imported.dose_grid, supersample=dvh_supersample)
    del dose_ct
    dvh["model"] = {"folder": str(model.source or model.name), **model.what(), "tta": tta}
    banded = trust.band(dvh["predicted"])
    if banded is not None:
        dvh["band"] = banded
    if checked is not None:
        dvh["in_distribution"] = checked
    if ceiling is not None:
        dvh["dose_ceiling"] = ceiling.to_dict()
    write_dvh_files(out_dir, dvh)
    written = []
    if plots:
        from provided_code.plots import has_matplotlib, plot_patient

        if has_matplotlib():
            written = plot_patient(out_dir, "patient", arrays, 0, predicted, stem="dose")
        else:
            logger.warning("No plots: matplotlib is not installed (pip install 'provided_code[plots]')")
    return ClinicReport(out_dir, model, imported, dvh, written, trust)


def dvh_report(arrays: SplitArrays, predicted: np.ndarray, imported: ImportReport, dose_ct: np.ndarray,
               reference_grid: DoseGrid | None = None, supersample: int = 1) -> dict:
    """The clinical DVH table of the prediction, and of the clinic's dose and the challenge's scores
    if there is one.

    The table is a planning system's (:func:`provided_code.dicom.dvh.dvh_report`): on the CT's grid,
    from the dose as ``RD.dcm`` holds it (``dose_ct``) and the clinic's dose trilinear at the same
    points, over each structure as drawn (``imported.ct_voxels``, or sub-voxels of its
    ``imported.contours`` when ``supersample`` > 1 and for structures of few voxels). The scores
    stay the challenge's, on the 128³ grid.
    """
    doses = {"predicted": dose_ct}
    if arrays.has_dose[0] and reference_grid is not None:
        doses["reference"] = reference_grid
    report = ct_dvh_report(imported.geometry, imported.ct_voxels, imported.contours, doses, supersample)
    if "reference" in doses:
        report["scores"] = {key: value for key, value in score_split(arrays, lambda row: predicted).summary().items()
                            if key in ("dose_score", "dvh_score")}
    return report


def write_dvh_files(out_dir: Path, report: dict) -> None:
    """``dvh.json`` (the report) and ``dvh.csv`` (one row per structure: its volume, and per metric the
    prediction, the band's low and high when there is one, and the reference)."""
    write_dvh_tables(out_dir / OUTPUTS["dvh_csv"], out_dir / OUTPUTS["dvh_json"], report)
