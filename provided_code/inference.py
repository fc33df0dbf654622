"""A trained model's doses for stacked patients: in batches, optionally with mirror flips, brought
back to 128³ and masked as the challenge scores them. Used by ``--predict-only``, by the validation
scores during training and by the DICOM predict command."""

from __future__ import annotations

import keras
import numpy as np

from provided_code.constants import LEFT_PAROTID_BIT, LEFT_RIGHT_AXIS, RIGHT_PAROTID_BIT
from provided_code.data.batches import in_batches
from provided_code.data.cache import SplitArrays
from provided_code.data.resample import downsample_split, upsample_dose
from provided_code.errors import UserError
from provided_code.infra.progress import Progress, no_progress


class PredictionError(UserError, RuntimeError):
    """A model's predictions are unusable (not finite)."""


def use_averaged_weights(model: keras.Model) -> None:
    """Overwrite the model's trainable weights with its optimizer's moving averages (``--ema``):
    the weights a model trained with averaging predicts with."""
    model.optimizer.finalize_variable_values(model.trainable_variables)


def mirror_left_right(structure_masks: np.ndarray, axis: int) -> np.ndarray:
    """Flip a bitfield volume left-right and swap the RightParotid and LeftParotid bits."""
    flipped = np.flip(structure_masks, axis=axis)
    right = (flipped & RIGHT_PAROTID_BIT) != 0
    left = (flipped & LEFT_PAROTID_BIT) != 0
    swapped = flipped & ~np.uint16(RIGHT_PAROTID_BIT | LEFT_PAROTID_BIT)
    return (swapped | np.where(right, LEFT_PAROTID_BIT, 0).astype(np.uint16)
            | np.where(left, RIGHT_PAROTID_BIT, 0).astype(np.uint16))


def predict_arrays(model, arrays: SplitArrays, batch_size: int, tta: bool = False,
                   progress: Progress = no_progress) -> np.ndarray:
    """Doses ``(N, R, R, R)`` float32 Gy at the arrays' resolution, in batches.

    ``model``: a ``keras.Model``, or any callable from a batch's inputs to its doses.
    With ``tta``, the mean of the prediction and the left-right mirrored prediction of the
    mirrored patient (parotids swapped), mirrored back.
    """
    predict_batch = model.predict_on_batch if isinstance(model, keras.Model) else model
    axis = 1 + LEFT_RIGHT_AXIS  # batch axis first
    out = np.empty(arrays.ct.shape, np.float32)
    batches = in_batches(np.arange(len(arrays)), batch_size)
    for rows in progress(batches, len(batches), "Predicting"):
        inputs = {"ct": arrays.ct[rows], "structure_masks": arrays.structure_masks[rows]}
        dose = np.asarray(predict_batch(inputs))[..., 0]
        if tta:
            mirrored = {"ct": np.ascontiguousarray(np.flip(inputs["ct"], axis)),
                        "structure_masks": np.ascontiguousarray(mirror_left_right(inputs["structure_masks"], axis))}
            dose = 0.5 * (dose + np.flip(np.asarray(predict_batch(mirrored))[..., 0], axis))
        out[rows] = dose
    return out


def predict_full_resolution(model, arrays: SplitArrays, resolution: int, batch_size: int, tta: bool = False,
                            progress: Progress = no_progress, label: str = "",
                            at_resolution: SplitArrays | None = None) -> np.ndarray:
    """Doses ``(N, 128, 128, 128)`` float32 Gy for 128³ ``arrays``: predicted at ``resolution``,
    brought back to 128³ and zeroed outside each possible-dose mask, as submitted and scored.
    ``at_resolution``: the same patients already at ``resolution`` (training keeps its validation
    patients so); otherwise they are brought there here.

    Raises :class:`PredictionError` naming the patients whose predictions are not finite
    (``label`` says whose model, for the message).
    """
    if at_resolution is None:
        at_resolution = downsample_split(arrays, resolution)
    low = predict_arrays(model, at_resolution, batch_size, tta, progress)
    broken = [pid for pid, dose in zip(arrays.patient_ids, low) if not np.isfinite(dose).all()]
    if broken:
        raise PredictionError(f"{label or 'The model'} predicts NaN or infinite doses for {', '.join(broken)}")
    predictions = np.empty(arrays.dose.shape, np.float32)
    for row in range(len(arrays)):
        predictions[row] = upsample_dose(low[row], arrays.possible_dose_mask[row])
    return predictions
