"""Beam input channels (``--beams``, ``--beam-angles``): the lines through the targets, per beam."""

import math

import numpy as np
import pytest

import tensorflow as tf

from provided_code.config import ConfigError, TrainConfig
from provided_code.data.augment import Augmenter, plane_sources
from provided_code.data.batches import fit_vectors, take_inputs
from provided_code.data.tf_augment import apply_geometry
from provided_code.model_spec import model_inputs
from provided_code.beams import beam_voxels, equidistant_angles, parse_beam_angles
from provided_code.networks.layers import CompactInputs
from provided_code.sites import load_site

STRUCTURES = load_site("openkbp").names  # OpenKBP's channel order

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
    expected = rays_by_hand(size, slices, (8, 8, 1), angle)  # within half a voxel of the line through (8, 8)
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
    return _turned(volume, plane_sources(volume.shape[0], turns, mirrored=False))


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
    assert NINE == tuple(float(40 * k) for k in range(9)) == load_site("openkbp").beams.gantry_angles()
    config = TrainConfig(beams=9)
    assert config.beam_angles == ",".join(f"{a:g}" for a in NINE) and config.beams == 9
    given = TrainConfig(beam_angles="10, 190,270")
    assert (given.beams, given.beam_angles) == (3, "10,190,270")
    assert (TrainConfig(beams=0).beams, TrainConfig(beams=0).beam_angles) == (0, "")
    assert TrainConfig().beam_angles == config.beam_angles  # the default: OpenKBP's nine beams
    assert TrainConfig.from_json(config.to_json()) == config
    for bad in ("", "a,b", "0,360", "0,nan", "400", "-90"):  # a gantry angle is in [0, 360): 400 is a slip, not 40
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
    from provided_code.beams import augmentations_that_move_beams

    everything = ("flip", "rotate", "shift")
    assert augmentations_that_move_beams(NINE, everything, ROTATION_STEP_DEGREES) == []
    assert augmentations_that_move_beams(equidistant_angles(9, phase=20.0), everything, ROTATION_STEP_DEGREES) == []
    assert augmentations_that_move_beams(equidistant_angles(9, phase=10.0), everything,
                                         ROTATION_STEP_DEGREES) == ["flip"]
    seven = equidistant_angles(7)
    assert augmentations_that_move_beams(seven, everything, ROTATION_STEP_DEGREES) == ["rotate"]
    assert augmentations_that_move_beams(seven, ("flip", "shift"), ROTATION_STEP_DEGREES) == []
    assert augmentations_that_move_beams((), everything, ROTATION_STEP_DEGREES) == []


def patient_channels(structure_masks: np.ndarray, angles: np.ndarray, beam_channels: str) -> np.ndarray:
    """The beam channels ``(patients, R, R, slices, C)`` of patients ``(patients, R, R, slices)``,
    each from its own gantry angles ``(patients, slots)`` (NaN: unused)."""
    layer = CompactInputs(beam_angles=NINE, beam_channels=beam_channels, beam_slots=angles.shape[1])
    out = np.asarray(layer([np.zeros_like(structure_masks), structure_masks, angles.astype(np.float32)]))
    return out[..., 1 + len(STRUCTURES):]


def rays_by_hand(size: int, slices: int, voxel: tuple[int, int, int], angle: float) -> np.ndarray:
    """The voxels within half a voxel of the line through ``voxel`` in the direction of the beam at
    gantry ``angle``, (-cos g, sin g) in (axis 0, axis 1), in its slice only."""
    i, j = np.meshgrid(np.arange(size) - voxel[0], np.arange(size) - voxel[1], indexing="ij")
    g = math.radians(angle)
    expected = np.zeros((size, size, slices), bool)
    expected[:, :, voxel[2]] = np.abs(i * math.sin(g) + j * math.cos(g)) < 0.5
    return expected


