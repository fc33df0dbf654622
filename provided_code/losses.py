"""Training losses, per patient: ``loss(element, predicted) -> (patients,)`` float32 Gy.

``element`` is a training element (``data.tf_dataset``): ``dose`` ``(patients, R, R, R, 1)`` Gy,
``structure_masks`` (for the DVH term), and, for the masked loss, ``possible_dose_mask``
``(patients, R, R, R)`` bool; the volumes' axes are OpenKBP's (``constants``: anterior to
posterior, right to left, superior to inferior). The losses treat the three alike.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from provided_code.config import LOSSES
from provided_code.model_spec import ModelSpec
from provided_code.sites import mask_dtype_for


def mean_absolute_error(element: dict, predicted) -> tf.Tensor:
    """The mean of |dose − predicted| over the whole volume (air included): the 2020 starter recipe."""
    return tf.reduce_mean(tf.abs(element["dose"] - tf.cast(predicted, tf.float32)), axis=[1, 2, 3, 4])


def masked_mean_absolute_error(element: dict, predicted) -> tf.Tensor:
    """The mean of |dose − predicted| over the voxels of the possible-dose mask only (what the
    dose score measures); outside the mask the prediction does not count. 0 for an empty mask."""
    mask = tf.cast(element["possible_dose_mask"], tf.float32)[..., None]
    error = tf.reduce_sum(tf.abs(element["dose"] - tf.cast(predicted, tf.float32)) * mask, axis=[1, 2, 3, 4])
    return error / tf.maximum(tf.reduce_sum(mask, axis=[1, 2, 3, 4]), 1.0)


DVH_MOMENTS = (1.0, 2.0, 10.0)  # mean, root mean square, a soft maximum; dvh_difference multiplies these out


def dvh_difference(element: dict, predicted, structures: int) -> tf.Tensor:
    """A differentiable DVH term: per structure the patient has, the mean over ``DVH_MOMENTS`` p of
    |M_p(predicted) − M_p(reference)|, where M_p = (mean of dose^p over the structure's
    voxels)^(1/p), averaged over the structures the patient has (Gy, like the masked MAE beside
    it). Zero for a perfect prediction; its gradient reaches only voxels inside a structure.
    ``structures``: how many bits of ``structure_masks`` are structures (the site's: OpenKBP's 10).

    Moments rather than the sorted voxels: comparing sorted doses per structure (the histograms
    point by point) made a 64³ CPU step 3.6× slower (one sort of the volume per structure). The
    sums of the three powers of both doses over every structure are matrix products of the
    structures' masks ``(patients, structures, voxels)``, unpacked from the bits, with the powers
    laid out the same way ``(patients, powers, voxels)``: a product along the voxels' contiguous
    axis. On a 64³ CPU step (loss and gradient) this layout took half the time of the powers
    stacked on the last axis; a segment sum over the voxels' bit patterns (a scatter) and a
    gather of the masks from a table of the 1,024 patterns were slower still. The reference's
    sums are a product of their own, so the gradient's product computes the prediction's rows
    only.
    """
    patients = tf.shape(element["dose"])[0]
    packing = mask_dtype_for(structures)  # the site's: uint16 (OpenKBP), uint32 above 16 structures
    patterns = tf.reshape(tf.cast(element["structure_masks"], tf.as_dtype(packing)), [patients, 1, -1])
    bits = np.left_shift(1, np.arange(structures)).astype(packing)
    # each structure's bit itself, 0 or 2^k, not shifted down to 0 or 1 (one pass fewer over the
    # volume): structure k's sums and its voxel count are all 2^k times too large, and the means
    # below, their ratios, are exact
    masks = tf.cast(tf.bitwise.bitwise_and(patterns, tf.constant(bits[:, None])), tf.float32)

    def powers(dose):  # (patients, moments, voxels): dose, dose², dose¹⁰ (multiplications: tf.pow is slower)
        dose = tf.maximum(tf.reshape(tf.cast(dose, tf.float32), [patients, -1]), 0.0)
        squared = dose * dose
        fourth = squared * squared
        return tf.stack([dose, squared, fourth * fourth * squared], axis=1)

    reference = tf.stop_gradient(powers(element["dose"]))
    # (patients, structures, moments)
    predicted_sums = tf.matmul(masks, powers(predicted), transpose_b=True)
    reference_sums = tf.matmul(masks, tf.concat([reference, tf.ones_like(reference[:, :1])], axis=1),
                               transpose_b=True)
    voxels = reference_sums[..., -1]  # (patients, structures), × 2^k
    exponents = tf.constant(DVH_MOMENTS, tf.float32)

    def moments(sums):  # 1e-6 keeps the root's gradient finite where a structure receives no dose
        return (sums / tf.maximum(voxels, 1.0)[..., None] + 1e-6) ** (1.0 / exponents)

    differences = tf.reduce_mean(tf.abs(moments(predicted_sums) - moments(reference_sums[..., :-1])), axis=-1)
    present = tf.cast(voxels > 0, tf.float32)
    return tf.reduce_sum(differences * present, axis=1) / tf.maximum(tf.reduce_sum(present, axis=1), 1.0)


def loss_function(name: str, dvh_weight: float, spec: ModelSpec):
    """The per-patient loss called ``name`` (one of ``LOSSES``) of a model ``spec`` describes, plus
    ``dvh_weight`` × the DVH term (:func:`dvh_difference`, over its site's structures) when it is not 0."""
    functions = {"mae": mean_absolute_error, "masked-mae": masked_mean_absolute_error}
    if name not in functions:
        raise ValueError(f"Invalid `loss`. Expected one of {LOSSES}. Received: loss={name!r}")
    base = functions[name]
    if not dvh_weight:
        return base
    structures = len(spec.site.names)
    return lambda element, predicted: (base(element, predicted)
                                       + dvh_weight * dvh_difference(element, predicted, structures))


def needs_possible_dose_mask(name: str) -> bool:
    return name == "masked-mae"
