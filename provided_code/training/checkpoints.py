"""Rotating ``.keras`` checkpoints (``models/epoch_<N>.keras``, newest kept) and the best one
(``models/best.keras`` with ``best.json``, never rotated); all written atomically."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import zipfile
from pathlib import Path

import keras

from provided_code.infra.atomic import atomic_path
from provided_code.errors import UserError

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^epoch_(\d+)\.keras$")
BEST_FILE = "best.keras"
BEST_RECORD = "best.json"  # {"epoch": N, "val_dose_score": Gy, "val_dvh_score": Gy}


class CheckpointError(UserError, RuntimeError):
    """A checkpoint (or the best checkpoint's record) that was asked for does not load."""


def list_checkpoints(models_dir: Path) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every checkpoint, newest first."""
    if not models_dir.is_dir():
        return []
    found = [(int(m.group(1)), models_dir / name) for name in os.listdir(models_dir)
             if (m := _CHECKPOINT.match(name))]
    return sorted(found, reverse=True)


def load_newest(models_dir: Path, epoch: int | None = None, compile: bool = True) -> tuple[int, keras.Model] | None:
    """The newest checkpoint that loads (or exactly ``epoch``), as ``(epoch, model)``.

    A checkpoint that fails to load (truncated, corrupt) is reported and the previous one tried.
    Returns None when there is no checkpoint at all; raises :class:`CheckpointError` if ``epoch``
    is given and does not load, or if no checkpoint loads (a Keras upgrade could do that to a
    long run: never start over without being asked).
    """
    import provided_code.networks.layers  # noqa: F401  (registers the custom layers)

    candidates = list_checkpoints(models_dir)
    if epoch is not None:
        candidates = [(e, p) for e, p in candidates if e == epoch]
        if not candidates:
            raise FileNotFoundError(f"No checkpoint for epoch {epoch} in {models_dir} "
                                    f"(have: {[e for e, _ in list_checkpoints(models_dir)]})")
    failures = []
    for found_epoch, path in candidates:
        try:
            return found_epoch, _load(path, compile)
        except Exception as error:  # noqa: BLE001 - any failure means "this file is unusable"
            if epoch is not None:
                raise CheckpointError(f"Checkpoint {path} does not load: {_reason(path, error)}") from error
            reason = _reason(path, error)
            logger.warning("Checkpoint %s does not load (%s); trying the previous one", path, reason)
            failures.append(f"{path.name} ({reason[:200]})")
    if candidates:
        raise CheckpointError(f"No checkpoint in {models_dir} loads: {'; '.join(failures)}. To train this model "
                              f"from scratch, pass --start-over (the old files are moved aside, not deleted).")
    return None


class _NotAKerasFile(ValueError):
    pass


def _load(path: Path, compile: bool) -> keras.Model:
    """``keras.models.load_model``, except that a file that is not a zip archive (a ``.keras``
    file cut off while it was written or copied, or not a checkpoint at all) says so: Keras calls
    it "File not found"."""
    if path.is_file() and not zipfile.is_zipfile(path):
        raise _NotAKerasFile(f"not a complete .keras file (a zip archive): truncated or corrupt, "
                             f"{path.stat().st_size} bytes")
    return keras.models.load_model(path, compile=compile)


def _reason(path: Path, error: Exception) -> str:
    """The first line of why ``path`` did not load."""
    text = str(error).splitlines()[0] if str(error) else ""
    return text if isinstance(error, _NotAKerasFile) else f"{type(error).__name__}: {text}"


def read_best(models_dir: Path) -> dict | None:
    """The record of ``best.keras`` (epoch and validation scores), or None if there is none."""
    path = Path(models_dir) / BEST_RECORD
    if not path.is_file():
        return None
    if not (Path(models_dir) / BEST_FILE).is_file():
        logger.warning("Ignoring %s: %s beside it is missing", path, BEST_FILE)
        return None
    try:
        record = json.loads(path.read_text())
        return {"epoch": int(record["epoch"]), "val_dose_score": float(record["val_dose_score"]),
                "val_dvh_score": float(record["val_dvh_score"])}
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"Invalid best-checkpoint record {path}: {type(error).__name__}: {error}. "
                              f"Delete it (and {BEST_FILE} beside it) to start the best-so-far afresh.") from None


def save_best(model: keras.Model, models_dir: Path, record: dict) -> Path:
    """Write ``best.keras`` and then its record, each atomically (the record is moved into place
    right after the model, so the two describe the same epoch)."""
    models_dir = Path(models_dir)
    final = models_dir / BEST_FILE
    with atomic_path(models_dir / BEST_RECORD) as record_tmp:
        record_tmp.write_text(json.dumps(record, indent=2) + "\n")
        with atomic_path(final, suffix=".keras") as tmp:
            model.save(tmp)
    return final


def load_best(models_dir: Path) -> tuple[int, keras.Model]:
    """``(epoch, model)`` of ``best.keras``; a clear error if there is none or it does not load."""
    import provided_code.networks.layers  # noqa: F401  (registers the custom layers)

    path = Path(models_dir) / BEST_FILE
    record = read_best(models_dir)
    if record is None or not path.is_file():
        raise FileNotFoundError(f"No best checkpoint in {models_dir} ({BEST_FILE} and {BEST_RECORD}): it is written "
                                f"when validation patients with doses are scored during training (--score-every).")
    try:
        return record["epoch"], _load(path, compile=False)
    except Exception as error:  # noqa: BLE001 - any failure means "this file is unusable"
        raise CheckpointError(f"Checkpoint {path} does not load: {_reason(path, error)}") from error


def set_aside(run_dir: Path, names: list[Path]) -> Path | None:
    """Move ``names`` (files of a run) into ``run_dir/abandoned-<time>/``; return that folder."""
    present = [path for path in names if path.exists()]
    if not present:
        return None
    folder = Path(run_dir) / time.strftime("abandoned-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    for path in present:
        os.replace(path, folder / path.name)
    return folder


class RotatingCheckpoint(keras.callbacks.Callback):
    """Save ``epoch_<N>.keras`` every ``save_every`` epochs and at epoch ``epochs``; keep the newest ``keep``.

    Each file is written under a temporary name in the same folder and moved into place; older
    checkpoints are deleted only after the new one is in place. An epoch whose loss is not finite
    is not saved, and rotates nothing away: rotation runs only after a checkpoint of a finite loss
    is in place, so the newest such checkpoint is never deleted, whatever ``keep`` says (the run
    stops on such an epoch before this callback: :mod:`provided_code.training.divergence`).
    """

    def __init__(self, models_dir: Path, save_every: int, keep: int, epochs: int):
        super().__init__()
        self.models_dir = Path(models_dir)
        self.save_every = save_every
        self.keep = keep
        self.epochs = epochs

    def on_train_begin(self, logs=None):
        self.models_dir.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(self.models_dir):  # left by a process killed mid-save
            if name.startswith(".epoch_") and name.endswith(".keras"):
                (self.models_dir / name).unlink()

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if done % self.save_every and done != self.epochs:
            return
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            logger.warning("Not saving epoch %d: its loss is %s; the checkpoints stay as they are", done, loss)
            return
        final = self.models_dir / f"epoch_{done}.keras"
        with atomic_path(final, suffix=".keras") as tmp:  # Keras insists on the extension
            self.model.save(tmp)
        logger.info("Saved checkpoint %s", final)
        for _, old in list_checkpoints(self.models_dir)[self.keep:]:
            old.unlink()
