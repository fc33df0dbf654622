"""``training_curves.png`` beside the log, redrawn after each scored epoch (needs matplotlib)."""

from __future__ import annotations

import logging
from pathlib import Path

import keras

from provided_code.plots import has_matplotlib, plot_training_curves
from provided_code.training.epoch_log import read_log

logger = logging.getLogger(__name__)


class TrainingCurves(keras.callbacks.Callback):
    """Redraw ``path`` from the CSV log ``log_path`` at every epoch with validation scores.

    Place after the CSV logger. Without matplotlib it says so once and draws nothing.
    """

    def __init__(self, log_path: Path, path: Path, best_epoch=lambda: None):
        super().__init__()
        self.log_path = Path(log_path)
        self.path = Path(path)
        self.best_epoch = best_epoch
        self.enabled = True

    def on_train_begin(self, logs=None):
        self.enabled = has_matplotlib()
        if not self.enabled:
            logger.info("No matplotlib: no %s (pip install 'provided_code[plots]')", self.path.name)

    def on_epoch_end(self, epoch, logs=None):
        if self.enabled and logs and "val_dose_score" in logs:
            plot_training_curves(read_log(self.log_path), self.path, self.best_epoch())