def test_a_patients_own_beams_make_its_channels_a_single_target_voxels_rays_by_hand():
    """Two phantoms of one batch, each with its own beams (not the site's nine): each voxel's
    channels are the rays of that patient's beams through its single target voxel, an unused slot
    adds nothing, and "count" divides by the patient's own number of beams. The beams arrive from
    the patients' arrays (``beam_angles``) through the declared inputs, as training feeds them."""
    size, slices = 16, 3
    structure_masks = np.zeros((2, size, size, slices), np.uint16)
    structure_masks[0, 8, 8, 1] = PTV70
    structure_masks[1, 8, 8, 2] = PTV56  # at the plane's centre, like the run-wide test's: its rays are the lines
    structure_masks[:, 2, 3, 0] = 1  # Brainstem only: not a target

    class Patients:  # what SplitArrays carries: beam_angles (N, slots), NaN in unused slots
        ct = np.zeros_like(structure_masks)
        beam_angles = np.array([[20.0, 135.0, np.nan], [90.0, 250.0, 310.0]], np.float32)
        patient_ids = ["pt_1", "pt_2"]

    Patients.structure_masks = structure_masks
    specs = model_inputs(load_site("openkbp"), beam_slots=3, beam_angles=NINE[:3])
    angles = take_inputs(fit_vectors(Patients(), specs), np.arange(2), specs)["beam_angles"]  # as training makes them
    np.testing.assert_array_equal(angles, Patients.beam_angles)
    each = patient_channels(structure_masks, angles, "each")
    expected = [[rays_by_hand(size, slices, (8, 8, 1), a) for a in (20.0, 135.0)] + [np.zeros((size, size, slices), bool)],
                [rays_by_hand(size, slices, (8, 8, 2), a) for a in (90.0, 250.0, 310.0)]]
    for patient in range(2):
        for slot in range(3):
            assert np.array_equal(each[patient, ..., slot], expected[patient][slot].astype(np.float32)), (patient, slot)
    count = patient_channels(structure_masks, angles, "count")[..., 0]
    np.testing.assert_allclose(count[0], np.sum(expected[0], axis=0) / 2, atol=1e-6)  # float32 k/2, k/3: an ulp
    np.testing.assert_allclose(count[1], np.sum(expected[1], axis=0) / 3, atol=1e-6)
    site_nine = patient_channels(structure_masks, np.array([NINE, NINE]), "count")[..., 0]
    assert not np.allclose(site_nine[0], count[0])  # the site's beams would have made other channels


def test_each_patients_own_angles_equal_the_run_wide_channels_when_they_are_the_same():
    """Per-patient channels from the run's nine angles are the run-wide channels exactly: the
    device computes the same lines (in float64, as ``ray_bins``)."""
    rng = np.random.default_rng(3)
    structure_masks = np.zeros((2, 32, 32, 4), np.uint16)
    structure_masks[rng.random(structure_masks.shape) < 0.01] = PTV70
    structure_masks[1, 10:14, 18:25, 1:3] |= PTV56
    for beam_channels in ("count", "each"):
        own = patient_channels(structure_masks, np.array([NINE, NINE]), beam_channels)
        run_wide = np.stack([channels(masks, NINE, beam_channels) for masks in structure_masks])
        assert np.array_equal(own, run_wide)


SEVEN = np.array([[10.0, 51.0, 102.0, 155.0, 204.0, 260.0, 306.0]], np.float32)  # no 40° turn or flip keeps these


def _patient(size: int) -> np.ndarray:
    """``(1, R, R, R)``: two targets, off-centre and elongated."""
    i, j, k = np.meshgrid(*(np.arange(size) - size / 2,) * 3, indexing="ij")
    structure_masks = np.zeros((1, size, size, size), np.uint16)
    structure_masks[0][((i - 3) / 5) ** 2 + ((j + 2) / 3) ** 2 + (k / 4) ** 2 <= 1] = PTV70
    structure_masks[0][((i + 4) / 3) ** 2 + ((j - 5) / 2) ** 2 + ((k - 2) / 3) ** 2 <= 1] |= PTV56
    return structure_masks


def _moved(structure_masks: np.ndarray, angles: np.ndarray, sources: np.ndarray, mirrored: bool, turn: float) -> dict:
    """``apply_geometry`` on one patient with its own angles, moved by the given draw."""
    size = structure_masks.shape[1]
    element = {"ct": tf.zeros(structure_masks.shape, tf.uint16), "structure_masks": tf.constant(structure_masks),
               "beam_angles": tf.constant(angles), "dose": tf.zeros((*structure_masks.shape, 1)), "weight": tf.ones(1),
               "plane_source": tf.constant(sources.reshape(1, size * size)), "slice_shift": tf.zeros(1, tf.int32),
               "mirrored": tf.constant([mirrored]), "turn_degrees": tf.constant([turn], tf.float32)}
    moved = apply_geometry(element, model_inputs(load_site("openkbp"), beam_slots=angles.shape[1]))
    return {name: value.numpy() for name, value in moved.items()}


