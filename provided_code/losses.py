"""Training losses, per patient: ``loss(element, predicted) -> (patients,)`` float32 Gy.

``element`` is a training element (``data.tf_dataset``): ``dose`` ``(patients, z, y, x, 1)`` Gy,
``structure_masks`` (for the DVH term), and, for the masked loss, ``possible_dose_mask``
``(patients, z, y, x)`` bool.
"""

from __future__ import annotations

import tensorflow as tf

from provided_code.config import LOSSES
from provided_code.constants import STRUCTURES, structures_of_patterns


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
    moments of every structure come from one segment sum of the dose's three powers over the
    voxels' structure bit patterns, and still tie each structure's mean, spread and high end
    (D_0.1cc, D1) to the reference's.
    """
    patients = tf.shape(element["dose"])[0]
    count = len(STRUCTURES)
    # Voxels grouped by their structures' bit pattern (patient by patient): sums over each of the
    # 1024 patterns, then over the patterns that hold each structure.
    patterns = tf.bitwise.bitwise_and(tf.reshape(tf.cast(element["structure_masks"], tf.int32), [patients, -1]),
                                      2**count - 1)
    segments = tf.reshape(patterns + (2**count) * tf.range(patients)[:, None], [-1])
    structures_of_pattern = tf.constant(structures_of_patterns(), tf.float32)
    exponents = tf.constant(DVH_MOMENTS, tf.float32)

    def sums_by_structure(values):  # (patients × voxels, k) -> (patients, structures, k)
        by_pattern = tf.math.unsorted_segment_sum(values, segments, patients * 2**count)
        return tf.einsum("pqk,qs->psk", tf.reshape(by_pattern, [patients, 2**count, -1]), structures_of_pattern)

    voxels = sums_by_structure(tf.ones_like(tf.cast(segments, tf.float32))[:, None])[..., 0]  # (patients, structures)

    def moments(dose):
        dose = tf.maximum(tf.reshape(tf.cast(dose, tf.float32), [-1]), 0.0)
        squared = dose * dose
        tenth = squared * squared * squared * squared * squared
        sums = sums_by_structure(tf.stack([dose, squared, tenth], axis=-1))
        # 1e-6 keeps the root's gradient finite where a structure receives no dose
        return (sums / tf.maximum(voxels, 1.0)[..., None] + 1e-6) ** (1.0 / exponents)

    differences = tf.reduce_mean(tf.abs(moments(predicted) - moments(element["dose"])), axis=-1)
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
