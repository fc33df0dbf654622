"""The residual U-Net and its plain control (networks/resunet.py): their layout at every size and
width, their dtypes, their heads and their blocks."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from provided_code.networks.build import build_network, network_body
from provided_code.networks.resunet import build_resunet, num_stages
from provided_code.networks.unet import build_unet
from tests.kit.runs import model_spec
from tests.kit.skips import requires_float16_convolutions

pytestmark = pytest.mark.usefixtures("reset_keras")


def resunet_spec(**fields):
    return model_spec(**{"arch": "resunet", "dropout": 0.0, **fields})


def test_stages_follow_the_input_size():
    assert [num_stages(r) for r in (128, 64, 32, 16, 8)] == [6, 5, 4, 3, 2]
    for bad in (48, 4, 100):
        with pytest.raises(ValueError, match="power of two"):
            num_stages(bad)


@pytest.mark.parametrize("resolution", [32, 64, 128])
def test_the_stem_and_the_head_work_at_full_resolution_at_every_size(resolution):
    model = build_resunet(resunet_spec(resolution=resolution, filters=2))  # built, not run
    full = (resolution,) * 3
    assert tuple(model.get_layer("encoder_0_stem_conv").output.shape[1:4]) == full
    assert tuple(model.get_layer("dose_head").output.shape[1:]) == (*full, 1)
    deepest = num_stages(resolution) - 1
    assert model.get_layer(f"encoder_{deepest}_down_conv").output.shape[1] == resolution >> deepest
    assert tuple(model.output.shape[1:]) == (*full, 1)


def test_stages_are_residual_blocks_joined_by_strided_and_transposed_convolutions():
    model = build_resunet(resunet_spec(resolution=32, filters=4))
    convolutions = [layer for layer in model.layers if type(layer) is keras.layers.Conv3D]
    strided = [layer for layer in convolutions if layer.strides == (2, 2, 2)]
    assert [layer.name for layer in strided] == [f"encoder_{s}_down_conv" for s in (1, 2, 3)]
    assert [layer.filters for layer in strided] == [8, 16, 32]
    head = model.get_layer("dose_head")
    assert head.kernel_size == (1, 1, 1) and head.use_bias and head.filters == 1
    assert all(not layer.use_bias and layer.kernel_size == (3, 3, 3) for layer in convolutions
               if layer is not head and "_proj" not in layer.name)
    assert sum(isinstance(layer, keras.layers.Add) for layer in model.layers) == num_stages(32)
    ups = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv3DTranspose)]
    assert [(layer.kernel_size, layer.strides) for layer in ups] == [((2, 2, 2), (2, 2, 2))] * 3
    ct = np.full((2, 32, 32, 32), 1000, np.uint16)
    dose = model({"ct": ct, "structure_masks": np.zeros_like(ct)})
    assert tuple(dose.shape) == (2, 32, 32, 32, 1) and dose.dtype == "float32"
    assert np.all(np.asarray(dose) >= 0)


def test_dropout_follows_the_generators_rule_alternate_decoder_stages():
    with_dropout = build_resunet(resunet_spec(resolution=32, filters=2, dropout=0.2))
    assert [layer.name for layer in with_dropout.layers
            if isinstance(layer, keras.layers.SpatialDropout3D)] == ["decoder_1_dropout"]
    without = build_resunet(resunet_spec(resolution=32, filters=2))
    assert not any(isinstance(layer, keras.layers.SpatialDropout3D) for layer in without.layers)


@requires_float16_convolutions
def test_mixed_precision_computes_in_float16_and_keeps_float32_outputs():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_resunet(resunet_spec(resolution=16, filters=2, physics=True))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.get_layer("encoder_0_stem_conv").compute_dtype == "float16"
    for name in ("dose_head", "dose_positive", "dose"):
        assert model.get_layer(name).compute_dtype == "float32"
    ct = np.full((1, 16, 16, 16), 1000, np.uint16)
    out = model({"ct": ct, "structure_masks": np.zeros_like(ct), "voxel_dimensions": np.full((1, 3), 3.5, "float32")})
    assert out.dtype == "float32"


def test_the_builder_builds_the_body_the_spec_names_and_the_generators_refuses_another():
    assert build_network(resunet_spec(resolution=16, filters=2)).name == "resunet"
    assert build_network(model_spec(resolution=16, filters=2)).name == "unet"
    with pytest.raises(ValueError, match="arch='generator'"):
        build_unet(resunet_spec(resolution=16, filters=2))


@pytest.mark.parametrize("arch,head", [("resunet", "softplus"), ("resunet", "relu"), ("resunet", "leaky"),
                                       ("plain", "softplus")])
def test_every_weighted_layer_is_in_a_recompute_block_and_the_encoder_is_named_as_such(arch, head):
    body = network_body(arch)
    model = build_network(resunet_spec(resolution=16, filters=2, dropout=0.2, arch=arch, head=head))
    unblocked = [layer.name for layer in model.layers if layer.weights and body.block_of(layer.name) is None]
    assert not unblocked
    assert body.block_of("compact_inputs") == body.block_of("encoder_0_stem_conv") == "inputs"
    head_layers = [layer.name for layer in model.layers if layer.name.startswith("dose")]
    assert {body.block_of(name) for name in head_layers} == {"decoder_0"}
    encoder = {layer.name for layer in model.layers if body.in_encoder(layer.name) and layer.weights}
    assert "encoder_0_stem_conv" in encoder and "encoder_2_down_conv" in encoder
    assert not any(name.startswith(("decoder", "dose")) for name in encoder)


def test_widths_set_each_stages_features_at_every_resolution():
    widths = (0.25, 1, 2, 4, 5, 5)
    for resolution, stages in ((64, 5), (32, 4)):
        model = build_resunet(resunet_spec(resolution=resolution, filters=8, widths=widths))
        features = [model.get_layer("encoder_0_stem_conv").filters] + [
            model.get_layer(f"encoder_{s}_down_conv").filters for s in range(1, stages)]
        assert features == [2, 8, 16, 32, 40][:stages]
        ups = [model.get_layer(f"decoder_{s}_up").filters for s in range(stages - 2, -1, -1)]
        assert ups == features[-2::-1]  # each decoder stage as wide as the encoder's at its resolution
    assert build_resunet(resunet_spec(resolution=32, filters=2, widths=(0.1, 1, 1, 1, 1, 1))).get_layer(
        "encoder_0_stem_conv").filters == 1  # never fewer than one feature


def test_the_plain_control_is_the_residual_body_without_its_additions():
    residual = build_resunet(resunet_spec(resolution=32, filters=4))
    plain = build_resunet(resunet_spec(resolution=32, filters=4, arch="plain"))
    assert plain.name == "plain_unet"
    assert not any(isinstance(layer, keras.layers.Add) for layer in plain.layers)
    assert not any("_proj" in layer.name for layer in plain.layers)

    def convolutions(model):
        return [(layer.filters, layer.kernel_size, layer.strides) for layer in model.layers
                if isinstance(layer, (keras.layers.Conv3D, keras.layers.Conv3DTranspose)) and "_proj" not in layer.name]

    assert convolutions(plain) == convolutions(residual)
    assert not {layer.name for layer in plain.layers if layer.weights} & {
        layer.name for layer in residual.layers if "_res" in layer.name}  # --init-from takes nothing across by name


def test_the_softplus_head_starts_low_and_keeps_a_gradient_below_zero():
    model = build_resunet(resunet_spec(resolution=16, filters=2))
    ct = np.random.default_rng(0).integers(0, 4000, (2, 16, 16, 16)).astype(np.uint16)
    inputs = {"ct": ct, "structure_masks": np.zeros_like(ct)}
    head = model.get_layer("dose_head")
    highest = model.get_layer("dose").scale
    kernel, bias = head.get_weights()
    head.set_weights([np.zeros_like(kernel), bias])
    np.testing.assert_allclose(np.asarray(model(inputs)), 0.05 * highest, rtol=1e-5)  # the bias: 5 % of it
    head.set_weights([kernel, bias])
    start = np.asarray(model(inputs))
    assert 0 < np.median(start) < 0.25 * highest and np.ptp(start) > 0.1  # low, and not one dose everywhere
    kernel, bias = head.get_weights()
    head.set_weights([kernel, bias - 30.0])  # far below zero on every voxel: a ReLU head would be dead
    with tf.GradientTape() as tape:
        dose = model(inputs, training=True)
        loss = tf.reduce_mean(tf.abs(dose - 10.0))
    gradient = tape.gradient(loss, head.bias)
    assert np.all(np.asarray(dose) > 0) and float(gradient[0]) < 0  # pushed up, not ignored


def test_the_leaky_head_starts_at_a_twentieth_of_the_prescription_and_keeps_a_gradient_below_zero():
    model = build_resunet(resunet_spec(resolution=16, filters=2, head="leaky"))
    assert [layer.name for layer in model.layers[-3:]] == ["dose_head", "dose_scale", "dose"]
    ct = np.random.default_rng(0).integers(0, 4000, (2, 16, 16, 16)).astype(np.uint16)
    inputs = {"ct": ct, "structure_masks": np.zeros_like(ct)}
    highest = model.get_layer("dose_scale").scale
    np.testing.assert_allclose(np.asarray(model(inputs)), 0.05 * highest, rtol=1e-6)  # one dose: the kernel is 0
    head = model.get_layer("dose_head")
    kernel, bias = head.get_weights()
    head.set_weights([np.random.default_rng(1).normal(0, 0.1, kernel.shape).astype(np.float32), bias])
    assert np.ptp(np.asarray(model(inputs))) > 0.1  # the features reach the dose once the kernel moves
    kernel, bias = head.get_weights()
    head.set_weights([kernel, bias - 30.0])  # below zero on every voxel: where the ReLU head dies
    assert not np.asarray(model(inputs)).any()  # predicting: 0 Gy, never below
    with tf.GradientTape() as tape:
        dose = model(inputs, training=True)
        loss = tf.reduce_mean(tf.abs(dose - 10.0))
    gradient = tape.gradient(loss, head.bias)
    assert np.all(np.asarray(dose) < 0) and float(gradient[0]) < 0  # training: below zero, and pushed up


def test_the_relu_head_of_models_saved_before_softplus_is_built_as_it_was():
    model = build_resunet(resunet_spec(resolution=16, filters=2, head="relu"))
    assert [layer.name for layer in model.layers[-3:]] == ["dose_head", "dose_scale", "dose"]
    assert isinstance(model.get_layer("dose"), keras.layers.ReLU)
