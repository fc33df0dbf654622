"""Apply ``augment.Augmenter``'s draws on the device: per volume one gather and one window, no
per-voxel Python.

Runs inside the training step (XLA-compiled with it when XLA is on), so the host only sends a
small index map and a shift, and a GPU never waits for augmentation.
"""

from __future__ import annotations

import tensorflow as tf

from provided_code.constants import LEFT_PAROTID_BIT, RIGHT_PAROTID_BIT

GEOMETRY_KEYS = ("plane_source", "slice_shift", "mirrored")


def move_volume(volume: tf.Tensor, plane_source: tf.Tensor, slice_shift: tf.Tensor) -> tf.Tensor:
    """``volume`` ``(patients, R, R, R)`` resampled by the draws: the axial plane by ``plane_source``
    (zero where -1), then translated by ``slice_shift`` voxels along axis 2 (zero-filled).

    One gather for the plane (a zero row appended stands for "outside"), then, per patient, a
    window into the zero-padded slices: no per-voxel index along axis 2 and no select. The
    number of patients must be static (it is: the batch size).
    """
    patients, size = volume.shape[0], volume.shape[-1]
    plane = size * size
    flat = tf.concat([tf.reshape(volume, (patients, plane, size)), tf.zeros((patients, 1, size), volume.dtype)], axis=1)
    moved = tf.gather(flat, tf.where(plane_source >= 0, plane_source, plane), axis=1, batch_dims=1)
    padded = tf.pad(moved, [[0, 0], [0, 0], [size, size]])  # any shift in (-R, R)
    windows = [tf.slice(padded[p], tf.stack([0, size - slice_shift[p]]), [plane, size]) for p in range(patients)]
    return tf.reshape(tf.stack(windows), tf.shape(volume))


def swap_parotids(structure_masks: tf.Tensor, mirrored: tf.Tensor) -> tf.Tensor:
    """Swap the RightParotid and LeftParotid bits of the patients where ``mirrored`` (what
    :func:`provided_code.inference.mirror_left_right` does in numpy for ``--tta``)."""
    dtype = structure_masks.dtype
    right = tf.bitwise.bitwise_and(structure_masks, tf.constant(RIGHT_PAROTID_BIT, dtype)) != 0
    left = tf.bitwise.bitwise_and(structure_masks, tf.constant(LEFT_PAROTID_BIT, dtype)) != 0
    swapped = tf.bitwise.bitwise_and(structure_masks, tf.constant(~(RIGHT_PAROTID_BIT | LEFT_PAROTID_BIT) & 0xFFFF, dtype))
    zero = tf.zeros((), dtype)
    swapped = tf.bitwise.bitwise_or(swapped, tf.where(right, tf.constant(LEFT_PAROTID_BIT, dtype), zero))
    swapped = tf.bitwise.bitwise_or(swapped, tf.where(left, tf.constant(RIGHT_PAROTID_BIT, dtype), zero))
    return tf.where(tf.reshape(mirrored, (-1, 1, 1, 1)), swapped, structure_masks)


def apply_geometry(element: dict) -> dict:
    """The element with ``ct``, ``structure_masks``, ``dose`` and (if present) ``possible_dose_mask``
    moved by its draws; the draw keys are dropped. Without draw keys the element is returned as is."""
    if "plane_source" not in element:
        return element
    plane, slices = element["plane_source"], element["slice_shift"]
    moved = {name: value for name, value in element.items() if name not in GEOMETRY_KEYS}
    moved["ct"] = move_volume(element["ct"], plane, slices)
    moved["structure_masks"] = swap_parotids(move_volume(element["structure_masks"], plane, slices),
                                             element["mirrored"])
    moved["dose"] = move_volume(element["dose"][..., 0], plane, slices)[..., None]
    if "possible_dose_mask" in element:
        mask = tf.cast(element["possible_dose_mask"], tf.uint8)
        moved["possible_dose_mask"] = tf.cast(move_volume(mask, plane, slices), tf.bool)
    return moved
