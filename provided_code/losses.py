"""Training losses, per patient: ``loss(element, predicted) -> (patients,)`` float32 Gy.

``element`` is a training element (``data.tf_dataset``): ``dose`` ``(patients, z, y, x, 1)`` Gy,
``structure_masks`` (for the DVH term), and, for the masked loss, ``possible_dose_mask``
``(patients, z, y, x)`` bool.
"""

from __future__ import annotations

import tensorflow as tf

from provided_code.config import LOSSES
from provided_code.constants import STRUCTURES


def mean_absolute_error(element: dict, predicted) -> tf.Tensor:
    """The mean of |dose − predicted| over the whole volume (air included): the 2020 starter recipe."""
    return tf.reduce_mean(tf.abs(element["dose"] - tf.cast(predicted, tf.float32)), axis=[1, 2, 3, 4])


def masked_mean_absolute_error(element: dict, predicted) -> tf.Tensor:
    """The mean of |dose − predicted| over the voxels of the possible-dose mask only (what the
    dose score measures); outside the mask the prediction does not count. 0 for an empty mask."""
    mask = tf.cast(element["possible_dose_mask"], tf.float32)[..., None]
    error = tf.reduce_sum(tf.abs(element["dose"] - tf.cast(predicted, tf.float32)) * mask, axis=[1, 2, 3, 4])
    return error / tf.maximum(tf.reduce_sum(mask, axis=[1, 2, 3, 4]), 1.0)


DVH_MOMENTS = (1.0, 2.0, 10.0)  # mean, root mean square, and a soft maximum


def dvh_difference(element: dict, predicted) -> tf.Tensor:
    """A differentiable DVH term: per structure the patient has, the mean over ``DVH_MOMENTS`` p of
    |M_p(predicted) − M_p(reference)|, where M_p = (mean of dose^p over the structure's
    voxels)^(1/p), averaged over the structures the patient has (Gy, like the masked MAE beside
    it). Zero for a perfect prediction; its gradient reaches only voxels inside a structure.

    Moments rather than the sorted voxels: comparing sorted doses per structure (the histograms
    point by point) made a 64³ CPU step 3.6× slower (one sort of the volume per structure). The
    sums of the three powers of both doses over every structure are one matrix product of the
    structures' 0/1 masks (unpacked from the bits by shifts) with the voxels' powers; a segment
    sum over the voxels' bit patterns instead took 1.4 times as long on a CPU (a scatter).
    """
    patients = tf.shape(element["dose"])[0]
    count = len(STRUCTURES)
    patterns = tf.reshape(tf.cast(element["structure_masks"], tf.int32), [patients, 1, -1])
    masks = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(patterns, tf.range(count)[:, None]), 1),
                    tf.float32)  # (patients, structures, voxels)
    exponents = tf.constant(DVH_MOMENTS, tf.float32)

    def powers(dose):  # (patients, voxels, moments)
        dose = tf.maximum(tf.reshape(tf.cast(dose, tf.float32), [patients, -1]), 0.0)
        squared = dose * dose
        return tf.stack([dose, squared, squared * squared * squared * squared * squared], axis=-1)

    reference = tf.stop_gradient(powers(element["dose"]))
    sums = tf.matmul(masks, tf.concat([powers(predicted), reference, tf.ones_like(reference[..., :1])], axis=-1))
    voxels = sums[..., -1]  # (patients, structures)
    # 1e-6 keeps the root's gradient finite where a structure receives no dose
    moments = (sums[..., :-1] / tf.maximum(voxels, 1.0)[..., None] + 1e-6) ** tf.tile(1.0 / exponents, [2])
    count_moments = len(DVH_MOMENTS)
    differences = tf.reduce_mean(tf.abs(moments[..., :count_moments] - moments[..., count_moments:]), axis=-1)
    present = tf.cast(voxels > 0, tf.float32)
    return tf.reduce_sum(differences * present, axis=1) / tf.maximum(tf.reduce_sum(present, axis=1), 1.0)


def loss_function(name: str, dvh_weight: float = 0.0):
    """The per-patient loss called ``name`` (one of ``LOSSES``), plus ``dvh_weight`` × the DVH term
    (:func:`dvh_difference`) when it is not 0."""
    functions = {"mae": mean_absolute_error, "masked-mae": masked_mean_absolute_error}
    if name not in functions:
        raise ValueError(f"Invalid `loss`. Expected one of {LOSSES}. Received: loss={name!r}")
    base = functions[name]
    if not dvh_weight:
        return base
    return lambda element, predicted: base(element, predicted) + dvh_weight * dvh_difference(element, predicted)


def needs_possible_dose_mask(name: str) -> bool:
    return name == "masked-mae"
