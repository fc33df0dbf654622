"""A per-epoch CSV log that survives resumes: one header, each epoch exactly once."""

from __future__ import annotations

import csv
import io
import logging
import os
import time
from pathlib import Path

import keras

from provided_code.errors import UserError
from provided_code.infra.atomic import naming_path, write_text_atomic

logger = logging.getLogger(__name__)

COLUMNS = ("epoch", "loss", "val_loss", "val_dose_score", "val_dvh_score", "learning_rate", "epoch_seconds",
           "samples_per_s", "peak_memory_mb")


class LogError(UserError, ValueError):
    """A training log that does not parse; the message names the file and the line."""


def read_log(path: Path) -> list[dict[str, str]]:
    """The rows of a training log (see :func:`read_log_rows`)."""
    return read_log_rows(path)[0]


def read_log_rows(path: Path) -> tuple[list[dict[str, str]], bool]:
    """``(rows, cut)``: the complete rows of a training log, and whether its last line was cut off
    (no final newline: a crash while the row was written) and left out.

    Raises :class:`LogError` naming the file and line for a log that does not parse.
    """
    path = Path(path)
    if not path.is_file():
        return [], False
    text = path.read_text(errors="replace")
    cut = bool(text) and not text.endswith("\n")
    if cut:
        text = text[:text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None:
        return [], cut
    if "epoch" not in reader.fieldnames:
        raise LogError(f"{path}: not a training log (header {','.join(reader.fieldnames)!r}); move it away and "
                       f"rerun to start a new one")
    rows = []
    for line, row in enumerate(reader, start=2):
        if None in row or None in row.values() or not row["epoch"].isdigit():
            raise LogError(f"{path}: line {line} is not a log row ({len(row)} fields, epoch {row['epoch']!r}); "
                           f"fix or delete that line")
        rows.append(row)
    return rows, cut


def _header(path: Path) -> list[str]:
    with open(path, newline="") as handle:
        return next(csv.reader(handle), [])


class EpochCSVLogger(keras.callbacks.Callback):
    """Append one row per finished epoch to ``path`` (epochs counted from 1).

    On train begin, rows after ``initial_epoch`` (epochs the process finished but did not
    checkpoint before it died) are dropped, since training repeats them, and so is a cut-off last
    row; the log is then rewritten atomically. Rows are flushed and fsynced as they are written.
    """

    def __init__(self, path: Path, initial_epoch: int, samples_per_epoch: int, epochs: int | None = None):
        super().__init__()
        self.epochs = epochs
        self.path = Path(path)
        self.initial_epoch = initial_epoch
        self.samples_per_epoch = samples_per_epoch

    def on_train_begin(self, logs=None):
        rows, cut = read_log_rows(self.path)
        if cut:
            logger.warning("%s ended in a cut-off row (a crash while it was written): left out", self.path)
        kept = [row for row in rows if int(row["epoch"]) <= self.initial_epoch]
        if cut or len(kept) != len(rows) or not self.path.is_file() or _header(self.path) != list(COLUMNS):
            if len(kept) != len(rows):
                logger.info("Dropping %d log row(s) after epoch %d from %s (not checkpointed)",
                            len(rows) - len(kept), self.initial_epoch, self.path)
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, COLUMNS, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows(kept)
            write_text_atomic(self.path, buffer.getvalue())

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self._train_end = None

    def on_test_begin(self, logs=None):  # validation starts: the epoch's training is over
        # (no batch-level hook: one would make Keras sync with the device after every step)
        if self._train_end is None:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        now = time.perf_counter()
        train_seconds = (self._train_end or now) - self._epoch_start
        def scalar(name):  # a float, or "" when absent
            return float(logs[name]) if name in logs else ""

        row = {
            "epoch": epoch + 1,
            "loss": scalar("loss"),
            "val_loss": scalar("val_loss"),
            "val_dose_score": scalar("val_dose_score"),  # empty on epochs that are not scored
            "val_dvh_score": scalar("val_dvh_score"),
            "learning_rate": f"{float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)):.6g}",
            "epoch_seconds": round(now - self._epoch_start, 3),
            "samples_per_s": round(self.samples_per_epoch / train_seconds, 4),
            "peak_memory_mb": scalar("peak_memory_mb"),
        }
        with naming_path(self.path), open(self.path, "a", newline="") as handle:  # a full disk names the log
            csv.DictWriter(handle, COLUMNS, lineterminator="\n").writerow(row)
            handle.flush()
            os.fsync(handle.fileno())
        logger.info("epoch %d/%s: loss %.4f%s%s, %.1f s, %.2f samples/s%s", row["epoch"], self.epochs or "?",
                    row["loss"], f", val_loss {row['val_loss']:.4f}" if row["val_loss"] != "" else "",
                    f", val dose/DVH score {row['val_dose_score']:.3f}/{row['val_dvh_score']:.3f} Gy"
                    if row["val_dose_score"] != "" else "",
                    row["epoch_seconds"], row["samples_per_s"],
                    f", peak memory {row['peak_memory_mb']:.0f} MB" if row["peak_memory_mb"] != "" else "")
