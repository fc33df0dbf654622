"""Training losses, per patient: ``loss(element, predicted) -> (patients,)`` float32 Gy.

``element`` is a training element (``data.tf_dataset``): ``dose`` ``(patients, z, y, x, 1)`` Gy,
and, for the masked loss, ``possible_dose_mask`` ``(patients, z, y, x)`` bool.
"""

from __future__ import annotations

import tensorflow as tf

from provided_code.config import LOSSES


def mean_absolute_error(element: dict, predicted) -> tf.Tensor:
    """The mean of |dose − predicted| over the whole volume (air included): the 2020 starter recipe."""
    return tf.reduce_mean(tf.abs(element["dose"] - tf.cast(predicted, tf.float32)), axis=[1, 2, 3, 4])


def masked_mean_absolute_error(element: dict, predicted) -> tf.Tensor:
    """The mean of |dose − predicted| over the voxels of the possible-dose mask only (what the
    dose score measures); outside the mask the prediction does not count. 0 for an empty mask."""
    mask = tf.cast(element["possible_dose_mask"], tf.float32)[..., None]
    error = tf.reduce_sum(tf.abs(element["dose"] - tf.cast(predicted, tf.float32)) * mask, axis=[1, 2, 3, 4])
    return error / tf.maximum(tf.reduce_sum(mask, axis=[1, 2, 3, 4]), 1.0)


def loss_function(name: str):
    """The per-patient loss called ``name`` (one of ``LOSSES``)."""
    functions = {"mae": mean_absolute_error, "masked-mae": masked_mean_absolute_error}
    if name not in functions:
        raise ValueError(f"Invalid `loss`. Expected one of {LOSSES}. Received: loss={name!r}")
    return functions[name]


def needs_possible_dose_mask(name: str) -> bool:
    return name == "masked-mae"
