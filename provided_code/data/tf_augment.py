"""Apply ``augment.Augmenter``'s draws on the device: two gathers per volume, no per-voxel Python.

Runs inside the training step (XLA-compiled with it when XLA is on), so the host only sends
small index maps and a GPU never waits for augmentation.
"""

from __future__ import annotations

import tensorflow as tf

from provided_code.constants import STRUCTURES

GEOMETRY_KEYS = ("plane_source", "slice_source", "mirrored")
_RIGHT_PAROTID = 1 << STRUCTURES.index("RightParotid")
_LEFT_PAROTID = 1 << STRUCTURES.index("LeftParotid")


def move_volume(volume: tf.Tensor, plane_source: tf.Tensor, slice_source: tf.Tensor) -> tf.Tensor:
    """``volume`` ``(patients, R, R, R)`` resampled by the index maps (zero where a source is -1)."""
    size = volume.shape[-1]
    patients = tf.shape(volume)[0]
    flat = tf.reshape(volume, (patients, size * size, size))
    zero = tf.zeros((), volume.dtype)
    moved = tf.gather(flat, tf.maximum(plane_source, 0), axis=1, batch_dims=1)
    moved = tf.where((plane_source >= 0)[:, :, None], moved, zero)
    moved = tf.gather(moved, tf.maximum(slice_source, 0), axis=2, batch_dims=1)
    moved = tf.where((slice_source >= 0)[:, None, :], moved, zero)
    return tf.reshape(moved, tf.shape(volume))


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
    plane, slices = element["plane_source"], element["slice_source"]
    moved = {name: value for name, value in element.items() if name not in GEOMETRY_KEYS}
    moved["ct"] = move_volume(element["ct"], plane, slices)
    moved["structure_masks"] = swap_parotids(move_volume(element["structure_masks"], plane, slices),
                                             element["mirrored"])
    moved["dose"] = move_volume(element["dose"][..., 0], plane, slices)[..., None]
    if "possible_dose_mask" in element:
        mask = tf.cast(element["possible_dose_mask"], tf.uint8)
        moved["possible_dose_mask"] = tf.cast(move_volume(mask, plane, slices), tf.bool)
    return moved
