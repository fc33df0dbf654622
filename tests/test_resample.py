import numpy as np
import pytest

from provided_code.data.cache import load_split
from provided_code.data.split_arrays import SplitArrays
from provided_code.data.resample import block_mean, block_or, downsample_split, upsample_dose
from provided_code.sites import openkbp


def test_block_mean_and_block_or():
    volume = np.arange(4 * 4 * 4, dtype=np.uint16).reshape(4, 4, 4)
    means = block_mean(volume, 2)
    assert means.shape == (2, 2, 2) and means.dtype == np.float32
    assert means[0, 0, 0] == volume[:2, :2, :2].mean()
    bits = np.zeros((4, 4, 4), np.uint16)
    bits[0, 0, 0] = 0b001
    bits[1, 1, 1] = 0b100
    bits[3, 3, 3] = 0b010
    reduced = block_or(bits, 2)
    assert reduced[0, 0, 0] == 0b101 and reduced[1, 1, 1] == 0b010 and reduced[0, 1, 0] == 0


def test_downsample_split_keeps_every_structure(phantom_data, tmp_path):
    full = load_split(phantom_data / "train-pats", cache_dir=tmp_path / "c", workers=1, site=openkbp())
    small = downsample_split(full, 32)
    assert small.ct.shape == (4, 32, 32, 32) and small.ct.dtype == np.uint16
    assert small.dose.dtype == np.float32 and small.structure_masks.dtype == np.uint16
    assert np.isclose(small.dose[0].mean(), full.dose[0].mean(), rtol=1e-5)  # float32 block means, then a mean of 2M values
    for row in range(len(full)):
        assert np.bitwise_or.reduce(small.structure_masks[row], axis=None) == \
            np.bitwise_or.reduce(full.structure_masks[row], axis=None)
    assert small.possible_dose_mask.sum() * 64 >= full.possible_dose_mask.sum()
    with pytest.raises(ValueError, match="Invalid `resolution`"):
        downsample_split(full, 48)


def test_upsample_dose_is_linear_and_masked():
    mask = np.ones((128, 128, 128), bool)
    mask[:, :, :10] = False
    constant = np.full((32, 32, 32), 5.0, np.float32)
    up = upsample_dose(constant, mask)
    assert up.shape == (128, 128, 128) and up.dtype == np.float32
    assert np.allclose(up[mask], 5.0) and np.all(up[~mask] == 0)
    ramp = np.broadcast_to(np.arange(64, dtype=np.float32)[:, None, None], (64, 64, 64))
    up = upsample_dose(ramp, np.ones((128, 128, 128), bool))
    # A linear ramp survives down(up(x)) away from the edges, where interpolation clamps.
    assert np.allclose(block_mean(up, 2)[1:-1], ramp[1:-1], atol=1e-5)  # float32 weights of a ramp up to ~30 Gy: ulps


def test_downsampling_keeps_a_wide_sites_uint32_bits():
    """More than 16 structures: the packing is uint32, and the block OR keeps every bit of it."""
    full = SplitArrays(patient_ids=["pt_1"], ct=np.zeros((1, 128, 128, 128), np.uint16),
                       structure_masks=np.zeros((1, 128, 128, 128), np.uint32),
                       possible_dose_mask=np.zeros((1, 128, 128, 128), bool), dose=np.zeros((1, 128, 128, 128), np.float32),
                       has_dose=np.ones(1, bool), dose_decimals=np.zeros(1, np.int8), voxel_dimensions=np.ones((1, 3)),
                       structure_present=np.ones((1, 20), bool), site=openkbp())  # (the site is not read here)
    full.structure_masks[0, 5, 6, 7] = (1 << 19) | 1
    full.structure_masks[0, 100, 3, 64] = 1 << 17
    small = downsample_split(full, 32)
    assert small.structure_masks.dtype == np.uint32
    assert small.structure_masks[0, 1, 1, 1] == (1 << 19) | 1 and small.structure_masks[0, 25, 0, 16] == 1 << 17
