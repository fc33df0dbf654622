"""Beam input channels (``--beams``, ``--beam-angles``): the lines through the targets, per beam."""

import math

import numpy as np
import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.constants import BEAM_PHASE_DEGREES, STRUCTURES
from provided_code.data.augment import plane_sources
from provided_code.networks.beams import beam_voxels, equidistant_angles, parse_beam_angles
from provided_code.networks.layers import CompactInputs

PTV70 = np.uint16(1 << STRUCTURES.index("PTV70"))
PTV56 = np.uint16(1 << STRUCTURES.index("PTV56"))
NINE = equidistant_angles(9)


def channels(structure_masks: np.ndarray, angles, beam_channels: str) -> np.ndarray:
    """The beam channels of one patient ``(R, R, slices, C)``."""
    layer = CompactInputs(beam_angles=angles, beam_channels=beam_channels)
    ct = np.zeros_like(structure_masks)
    out = np.asarray(layer([ct[None], structure_masks[None]]))[0]
    return out[..., 1 + len(STRUCTURES):]


@pytest.mark.parametrize("angle", [0.0, 40.0, 45.0, 90.0, 200.0, 320.0])
def test_a_single_target_voxels_rays_by_hand(angle):
    """One PTV voxel at the plane's centre: the beam's voxels are those of its slice whose centre lies
    within half a voxel of the line through it in the beam's direction, (-cos g, sin g) in
    (axis 0, axis 1); other slices and an organ-only voxel add nothing."""
    size, slices = 16, 3
    structure_masks = np.zeros((size, size, slices), np.uint16)
    structure_masks[8, 8, 1] = PTV70
    structure_masks[2, 3, 2] = 1  # Brainstem only: not a target
    i, j = np.meshgrid(np.arange(size) - 8.0, np.arange(size) - 8.0, indexing="ij")
    g = math.radians(angle)
    direction = np.array([-math.cos(g), math.sin(g)])
    across = np.abs(i * direction[1] - j * direction[0])  # distance from the line through (8, 8)
    expected = np.zeros((size, size, slices), bool)
    expected[:, :, 1] = across < 0.5
    got = channels(structure_masks, (angle,), "each")[..., 0]
    assert np.array_equal(got, expected.astype(np.float32))
    assert np.array_equal(beam_voxels((structure_masks & PTV70) != 0, angle), expected)
    if angle == 0.0:  # anterior: the voxel's column along axis 0
        assert np.array_equal(np.argwhere(got), [[a, 8, 1] for a in range(size)])
    if angle == 90.0:  # the patient's left: its row along axis 1
        assert np.array_equal(np.argwhere(got), [[8, b, 1] for b in range(size)])


def test_count_is_the_mean_of_the_beams_and_any_target_counts():
    rng = np.random.default_rng(0)
    structure_masks = np.zeros((16, 16, 4), np.uint16)
    structure_masks[5:8, 9:11, 1:3] = PTV56
    structure_masks[rng.random(structure_masks.shape) < 0.01] |= PTV70
    each = channels(structure_masks, NINE, "each")
    count = channels(structure_masks, NINE, "count")
    assert each.shape[-1] == 9 and count.shape[-1] == 1
    # float32: the count channel divides a sum of 0/1 by the beams; numpy's mean does too, in another
    # order: values <= 1 differ by at most an ulp (6e-8), so 1e-6 is a bound, not a fit.
    np.testing.assert_allclose(count[..., 0], each.mean(axis=-1), atol=1e-6)
    assert count.max() == pytest.approx(1.0) and set(np.unique(each)) == {0.0, 1.0}
    targets = (structure_masks & (PTV56 | PTV70)) != 0
    for k, angle in enumerate(NINE):
        assert np.array_equal(each[..., k], beam_voxels(targets, angle).astype(np.float32))


def _rotate(volume: np.ndarray, turns: int) -> np.ndarray:
    """``volume`` ``(R, R, ...)`` rotated in the axial plane by ``turns`` × 40° as the augmentation does."""
    size = volume.shape[0]
    source = plane_sources(size, turns, mirrored=False)
    flat = volume.reshape(size * size, *volume.shape[2:])
    moved = np.where((source >= 0).reshape(-1, *[1] * (volume.ndim - 2)), flat[np.maximum(source, 0)], 0)
    return moved.reshape(volume.shape)


