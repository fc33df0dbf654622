"""The beams' physics channel (networks/physics.py) against a plain recomputation on small
phantoms: depth dose in water, the inverse square, the electron density table, and the channel
moving with the patient under the training step's flips and turns."""

import math

import numpy as np
import pytest

from provided_code.constants import CT_HU_OFFSET
from provided_code.data.augment import plane_sources
from provided_code.networks import physics

SIZE = 32
VOXEL_MM = 4.0  # at SIZE³: voxel_dimensions (of the 128³ grid) are VOXEL_MM × SIZE / 128
GRID_MM = np.full((1, 3), VOXEL_MM * SIZE / 128, np.float32)


def water_slab(surface: int = 8):
    """Air above ``surface`` along axis 0 (anterior), water behind it; a 4³ target in the middle."""
    ct = np.zeros((1, SIZE, SIZE, SIZE), np.float32)
    ct[:, surface:] = CT_HU_OFFSET  # 0 HU
    targets = np.zeros_like(ct)
    targets[:, 14:18, 14:18, 14:18] = 1.0
    return ct, targets


def channel(ct, targets, angles, grid=GRID_MM):
    return np.asarray(physics.physics_channel(ct, targets, np.asarray(angles, np.float32), grid))


def on_axis(surface: int, voxels):
    """The plain formula on the central axis of a beam from anterior (gantry 0): depth from the
    water's surface to the voxel's centre, z from the targets' centre (voxel 15.5) along the beam."""
    depth = (np.asarray(voxels) - surface + 0.5) * VOXEL_MM
    z = (np.asarray(voxels) - 15.5) * VOXEL_MM
    inverse_square = (physics.SAD_MM / (physics.SAD_MM + z)) ** 2
    return inverse_square * (1 - np.exp(-physics.BUILDUP_PER_MM * depth)) * np.exp(-physics.MU_PER_MM * depth)


def test_electron_density_is_the_tables_piecewise_line_flat_beyond_its_ends():
    hu = np.array([-2000, -1000, -500, 0, 500, 1000, 2000, 3000, 5000], np.float32)
    points = np.array(physics.DENSITY_TABLE)
    expected = np.interp(hu, points[:, 0], points[:, 1])  # np.interp is flat beyond the ends
    np.testing.assert_allclose(np.asarray(physics.electron_density(hu)), expected, atol=1e-6)


def test_a_beam_through_water_falls_with_depth_as_the_formula_says():
    ct, targets = water_slab(surface=8)
    line = channel(ct, targets, [[0.0]])[0, :, 16, 16]
    assert np.all(line[:8] == 0)  # air before the surface: no depth, no build-up
    voxels = np.arange(8, SIZE)
    expected = on_axis(8, voxels)
    # the channel is normalised to its mean in the targets: compare shapes, each over its own maximum
    # (float32 cumulative sums over < 32 voxels: ~1e-6 relative)
    np.testing.assert_allclose(line[8:] / line[8:].max(), expected / expected.max(), rtol=1e-4)
    peak_mm = (np.argmax(line) - 8 + 0.5) * VOXEL_MM
    assert 10 <= peak_mm <= 22  # the build-up peaks near 15.6 mm (ln((b + mu) / mu) / b)


def test_without_attenuation_the_axis_follows_the_inverse_square_from_100_cm(monkeypatch):
    monkeypatch.setattr(physics, "MU_PER_MM", 0.0)
    monkeypatch.setattr(physics, "BUILDUP_PER_MM", 50.0)  # full build-up within the first voxel
    ct, targets = water_slab(surface=0)
    line = channel(ct, targets, [[0.0]])[0, :, 16, 16]
    z = (np.arange(SIZE) - 15.5) * VOXEL_MM
    expected = (physics.SAD_MM / (physics.SAD_MM + z)) ** 2
    np.testing.assert_allclose(line / line[16], expected / expected[16], rtol=1e-5)
    assert line[0] / line[-1] == pytest.approx(((1000 + 15.5 * 4) / (1000 - 15.5 * 4)) ** 2, rel=1e-5)


def test_the_opposed_beam_enters_from_the_back_and_a_crossing_beam_misses_the_axis_outside_its_aperture():
    ct, targets = water_slab(surface=0)
    front, back = channel(ct, targets, [[0.0]])[0], channel(ct, targets, [[180.0]])[0]
    # the canvas is symmetric about the plane's centre: the same sums in the opposite order (float32 ulps)
    np.testing.assert_allclose(back[::-1, 16, 16], front[:, 16, 16], rtol=1e-5)
    lateral = channel(ct, targets, [[90.0]])[0]  # from the patient's left, along axis 1
    assert lateral[2, 16, 16] < 1e-3 * lateral[16, 16, 16]  # 14 voxels anterior: outside the aperture


