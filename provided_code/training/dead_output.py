"""A run whose output has died stops and says so.

A network whose dose head ends in a ReLU can push the head's input below zero on every voxel: it
then predicts 0 Gy everywhere, no gradient flows back through the ReLU, and it never learns again
(the residual U-Net did so on the prostate phantoms: its training loss stayed at the zero dose's
from the second epoch to the last, and nothing said why). After each epoch's updates, the model
predicts a few training patients (the same ones each time); if its doses inside their possible-dose
masks are the same on every voxel (within ``SPREAD_GY``) at ``PATIENCE`` checks in a row, the run
stops before that epoch is validated, logged or saved, with what it predicts and what to try. The
check costs one forward pass of ``batch_size`` patients an epoch.
"""

from __future__ import annotations

import logging

import numpy as np

from provided_code.data.batches import fit_vectors, take_inputs
from provided_code.data.split_arrays import SplitArrays
from provided_code.errors import UserError
from provided_code.model_spec import ModelSpec
from provided_code.training.loop import EpochMeasure

logger = logging.getLogger(__name__)

SPREAD_GY = 1e-3  # doses closer than this on every voxel of every probed patient: one constant dose
PATIENCE = 2  # checks in a row (a dead ReLU head stays dead; two rule out an inference-time coincidence)


class DeadOutputError(UserError, RuntimeError):
    """Training stopped: the model predicts one dose whatever its input; the message says what to try."""


class DeadOutputGuard(EpochMeasure):
    """After each epoch's updates, raise :class:`DeadOutputError` when the model's doses for the
    probe patients (the first ``batch_size`` of ``arrays``, at the training resolution) have been
    constant inside their possible-dose masks for ``PATIENCE`` epochs in a row.

    ``predict_batch``: inputs → doses (a plain model call, no collectives: only the chief checks).
    ``spec``: the model's (its inputs and head, for the advice). ``newest_checkpoint``: a function
    giving the checkpoint a resume would start from, for the message."""

    def __init__(self, arrays: SplitArrays, batch_size: int, predict_batch, spec: ModelSpec,
                 newest_checkpoint=lambda: None):
        rows = np.arange(min(batch_size, len(arrays)))
        self.inputs = take_inputs(fit_vectors(arrays.select(rows), spec.inputs), rows, spec.inputs)
        self.masks = np.asarray(arrays.possible_dose_mask[rows]).astype(bool)
        self.patients = [arrays.patient_ids[row] for row in rows]
        self.predict_batch = predict_batch
        self.spec = spec
        self.newest_checkpoint = newest_checkpoint
        self.constant_since: int | None = None  # the first epoch (1-based) of the current constant run

    def end_updates(self, epoch: int) -> None:
        done = epoch + 1
        doses = np.asarray(self.predict_batch(self.inputs))[..., 0]
        inside = doses[self.masks] if self.masks.any() else doses.ravel()
        if inside.size == 0 or not np.isfinite(inside).all() or np.ptp(inside) > SPREAD_GY:
            self.constant_since = None
            return
        self.constant_since = self.constant_since or done
        if done - self.constant_since + 1 < PATIENCE:
            logger.warning("Epoch %d: the model predicts %.4g Gy on every voxel of training patients %s", done,
                           float(inside.mean()), ", ".join(self.patients))
            return
        newest = self.newest_checkpoint()
        advice = ("its head ends in a ReLU whose input is below zero everywhere, so no gradient reaches the "
                  "network: train it anew (--start-over) with --head leaky or --head softplus, which keep a "
                  "gradient, or a lower --learning-rate" if self.spec.head == "relu" else
                  "train it anew (--start-over) with a lower --learning-rate, or check the data (are the doses "
                  "and possible-dose masks what they should be?)")
        raise DeadOutputError(
            f"Training stopped at epoch {done}: the model's output has died. Since epoch {self.constant_since} it "
            f"predicts {float(inside.mean()):.4g} Gy on every voxel inside the possible-dose masks of training "
            f"patients {', '.join(self.patients)}, whatever their anatomy; {advice}. Stopped before saving that "
            f"epoch" + (f"; the newest checkpoint, {newest}, is kept" if newest is not None else "") + ".")
