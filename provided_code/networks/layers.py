"""Custom layers of the U-Net, registered so that ``.keras`` checkpoints load them back."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from provided_code.constants import CT_MAX
from provided_code.beams import ray_bins, ray_count
from provided_code.networks.physics import physics_volume
from provided_code.sites import Site, openkbp


TABLE_BITS = 12  # up to this many structures, one gather from a table of every bit pattern (2^12 × 13 at most)


@keras.saving.register_keras_serializable(package="provided_code")
class CompactInputs(keras.layers.Layer):
    """``[ct, structure_masks]`` in compact dtypes (and, per patient, ``prescriptions`` and
    ``beam_angles``) → one ``(batch, d0, d1, d2, C)`` volume: the CT, one channel per structure,
    one more with ``prescription``, and the beam channels. Its inputs are declared in
    :mod:`provided_code.model_spec`.

    ``ct``: uint16 grey values in [0, 4095], scaled to [0, 1]. ``structure_masks``: bitfield
    (uint16, or uint32 for more than 16 structures), bit k unpacked into channel 1 + k. The host
    sends 4 bytes per voxel (two uint16) instead of 4 per channel (44 for OpenKBP's 11 float32
    channels, more with the prescription and beam channels).
    ``prescription``: one more channel, the highest prescription of the targets that cover the
    voxel divided by ``max_prescription_gy`` (OpenKBP: 70, 63 or 56 Gy over 70), 0 outside them.

    The site is the layer's config (:func:`site_unpacking`): ``structures`` (how many bits),
    ``targets`` (the targets' structure indices, in the site's target order), ``prescriptions_gy``
    (per structure, 0 for an organ) and ``max_prescription_gy``. A checkpoint saved before sites
    has none of them: it is OpenKBP's; one saved before ``targets`` was written has its targets
    where ``prescriptions_gy`` is above 0. Up to 12 structures, the structure channels (and the run-wide prescription) are one
    gather from a table of every bit pattern's values (OpenKBP: 1024 × 10 or 11): a single pass
    that writes the floats directly, where shifting, masking and casting a broadcast copy took three
    passes and one full-size temporary more. Above 12 (the table would have 2^13 rows or more) the
    bits are shifted out.

    ``physics``: one more channel after the beams', the beams' primary fluence
    (:mod:`provided_code.networks.physics`), from the CT, the targets and the beams (each
    patient's own with ``beam_slots``, else ``beam_angles``), with a last input ``voxel_dimensions``
    ``(batch, 3)`` mm.

    ``patient_prescriptions``: a third input, ``(batch, targets)`` Gy in the site's target order;
    the prescription channel is then each patient's own.

    ``beam_angles`` (gantry degrees, :mod:`provided_code.beams`): per beam, the voxels
    on its lines that cross a target voxel (any target) of the same axial slice. ``beam_channels``
    ``"count"``: one channel, how many beams cross each voxel divided by the number of beams;
    ``"each"``: one 0/1 channel per beam, in the order of ``beam_angles``. Made here, after the
    training step's augmentation has moved the structures, by one segment maximum (per line and
    slice) and one gather per beam over the plane's precomputed line table. ``beam_slots`` > 0:
    the angles are a last input instead, ``(batch, beam_slots)`` degrees per patient (NaN: an
    unused slot, which adds nothing), which augmentation turns with the patient; each slot's lines
    are computed on the device and one segment maximum per slot covers the whole batch (segment
    ids offset per patient); "count" divides by the patient's own number of beams.
    """

    def __init__(self, prescription: bool = False, beam_angles=(), beam_channels: str = "count",
                 structures: int | None = None, prescriptions_gy=None, max_prescription_gy: float | None = None,
                 patient_prescriptions: bool = False, beam_slots: int = 0, targets=None, physics: bool = False,
                 **kwargs):
        kwargs.setdefault("autocast", False)  # per-patient angles and Gy stay float32 under mixed precision
        super().__init__(**kwargs)
        if structures is None:  # a checkpoint saved before sites: OpenKBP
            unpacking = site_unpacking(openkbp())
            structures, prescriptions_gy = unpacking["structures"], unpacking["prescriptions_gy"]
            max_prescription_gy, targets = unpacking["max_prescription_gy"], unpacking["targets"]
        if targets is None:  # a checkpoint saved before the targets were written: those with a prescription
            targets = [k for k, gy in enumerate(prescriptions_gy) if (gy or 0.0) > 0]
        self.prescription = prescription
        self.beam_angles = tuple(float(angle) for angle in beam_angles)
        self.beam_channels = beam_channels
        self.structures = int(structures)
        self.prescriptions_gy = tuple(float(gy or 0.0) for gy in prescriptions_gy)
        self.max_prescription_gy = float(max_prescription_gy)
        self.patient_prescriptions = bool(patient_prescriptions)
        self.beam_slots = int(beam_slots)
        self.targets = tuple(int(k) for k in targets)
        self.physics = bool(physics)
        if len(self.prescriptions_gy) != self.structures:
            raise ValueError(f"Invalid `prescriptions_gy`. Expected one value per structure ({self.structures}). "
                             f"Received: prescriptions_gy={list(self.prescriptions_gy)}")

    def get_config(self):
        return {**super().get_config(), "prescription": self.prescription, "beam_angles": list(self.beam_angles),
                "beam_channels": self.beam_channels, "structures": self.structures,
                "prescriptions_gy": list(self.prescriptions_gy), "max_prescription_gy": self.max_prescription_gy,
                "patient_prescriptions": self.patient_prescriptions, "beam_slots": self.beam_slots,
                "targets": list(self.targets), "physics": self.physics}

    @property
    def target_bits(self) -> int:
        return sum(1 << k for k in self.targets)

    @property
    def beams_per_patient(self) -> bool:
        return self.beam_slots > 0

    @property
    def beam_channel_count(self) -> int:
        if self.beams_per_patient:
            return 1 if self.beam_channels == "count" else self.beam_slots
        if not self.beam_angles:
            return 0
        return 1 if self.beam_channels == "count" else len(self.beam_angles)

    def call(self, inputs):
        ct, structure_masks, *rest = inputs
        prescriptions = rest.pop(0) if self.patient_prescriptions else None
        angles = rest.pop(0) if self.beams_per_patient else None
        voxel_mm = rest.pop(0) if self.physics else None
        count = self.structures
        run_wide_prescription = self.prescription and not self.patient_prescriptions
        levels = np.array(self.prescriptions_gy) / self.max_prescription_gy  # per structure, 0 for an organ
        if count <= TABLE_BITS:
            table = structures_of_patterns(count)  # (2^count, count)
            if run_wide_prescription:
                table = np.concatenate([table, (table * levels).max(axis=1)[:, None]], axis=1)
            table = ops.convert_to_tensor(table, dtype=self.compute_dtype)
            patterns = ops.bitwise_and(ops.cast(structure_masks, "int32"), 2**count - 1)  # unused high bits dropped
            masks = ops.take(table, patterns, axis=0)
            structure_channels = masks[..., :count]
        else:  # too many bits for a table: shift each out (a uint32 cast to int32 keeps its bits)
            patterns = ops.cast(structure_masks, "int32")
            shifts = ops.convert_to_tensor(np.arange(count, dtype=np.int32))
            masks = ops.cast(ops.bitwise_and(ops.right_shift(patterns[..., None], shifts), 1), self.compute_dtype)
            structure_channels = masks
            if run_wide_prescription:
                masks = ops.concatenate([masks, self._highest(masks, ops.convert_to_tensor(
                    levels[list(self.targets)][None], dtype=self.compute_dtype))], axis=-1)
        ct = ops.cast(ct, self.compute_dtype) * (1.0 / CT_MAX)
        channels = [ct[..., None], masks]
        if self.prescription and self.patient_prescriptions:
            levels = ops.cast(ops.cast(prescriptions, "float32") / self.max_prescription_gy, self.compute_dtype)
            channels.append(self._highest(structure_channels, levels))
        if self.beams_per_patient:
            channels.append(self._patient_beams(patterns, angles))
        elif self.beam_angles:
            channels.append(self._beams(patterns))
        if self.physics:
            channels.append(self._physics(inputs[0], patterns, angles, voxel_mm))
        return ops.concatenate(channels, axis=-1)

    def _physics(self, ct, patterns, angles, voxel_mm):
        """The beams' physics channel (:func:`~provided_code.networks.physics.physics_volume`) of
        the CT as stored, the targets, the beams (each patient's own, or the run's) and each
        patient's voxel size; no gradient flows through it (it depends on the inputs only)."""
        if angles is None:
            angles = ops.broadcast_to(ops.convert_to_tensor([self.beam_angles], dtype="float32"),
                                      (ops.shape(ct)[0], len(self.beam_angles)))
        channel = physics_volume(ct, ops.cast(self._target_voxels(patterns), "float32"), angles, voxel_mm)
        return ops.cast(ops.stop_gradient(channel), self.compute_dtype)[..., None]

    def _highest(self, structure_channels, levels):
        """``(batch, ..., 1)``: per voxel the highest of ``levels`` ``(batch or 1, targets)`` over the
        targets that cover it (0 outside them)."""
        highest = None
        for column, k in enumerate(self.targets):
            level = ops.reshape(levels[:, column], (-1, 1, 1, 1))
            value = structure_channels[..., k] * level
            highest = value if highest is None else ops.maximum(highest, value)
        return highest[..., None]

    def _target_voxels(self, patterns):
        bits = self.target_bits
        signed = bits - (1 << 32) if bits >= 1 << 31 else bits  # the int32 with the same bits
        return ops.cast(ops.not_equal(ops.bitwise_and(patterns, signed), 0), self.compute_dtype)

    def _beams(self, patterns):
        size, slices = patterns.shape[1], patterns.shape[3]
        targets = self._target_voxels(patterns)
        by_voxel = ops.reshape(ops.transpose(targets, (1, 2, 0, 3)), (size * size, -1))  # (plane, batch × slices)
        table = ops.convert_to_tensor(np.stack([ray_bins(size, angle) for angle in self.beam_angles]))  # (beams, plane)

        def beam(k):
            lines = ops.take(table, k, axis=0)
            crossed = ops.maximum(ops.segment_max(by_voxel, lines, num_segments=ray_count(size)), 0.0)  # empty: 0
            return ops.take(crossed, lines, axis=0)

        if self.beam_channels == "count":
            total = _running_sum(beam, len(self.beam_angles))
            stacked = (total / len(self.beam_angles))[..., None]
        else:
            stacked = ops.stack([beam(k) for k in range(len(self.beam_angles))], axis=-1)
        stacked = ops.reshape(stacked, (size, size, -1, slices, self.beam_channel_count))
        return ops.transpose(stacked, (2, 0, 1, 3, 4))

    def _patient_beams(self, patterns, angles):
        """The beam channels of each patient's own angles ``(batch, beam_slots)`` degrees (NaN:
        unused). Per slot, the line of every voxel of the plane is computed here for every patient
        (:func:`~provided_code.beams.ray_bins`, in float64 as there), offset by the
        patient's place in the batch so that one segment maximum serves the whole batch."""
        size, slices = patterns.shape[1], patterns.shape[3]
        batch = ops.shape(patterns)[0]
        lines_per_plane = ray_count(size)
        targets = ops.reshape(self._target_voxels(patterns), (-1, slices))  # (batch × plane, slices)
        angles = ops.cast(angles, "float64")
        used = ops.isfinite(angles)  # (batch, slots)
        radians = ops.where(used, angles, 0.0) * (math.pi / 180.0)
        used = ops.cast(used, self.compute_dtype)
        i, j = np.meshgrid(np.arange(size, dtype=np.float64), np.arange(size, dtype=np.float64), indexing="ij")
        a = ops.convert_to_tensor((i - size / 2).reshape(1, -1))  # (1, plane)
        b = ops.convert_to_tensor((j - size / 2).reshape(1, -1))
        offsets = ops.reshape(ops.arange(batch, dtype="int32") * lines_per_plane, (-1, 1))  # (batch, 1)

        def beam(slot):
            g = ops.reshape(ops.take(radians, slot, axis=1), (-1, 1))  # (batch, 1)
            across = a * ops.sin(g) + b * ops.cos(g)  # (batch, plane): as ray_bins
            lines = ops.cast(ops.floor(across + 0.5), "int32") + lines_per_plane // 2 + offsets
            lines = ops.reshape(lines, (-1,))
            crossed = ops.maximum(ops.segment_max(targets, lines, num_segments=batch * lines_per_plane), 0.0)
            crossed = ops.reshape(ops.take(crossed, lines, axis=0), (-1, size, size, slices))
            return crossed * ops.reshape(ops.take(used, slot, axis=1), (-1, 1, 1, 1))  # unused: 0

        if self.beam_channels == "count":
            total = _running_sum(beam, self.beam_slots)
            beams = ops.maximum(ops.sum(used, axis=1), 1.0)  # the patient's own
            return (total / ops.reshape(beams, (-1, 1, 1, 1)))[..., None]
        return ops.stack([beam(slot) for slot in range(self.beam_slots)], axis=-1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[0], 1 + self.structures + int(self.prescription) + self.beam_channel_count
                + int(self.physics))


