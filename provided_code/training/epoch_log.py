"""The per-epoch CSV log (``training_log.csv``), which survives resumes: one header, each epoch exactly
once. Read, repaired before a run trains on, and appended to, epoch after epoch."""

from __future__ import annotations

import csv
import io
import logging
import os
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


def repair_log(path: Path, initial_epoch: int) -> None:
    """Before a run trains on: drop the rows after ``initial_epoch`` (epochs a process finished but
    did not checkpoint before it died: training repeats them) and a cut-off last row, and give the
    log today's header; rewritten whole (atomically) only when something changes."""
    path = Path(path)
    rows, cut = read_log_rows(path)
    if cut:
        logger.warning("%s ended in a cut-off row (a crash while it was written): left out", path)
    kept = [row for row in rows if int(row["epoch"]) <= initial_epoch]
    if cut or len(kept) != len(rows) or not path.is_file() or _header(path) != list(COLUMNS):
        if len(kept) != len(rows):
            logger.info("Dropping %d log row(s) after epoch %d from %s (not checkpointed)",
                        len(rows) - len(kept), initial_epoch, path)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
        write_text_atomic(path, buffer.getvalue())


class EpochCSVLogger(keras.callbacks.Callback):
    """Append one row per finished epoch to ``path`` (epochs counted from 1), from the epoch's logs
    (:data:`COLUMNS`; the learning rate from the optimizer), flushed and fsynced as it is written.
    The run repairs the log before it trains (:func:`repair_log`)."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}

        def scalar(name):  # a float, or "" when absent (the scores on epochs that are not scored)
            return float(logs[name]) if name in logs else ""

        row = {name: scalar(name) for name in COLUMNS}
        row["epoch"] = epoch + 1
        row["learning_rate"] = f"{float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)):.6g}"
        with naming_path(self.path), open(self.path, "a", newline="") as handle:  # a full disk names the log
            csv.DictWriter(handle, COLUMNS, lineterminator="\n").writerow(row)
            handle.flush()
            os.fsync(handle.fileno())
