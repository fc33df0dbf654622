"""``openkbp-dicom predict``: a clinic's DICOM patient in, a predicted RT Dose out, in one call.

Import (CT, RTSTRUCT, optional RTDOSE) into ``OUT_DIR/patient/`` for the model's own site (its
``config.json``'s ``site``: structures, DICOM names, grid; none there means OpenKBP), predict the
patient the import returns (its folder is not read back) with the model at its own resolution
(from its ``config.json``), write the prediction in the challenge's CSV format, export it as
``RD.dcm`` and ``dose.nii.gz`` on the CT's grid, and tabulate the DVH (with the clinic's own dose
beside it and the challenge's scores when ``--rtdose`` is given). The DVH table is computed on the
CT's grid, as a planning system computes it from ``RD.dcm`` and the RTSTRUCT; the challenge's
scores on the 128³ grid they are defined on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np

from provided_code.config import ConfigError
from provided_code.data.batches import warn_plan_files_not_taken
from provided_code.data.split_arrays import SplitArrays
from provided_code.data.csv_io import write_dose_csv
from provided_code.dicom.dvh import check_supersample
from provided_code.dicom.dvh import dvh_report as ct_dvh_report
from provided_code.dicom.dvh import write_dvh_files as write_dvh_tables
from provided_code.dicom.exporter import dose_on_ct_grid, write_dose_on_ct_grid
from provided_code.dicom.importer import ImportReport, import_patient
from provided_code.dicom.rtdose import DoseGrid
from provided_code.inference import predict_full_resolution
from provided_code.infra.atomic import write_text_atomic
from provided_code.infra.progress import Progress, no_progress
from provided_code.metrics.scoring import score_split
from provided_code.run_folder import RunFolder, TrainedModel, check_site
from provided_code.sites import Site

logger = logging.getLogger(__name__)

PATIENT_FOLDER = "patient"
OUTPUTS = {"rtdose": "RD.dcm", "nifti": "dose.nii.gz", "dvh_csv": "dvh.csv", "dvh_json": "dvh.json",
           "prediction": "prediction.csv"}


@dataclasses.dataclass
class ClinicReport:
    out_dir: Path
    epoch: int
    imported: ImportReport
    dvh: dict  # the dvh.json content
    plots: list[Path]

    def summary(self) -> str:
        lines = [*self.imported.lines, f"Predicted with the epoch {self.epoch} checkpoint.",
                 f"RT Dose: {self.out_dir / OUTPUTS['rtdose']}", f"NIfTI: {self.out_dir / OUTPUTS['nifti']}",
                 f"DVH table: {self.out_dir / OUTPUTS['dvh_csv']} and {OUTPUTS['dvh_json']}"]
        lines += [f"Plot: {path}" for path in self.plots]
        if "scores" in self.dvh:
            lines.append(f"Against the clinic's dose: dose score {self.dvh['scores']['dose_score']:.3f} Gy, "
                         f"DVH score {self.dvh['scores']['dvh_score']:.3f} Gy")
        return "\n".join(lines)


def predict_dicom_patient(model_dir: os.PathLike | str, ct_dir: os.PathLike | str, rtstruct: os.PathLike | str,
                          out_dir: os.PathLike | str, rtdose: os.PathLike | str | None = None,
                          epoch: int | str | None = None, tta: bool = False, names: os.PathLike | str | None = None,
                          allow_missing_targets: bool = False, plots: bool = True,
                          progress: Progress = no_progress, loaded: TrainedModel | None = None,
                          site: Site | str | None = None, dvh_supersample: int = 1) -> ClinicReport:
    """Import, predict, export and tabulate one patient (see the module docstring).

    ``model_dir``: a run folder (``results/<model-name>``). ``epoch``: a checkpoint's epoch, "best",
    or None: ``best`` when the run has one, else the newest checkpoint. ``loaded``: the model of
    this folder as :meth:`RunFolder.load_trained_model` returned it, kept in memory (the node's):
    then nothing of the model's folder is read again. ``site``: None (the model's), or the model's
    own (``--site``): another is refused in one line. ``dvh_supersample``: sub-voxels per axis of
    the DVH table's sampling (:mod:`provided_code.dicom.dvh`; 1: the CT's voxels, and sub-voxels
    for small structures only).
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    check_supersample(dvh_supersample)
    if loaded is None:
        folder = RunFolder(model_dir)
        epoch = folder.epoch_to_apply(epoch)  # before the import: a folder with no model fails at once
        spec = folder.spec(site)  # the model's own site; another --site is refused before the import
    else:
        spec = loaded.spec
        check_site(spec, site, model_dir)
    imported = import_patient(ct_dir, rtstruct, out_dir / PATIENT_FOLDER, rtdose=rtdose, names=names,
                              allow_missing_targets=allow_missing_targets, site=spec.site)
    arrays = SplitArrays.from_patients([imported.patient], site=spec.site)  # the folder's patient, kept in memory
    arrays.folder = out_dir  # (its files: out_dir/patient/...)
    trained = loaded if loaded is not None else folder.load_trained_model(epoch)
    epoch = trained.epoch
    warn_plan_files_not_taken(arrays, spec.inputs_left_out(), f"Model {model_dir}")
    predicted = predict_full_resolution(trained.model, arrays, spec, batch_size=1, tta=tta, progress=progress,
                                        label=f"Model {model_dir} at epoch {epoch}")[0]
    write_dose_csv(out_dir / OUTPUTS["prediction"], predicted, arrays.possible_dose_mask[0])
    dose_ct = dose_on_ct_grid(predicted, imported.geometry)
    write_dose_on_ct_grid(dose_ct, imported.geometry, out_dir / OUTPUTS["rtdose"], nifti=out_dir / OUTPUTS["nifti"],
                          description=f"Predicted dose, {model_dir.name} epoch {epoch}")
    dvh = dvh_report(arrays, predicted, imported, dose_ct, imported.dose_grid, supersample=dvh_supersample)
    del dose_ct
    dvh["model"] = {"folder": str(model_dir), "epoch": epoch, "tta": tta}
    write_dvh_files(out_dir, dvh)
    written = []
    if plots:
        from provided_code.plots import has_matplotlib, plot_patient

        if has_matplotlib():
            written = plot_patient(out_dir, "patient", arrays, 0, predicted, stem="dose")
        else:
            logger.warning("No plots: matplotlib is not installed (pip install 'provided_code[plots]')")
    return ClinicReport(out_dir, epoch, imported, dvh, written)


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
    """``dvh.json`` (the report) and ``dvh.csv`` (one row per structure, predicted and reference)."""
    write_dvh_tables(out_dir / OUTPUTS["dvh_csv"], out_dir / OUTPUTS["dvh_json"], report)