def _running_sum(beam, count: int):
    """``beam(0) + beam(1) + ... + beam(count - 1)``, added in that order in a loop of the graph
    (``ops.fori_loop``): one beam's operations traced once, not once per beam (a prostate model has
    35 slots)."""
    return ops.fori_loop(1, count, lambda k, total: total + beam(k), beam(0))


def unpacked_inputs(spec) -> tuple[dict, object]:
    """``(inputs, x)``: one ``keras.Input`` per input a model spec declares
    (:class:`~provided_code.model_spec.ModelSpec`, by name) and their unpacking, ``x``
    ``(batch, R, R, R, C)``, by :class:`CompactInputs` configured from the spec: where every body
    starts."""
    inputs = {model_input.name: keras.Input(model_input.shape(spec.resolution), dtype=model_input.dtype,
                                            name=model_input.name) for model_input in spec.inputs}
    x = CompactInputs(prescription=spec.prescription_channel, beam_angles=spec.gantry_angles,
                      beam_channels=spec.beam_channels, patient_prescriptions=spec.patient_prescriptions,
                      beam_slots=spec.beam_slots, physics=spec.physics, **site_unpacking(spec.site),
                      name="compact_inputs")([inputs[name] for name in spec.input_names])
    return inputs, x


def site_unpacking(site: Site) -> dict:
    """A site as :class:`CompactInputs` is configured: ``structures`` (how many), ``targets`` (their
    structure indices, in the site's target order: the per-patient prescriptions' columns),
    ``prescriptions_gy`` (per structure, 0 for an organ) and ``max_prescription_gy``."""
    prescriptions = site.prescriptions_gy
    return {"structures": len(site.names), "targets": tuple(site.names.index(name) for name in site.targets),
            "prescriptions_gy": tuple(prescriptions.get(name, 0.0) for name in site.names),
            "max_prescription_gy": site.max_prescription_gy}


def structures_of_patterns(count: int) -> np.ndarray:
    """``(2^count, count)`` 0/1: row p says which structures a voxel whose packed bits are p is in."""
    return (np.arange(2 ** count)[:, None] >> np.arange(count)) & 1


@keras.saving.register_keras_serializable(package="provided_code")
class DoseFloor(keras.layers.Layer):
    """The ``"leaky"`` dose head's last step: ``x`` above zero; below it ``negative_slope × x`` while
    training (a LeakyReLU: the loss's gradient reaches a head that is below zero on every voxel,
    so the output cannot die) and 0 when predicting or evaluating (a dose is never negative)."""

    def __init__(self, negative_slope: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        if not negative_slope > 0:
            raise ValueError(f"Invalid `negative_slope`. Expected a number above 0. "
                             f"Received: negative_slope={negative_slope!r}")
        self.negative_slope = float(negative_slope)

    def call(self, x, training=False):
        if training:
            return ops.leaky_relu(x, negative_slope=self.negative_slope)
        return ops.relu(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "negative_slope": self.negative_slope}


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
