"""A residual 3D U-Net from CT and structures to dose, in the manner of nnU-Net's residual-encoder
U-Net (Isensee et al., 2024), and its plain control (the same layers without the residual
additions). A pure builder, no I/O.

Unlike the 2020 generator (:mod:`provided_code.networks.unet`), the first convolution sees the
volume at full resolution and the dose comes out of a full-resolution 1×1×1 convolution.
"""

from __future__ import annotations

import math

import keras

from provided_code.model_spec import STAGES, ModelSpec
from provided_code.networks.blocks import block_map
from provided_code.networks.layers import DoseFloor, unpacked_inputs

BLOCKS_PER_STAGE = 1  # residual blocks in each encoder stage
NEGATIVE_SLOPE = 0.01  # nnU-Net's LeakyReLU
# The softplus head's first bias: softplus of it is 5 % of the highest prescription (3.5 Gy for OpenKBP), so
# that the first doses are low and spread (its kernel Glorot's). Measured on phantoms at 32³ (120 steps) and on
# the 55 real patients at 64³ (docs/recipe.md): a kernel starting at zero learned far slower, a bias starting
# at 0 (half the prescription) or a quarter higher doses first and got stuck on one seed of two.
SOFTPLUS_START = math.log(math.expm1(0.05))
# The leaky head's start: a kernel of zeros and a bias of 5 % of the highest prescription, so that the first
# doses are 3.5 Gy everywhere (OpenKBP) and the kernel learns from there. With Glorot's kernel (× the
# prescription: doses of ±100 Gy at the start) it fitted the phantoms at 32³ in 10 epochs far less surely
# (docs/recipe.md: the head arm).
LEAKY_START = 0.05

# The recompute blocks (networks/blocks.py): the stem with the inputs, the head with the last stage
block_of = block_map({"compact_inputs": "inputs", "encoder_0_stem_conv": "inputs", "dose_head": "decoder_0",
                      "dose_scale": "decoder_0", "dose_positive": "decoder_0", "dose": "decoder_0"})


def num_stages(resolution: int) -> int:
    """Encoder stages for a cubic input: log2(resolution) - 1, at most ``STAGES`` (6: 128³ → 6:
    128 … 4³; 64³ → 5; 32³ → 4); the deepest stage is 4³ (8³ at most stages)."""
    if resolution < 8 or resolution & (resolution - 1):
        raise ValueError(f"Invalid `resolution`. Expected a power of two >= 8. Received: resolution={resolution}")
    return min(STAGES, resolution.bit_length() - 2)


