"""``training_curves.png`` beside the log, redrawn after each scored epoch (needs matplotlib)."""

from __future__ import annotations

import logging
from pathlib import Path

import keras

from provided_code.plots import has_matplotlib, plot_training_curves
from provided_code.training.checkpoints import read_best
from provided_code.training.epoch_log import read_log

logger = logging.getLogger(__name__)


class TrainingCurves(keras.callbacks.Callback):
    """Redraw ``path`` at every epoch with validation scores: the rows of the CSV log ``log_path``
    as they were when training began, then each epoch's logs; the best epoch from ``best.json`` in
    ``models_dir``. Without matplotlib it says so once and draws nothing.
    """

    def __init__(self, log_path: Path, path: Path, models_dir: Path, initial_epoch: int):
        super().__init__()
        self.log_path = Path(log_path)
        self.path = Path(path)
        self.models_dir = Path(models_dir)
        self.initial_epoch = initial_epoch
        self.rows: list[dict] = []
        self.enabled = True

    def on_train_begin(self, logs=None):
        self.enabled = has_matplotlib()
        if not self.enabled:
            logger.info("No matplotlib: no %s (pip install 'provided_code[plots]')", self.path.name)
        self.rows = [row for row in read_log(self.log_path) if int(row["epoch"]) <= self.initial_epoch]

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        self.rows.append({"epoch": epoch + 1, **{name: str(value) for name, value in logs.items()}})
        if self.enabled and "val_dose_score" in logs:
            best = read_best(self.models_dir)
            plot_training_curves(self.rows, self.path, best and best["epoch"])