def test_rotating_the_inputs_by_40_degrees_rotates_the_channels():
    """The augmentation turns the patient by 40°: the nine beams' geometry turns with it, so the
    channels made after it equal the channels made before it, turned (each beam's channel becoming
    its neighbour's: a turn by +40° takes gantry g to g - 40). Voxel grids turn only
    approximately, so the match is measured: nearly every voxel, far above a wrong pairing."""
    size = 32
    i, j, k = np.meshgrid(*(np.arange(size) - 15.5,) * 3, indexing="ij")
    structure_masks = np.zeros((size,) * 3, np.uint16)
    structure_masks[((i - 4) / 6) ** 2 + ((j + 3) / 4) ** 2 + (k / 8) ** 2 <= 1] = PTV70  # off-centre, elongated
    structure_masks[((i + 5) / 3) ** 2 + ((j - 6) / 3) ** 2 + ((k - 2) / 5) ** 2 <= 1] = PTV56
    body = (i**2 + j**2) < 15**2  # the voxels a 40° turn keeps inside the plane
    turned_inputs = _rotate(structure_masks, 1)
    for beam_channels in ("count", "each"):
        after = channels(turned_inputs, NINE, beam_channels)
        before = _rotate(channels(structure_masks, NINE, beam_channels), 1)
        if beam_channels == "each":
            assert np.mean(after[body] == np.roll(before, -1, axis=-1)[body]) > 0.97  # 0.977
            assert np.mean(after[body] == before[body]) < 0.9  # the pairing matters: 0.81
        else:
            assert np.mean(np.abs(after - before)[body] <= 1 / 9 + 1e-6) > 0.97
            assert np.mean(np.abs(after - before)[body]) < 0.025  # 0.019; not turning it: 0.059


def test_beam_settings_resolve_to_saved_angles_and_bad_ones_are_refused():
    assert NINE == tuple(float((BEAM_PHASE_DEGREES + 40 * k) % 360) for k in range(9))
    config = TrainConfig(beams=9)
    assert config.beam_angles == ",".join(f"{a:g}" for a in NINE) and config.beams == 9
    given = TrainConfig(beam_angles="10, 190,-90")
    assert (given.beams, given.beam_angles) == (3, "10,190,270")
    assert (TrainConfig(beams=0).beams, TrainConfig(beams=0).beam_angles) == (0, "")
    assert TrainConfig().beam_angles == config.beam_angles  # the default: OpenKBP's nine beams
    assert TrainConfig.from_json(config.to_json()) == config
    for bad in ("", "a,b", "0,360", "0,nan"):
        with pytest.raises(ValueError, match="Invalid `beam_angles`"):
            parse_beam_angles(bad)
    with pytest.raises(ConfigError, match="Invalid `beam_angles`"):
        TrainConfig(beam_angles="0,0")
    with pytest.raises(ConfigError, match="Invalid `beams`"):
        TrainConfig(beams=-1)
    with pytest.raises(ConfigError, match="Invalid `beam_channels`"):
        TrainConfig(beams=9, beam_channels="some")


def test_augmentations_that_would_move_the_beams_are_named():
    from provided_code.data.augment import ROTATION_STEP_DEGREES
    from provided_code.networks.beams import augmentations_that_move_beams

    everything = ("flip", "rotate", "shift")
    assert augmentations_that_move_beams(NINE, everything, ROTATION_STEP_DEGREES) == []
    assert augmentations_that_move_beams(equidistant_angles(9, phase=20.0), everything, ROTATION_STEP_DEGREES) == []
    assert augmentations_that_move_beams(equidistant_angles(9, phase=10.0), everything,
                                         ROTATION_STEP_DEGREES) == ["flip"]
    seven = equidistant_angles(7)
    assert augmentations_that_move_beams(seven, everything, ROTATION_STEP_DEGREES) == ["rotate"]
    assert augmentations_that_move_beams(seven, ("flip", "shift"), ROTATION_STEP_DEGREES) == []
    assert augmentations_that_move_beams((), everything, ROTATION_STEP_DEGREES) == []