def build_resunet(spec: ModelSpec) -> keras.Model:
    """Build (not compile) the residual U-Net ``spec`` describes (``spec.arch`` ``"resunet"``), or
    with ``spec.arch == "plain"`` its plain control: the same stem, stages, decoder and head, each
    block's two convolutions without the addition of its input (and so without the shortcut's
    projection).

    Inputs and output as :func:`provided_code.networks.unet.build_unet`: the compact volumes
    ``(batch, d, d, d)`` unpacked on the device by :class:`CompactInputs`, ``d = spec.resolution``
    (a power of two >= 8; the volume is halved ``num_stages - 1`` times, so ``d`` must be divisible
    by ``2 ** (num_stages - 1)``, which every power of two of at least 8 is); output ``dose``
    ``(batch, d, d, d, 1)`` float32, in Gy, non-negative.

    Layout (stage ``s`` at ``d / 2**s`` with ``spec.stage_features(s)`` features: ``spec.filters``
    × ``spec.widths[s]``, e.g. 1, 2, 4, 8, 8, 8 × filters, or 0.25, 1, 2, 4, 8, 8 × for a thin
    full-resolution stage):

    - a stem at full resolution: Conv3D 3³ + normalisation + LeakyReLU(0.01);
    - each stage: (stages after the first) a Conv3D 3³ of stride 2 down + normalisation + LeakyReLU,
      then ``BLOCKS_PER_STAGE`` residual blocks: two Conv3D 3³ (normalisation after each, LeakyReLU
      after the first) added to the block's input, then LeakyReLU (plain: not added);
    - each decoder stage: Conv3DTranspose 2³ of stride 2 up, the encoder's features of the same
      stage concatenated, Conv3D 3³ + normalisation + LeakyReLU (SpatialDropout3D(``spec.dropout``)
      after alternate stages, as the generator, when ``spec.dropout`` > 0);
    - the head, all float32 whatever the dtype policy: Conv3D 1³ to one channel, then
      ``spec.head``: ``"softplus"``, the site's highest prescription × softplus (positive, with a
      gradient everywhere: the output cannot die; its bias starts at ``SOFTPLUS_START``); ``"relu"`` (models saved before the softplus
      head), times the highest prescription, then a ReLU (a convolution negative on every voxel
      passes no gradient back, and the model predicts 0 Gy from then on); ``"leaky"``, the ReLU head
      with :class:`~provided_code.networks.layers.DoseFloor` for its ReLU (a LeakyReLU(0.01) while
      training, so a gradient reaches it below zero; clipped at zero when predicting), its kernel
      starting at zero and its bias at ``LEAKY_START`` (5 % of the highest prescription everywhere).
      The scaling makes the convolution's output a dose relative to the prescription, of the order of
      its normalised features, so that Adam's small steps reach doses of tens of Gy.

    Convolutions have no bias (a normalisation follows each), but the head's. Normalisation as the
    generator's (``spec.norm``: instance or synchronised batch norm).

    Layer names follow the generator's blocks (``encoder_<s>_*``, ``decoder_<s>_*``: what
    ``--recompute`` splits on and ``--freeze encoder`` holds, :data:`block_of`,
    :func:`provided_code.networks.blocks.in_encoder`) with names of their own inside (``_stem``,
    ``_down``, ``_res<b>`` (plain: ``_conv<b>``), ``_up``, ``_fuse``), so that ``--init-from``
    never takes a generator's weights into this body by name, nor a plain body's into a residual one.
    """
    if spec.arch not in ("resunet", "plain"):
        raise ValueError(f"Invalid `spec`. Expected arch 'resunet' or 'plain' (networks.build.build_network builds "
                         f"every body). Received: arch={spec.arch!r}")
    residual = spec.arch == "resunet"
    stages = num_stages(spec.resolution)

    def normalisation(name: str) -> keras.layers.Layer:
        if spec.norm == "instance":
            return keras.layers.GroupNormalization(groups=-1, epsilon=1e-3, name=f"{name}_norm")
        return keras.layers.BatchNormalization(momentum=0.99, epsilon=1e-3, synchronized=True, name=f"{name}_bn")

    def conv_norm(x, features: int, name: str, strides: int = 1, kernel: int = 3):
        x = keras.layers.Conv3D(features, kernel, strides=strides, padding="same", use_bias=False,
                                name=f"{name}_conv")(x)
        return normalisation(name)(x)

    def act(x, name: str):
        return keras.layers.LeakyReLU(negative_slope=NEGATIVE_SLOPE, name=f"{name}_act")(x)

    def residual_block(x, features: int, name: str):
        y = act(conv_norm(x, features, f"{name}a"), f"{name}a")
        y = conv_norm(y, features, f"{name}b")
        if x.shape[-1] != features:  # the shortcut projected (a 1³ convolution) where the width changes
            x = conv_norm(x, features, f"{name}_proj", kernel=1)
        return act(keras.layers.Add(name=f"{name}_add")([x, y]), name)

    def plain_block(x, features: int, name: str):
        y = act(conv_norm(x, features, f"{name}a"), f"{name}a")
        return act(conv_norm(y, features, f"{name}b"), name)

    inputs, x = unpacked_inputs(spec)

    skips = []
    for stage in range(stages):
        features = spec.stage_features(stage)
        if stage == 0:
            x = act(conv_norm(x, features, "encoder_0_stem"), "encoder_0_stem")
        else:
            x = act(conv_norm(x, features, f"encoder_{stage}_down", strides=2), f"encoder_{stage}_down")
        for block in range(1, BLOCKS_PER_STAGE + 1):
            if residual:
                x = residual_block(x, features, f"encoder_{stage}_res{block}")
            else:
                x = plain_block(x, features, f"encoder_{stage}_conv{block}")
        skips.append(x)

    for block, stage in enumerate(range(stages - 2, -1, -1)):
        features = spec.stage_features(stage)
        x = keras.layers.Conv3DTranspose(features, 2, strides=2, use_bias=False, name=f"decoder_{stage}_up")(x)
        x = keras.layers.Concatenate(name=f"decoder_{stage}_skip")([x, skips[stage]])
        x = act(conv_norm(x, features, f"decoder_{stage}_fuse"), f"decoder_{stage}_fuse")
        if block % 2 == 1 and spec.dropout > 0:
            x = keras.layers.SpatialDropout3D(spec.dropout, name=f"decoder_{stage}_dropout")(x)

    scale = spec.site.max_prescription_gy
    if spec.head == "relu":
        x = keras.layers.Conv3D(1, 1, dtype="float32", name="dose_head")(x)
        x = keras.layers.Rescaling(scale, dtype="float32", name="dose_scale")(x)
        dose = keras.layers.ReLU(dtype="float32", name="dose")(x)
    elif spec.head == "leaky":
        x = keras.layers.Conv3D(1, 1, dtype="float32", kernel_initializer="zeros",
                                bias_initializer=keras.initializers.Constant(LEAKY_START), name="dose_head")(x)
        x = keras.layers.Rescaling(scale, dtype="float32", name="dose_scale")(x)
        dose = DoseFloor(NEGATIVE_SLOPE, dtype="float32", name="dose")(x)
    else:
        x = keras.layers.Conv3D(1, 1, dtype="float32", bias_initializer=keras.initializers.Constant(SOFTPLUS_START),
                                name="dose_head")(x)
        x = keras.layers.Activation(spec.head, dtype="float32", name="dose_positive")(x)
        dose = keras.layers.Rescaling(scale, dtype="float32", name="dose")(x)
    return keras.Model(inputs=inputs, outputs=dose, name="resunet" if residual else "plain_unet")
