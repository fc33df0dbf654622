"""The challenge's scores on the validation patients every few epochs, and the best checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import keras

from provided_code.data.split_arrays import SplitArrays
from provided_code.inference import PredictionError, predict_full_resolution
from provided_code.metrics.scoring import score_split
from provided_code.model_spec import ModelSpec
from provided_code.run_folder import BEST_FILE, RunFolder
from provided_code.training.loop import EpochMeasure

logger = logging.getLogger(__name__)


def is_scoring_epoch(done: int, score_every: int, epochs: int) -> bool:
    """Whether the epoch that brings the run to ``done`` epochs is scored (every N and the last)."""
    return score_every > 0 and (done % score_every == 0 or done == epochs)


@dataclasses.dataclass
class Validation:
    """The validation patients that have reference doses: at the training resolution (the
    validation loss, and the predictions that are scored) and at 128³ (what they are scored against)."""

    arrays: SplitArrays
    full: SplitArrays


class ValidationScores(EpochMeasure):
    """Every ``score_every`` epochs and at epoch ``epochs``, predict the validation patients, bring
    them to 128³ and mask them as ``--predict-only`` does, and score them with the code of
    ``openkbp-score``: ``val_dose_score`` and ``val_dvh_score``; keep ``best.keras`` (lowest dose
    score so far, its record ``best.json`` read back on resume).

    ``validation``: the patients, downsampled once when loaded. ``model``: what is saved as best.
    ``predict_batch``: inputs → doses at the training resolution (a plain model call, no
    collectives: only the chief scores). ``spec``: what the model is (its resolution and inputs).
    """

    def __init__(self, validation: Validation, batch_size: int, score_every: int, epochs: int,
                 folder: RunFolder, model: keras.Model, predict_batch, spec: ModelSpec):
        self.validation = validation
        self.model = model
        self.batch_size = batch_size
        self.score_every = score_every
        self.epochs = epochs
        self.folder = folder
        self.predict_batch = predict_batch
        self.spec = spec
        self.best = None

    def start(self) -> None:
        self.folder.models.mkdir(parents=True, exist_ok=True)
        self.folder.remove_unfinished_best()  # left by a process killed while saving best.keras
        self.best = self.folder.read_best()
        if self.best is not None:
            logger.info("Best so far: epoch %d, validation dose score %.4f Gy (%s)", self.best["epoch"],
                        self.best["val_dose_score"], self.folder.best_checkpoint)

    def measure(self, epoch: int) -> dict:
        done = epoch + 1
        if not is_scoring_epoch(done, self.score_every, self.epochs):
            return {}
        start = time.perf_counter()
        try:
            predictions = predict_full_resolution(self.predict_batch, self.validation.full, self.spec,
                                                  self.batch_size, label=f"The model at epoch {done}",
                                                  at_resolution=self.validation.arrays)
        except PredictionError as error:
            logger.warning("Validation scores skipped at epoch %d: %s", done, error)
            return {}
        scores = score_split(self.validation.full, lambda row: predictions[row])
        improved = math.isfinite(scores.dose_score) and (
            self.best is None or scores.dose_score < self.best["val_dose_score"])
        if improved:
            self.best = {"epoch": done, "val_dose_score": scores.dose_score, "val_dvh_score": scores.dvh_score}
            self.folder.save_best(self.model, self.best)
        logger.info("epoch %d: validation dose score %.4f Gy, DVH score %.4f Gy (%d patients, %.1f s)%s", done,
                    scores.dose_score, scores.dvh_score, len(self.validation.full), time.perf_counter() - start,
                    f"; new best, saved {BEST_FILE}" if improved else
                    f"; best: epoch {self.best['epoch']}" if self.best else "")
        return {"val_dose_score": scores.dose_score, "val_dvh_score": scores.dvh_score}
