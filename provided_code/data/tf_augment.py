"""Apply ``augment.Augmenter``'s draws on the device: two gathers per volume, no per-voxel Python.

Runs inside the training step (XLA-compiled with it when XLA is on), so the host only sends
small index maps and a GPU never waits for augmentation.
"""

from __future__ import annotations

import tensorflow as tf

from provided_code.constants import STRUCTURES

GEOMETRY_KEYS = ("plane_source", "slice_shift", "mirrored")
_RIGHT_PAROTID = 1 << STRUCTURES.index("RightParotid")
_LEFT_PAROTID = 1 << STRUCTURES.index("LeftParotid")


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
    """Swap the RightParotid and LeftParotid bits of the patients where ``mirrored``."""
    one = tf.constant(1, structure_masks.dtype)
    right_shift = STRUCTURES.index("RightParotid")
    left_shift = STRUCTURES.index("LeftParotid")
    right = tf.bitwise.bitwise_and(tf.bitwise.right_shift(structure_masks, tf.cast(right_shift, structure_masks.dtype)), one)
    left = tf.bitwise.bitwise_and(tf.bitwise.right_shift(structure_masks, tf.cast(left_shift, structure_masks.dtype)), one)
    others = tf.bitwise.bitwise_and(structure_masks, tf.constant(~(_RIGHT_PAROTID | _LEFT_PAROTID) & 0xFFFF,
                                                                 structure_masks.dtype))
    swapped = tf.bitwise.bitwise_or(others, tf.bitwise.bitwise_or(
        tf.bitwise.left_shift(right, tf.cast(left_shift, structure_masks.dtype)),
        tf.bitwise.left_shift(left, tf.cast(right_shift, structure_masks.dtype))))
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
