"""One plain log line per epoch (under nohup, tee or a pod's log, where no progress bar is drawn)."""

from __future__ import annotations

import logging

import keras

logger = logging.getLogger(__name__)


class EpochLine(keras.callbacks.Callback):
    """Log ``epoch N/E: loss, val_loss, val dose/DVH score, seconds, samples/s, peak memory`` from the
    epoch's logs, each figure only when the epoch has it (epochs counted from 1)."""

    def __init__(self, epochs: int | None = None):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        logger.info("epoch %d/%s: loss %.4f%s%s, %.1f s, %.2f samples/s%s", epoch + 1, self.epochs or "?",
                    logs["loss"], f", val_loss {logs['val_loss']:.4f}" if "val_loss" in logs else "",
                    f", val dose/DVH score {logs['val_dose_score']:.3f}/{logs['val_dvh_score']:.3f} Gy"
                    if "val_dose_score" in logs else "",
                    logs["epoch_seconds"], logs["samples_per_s"],
                    f", peak memory {logs['peak_memory_mb']:.0f} MB" if "peak_memory_mb" in logs else "")
