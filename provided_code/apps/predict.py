"""``--predict-only``: a trained model's predictions for a stage, in the challenge's format, scored."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import logging
import shutil
import zipfile
from pathlib import Path

import keras
import numpy as np

from provided_code.infra.atomic import atomic_path, new_folder_beside, replace_folder, tidy_folder
from provided_code.config import LOG_FILE, ConfigError, TrainConfig, read_saved_config
from provided_code.data.cache import load_split
from provided_code.data.csv_io import write_dose_csv
from provided_code.inference import PredictionError, predict_full_resolution
from provided_code.metrics.scoring import Scores, score_split
from provided_code.infra.progress import Progress, no_progress
from provided_code.infra.run_lock import RunLock
from provided_code.apps.score_folder import read_prediction, reference_rows, write_score_reports
from provided_code.training.checkpoints import load_best, load_newest
from provided_code.training.ema import use_averaged_weights

logger = logging.getLogger(__name__)

SCORES_FILE = "scores.json"  # in results/<model-name>/<stage>-predictions/, with scores.csv beside it


def predictions_folder(run_dir: Path, stage: str) -> Path:
    """``results/<model-name>/<stage>-predictions/``: a stage's prediction CSVs, and beside them
    in the same folder the submission zip and (with reference doses) ``scores.json`` and
    ``scores.csv``. It is filled as a hidden folder beside it and moved into place whole."""
    return Path(run_dir) / f"{stage}-predictions"


@dataclasses.dataclass
class PredictionReport:
    stage: str
    epoch: int | str  # "ensemble" for an ensemble
    patients: int
    predictions_dir: Path
    submission: Path
    scores: Scores | None
    scores_path: Path | None

    def summary(self) -> str:
        model = "an ensemble" if self.epoch == "ensemble" else f"the epoch {self.epoch} checkpoint"
        lines = [f"Predicted {self.patients} {self.stage} patients with {model}.",
                 f"Predictions: {self.predictions_dir}", f"Submission: {self.submission}"]
        if self.scores is not None:
            if self.scores.without_reference:
                lines.append(f"Scored the {len(self.scores.patient_ids)} of {self.patients} patients that have a "
                             f"reference dose (none for {', '.join(self.scores.without_reference)}).")
            lines += [f"Scores: {self.scores_path}",
                      f"DVH score {self.scores.dvh_score:.4f} Gy, dose score {self.scores.dose_score:.4f} Gy"]
        else:
            lines.append("No reference doses in this stage: not scored.")
        return "\n".join(lines)


def load_trained_model(models_dir: Path, epoch: int | str | None = None) -> tuple[TrainConfig, int, keras.Model]:
    """``(saved config, epoch, model)`` of the model trained in ``models_dir`` (``results/<name>/models``),
    under the dtype policy it was trained with. ``epoch``: a checkpoint's epoch, ``"best"`` or None
    for the newest. A model trained with ``--ema`` predicts with its averaged weights (``best.keras``
    holds them; an epoch checkpoint holds the raw ones and the optimizer's averages)."""
    models_dir = Path(models_dir)
    saved = read_saved_config(models_dir)
    if saved is None:
        raise FileNotFoundError(f"No trained model {models_dir.parent.name!r}: {models_dir} has no config.json. "
                                f"Train it first, or pass the --model-name and --results-dir it was trained with.")
    keras.mixed_precision.set_global_policy(saved.precision if saved.precision != "auto" else "float32")
    if epoch == "best":
        epoch, model = load_best(models_dir)
    else:
        loaded = load_newest(models_dir, epoch=epoch, compile=saved.ema)
        if loaded is None:
            raise FileNotFoundError(f"No checkpoint of model {models_dir.parent.name!r} loads from {models_dir}.")
        epoch, model = loaded
        if saved.ema:
            use_averaged_weights(model)
    return saved, epoch, model


def predict_stage(config: TrainConfig, stage: str = "validation", epoch: int | str | None = None, tta: bool = False,
                  plots: bool = False, progress: Progress = no_progress,
                  ensemble: list[str] | None = None) -> PredictionReport:
    """Predict every patient of ``<data_dir>/<stage>-pats`` with a trained model; write and score.

    ``epoch``: a checkpoint's epoch, ``"best"`` (``models/best.keras``, the lowest validation
    dose score while training), or None for the newest.

    ``ensemble``: names of trained runs in ``config.results_dir`` (each once), each at ``epoch``
    (default ``"best"``); their 128³ predictions (each with its own mirror flips under ``tta``) are
    averaged, then written and scored like one model's into ``results/<config.model_name>/``,
    which must not be a member's folder. The scores JSON names the members. Each member's folder
    is locked shared meanwhile: a member still training (or being predicted) refuses the ensemble.

    The CSVs, the submission zip and the scores go into a new folder beside
    ``<stage>-predictions/`` that then replaces it whole (:func:`predictions_folder`): a run
    killed at any moment leaves the previous complete set or the new one, never a mix.

    ``config`` names the model, data, results and cache folders; the architecture comes from the
    model's saved config.
    """
    if plots:
        from provided_code.plots import require_matplotlib

        require_matplotlib()
    if ensemble is not None:
        if not ensemble:
            raise ConfigError("Invalid `ensemble`. Expected the names of one or more trained runs. Received: "
                              "ensemble=[]")
        repeated = sorted({name for name in ensemble if ensemble.count(name) > 1})
        if repeated:
            raise ConfigError(f"Invalid `ensemble`. Expected each member once ({', '.join(repeated)} would weigh "
                              f"more than the others). Received: ensemble={','.join(ensemble)!r}")
        if config.model_name in ensemble:
            raise ConfigError(f"Invalid `model_name` for an ensemble. Expected a name other than its members "
                              f"({', '.join(ensemble)}): the ensemble's outputs go to results/<model-name>/. "
                              f"Received: model_name={config.model_name!r}")
        for name in ensemble:
            if not (Path(config.results_dir) / name / "models").is_dir():
                raise FileNotFoundError(f"No trained model {name!r} for the ensemble: "
                                        f"{Path(config.results_dir) / name / 'models'} does not exist.")
    elif not config.models_dir.is_dir():
        raise FileNotFoundError(f"No trained model {config.model_name!r}: {config.models_dir} has no config.json. "
                                f"Train it first, or pass the --model-name and --results-dir it was trained with.")
    with contextlib.ExitStack() as locks:
        locks.enter_context(RunLock(config.run_dir, f"--predict-only --stage {stage}"))
        for name in ensemble or []:
            locks.enter_context(RunLock(Path(config.results_dir) / name,
                                        f"read by the ensemble {config.model_name!r}", shared=True))
        tidy_folder(predictions_folder(config.run_dir, stage))  # left by a killed run
        return _predict_stage(config, stage, epoch, tta, plots, progress, ensemble)


def _predict_stage(config: TrainConfig, stage: str, epoch: int | str | None, tta: bool, plots: bool,
                   progress: Progress, ensemble: list[str] | None = None) -> PredictionReport:
    stage_dir = Path(config.data_dir) / f"{stage}-pats"
    arrays = load_split(stage_dir, cache_dir=config.cache_dir, require_dose=False,
                        skip_incomplete=config.skip_incomplete, progress=progress)
    members = []  # {"model": name, "epoch": epoch} of each model predicted with
    predictions = None
    member_epoch = "best" if ensemble and epoch is None else epoch  # an ensemble's members: best by default
    for name in ensemble or [config.model_name]:
        models_dir = Path(config.results_dir) / name / "models"
        saved, loaded_epoch, model = load_trained_model(models_dir, member_epoch)
        try:
            predicted = predict_full_resolution(model, arrays, saved.resolution, config.batch_size, tta, progress,
                                                label=f"Model {name!r} at epoch {loaded_epoch}")
        except PredictionError as error:
            raise PredictionError(f"{error}: this checkpoint is unusable (did training diverge? see "
                                  f"{models_dir.parent / LOG_FILE}); nothing was written.") from None
        predictions = predicted if predictions is None else predictions + predicted
        members.append({"model": name, "epoch": loaded_epoch})
        del model
        keras.backend.clear_session()
    if ensemble:
        predictions /= np.float32(len(members))
        epoch = "ensemble"
        logger.info("Ensemble of %s", ", ".join(f"{m['model']} (epoch {m['epoch']})" for m in members))
    else:
        epoch = members[0]["epoch"]

    # The whole set (CSVs, zip, scores) is written into a new folder and moved into place whole.
    predictions_dir = predictions_folder(config.run_dir, stage)
    zip_name = (f"{config.model_name}_{stage}_ensemble.zip" if ensemble else
                f"{config.model_name}_{stage}_epoch_{epoch}.zip")
    scores = None
    new = new_folder_beside(predictions_dir)
    try:
        for row, pid in enumerate(progress(arrays.patient_ids, len(arrays), "Writing")):
            write_dose_csv(new / f"{pid}.csv", predictions[row], arrays.possible_dose_mask[row])
        _write_submission(new, arrays.patient_ids, new / zip_name)
        if arrays.has_dose.any():  # those with reference doses; a warning names the others
            # The scores of the predictions as written (the CSVs' decimals, which a submission is
            # judged on), read back as openkbp-score reads them: both report one number, on any processor.
            scores = score_split(arrays, lambda row: read_prediction(new, arrays.patient_ids[row]), progress,
                                 rows=reference_rows(arrays, stage_dir))
            extra = {"model": config.model_name, "stage": stage, "epoch": epoch}
            write_score_reports(scores, new / SCORES_FILE, (new / SCORES_FILE).with_suffix(".csv"),
                                extra={**extra, "members": members} if ensemble else extra)
        replace_folder(new, predictions_dir)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    _remove_earlier_layout(config.run_dir, stage, config.model_name)
    submission = predictions_dir / zip_name
    scores_path = predictions_dir / SCORES_FILE if scores is not None else None
    logger.info("Wrote %d predictions and %s to %s", len(arrays), zip_name, predictions_dir)
    if plots:
        from provided_code.plots import plot_patient

        plot_dir = config.run_dir / f"{stage}-plots"
        for row, pid in enumerate(progress(arrays.patient_ids, len(arrays), "Plotting")):
            plot_patient(plot_dir, pid, arrays, row, predictions[row])
        logger.info("Wrote plots to %s", plot_dir)
    return PredictionReport(stage, epoch, len(arrays), predictions_dir, submission, scores, scores_path)


def _write_submission(predictions_dir: Path, patient_ids: list[str], path: Path) -> Path:
    """A zip of the prediction CSVs, written beside its final name and moved into place."""
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for pid in patient_ids:
            archive.write(predictions_dir / f"{pid}.csv", arcname=f"{pid}.csv")
    return path


def _remove_earlier_layout(run_dir: Path, stage: str, model_name: str) -> None:
    """The scores and zips that earlier versions wrote beside the predictions folder
    (``<stage>-scores.json``, ``<stage>-scores.csv``, ``submissions/<model>_<stage>_*.zip``)
    describe the predictions just replaced: removed."""
    submissions = Path(run_dir) / "submissions"
    earlier = [Path(run_dir) / f"{stage}-scores.json", Path(run_dir) / f"{stage}-scores.csv",
               *sorted(submissions.glob(f"{glob.escape(model_name)}_{stage}_*.zip"))]
    removed = [path for path in earlier if path.is_file()]
    for path in removed:
        path.unlink()
    if removed:
        with contextlib.suppress(OSError):
            submissions.rmdir()  # when empty
        logger.info("Removed the scores and zips of the earlier predictions (now inside %s): %s",
                    predictions_folder(run_dir, stage), ", ".join(str(path) for path in removed))
