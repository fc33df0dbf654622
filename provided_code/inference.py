"""A trained model's doses for stacked patients: in batches, optionally with mirror flips, brought
back to 128³ and masked as the challenge scores them. Used by ``--predict-only``, by the validation
scores during training and by the DICOM predict command."""

from __future__ import annotations

import keras
import numpy as np

from provided_code.constants import LEFT_RIGHT_AXIS
from provided_code.data.batches import fit_vectors, in_batches, take_inputs
from provided_code.data.split_arrays import SplitArrays
from provided_code.data.resample import downsample_split, upsample_dose
from provided_code.errors import UserError
from provided_code.infra.progress import Progress, no_progress
from provided_code.model_spec import ANGLES, STRUCTURE_BITS, VOLUME, InputSpec, ModelSpec, swap_mirror_bits


class PredictionError(UserError, RuntimeError):
    """A model's predictions are unusable (not finite)."""


def use_averaged_weights(model: keras.Model) -> None:
    """Overwrite the model's trainable weights with its optimizer's moving averages (``--ema``):
    the weights a model trained with averaging predicts with."""
    model.optimizer.finalize_variable_values(model.trainable_variables)


def mirror_left_right(structure_masks: np.ndarray, axis: int, mirror_bits) -> np.ndarray:
    """Flip a bitfield volume left-right and swap the bits of each ``(right, left)`` pair of
    ``mirror_bits`` (a site's ``mirror_bits``: OpenKBP's, the parotids):
    :func:`provided_code.model_spec.swap_mirror_bits`, as augmentation swaps them."""
    return swap_mirror_bits(np.flip(structure_masks, axis=axis), mirror_bits, np.where)


def mirrored_inputs(inputs: dict[str, np.ndarray], specs: tuple[InputSpec, ...], axis: int) -> dict[str, np.ndarray]:
    """A batch's model inputs of the patients mirrored left-right (``--tta``), each as its
    declaration says a flip moves it: volumes flipped along ``axis``, structure bits also swapped
    pair by pair, gantry angles g to -g; the rest as is."""
    mirrored = {}
    for spec in specs:
        value = inputs[spec.name]
        if spec.moves == VOLUME:
            value = np.ascontiguousarray(np.flip(value, axis))
        elif spec.moves == STRUCTURE_BITS:
            value = np.ascontiguousarray(mirror_left_right(value, axis, spec.mirror_bits))
        elif spec.moves == ANGLES:
            value = np.mod(-value, np.float32(360.0)).astype(np.float32)
        mirrored[spec.name] = value
    return mirrored


def predict_arrays(model, arrays: SplitArrays, spec: ModelSpec, batch_size: int, tta: bool = False,
                   progress: Progress = no_progress) -> np.ndarray:
    """Doses ``(N, R, R, R)`` float32 Gy at the arrays' resolution, in batches.

    ``model``: a ``keras.Model``, or any callable from a batch's inputs to its doses; ``spec``: the
    model it is (its inputs). With ``tta``, the mean of the prediction and the left-right mirrored
    prediction of the mirrored patient (mirror pairs swapped, angles mirrored), mirrored back.
    """
    inputs = spec.inputs
    arrays = fit_vectors(arrays, inputs)  # the per-patient vectors, once (none for OpenKBP's two volumes)
    predict_batch = model.predict_on_batch if isinstance(model, keras.Model) else model
    axis = 1 + LEFT_RIGHT_AXIS  # batch axis first
    out = np.empty(arrays.ct.shape, np.float32)
    batches = in_batches(np.arange(len(arrays)), batch_size)
    for rows in progress(batches, len(batches), "Predicting"):
        batch = take_inputs(arrays, rows, inputs)
        dose = np.asarray(predict_batch(batch))[..., 0]
        if tta:
            mirrored = mirrored_inputs(batch, inputs, axis)
            dose = 0.5 * (dose + np.flip(np.asarray(predict_batch(mirrored))[..., 0], axis))
        out[rows] = dose
    return out


def predict_full_resolution(model, arrays: SplitArrays, spec: ModelSpec, batch_size: int, tta: bool = False,
                            progress: Progress = no_progress, label: str = "",
                            at_resolution: SplitArrays | None = None) -> np.ndarray:
    """Doses ``(N, 128, 128, 128)`` float32 Gy for 128³ ``arrays``: predicted by the model ``spec``
    describes at its resolution, brought back to 128³ and zeroed outside each possible-dose mask,
    as submitted and scored. ``at_resolution``: the same patients already at the model's
    resolution (training keeps its validation patients so); otherwise they are brought there here.

    Raises :class:`PredictionError` naming the patients whose predictions are not finite
    (``label`` says whose model, for the message).
    """
    if at_resolution is None:
        at_resolution = downsample_split(arrays, spec.resolution)
    low = predict_arrays(model, at_resolution, spec, batch_size, tta, progress)
    broken = [pid for pid, dose in zip(arrays.patient_ids, low) if not np.isfinite(dose).all()]
    if broken:
        raise PredictionError(f"{label or 'The model'} predicts NaN or infinite doses for {', '.join(broken)}")
    predictions = np.empty(arrays.dose.shape, np.float32)
    for row in range(len(arrays)):
        predictions[row] = upsample_dose(low[row], arrays.possible_dose_mask[row])
    return predictions
