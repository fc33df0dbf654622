"""The OpenKBP generator: a 3D U-Net from CT and structures to dose. A pure builder, no I/O."""

from __future__ import annotations

import math

import keras

from provided_code.model_spec import STAGES, ModelSpec
from provided_code.networks.blocks import block_map
from provided_code.networks.layers import AveragePool3x3x3, DoseFloor, unpacked_inputs

# The generator's recompute blocks (networks/blocks.py): the input unpacking with the first
# convolution (and without the first batch norm, so that the block can run one sample at a time),
# the output layers with the last decoder block
block_of = block_map({"compact_inputs": "inputs", "encoder_1_conv": "inputs", "dose_conv": "decoder_0",
                      "dose_smooth": "decoder_0", "dose": "decoder_0"})


def num_levels(resolution: int) -> int:
    """Encoder levels for a cubic input: log2(resolution) - 1, at most 6 (128³ → 6, 32³ → 4)."""
    if resolution < 8 or resolution & (resolution - 1):
        raise ValueError(f"Invalid `resolution`. Expected a power of two >= 8. Received: resolution={resolution}")
    return min(STAGES, int(math.log2(resolution)) - 1)


def build_unet(spec: ModelSpec, keras_pooling: bool = False) -> keras.Model:
    """Build (not compile) the generator ``spec`` describes (:class:`~provided_code.model_spec.ModelSpec`:
    its site, resolution, filters, normalisation and inputs).

    ``keras_pooling``: the final smoothing by Keras's AveragePooling3D instead of the separable
    :class:`AveragePool3x3x3` (the same values; XLA compiles the separable one faster: for the
    benchmark that measures it).

    Inputs (declared in :mod:`provided_code.model_spec`, one ``keras.Input`` each), volumes laid out
    ``(batch, d0, d1, d2)`` with ``d = spec.resolution`` (a power of two >= 8, divisible by
    2**levels): ``ct`` uint16 grey values in [0, 4095] and ``structure_masks``, the site's bitfield
    (bit k = ``site.names[k]``; uint16, uint32 above 16 structures); with per-patient inputs
    (``spec.patient_prescriptions``, ``spec.beam_slots``) also ``prescriptions`` ``(batch,
    targets)`` Gy and ``beam_angles`` ``(batch, slots)`` degrees. All are unpacked on the device by
    :class:`CompactInputs`. Output ``dose``: ``(batch, d0, d1, d2, 1)`` float32, in Gy, non-negative.

    Encoder: ``num_levels`` blocks of Conv3D (kernel 4, stride 2, no bias) + normalisation (not on
    the bottleneck) + LeakyReLU(0.2), with ``spec.stage_features(level)`` features (``filters`` × the
    level's ``spec.widths``: 1, 2, 4, 8, 8, 8 × ``filters`` unless set otherwise). Decoder: Conv3DTranspose
    (kernel 4, stride 2, no bias) + normalisation + ReLU (+ SpatialDropout3D(``spec.dropout``) on
    alternate blocks), concatenating the encoder's features of the same size. Then a
    Conv3DTranspose to one channel, a 3×3×3 average pooling and ``spec.head`` (a ReLU; ``"leaky"``:
    :class:`~provided_code.networks.layers.DoseFloor`), all float32 whatever the dtype policy.

    With ``spec.prescription_channel`` the inputs carry one more channel, each voxel's highest
    target prescription (:class:`CompactInputs`; each patient's own with
    ``spec.patient_prescriptions``); with ``spec.gantry_angles`` (degrees), the beam channels
    (one, or one per beam: ``spec.beam_channels``), made from the targets (from each patient's
    own angles with ``spec.beam_slots``).

    Normalisation (``spec.norm``): ``batch``, batch norm synchronised across replicas (its
    statistics are those of the global batch); ``instance``, per sample and channel over the
    volume (GroupNormalization with one group per channel), nothing shared between samples.
    """
    if spec.arch != "generator":
        raise ValueError(f"Invalid `spec`. Expected arch='generator' (networks.build.build_network builds every "
                         f"body). Received: arch={spec.arch!r}")
    resolution, dropout = spec.resolution, spec.dropout

    def normalisation(name: str) -> keras.layers.Layer:
        if spec.norm == "instance":
            return keras.layers.GroupNormalization(groups=-1, epsilon=1e-3, name=f"{name}_norm")
        return keras.layers.BatchNormalization(momentum=0.99, epsilon=1e-3, synchronized=True, name=f"{name}_bn")

    levels = num_levels(resolution)
    inputs, x = unpacked_inputs(spec)

    skips = []
    for level in range(levels):
        x = keras.layers.Conv3D(spec.stage_features(level), 4, strides=2, padding="same",
                                use_bias=False, name=f"encoder_{level + 1}_conv")(x)
        if level < levels - 1:
            x = normalisation(f"encoder_{level + 1}")(x)
        x = keras.layers.LeakyReLU(negative_slope=0.2, name=f"encoder_{level + 1}_act")(x)
        skips.append(x)

    for block, level in enumerate(range(levels - 2, -1, -1)):
        if block > 0:
            x = keras.layers.Concatenate(name=f"decoder_{level + 1}_skip")([x, skips[level + 1]])
        x = keras.layers.Conv3DTranspose(spec.stage_features(level), 4, strides=2, padding="same",
                                         use_bias=False, name=f"decoder_{level + 1}_conv")(x)
        x = normalisation(f"decoder_{level + 1}")(x)
        x = keras.layers.ReLU(name=f"decoder_{level + 1}_act")(x)
        if block % 2 == 1 and dropout > 0:  # after the ReLU (the same values as before it: it zeroes or
            # scales whole channels), so that --recompute keeps it outside the recomputed block
            x = keras.layers.SpatialDropout3D(dropout, name=f"decoder_{level + 1}_dropout")(x)

    x = keras.layers.Concatenate(name="decoder_0_skip")([x, skips[0]])
    x = keras.layers.Conv3DTranspose(1, 4, strides=2, padding="same", dtype="float32", name="dose_conv")(x)
    if keras_pooling:
        x = keras.layers.AveragePooling3D(3, strides=1, padding="same", dtype="float32", name="dose_smooth")(x)
    else:
        x = AveragePool3x3x3(dtype="float32", name="dose_smooth")(x)
    if spec.head == "relu":
        dose = keras.layers.ReLU(dtype="float32", name="dose")(x)
    elif spec.head == "leaky":
        dose = DoseFloor(dtype="float32", name="dose")(x)
    else:
        dose = keras.layers.Activation(spec.head, dtype="float32", name="dose")(x)
    return keras.Model(inputs=inputs, outputs=dose, name="unet")
