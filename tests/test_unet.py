import keras
import numpy as np
import pytest

from provided_code.networks.unet import build_unet, num_levels
from tests.kit.runs import model_spec
from tests.kit.skips import requires_float16_convolutions


def test_levels_follow_the_input_size():
    assert [num_levels(r) for r in (128, 64, 32, 16, 8)] == [6, 5, 4, 3, 2]
    for bad in (48, 4, 100):
        with pytest.raises(ValueError, match="power of two"):
            num_levels(bad)


def test_generator_shape_and_layers():
    model = build_unet(model_spec(resolution=32, filters=4, dropout=0.2))
    encoders = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv3D)
                and not isinstance(layer, keras.layers.Conv3DTranspose)]
    assert [layer.filters for layer in encoders] == [4, 8, 16, 32]
    assert all(layer.kernel_size == (4, 4, 4) and layer.strides == (2, 2, 2) and not layer.use_bias
               for layer in encoders)
    assert sum(isinstance(layer, keras.layers.SpatialDropout3D) for layer in model.layers) == 1
    assert "encoder_4_bn" not in [layer.name for layer in model.layers]  # no batch norm on the bottleneck
    ct = np.zeros((2, 32, 32, 32), np.uint16)
    out = model({"ct": ct, "structure_masks": ct})
    assert tuple(out.shape) == (2, 32, 32, 32, 1) and out.dtype == "float32"
    assert np.all(np.asarray(out) >= 0)


@requires_float16_convolutions
def test_mixed_precision_policy_keeps_float32_outputs():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_unet(model_spec(resolution=16, filters=2, dropout=0.2))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.get_layer("encoder_1_conv").compute_dtype == "float16"
    for name in ("dose_conv", "dose_smooth", "dose"):
        assert model.get_layer(name).compute_dtype == "float32"
    ct = np.zeros((1, 16, 16, 16), np.uint16)
    assert model({"ct": ct, "structure_masks": ct}).dtype == "float32"
