"""Custom layers of the U-Net, registered so that ``.keras`` checkpoints load them back."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from provided_code.constants import CT_MAX, PRESCRIPTIONS_GY, STRUCTURES, TARGET_BITS, structures_of_patterns
from provided_code.networks.beams import ray_bins, ray_count


@keras.saving.register_keras_serializable(package="provided_code")
class CompactInputs(keras.layers.Layer):
    """``[ct, structure_masks]`` in compact dtypes → one ``(batch, d0, d1, d2, C)`` volume: 11
    channels, one more with ``prescription``, and the beam channels.

    ``ct``: uint16 grey values in [0, 4095], scaled to [0, 1]. ``structure_masks``: uint16
    bitfield, bit k unpacked into channel 1 + k. The host sends 4 bytes per voxel (two uint16) instead
    of 4 per channel (44 for these 11 float32 channels, more with the prescription and beam channels).
    ``prescription``: one more channel, the highest prescription level of the PTVs that cover the
    voxel (70, 63 or 56 Gy) divided by 70, 0 outside them.

    The structure channels (and the prescription) are one gather from a table of every 10-bit
    pattern's values (1024 × 10 or 11): a single pass that writes the floats directly, where
    shifting, masking and casting a broadcast copy took three passes and one full-size temporary
    more.

    ``beam_angles`` (gantry degrees, :mod:`provided_code.networks.beams`): per beam, the voxels
    on its lines that cross a target voxel (any PTV) of the same axial slice. ``beam_channels``
    ``"count"``: one channel, how many beams cross each voxel divided by the number of beams;
    ``"each"``: one 0/1 channel per beam, in the order of ``beam_angles``. Made here, after the
    training step's augmentation has moved the structures, by one segment maximum (per line and
    slice) and one gather per beam over the plane's precomputed line table.
    """

    def __init__(self, prescription: bool = False, beam_angles=(), beam_channels: str = "count", **kwargs):
        super().__init__(**kwargs)
        self.prescription = prescription
        self.beam_angles = tuple(float(angle) for angle in beam_angles)
        self.beam_channels = beam_channels

    def get_config(self):
        return {**super().get_config(), "prescription": self.prescription, "beam_angles": list(self.beam_angles),
                "beam_channels": self.beam_channels}

    @property
    def beam_channel_count(self) -> int:
        if not self.beam_angles:
            return 0
        return 1 if self.beam_channels == "count" else len(self.beam_angles)

    def call(self, inputs):
        ct, structure_masks = inputs
        count = len(STRUCTURES)
        table = structures_of_patterns()  # (1024, 10)
        if self.prescription:
            levels = np.array([PRESCRIPTIONS_GY.get(name, 0.0) for name in STRUCTURES]) / max(PRESCRIPTIONS_GY.values())
            table = np.concatenate([table, (table * levels).max(axis=1)[:, None]], axis=1)
        table = ops.convert_to_tensor(table, dtype=self.compute_dtype)
        patterns = ops.bitwise_and(ops.cast(structure_masks, "int32"), 2**count - 1)  # unused high bits dropped
        masks = ops.take(table, patterns, axis=0)
        ct = ops.cast(ct, self.compute_dtype) * (1.0 / CT_MAX)
        channels = [ct[..., None], masks]
        if self.beam_angles:
            channels.append(self._beams(patterns))
        return ops.concatenate(channels, axis=-1)

    def _beams(self, patterns):
        size, slices = patterns.shape[1], patterns.shape[3]
        targets = ops.cast(ops.not_equal(ops.bitwise_and(patterns, TARGET_BITS), 0), self.compute_dtype)
        by_voxel = ops.reshape(ops.transpose(targets, (1, 2, 0, 3)), (size * size, -1))  # (plane, batch × slices)
        total, each = None, []  # "count" keeps one running sum, not one volume per beam
        for angle in self.beam_angles:
            lines = ops.convert_to_tensor(ray_bins(size, angle))
            crossed = ops.maximum(ops.segment_max(by_voxel, lines, num_segments=ray_count(size)), 0.0)  # empty: 0
            beam = ops.take(crossed, lines, axis=0)
            if self.beam_channels == "count":
                total = beam if total is None else total + beam
            else:
                each.append(beam)
        if self.beam_channels == "count":
            stacked = (total / len(self.beam_angles))[..., None]
        else:
            stacked = ops.stack(each, axis=-1)
        stacked = ops.reshape(stacked, (size, size, -1, slices, self.beam_channel_count))
        return ops.transpose(stacked, (2, 0, 1, 3, 4))

    def compute_output_shape(self, input_shape):
        return (*input_shape[0], 1 + len(STRUCTURES) + int(self.prescription) + self.beam_channel_count)


@keras.saving.register_keras_serializable(package="provided_code")
class AveragePool3x3x3(keras.layers.Layer):
    """What ``AveragePooling3D(3, strides=1, padding="same")`` computes, written separably.

    Each output voxel is the mean of the in-volume voxels of its 3×3×3 neighbourhood (padding is
    not counted). Built from padded shifted sums along each axis and a divisor that is the
    product of three 1-D count vectors, so XLA has no volume-sized constant to fold: the built-in
    layer made XLA spend tens of seconds constant-folding its reduce-window divisor and gradient.
    """

    def call(self, x):
        divisor = None
        for axis in (1, 2, 3):
            size = x.shape[axis]
            padding = [(0, 0)] * 5
            padding[axis] = (1, 1)
            padded = ops.pad(x, padding)
            x = _shifted(padded, 0, size, axis) + _shifted(padded, 1, size, axis) + _shifted(padded, 2, size, axis)
            counts = np.full(size, 3.0, np.float32)  # in-volume neighbours along this axis
            counts[0] = counts[-1] = 2.0 if size > 1 else 1.0
            shape = [1] * 5
            shape[axis] = size
            counts = ops.convert_to_tensor(counts.reshape(shape), dtype=x.dtype)
            divisor = counts if divisor is None else divisor * counts
        return x / divisor

    def compute_output_shape(self, input_shape):
        return input_shape


def _shifted(padded, start: int, size: int, axis: int):
    index = [slice(None)] * 5
    index[axis] = slice(start, start + size)
    return padded[tuple(index)]
