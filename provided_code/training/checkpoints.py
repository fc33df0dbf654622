"""Rotating ``.keras`` checkpoints while training: ``models/epoch_<N>.keras`` every few epochs, the
newest kept, each written atomically (where they live, and loading them: :mod:`provided_code.run_folder`)."""

from __future__ import annotations

import logging
import math

import keras

from provided_code.infra.atomic import atomic_path
from provided_code.run_folder import RunFolder

logger = logging.getLogger(__name__)


class RotatingCheckpoint(keras.callbacks.Callback):
    """Save ``epoch_<N>.keras`` every ``save_every`` epochs and at epoch ``epochs``; keep the newest ``keep``.

    Each file is written under a temporary name in the same folder and moved into place; older
    checkpoints are deleted only after the new one is in place. An epoch whose loss is not finite
    is not saved, and rotates nothing away: rotation runs only after a checkpoint of a finite loss
    is in place, so the newest such checkpoint is never deleted, whatever ``keep`` says (the run
    stops on such an epoch before this callback: :mod:`provided_code.training.divergence`).

    ``kept_until_scored``: after a recipe change (``--change-recipe``), the epochs done before it: the
    newest checkpoint of those epochs is not rotated away until an epoch of the new recipe has
    been scored on the validation patients (a finite ``val_dose_score``), so that a change that
    makes worse models, without diverging, still leaves the model from before it.
    """

    def __init__(self, folder: RunFolder, save_every: int, keep: int, epochs: int,
                 kept_until_scored: int | None = None):
        super().__init__()
        self.folder = folder
        self.save_every = save_every
        self.keep = keep
        self.epochs = epochs
        self.kept_until_scored = kept_until_scored

    def on_train_begin(self, logs=None):
        self.folder.models.mkdir(parents=True, exist_ok=True)
        self.folder.remove_unfinished_checkpoints()  # left by a process killed mid-save

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        scored = (logs or {}).get("val_dose_score")
        if self.kept_until_scored is not None and scored is not None and math.isfinite(scored):
            logger.info("Epoch %d of the changed recipe is scored: the checkpoints before the change rotate as usual",
                        done)
            self.kept_until_scored = None
        if done % self.save_every and done != self.epochs:
            return
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            logger.warning("Not saving epoch %d: its loss is %s; the checkpoints stay as they are", done, loss)
            return
        final = self.folder.checkpoint(done)
        with atomic_path(final, suffix=".keras") as tmp:  # Keras insists on the extension
            self.model.save(tmp)
        logger.info("Saved checkpoint %s", final)
        checkpoints = self.folder.checkpoints()
        before_change = next((epoch for epoch, _ in checkpoints if self.kept_until_scored is not None
                              and epoch <= self.kept_until_scored), None)
        for old_epoch, old in checkpoints[self.keep:]:
            if old_epoch == before_change:
                logger.info("Keeping %s, the newest checkpoint before the recipe change, until an epoch of the new "
                            "recipe is scored", old)
                continue
            old.unlink()