def test_the_aperture_is_the_targets_projection_with_a_margin_and_a_penumbra():
    ct, targets = water_slab(surface=0)
    plane = channel(ct, targets, [[0.0]])[0, 16, :, 16]  # across the beam at the isocentre's depth
    inside, edge, outside = plane[15], plane[13], plane[8]  # target 14..17; margin 5 mm ~ 1 voxel
    assert inside > edge > outside and outside < 0.01 * inside
    assert edge > 0.3 * inside  # one voxel beyond the target, within the margin's reach


def test_unused_beam_slots_add_nothing_and_a_patient_without_targets_gets_zero():
    ct, targets = water_slab(surface=8)
    one = channel(ct, targets, [[0.0]])
    padded = channel(ct, targets, [[0.0, np.nan, np.nan]])
    np.testing.assert_array_equal(one, padded)
    assert not np.any(channel(ct, np.zeros_like(targets), [[0.0]]))


def _phantom(seed=0):
    """An off-centre elliptic body of soft tissue with a bone, and an off-centre target."""
    rng = np.random.default_rng(seed)
    i, j, k = np.meshgrid(*(np.arange(SIZE),) * 3, indexing="ij")
    body = ((i - 15) / 11.0) ** 2 + ((j - 17) / 13.0) ** 2 < 1
    ct = np.where(body, CT_HU_OFFSET + 40 + rng.normal(0, 10, body.shape), 0).astype(np.float32)
    ct[(i - 20) ** 2 + (j - 14) ** 2 < 6] = CT_HU_OFFSET + 900  # a bone behind the target
    targets = (((i - 12) ** 2 + (j - 20) ** 2 + (k - 16) ** 2) < 12).astype(np.float32)
    return ct[None], targets[None]


def _moved(volume, sources):
    flat = volume[0].reshape(SIZE * SIZE, SIZE)
    return np.where((sources >= 0)[:, None], flat[np.maximum(sources, 0)], 0).reshape(volume.shape)


@pytest.mark.parametrize("rotation, mirrored", [(0, True), (1, False), (1, True)])
def test_the_channel_moves_with_the_patient_under_flips_and_40_degree_turns(rotation, mirrored):
    """Computed after the move (as the training step does) against the unmoved channel moved the
    same way: equal up to the nearest-voxel resampling of both paths (a voxel or so at edges)."""
    ct, targets = _phantom()
    angles = np.array([[30.0, 100.0, 250.0]], np.float32)  # no symmetry: each beam must move itself
    sources = plane_sources(SIZE, rotation, mirrored)
    moved_angles = (-angles if mirrored else angles) - 40.0 * rotation  # tf_augment.move_angles
    after = channel(_moved(ct, sources), _moved(targets, sources), moved_angles % 360)
    before = _moved(channel(ct, targets, angles), sources)
    body = _moved(ct, sources)[0] > CT_HU_OFFSET / 2
    scale = before[0][body].mean()
    difference = np.abs(after[0] - before[0])[body]
    # Both paths resample to the nearest voxel (the move about the plane's centre (R - 1) / 2, the
    # beam's canvas about R / 2), which moves the small target's aperture edges by a voxel: most
    # voxels agree to float32 ulps (the median), the edges differ, 8-11 % of the channel on average
    # here. Angles moved the wrong way (g + turn, or not negated) differ by 40-58 %.
    assert np.median(difference) < 1e-5 * scale
    assert difference.mean() < 0.15 * scale
    wrong = ((angles if mirrored else -angles) + 40.0 * rotation) % 360
    wrongly = channel(_moved(ct, sources), _moved(targets, sources), wrong)
    assert np.abs(wrongly[0] - before[0])[body].mean() > 3 * difference.mean()


def test_the_volume_is_computed_on_the_coarser_grid_and_repeated_back():
    ct, targets = _phantom()
    angles = np.array([[0.0, 120.0, 240.0]], np.float32)
    fine = np.asarray(physics.physics_volume(ct, targets, angles, GRID_MM))
    f = physics.COARSENING
    coarse_ct = ct.reshape(1, SIZE // f, f, SIZE // f, f, SIZE // f, f).mean(axis=(2, 4, 6))
    coarse_targets = targets.reshape(1, SIZE // f, f, SIZE // f, f, SIZE // f, f).max(axis=(2, 4, 6))
    coarse = channel(coarse_ct, coarse_targets, angles)
    expected = coarse.repeat(f, axis=1).repeat(f, axis=2).repeat(f, axis=3)
    np.testing.assert_allclose(fine, expected, rtol=1e-5, atol=1e-6)  # the same float32 ops on the same values
    assert math.isclose(float((fine * targets).sum() / targets.sum()), 1.0, rel_tol=0.15)  # ~1 in the targets
