import keras
import numpy as np
import pytest

from provided_code.constants import CT_MAX
from provided_code.networks.layers import AveragePool3x3x3, CompactInputs, DoseFloor, site_unpacking
from provided_code.sites import load_site, openkbp

STRUCTURES = load_site("openkbp").names  # OpenKBP's channel order


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


def test_a_layer_saved_before_sites_unpacks_as_openkbp():
    """A checkpoint's CompactInputs config without the site's fields (saved before sites) takes
    OpenKBP's: the same channels as today's OpenKBP layer."""
    old = {"name": "compact_inputs", "trainable": True, "dtype": "float32", "prescription": True,
           "beam_angles": [0.0, 40.0], "beam_channels": "count"}
    restored = CompactInputs.from_config(old)
    assert (restored.structures, restored.max_prescription_gy, restored.targets) == (10, 70.0, (7, 8, 9))
    assert restored.prescriptions_gy[7:] == (56.0, 63.0, 70.0) and not any(restored.prescriptions_gy[:7])
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 1024, (1, 8, 8, 8)).astype(np.uint16)
    ct = rng.integers(0, CT_MAX, (1, 8, 8, 8)).astype(np.uint16)
    today = CompactInputs(prescription=True, beam_angles=(0.0, 40.0), beam_channels="count",
                          **site_unpacking(openkbp()))  # as build_unet configures it today
    assert np.array_equal(np.asarray(restored([ct, bits])), np.asarray(today([ct, bits])))


@pytest.mark.parametrize("structures, dtype", [(13, np.uint16), (32, np.uint32)])
def test_more_structures_than_a_table_holds_unpack_by_shifts(structures, dtype):
    """Above 12 structures each bit is shifted out (a uint32's bit 31 included): the same channels
    as numpy's unpacking, and the prescription channel the highest of the covering targets'."""
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 2 ** structures, (2, 8, 8, 8), dtype=np.uint64).astype(dtype)
    prescriptions = [0.0] * (structures - 3) + [50.0, 60.0, 80.0]  # the last three structures are targets
    layer = CompactInputs(prescription=True, structures=structures, prescriptions_gy=prescriptions,
                          max_prescription_gy=80.0)
    out = np.asarray(layer([np.zeros(bits.shape, np.uint16), bits]))
    unpacked = ((bits[..., None].astype(np.uint64) >> np.arange(structures, dtype=np.uint64)) & 1).astype(np.float32)
    assert out.shape[-1] == 1 + structures + 1
    assert np.array_equal(out[..., 1:1 + structures], unpacked)
    expected = np.max(unpacked[..., -3:] * np.array([50.0, 60.0, 80.0], np.float32) / np.float32(80.0), axis=-1)
    np.testing.assert_allclose(out[..., -1], expected, rtol=1e-6)  # Gy / 80 in float32, two orders: an ulp
    assert (out[..., -1] == 1.0).any() and (bits >> (structures - 1)).any()  # the top bit is exercised


def test_each_patients_own_prescriptions_make_its_prescription_channel():
    """With per-patient prescriptions the channel follows each patient's own Gy (over the site's
    highest), and a patient at the site's prescriptions gets the run-wide channel exactly."""
    site = load_site("openkbp")
    ptv56, ptv63, ptv70 = (1 << site.names.index(name) for name in ("PTV56", "PTV63", "PTV70"))
    bits = np.zeros((2, 4, 4, 4), np.uint16)
    bits[:, 0, 0, 0] = ptv56
    bits[:, 0, 0, 1] = ptv56 | ptv63  # overlap: the higher of the two
    bits[:, 0, 0, 2] = ptv70
    bits[:, 0, 0, 3] = 1  # an organ alone: 0
    prescriptions = np.array([[56.0, 63.0, 70.0], [50.0, 66.0, 60.0]], np.float32)  # site.targets order
    assert site.targets == ("PTV56", "PTV63", "PTV70")
    ct = np.zeros_like(bits)
    own = np.asarray(CompactInputs(prescription=True, patient_prescriptions=True)([ct, bits, prescriptions]))[..., -1]
    run_wide = np.asarray(CompactInputs(prescription=True)([ct, bits]))[..., -1]
    assert np.array_equal(own[0], run_wide[0])
    np.testing.assert_allclose(own[1, 0, 0], np.float32([50.0, 66.0, 60.0, 0.0]) / np.float32(70.0), rtol=1e-7)
    assert not np.array_equal(own[1], run_wide[1])


def test_the_dose_floor_is_leaky_while_training_and_zero_below_when_predicting(tmp_path):
    x = np.array([[-20.0, -0.5, 0.0, 0.25, 70.0]], np.float32)
    layer = DoseFloor(0.01)
    # one float32 product each: within float32's rounding (6e-8 relative) of the decimal slopes
    np.testing.assert_allclose(np.asarray(layer(x, training=True)), [[-0.2, -0.005, 0.0, 0.25, 70.0]], rtol=1e-7)
    np.testing.assert_array_equal(np.asarray(layer(x)), [[0.0, 0.0, 0.0, 0.25, 70.0]])
    inputs = keras.Input((5,))
    keras.Model(inputs, DoseFloor(0.05, name="dose")(inputs)).save(tmp_path / "floor.keras")
    loaded = keras.models.load_model(tmp_path / "floor.keras").get_layer("dose")
    assert isinstance(loaded, DoseFloor) and loaded.negative_slope == 0.05


def test_a_dose_floor_without_a_slope_below_zero_is_refused():
    with pytest.raises(ValueError, match="Invalid `negative_slope`. Expected a number above 0. Received: negative_slope=0"):
        DoseFloor(0)
