"""``training_curves.png`` beside the log, redrawn after each scored epoch (needs matplotlib)."""

from __future__ import annotations

import logging

import keras

from provided_code.plots import has_matplotlib, plot_training_curves
from provided_code.run_folder import RunFolder
from provided_code.training.epoch_log import read_log

logger = logging.getLogger(__name__)


class TrainingCurves(keras.callbacks.Callback):
    """Redraw the run's ``training_curves.png`` at every epoch with validation scores: the rows of
    its log as they were when training began, then each epoch's logs; the best epoch from
    ``best.json``. Without matplotlib it says so once and draws nothing.
    """

    def __init__(self, folder: RunFolder, initial_epoch: int):
        super().__init__()
        self.folder = folder
        self.path = folder.curves
        self.initial_epoch = initial_epoch
        self.rows: list[dict] = []
        self.enabled = True

    def on_train_begin(self, logs=None):
        self.enabled = has_matplotlib()
        if not self.enabled:
            logger.info("No matplotlib: no %s (pip install 'provided_code[plots]')", self.path.name)
        self.rows = [row for row in read_log(self.folder.log) if int(row["epoch"]) <= self.initial_epoch]

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        self.rows.append({"epoch": epoch + 1, **{name: str(value) for name, value in logs.items()}})
        if self.enabled and "val_dose_score" in logs:
            best = self.folder.read_best()
            plot_training_curves(self.rows, self.path, best and best["epoch"])
