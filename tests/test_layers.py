import keras
import numpy as np
import pytest

from provided_code.constants import CT_MAX, STRUCTURES
from provided_code.networks.layers import AveragePool3x3x3, CompactInputs


@pytest.mark.parametrize("shape", [(2, 8, 8, 8, 1), (1, 5, 7, 9, 3), (1, 1, 4, 2, 1)])
def test_average_pool_matches_keras_same_padding(shape):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    expected = keras.layers.AveragePooling3D(3, strides=1, padding="same")(x)
    assert np.allclose(AveragePool3x3x3()(x), expected, atol=1e-6)  # float32 sums of 27 values below 1, two orders


def test_compact_inputs_unpack_bits_and_scale_ct():
    ct = np.array([[[[0, CT_MAX]]]], np.uint16)  # (1, 1, 1, 2)
    bits = np.array([[[[0b1000000101, 0b0000000010]]]], np.uint16)
    out = np.asarray(CompactInputs()([ct, bits]))
    assert out.shape == (1, 1, 1, 2, 1 + len(STRUCTURES))
    assert out[0, 0, 0, 0, 0] == 0 and out[0, 0, 0, 1, 0] == 1
    assert out[0, 0, 0, 0, 1:].tolist() == [1, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert out[0, 0, 0, 1, 1:].tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]


def test_compact_inputs_equal_the_plain_unpacking_for_every_value():
    """Every grey value and every bit pattern, against casting and shifting in numpy: exact in float32,
    and float16 (mixed precision) within its rounding; bits above the 10 structures are ignored."""
    rng = np.random.default_rng(0)
    ct = np.concatenate([np.arange(CT_MAX + 1), rng.integers(0, CT_MAX + 1, 8192 - CT_MAX - 1)])
    bits = np.concatenate([np.arange(2 ** len(STRUCTURES)), rng.integers(0, 2 ** len(STRUCTURES), 8192 - 2 ** len(STRUCTURES))])
    ct, bits = ct.astype(np.uint16).reshape(1, 16, 16, 32), bits.astype(np.uint16).reshape(1, 16, 16, 32)
    expected = np.concatenate([ct[..., None].astype(np.float32) * np.float32(1.0 / CT_MAX),
                               ((bits[..., None] >> np.arange(len(STRUCTURES))) & 1).astype(np.float32)], axis=-1)
    out = np.asarray(CompactInputs()([ct, bits]))
    assert out.dtype == np.float32 and np.array_equal(out, expected)
    unused_bits_set = bits | np.uint16(0xFFFF ^ (2 ** len(STRUCTURES) - 1))
    assert np.array_equal(np.asarray(CompactInputs()([ct, unused_bits_set])), expected)
    half = np.asarray(CompactInputs(dtype="mixed_float16")([ct, bits]))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), expected, rtol=2**-10, atol=0)  # float16 roundings


def test_prescription_channel_holds_the_highest_ptv_level_by_hand():
    from provided_code.constants import STRUCTURES
    from provided_code.data.phantoms import make_phantom
    from provided_code.data.resample import block_or

    volumes = make_phantom(4)
    structure_masks = np.zeros(volumes["ct"].shape, np.uint16)
    for bit, name in enumerate(STRUCTURES):
        structure_masks[volumes[name]] |= np.uint16(1 << bit)
    structure_masks = block_or(structure_masks, 4)  # 32³
    structure_masks[0, 0, 0] = (1 << STRUCTURES.index("PTV56")) | (1 << STRUCTURES.index("PTV63"))  # overlap: 63
    structure_masks[0, 0, 1] = 1 << STRUCTURES.index("Brainstem")  # an organ alone: 0
    ct = np.zeros_like(structure_masks)
    unpacked = CompactInputs(prescription=True)([ct[None], structure_masks[None]])
    channel = np.asarray(unpacked)[0, ..., -1]
    expected = np.zeros(structure_masks.shape, np.float32)
    for name, level in (("PTV56", 56.0), ("PTV63", 63.0), ("PTV70", 70.0)):  # ascending: the highest wins
        expected[(structure_masks >> STRUCTURES.index(name)) & 1 == 1] = level / 70.0
    assert np.asarray(unpacked).shape[-1] == 12
    np.testing.assert_allclose(channel, expected, rtol=1e-6)  # float32 Gy / 70 against float64: an ulp (1.2e-7)
    assert channel[0, 0, 0] == pytest.approx(0.9) and channel[0, 0, 1] == 0 and (channel == 1.0).any()
    restored = CompactInputs.from_config(CompactInputs(prescription=True).get_config())
    assert restored.prescription is True