def _turned(volume: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """``volume`` ``(R, R, ...)`` resampled by an axial index map (zero outside)."""
    flat = volume.reshape(len(sources), *volume.shape[2:])
    moved = np.where((sources >= 0).reshape(-1, *[1] * (volume.ndim - 2)), flat[np.maximum(sources, 0)], 0)
    return moved.reshape(volume.shape)


def _quarter_turn_sources(size: int, quarter_turns: int, mirrored: bool) -> np.ndarray:
    """An axial index map like ``augment.plane_sources`` (the input mirrored, then turned by
    ``quarter_turns`` × 90° in its sense), about the point (R/2, R/2) where the beams' lines are
    anchored: on the grid, so the lines map onto lines exactly. -1 where the source is outside."""
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    a, b = i - size // 2, j - size // 2
    cos, sin = [(1, 0), (0, 1), (-1, 0), (0, -1)][quarter_turns % 4]
    source_i, source_j = size // 2 + cos * a + sin * b, size // 2 - sin * a + cos * b
    if mirrored:
        source_j = size - source_j
    inside = (source_i >= 0) & (source_i < size) & (source_j >= 0) & (source_j < size)
    return np.where(inside, source_i * size + source_j, -1).reshape(-1).astype(np.int32)


@pytest.mark.parametrize("quarter_turns, mirrored", [(1, False), (0, True), (3, True)])
def test_turning_a_patient_and_its_angles_then_making_channels_equals_making_then_turning(quarter_turns, mirrored):
    """Augmentation moves a patient's own angles with it (``apply_geometry``: a flip takes g to -g,
    a turn by r takes g to g - r), for any angle set (seven beams that no 40° turn or flip carries
    into themselves): the channels made from the moved patient and its moved angles are those of
    the patient moved. Turns by 90° about the lines' anchor and flips about it are exact on the
    grid, so the match is exact wherever the moved plane has a source. (Lines cannot tell g from
    g + 180°, so a quarter turn cannot tell the turn's sign: the 40° test below does.)"""
    size = 24
    structure_masks = _patient(size)
    sources = _quarter_turn_sources(size, quarter_turns, mirrored)
    moved = _moved(structure_masks, SEVEN, sources, mirrored, 90.0 * quarter_turns)
    np.testing.assert_array_equal(moved["beam_angles"], np.mod((-SEVEN if mirrored else SEVEN) - 90.0 * quarter_turns,
                                                               360.0))
    inside = (sources >= 0).reshape(size, size)
    for beam_channels in ("count", "each"):
        after = patient_channels(moved["structure_masks"], moved["beam_angles"], beam_channels)[0]
        before = patient_channels(structure_masks, SEVEN, beam_channels)[0]
        assert np.array_equal(after[inside], _turned(before, sources)[inside])
        assert after.any() and not np.array_equal(after, before)  # the channels did move


def test_a_40_degree_turn_of_the_augmentation_turns_a_patients_own_angles_by_minus_40():
    """The augmentation's own draw (a turn by k × 40°, its ``turn_degrees``): the channels of the
    turned patient from its turned angles match the turned channels as closely as the voxel grid
    allows (nearest-neighbour turns move voxels by up to half a voxel), far closer than with the
    angles turned the other way."""
    size = 32
    structure_masks = _patient(size)
    draws = Augmenter(("rotate",), np.ones((1, size, size, size), bool), seed=0)
    draw = next(d for d in (draws.draw(np.arange(1), 0, index) for index in range(50)) if d["turn_degrees"][0] == 40.0)
    np.testing.assert_array_equal(draw["plane_source"][0], plane_sources(size, 1, False))
    moved = _moved(structure_masks, SEVEN, draw["plane_source"][0], False, float(draw["turn_degrees"][0]))
    np.testing.assert_array_equal(moved["beam_angles"], np.mod(SEVEN - 40.0, 360.0))
    before = _turned(patient_channels(structure_masks, SEVEN, "each")[0], draw["plane_source"][0])
    after = patient_channels(moved["structure_masks"], moved["beam_angles"], "each")[0]
    other_way = patient_channels(moved["structure_masks"], np.mod(SEVEN + 40.0, 360.0), "each")[0]
    i, j = np.meshgrid(np.arange(size) - 15.5, np.arange(size) - 15.5, indexing="ij")
    body = i ** 2 + j ** 2 < 15 ** 2  # the voxels a 40° turn keeps inside the plane
    same, same_other_way = np.mean(after[body] == before[body]), np.mean(other_way[body] == before[body])
    assert same > 0.97 and same_other_way < 0.9, (same, same_other_way)  # 0.983; the other way 0.874
