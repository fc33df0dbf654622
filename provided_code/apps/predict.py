"""``--predict-only``: a trained model's predictions for a stage, in the challenge's format, scored.

A commissioned cross-validated model's folds (``--ensemble <model>``) also say how far to trust
each prediction (:mod:`provided_code.trust`): ``<stage>-predictions/dvh/<patient>.csv`` and
``.json`` hold its DVH table (the site's metrics and the clinical ones, on the 128³ grid, as
commissioning assessed them) with the band of each and the in-distribution check, and
``scores.json`` sums them up (``band``: the observed coverage of the plans' values;
``in_distribution``: the patients outside the training cohort). Another model predicts as before
and says why it has none.

Every model's predictions are held to the site's plausible ceiling (:mod:`provided_code.metrics.ceiling`):
``scores.json``'s ``dose_ceiling`` gives the ceiling and the patients above it, each a warning in the
log and the summary."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import zipfile
from pathlib import Path

import pandas as pd

from provided_code.apps.score_folder import SparseDoses, read_prediction, reference_rows, write_score_reports
from provided_code.config import ConfigError, TrainConfig
from provided_code.data.cache import load_split
from provided_code.data.csv_io import exact_dose, write_dose_csv
from provided_code.data_folder import split_dir
from provided_code.deployed_model import DeployedModel, member_folders
from provided_code.exclusions import excluded_patients
from provided_code.folds import (HELD_OUT_STAGE, MADE_WITH, SPLITS_FILE, FoldsError, held_out_record,
                                 read_dealing)
from provided_code.infra.atomic import atomic_path, new_folder_beside, replace_folder, tidy_folder, write_text_atomic
from provided_code.infra.progress import Progress, no_progress
from provided_code.metrics import calibration
from provided_code.metrics.calibration import DEFAULT_COVERAGE, check_coverage
from provided_code.metrics.ceiling import above_ceiling
from provided_code.metrics.dvh_table import CLINICAL_METRICS, dvh_csv_text, patient_table
from provided_code.metrics.scoring import Scores, score_split
from provided_code.run_folder import SCORES_FILE, RunFolder
from provided_code.sites import Site
from provided_code.trust import OUTSIDE, Trust

DVH_FOLDER = "dvh"  # <stage>-predictions/dvh/<patient>.csv and .json: each prediction's table, bands and check

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class PredictionReport:
    stage: str
    model: DeployedModel  # what predicted them
    patients: int
    predictions_dir: Path
    submission: Path
    scores: Scores | None
    scores_path: Path | None
    trust: list[str] = dataclasses.field(default_factory=list)  # what the predictions say about themselves, or why not
    warnings: list[str] = dataclasses.field(default_factory=list)  # predictions above the plausible ceiling

    @property
    def epoch(self) -> int | None:
        """The checkpoint's epoch of a single model; None for several averaged (:attr:`model`'s members)."""
        return self.model.epoch

    def summary(self) -> str:
        lines = [f"Predicted {self.patients} {self.stage} patients with {self.model.used()}.",
                 f"Predictions: {self.predictions_dir}", f"Submission: {self.submission}"]
        if self.scores is not None:
            if self.scores.without_reference:
                lines.append(f"Scored the {len(self.scores.patient_ids)} of {self.patients} patients that have a "
                             f"reference dose (none for {', '.join(self.scores.without_reference)}).")
            lines += [f"Scores: {self.scores_path}",
                      f"dose score {self.scores.dose_score:.4f} Gy, DVH score {self.scores.dvh_score:.4f} Gy"]
        else:
            lines.append("No reference doses in this stage: not scored.")
        return "\n".join(lines + self.trust + [f"Warning: {line}" for line in self.warnings])


def predict_stage(run_dir: os.PathLike | str, data_dir: os.PathLike | str, stage: str = "validation",
                  epoch: int | str | None = None, tta: bool = False, plots: bool = False,
                  progress: Progress = no_progress, ensemble: list[str] | None = None,
                  batch_size: int = TrainConfig.batch_size, cache_dir: os.PathLike | str | None = None,
                  skip_incomplete: bool = False, site: Site | str | None = None,
                  band: float = DEFAULT_COVERAGE) -> PredictionReport:
    """Predict every patient of ``<data_dir>/<stage>-pats`` with the model trained in ``run_dir``
    (``results/<model-name>``; its architecture and resolution from its saved config); write and score.

    ``epoch``: a checkpoint's epoch, ``"best"`` (``models/best.keras``, the lowest validation
    dose score while training), or None for the newest.

    ``ensemble``: names of trained runs beside ``run_dir`` (each once), each at ``epoch`` (default
    ``"best"``; a cross-validated model's folds: their final checkpoints); their 128³ predictions
    (each with its own mirror flips under ``tta``) are averaged, then written and scored like one model's into ``run_dir``, which must not be a
    member's folder. The scores JSON names the members (each with its epoch and SHA-256, and no
    epoch of the ensemble's: even one run named so) and the zip is ``<model>_<stage>_ensemble.zip``.
    Each member's folder is locked shared
    meanwhile: a member still training (or being predicted) refuses the ensemble.

    The CSVs, the submission zip and the scores go into a new folder beside
    ``<stage>-predictions/`` that then replaces it whole (:meth:`RunFolder.predictions`): a run
    killed at any moment leaves the previous complete set or the new one, never a mix.

    ``batch_size``: patients per prediction call; ``cache_dir`` and ``skip_incomplete``: how the
    stage's patients are read, as training reads its splits. The stage is read as data of the
    model's own site (``config.json``'s ``site``; an ensemble's members must share one); ``site``,
    if given (``--site``), must be that site; None: not given.

    ``band``: the nominal coverage of the bands a commissioned cross-validated model's folds give
    each prediction (``--ensemble <model>``; the module docstring).
    """
    band = check_coverage(band)
    folder = RunFolder(run_dir)
    if plots:
        from provided_code.plots import require_matplotlib

        require_matplotlib()
    members = ensemble_members(folder, ensemble) if ensemble is not None else [folder]
    for member in members:
        if not member.models.is_dir():  # before the lock is taken and the stage's patients are loaded
            raise member.missing_model()
    with contextlib.ExitStack() as locks:
        locks.enter_context(folder.lock(f"--predict-only --stage {stage}"))
        for member in members if ensemble else []:
            locks.enter_context(member.lock(f"read by the ensemble {folder.name!r}", shared=True))
        # under the locks: a config or checkpoint being written is not read. A run alone at --epoch
        # (None: its newest); an ensemble's members each at its best by default (a fold: its final)
        epochs = [member.epoch_to_apply(epoch) for member in members] if ensemble is not None else [epoch]
        source = (None if ensemble is not None and len(ensemble) > 1 else
                  _beside(folder, ensemble[0]).path if ensemble is not None else folder.path)
        model = DeployedModel.of_runs(",".join(ensemble) if ensemble is not None else folder.name, members, epochs,
                                      site, source=source, ensemble=ensemble is not None)
        tidy_folder(folder.predictions(stage))  # left by a killed run
        stage_dir = split_dir(data_dir, stage)
        arrays = load_split(stage_dir, cache_dir=cache_dir, require_dose=False, skip_incomplete=skip_incomplete,
                            progress=progress, site=model.site)
        return _predict_stage(folder, stage_dir, arrays, stage, model, tta, plots, progress, batch_size,
                              trust=model.trust(band))


def ensemble_members(folder: RunFolder, names: list[str]) -> list[RunFolder]:
    """The run folders of an ensemble's ``names`` (trained runs beside ``folder``, which receives
    the ensemble's outputs): a cross-validated model (``--folds``: its ``splits.json``) stands for
    its folds, the folds serving as the deployed ensemble (``--ensemble cv``, even with
    ``--model-name cv``). Each member once, compared by the folder it names (``m``, ``./m``, ``m/``
    and ``../results/m`` are one model); ``folder`` must not be one of them."""
    if not names:
        raise ConfigError("Invalid `ensemble`. Expected the names of one or more trained runs. Received: ensemble=[]")
    named = []  # (the name given, its run folder)
    for name in names:
        given = _beside(folder, name)
        named += [(name if member.path == given.path else f"{name} fold {k}", member)
                  for k, member in enumerate(member_folders(given.path), start=1)]
    where = [member.path.resolve() for _, member in named]
    groups: dict[Path, list[str]] = {}
    for (name, _), path in zip(named, where):
        groups.setdefault(path, []).append(name)
    repeated = [list(dict.fromkeys(given)) for given in groups.values() if len(given) > 1]
    if repeated:
        said = "; ".join(given[0] if len(given) == 1 else f"{' and '.join(given)} name one model" for given in repeated)
        raise ConfigError(f"Invalid `ensemble`. Expected each member once ({said}: it would weigh more than the "
                          f"others). Received: ensemble={','.join(names)!r}")
    if folder.path.resolve() in where:
        raise ConfigError(f"Invalid `model_name` for an ensemble. Expected a name other than its members "
                          f"({', '.join(names)}): the ensemble's outputs go to results/<model-name>/. "
                          f"Received: model_name={folder.name!r}")
    return [member for _, member in named]


def predict_held_out(run_dir: os.PathLike | str, data_dir: os.PathLike | str, progress: Progress = no_progress,
                     batch_size: int = TrainConfig.batch_size, cache_dir: os.PathLike | str | None = None,
                     skip_incomplete: bool = False) -> PredictionReport:
    """A trained fold's out-of-fold predictions (``--folds``): its held-out patients (of the
    model's dealing, the excluded left out) predicted with its final checkpoint (not its best,
    which was picked on these very patients: :meth:`RunFolder.epoch_to_apply`), written and scored as ``--predict-only`` writes a stage, into
    ``fold-<K>/held-out-predictions/`` (replaced whole). Each patient of the training split is
    predicted so by the one fold that never saw it; ``openkbp-commission`` reads them."""
    folder = RunFolder(run_dir)
    with folder.lock("predicting its held-out patients"):
        saved = folder.read_config()
        if saved is None or not saved.folds:
            raise ConfigError(f"Invalid `run_dir`. Expected a fold of a cross-validated model (--folds). Received: "
                              f"{folder.path}")
        dealing = read_dealing(folder.path.parent)
        if dealing is None:
            raise FoldsError(f"{folder.path.parent / SPLITS_FILE} is missing: the dealing of the folds")
        held_out = set(dealing.held_out_of(saved.fold, excluded_patients(saved.excluded)))
        tidy_folder(folder.predictions(HELD_OUT_STAGE))
        stage_dir = split_dir(data_dir, "train")
        arrays = load_split(stage_dir, cache_dir=cache_dir, require_dose=True, skip_incomplete=skip_incomplete,
                            progress=progress, site=saved.site)
        arrays = arrays.select([row for row, pid in enumerate(arrays.patient_ids) if pid in held_out])
        # a fold's final checkpoint: not its best, picked on these patients
        model = DeployedModel.of_runs(folder.name, [folder], [folder.epoch_to_apply(None)], source=folder.path)

        def made_with(new: Path) -> dict:  # what commissioning certifies (folds.held_out_record)
            member, = model.members
            return {MADE_WITH: held_out_record(member.checkpoint, member.epoch, member.sha256, new, arrays.patient_ids,
                                               arrays.sources_of())}

        return _predict_stage(folder, stage_dir, arrays, HELD_OUT_STAGE, model, False, False, progress, batch_size,
                              recording=made_with)


def _beside(folder: RunFolder, name: str) -> RunFolder:
    """The folder of the trained run ``name`` beside ``folder`` (an ensemble's member)."""
    return RunFolder(folder.path.parent / name)


def _predict_stage(folder: RunFolder, stage_dir: Path, arrays, stage: str, model: DeployedModel, tta: bool,
                   plots: bool, progress: Progress, batch_size: int, trust: Trust | None = None,
                   recording=None) -> PredictionReport:
    """``model``'s predictions of ``arrays`` written and scored into ``folder``'s ``<stage>-predictions/``.
    ``trust``: what the predictions may say of themselves; None: none asked (a fold's out-of-fold
    predictions). ``recording(new)``: what ``scores.json`` also records of them (``new``: the folder
    the CSVs were written into); None: nothing more."""
    from provided_code.inference import PredictionError

    try:
        predictions = model.predict(arrays, batch_size, tta, progress)
    except PredictionError as error:
        raise PredictionError(f"{error}; nothing was written.") from None
    ceiling = {pid: found for row, pid in enumerate(arrays.patient_ids)
               if (found := above_ceiling(predictions[row], model.site)) is not None}
    warnings = [f"{pid}: {found.line()}" for pid, found in ceiling.items()]
    for line in warnings:
        logger.warning("%s", line)
    # The whole set (CSVs, zip, scores) is written into a new folder and moved into place whole.
    predictions_dir = folder.predictions(stage)
    zip_name = folder.submission_name(stage, model.epoch)
    scores = None
    new = new_folder_beside(predictions_dir)
    try:
        for row, pid in enumerate(progress(arrays.patient_ids, len(arrays), "Writing")):
            write_dose_csv(new / f"{pid}.csv", predictions[row], arrays.possible_dose_mask[row])
        _write_submission(new, arrays.patient_ids, new / zip_name)
        written = SparseDoses()  # the predictions as written, read back once for the bands and the scores
        trusted = (_write_trust(new, arrays, trust, progress, written)
                   if trust is not None and (trust.bands is not None or trust.cohort is not None) else {})
        if arrays.has_dose.any():  # those with reference doses; a warning names the others
            # The scores of the predictions as written (the CSVs' decimals, which a submission is
            # judged on), read back as openkbp-score reads them: both report one number, on any processor.
            scores = score_split(arrays, lambda row: written[row] if row in written else
                                 read_prediction(new, arrays.patient_ids[row]), progress,
                                 rows=reference_rows(arrays, stage_dir))
            extra = {"model": folder.name, "stage": stage, **model.what(), **trusted,
                     "dose_ceiling": {"ceiling_gy": model.site.dose_ceiling_gy, "source": model.site.dose_ceiling_said,
                                      "above": {pid: found.to_dict() for pid, found in ceiling.items()}},
                     **(recording(new) if recording is not None else {})}
            write_score_reports(scores, new / SCORES_FILE, (new / SCORES_FILE).with_suffix(".csv"), extra=extra)
        replace_folder(new, predictions_dir)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    removed = folder.remove_earlier_layout(stage)
    if removed:
        logger.info("Removed the scores and zips of the earlier predictions (now inside %s): %s", predictions_dir,
                    ", ".join(str(path) for path in removed))
    submission = predictions_dir / zip_name
    scores_path = predictions_dir / SCORES_FILE if scores is not None else None
    logger.info("Wrote %d predictions and %s to %s", len(arrays), zip_name, predictions_dir)
    if plots:
        from provided_code.plots import plot_patient

        plot_dir = folder.plots(stage)
        for row, pid in enumerate(progress(arrays.patient_ids, len(arrays), "Plotting")):
            plot_patient(plot_dir, pid, arrays, row, predictions[row])
        logger.info("Wrote plots to %s", plot_dir)
    said = _trust_lines(trusted, trust, predictions_dir) if trust is not None else []
    for line in said:
        logger.info("%s", line)
    return PredictionReport(stage, model, len(arrays), predictions_dir, submission, scores, scores_path, said, warnings)


def _write_trust(new: Path, arrays, trust: Trust, progress: Progress, written: SparseDoses) -> dict:
    """Each patient's DVH table with its bands and in-distribution check, ``dvh/<patient>.csv`` and
    ``.json`` in the predictions folder being written (``new``), from the predictions as written
    (the CSVs' decimals, as commissioning reads the folds'); returns what ``scores.json`` sums up:
    ``band`` (nominal coverage, method, the patients' values held by their bands and the median
    width) and ``in_distribution`` (alpha, each patient's p-value, those outside with the feature that flagged them). The predictions
    read back are kept in ``written`` (by row) for the scores."""
    site = arrays.site
    folder = new / DVH_FOLDER
    folder.mkdir()
    metrics = [*site.metric_names, *CLINICAL_METRICS]
    rows, checked = [], []  # (patient, structure, metric, plan, predicted) with a reference; in-distribution checks
    for row, pid in enumerate(progress(arrays.patient_ids, len(arrays), "Bands")):
        masks, voxel_dimensions = arrays.structure_masks[row], arrays.voxel_dimensions[row]
        dose = read_prediction(new, pid)
        written[row] = dose
        predicted = patient_table(dose, masks, voxel_dimensions, site)
        report = {"patient": pid, "metrics": metrics, "predicted": predicted}
        if arrays.has_dose[row]:
            plan = exact_dose(arrays.dose[row].reshape(-1), int(arrays.dose_decimals[row]))
            report["reference"] = patient_table(plan, masks, voxel_dimensions, site)
            rows += [(pid, structure, metric, report["reference"][structure].get(metric), value)
                     for structure, values in predicted.items() for metric, value in values.items()]
        banded = trust.band(predicted)
        if banded is not None:
            report["band"] = banded
        found = trust.in_distribution(masks, arrays.possible_dose_mask[row], voxel_dimensions, site, arrays.ct[row])
        if found is not None:
            report["in_distribution"] = found
            checked.append((pid, found))
        write_text_atomic(folder / f"{pid}.json", json.dumps(report, indent=2) + "\n")
        write_text_atomic(folder / f"{pid}.csv", dvh_csv_text(report, metrics))
    summary = {}
    if trust.bands is not None:
        table = pd.DataFrame(rows, columns=["patient", "structure", "metric", "plan", "predicted"]).dropna()
        held = calibration.coverage_rows(table, trust.bands["residuals"], levels=(trust.coverage,))
        summary["band"] = {"coverage": trust.coverage, "method": calibration.METHOD,
                           "calibration_patients": trust.bands["patients"], "values": int(len(held)),
                           "observed": float(held["covered"].mean()) if len(held) else None,
                           "median_width": float(held["width"].median()) if len(held) else None}
    if trust.cohort is not None:
        summary["in_distribution"] = {
            "alpha": trust.cohort["alpha"], "threshold": trust.cohort["threshold"], "patients": len(checked),
            "p_values": {pid: found["p_value"] for pid, found in checked},
            **({"too_small": checked[0][1]["too_small"]} if checked and checked[0][1]["too_small"] else {}),
            "outside": [{"patient": pid, "score": found["score"], "p_value": found["p_value"],
                         "feature": found["feature"], "reasons": found["reasons"]}
                        for pid, found in checked if not found["inside"]]}
    return summary


def _trust_lines(summary: dict, trust: Trust, predictions_dir: Path) -> list[str]:
    """What the predictions said about themselves, for the summary (or why they said nothing)."""
    lines = trust.missing_lines()
    band = summary.get("band")
    if band is not None and trust.gives_bands:  # else its missing line said why there is none
        held = (f": the plans' values held {100 * band['observed']:.1f} % of the time ({band['values']} values), "
                f"median width {band['median_width']:.2f} Gy" if band["observed"] is not None else "")
        lines.append(f"Bands of {100 * band['coverage']:g} % nominal coverage{held}; per patient in "
                     f"{predictions_dir / DVH_FOLDER}")
    checked = summary.get("in_distribution")
    if checked is not None:
        outside = checked["outside"]
        lines.append(f"{len(outside)} of {checked['patients']} patients {OUTSIDE} (p below {checked['alpha']:g})"
                     + (f": {', '.join(entry['patient'] + ' (' + str(entry['feature']) + ')' for entry in outside)}"
                        if outside else ""))
        if checked.get("too_small"):
            lines.append(f"In-distribution check: {checked['too_small']}")
    return lines


# Deflate level of the submission zip: a real OpenKBP dose CSV's zip is a fifth larger than at zlib's
# default 6, and written 6× faster (scripts/bench_data.py: submission_zip_*)
SUBMISSION_ZIP_LEVEL = 1


def _write_submission(predictions_dir: Path, patient_ids: list[str], path: Path) -> Path:
    """A zip of the prediction CSVs (deflated at ``SUBMISSION_ZIP_LEVEL``), written beside its final
    name and moved into place."""
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED,
                                                   compresslevel=SUBMISSION_ZIP_LEVEL) as archive:
        for pid in patient_ids:
            archive.write(predictions_dir / f"{pid}.csv", arcname=f"{pid}.csv")
    return path
