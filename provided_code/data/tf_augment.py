"""Apply ``augment.Augmenter``'s draws on the device: per volume one gather and one window, no
per-voxel Python.

Runs inside the training step (XLA-compiled with it when XLA is on), so the host only sends a
small index map and a shift, and a GPU never waits for augmentation.
"""

from __future__ import annotations

import tensorflow as tf

from provided_code.model_spec import ANGLES, STRUCTURE_BITS, VOLUME, InputSpec
from provided_code.model_spec import swap_mirror_bits as swapped_bits

GEOMETRY_KEYS = ("plane_source", "slice_shift", "mirrored", "turn_degrees")


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


def swap_mirror_bits(structure_masks: tf.Tensor, mirrored: tf.Tensor, mirror_bits) -> tf.Tensor:
    """Swap the bits of each ``(right, left)`` pair of ``mirror_bits`` (a site's ``mirror_bits``;
    OpenKBP: the parotids) of the patients where ``mirrored``: :func:`provided_code.model_spec.swap_mirror_bits`,
    as ``--tta`` swaps them in numpy."""
    if not mirror_bits:
        return structure_masks
    swapped = swapped_bits(structure_masks, mirror_bits, tf.where)
    return tf.where(tf.reshape(mirrored, (-1, 1, 1, 1)), swapped, structure_masks)


def move_angles(angles: tf.Tensor, mirrored: tf.Tensor, turn_degrees: tf.Tensor) -> tf.Tensor:
    """Gantry angles ``(patients, slots)`` degrees of the patients moved as the draws move them:
    mirrored left-right first (g to -g), then turned by ``turn_degrees`` (g to g - turn), in
    [0, 360); NaN (an unused slot) stays NaN. (The conventions of ``augment.plane_sources`` and
    ``provided_code.beams``: tested in tests/test_tf_augment.py.)"""
    flipped = tf.where(tf.reshape(mirrored, (-1, 1)), -angles, angles)
    return tf.math.floormod(flipped - tf.reshape(tf.cast(turn_degrees, angles.dtype), (-1, 1)), 360.0)


def apply_geometry(element: dict, inputs: tuple[InputSpec, ...]) -> dict:
    """The element with its declared model ``inputs`` (a model's ``spec.inputs``) moved as each declares (volumes resampled, structure bits also swapped on
    a flip, angles turned and flipped), and ``dose`` and (if present) ``possible_dose_mask``
    moved by the draws; the draw keys are dropped. Without draw keys the element is returned as is."""
    if "plane_source" not in element:
        return element
    plane, slices = element["plane_source"], element["slice_shift"]
    moved = {name: value for name, value in element.items() if name not in GEOMETRY_KEYS}
    for spec in inputs:
        if spec.moves == VOLUME:
            moved[spec.name] = move_volume(element[spec.name], plane, slices)
        elif spec.moves == STRUCTURE_BITS:
            moved[spec.name] = swap_mirror_bits(move_volume(element[spec.name], plane, slices), element["mirrored"],
                                                spec.mirror_bits)
        elif spec.moves == ANGLES:
            moved[spec.name] = move_angles(element[spec.name], element["mirrored"], element["turn_degrees"])
    moved["dose"] = move_volume(element["dose"][..., 0], plane, slices)[..., None]
    if "possible_dose_mask" in element:
        mask = tf.cast(element["possible_dose_mask"], tf.uint8)
        moved["possible_dose_mask"] = tf.cast(move_volume(mask, plane, slices), tf.bool)
    return moved
