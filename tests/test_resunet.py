"""The residual U-Net (networks/resunet.py): its layout at every size, its dtypes and its blocks."""

import keras
import numpy as np
import pytest

from provided_code.networks.build import build_network
from provided_code.networks.resunet import build_resunet, num_stages
from provided_code.networks.unet import block_of, build_unet, in_encoder
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
    for name in ("dose_head", "dose_scale", "dose"):
        assert model.get_layer(name).compute_dtype == "float32"
    ct = np.full((1, 16, 16, 16), 1000, np.uint16)
    out = model({"ct": ct, "structure_masks": np.zeros_like(ct), "voxel_dimensions": np.full((1, 3), 3.5, "float32")})
    assert out.dtype == "float32"


def test_the_builder_builds_the_body_the_spec_names_and_the_generators_refuses_another():
    assert build_network(resunet_spec(resolution=16, filters=2)).name == "resunet"
    assert build_network(model_spec(resolution=16, filters=2)).name == "unet"
    with pytest.raises(ValueError, match="arch='generator'"):
        build_unet(resunet_spec(resolution=16, filters=2))


def test_every_weighted_layer_is_in_a_recompute_block_and_the_encoder_is_named_as_such():
    model = build_resunet(resunet_spec(resolution=16, filters=2, dropout=0.2))
    unblocked = [layer.name for layer in model.layers if layer.weights and block_of(layer.name) is None]
    assert not unblocked
    assert block_of("compact_inputs") == block_of("encoder_0_stem_conv") == "inputs"
    assert block_of("dose_head") == block_of("dose_scale") == block_of("dose") == "decoder_0"
    encoder = {layer.name for layer in model.layers if in_encoder(layer.name) and layer.weights}
    assert "encoder_0_res1a_conv" in encoder and "encoder_2_down_conv" in encoder
    assert not any(name.startswith(("decoder", "dose")) for name in encoder)
