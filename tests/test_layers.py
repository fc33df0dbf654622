import keras
import numpy as np
import pytest

from provided_code.constants import CT_MAX, STRUCTURES
from provided_code.networks.layers import AveragePool3x3x3, CompactInputs


@pytest.mark.parametrize("shape", [(2, 8, 8, 8, 1), (1, 5, 7, 9, 3), (1, 1, 4, 2, 1)])
def test_average_pool_matches_keras_same_padding(shape):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    expected = keras.layers.AveragePooling3D(3, strides=1, padding="same")(x)
    assert np.allclose(AveragePool3x3x3()(x), expected, atol=1e-6)


def test_compact_inputs_unpack_bits_and_scale_ct():
    ct = np.array([[[[0, CT_MAX]]]], np.uint16)  # (1, 1, 1, 2)
    bits = np.array([[[[0b1000000101, 0b0000000010]]]], np.uint16)
    out = np.asarray(CompactInputs()([ct, bits]))
    assert out.shape == (1, 1, 1, 2, 1 + len(STRUCTURES))
    assert out[0, 0, 0, 0, 0] == 0 and out[0, 0, 0, 1, 0] == 1
    assert out[0, 0, 0, 0, 1:].tolist() == [1, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert out[0, 0, 0, 1, 1:].tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
