import numpy as np
import tensorflow as tf

from provided_code.data.augment import Augmenter, plane_sources
from provided_code.data.tf_augment import apply_geometry, move_volume, swap_mirror_bits
from provided_code.model_spec import model_inputs
from provided_code.sites import load_site

STRUCTURES = load_site("openkbp").names  # OpenKBP's channel order
VOLUMES = model_inputs(load_site("openkbp"))  # what an OpenKBP model eats: the CT and the packed structures

RIGHT, LEFT = 1 << STRUCTURES.index("RightParotid"), 1 << STRUCTURES.index("LeftParotid")


def element(size=8, seed=0):
    rng = np.random.default_rng(seed)
    structure_masks = rng.integers(0, 1 << len(STRUCTURES), (2, size, size, size)).astype(np.uint16)
    return {"ct": rng.integers(1, 4096, (2, size, size, size)).astype(np.uint16),
            "structure_masks": structure_masks,
            "dose": rng.uniform(1, 70, (2, size, size, size, 1)).astype(np.float32),
            "possible_dose_mask": rng.random((2, size, size, size)) < 0.7,
            "weight": np.full(2, 0.5, np.float32)}


def with_draws(base, planes, shifts, mirrored):
    return {name: tf.constant(value) for name, value in {
        **base, "plane_source": np.stack(planes).astype(np.int32), "slice_shift": np.array(shifts, np.int32),
        "mirrored": np.array(mirrored)}.items()}


def numpy(result):
    return {name: value.numpy() for name, value in result.items()}


def test_rotation_by_zero_and_shift_by_zero_are_the_identity():
    base = element()
    out = numpy(apply_geometry(with_draws(base, [plane_sources(8, 0, False)] * 2, [0, 0],
                                          [False, False]), VOLUMES))
    assert set(out) == set(base)  # the draws are consumed
    for name in base:
        assert np.array_equal(out[name], base[name])


def test_mirror_with_parotid_swap_twice_is_the_identity():
    base = element()
    mirror = with_draws(base, [plane_sources(8, 0, True)] * 2, [0, 0], [True, True])
    once = numpy(apply_geometry(mirror, VOLUMES))
    assert np.array_equal(once["ct"], base["ct"][:, :, ::-1])
    right_before = (base["structure_masks"] & RIGHT) != 0
    assert np.array_equal((once["structure_masks"] & LEFT) != 0, right_before[:, :, ::-1])
    twice = numpy(apply_geometry(with_draws(once, [plane_sources(8, 0, True)] * 2, [0, 0],
                                            [True, True]), VOLUMES))
    for name in base:
        assert np.array_equal(twice[name], base[name])


def test_swap_mirror_bits_only_where_mirrored():
    masks = np.array([RIGHT, LEFT | 1, RIGHT | LEFT, 0], np.uint16).reshape(1, 1, 1, 4)
    both = np.concatenate([masks, masks])
    out = swap_mirror_bits(tf.constant(both), tf.constant([True, False]), ((RIGHT, LEFT),)).numpy()
    assert out[0].reshape(-1).tolist() == [LEFT, RIGHT | 1, RIGHT | LEFT, 0]
    assert np.array_equal(out[1], both[1])


def test_rotation_keeps_every_value_one_of_the_inputs():
    base = element(size=16)
    for turn in (1, 4, 7):
        planes = [plane_sources(16, turn, False), plane_sources(16, turn, True)]
        out = numpy(apply_geometry(with_draws(base, planes, [2, 2], [False, True]), VOLUMES))
        for name in ("ct", "dose", "structure_masks"):
            for n in range(2):
                values = np.unique(out[name][n])
                allowed = np.union1d(np.unique(base[name][n]), [0])  # zero where the source is outside
                if name == "structure_masks":
                    allowed = np.union1d(allowed, np.unique(swap_mirror_bits(tf.constant(base[name][n:n + 1]),
                                                                          tf.constant([True]), ((RIGHT, LEFT),)).numpy()))
                assert np.isin(values, allowed).all()
        assert not np.array_equal(out["ct"], base["ct"])


def test_everything_moves_together_and_the_mask_stays_whole():
    """Drawn like training does: dose stays inside the moved mask, and a shift never cuts the mask."""
    rng = np.random.default_rng(5)
    size = 16
    base = element(size)
    mask = np.zeros((2, size, size, size), bool)
    mask[:, 3:11, 4:12, 2:9] = True
    base["possible_dose_mask"] = mask
    base["dose"] = np.where(mask[..., None], rng.uniform(1, 70, mask.shape + (1,)), 0).astype(np.float32)
    base["ct"] = np.where(mask, base["ct"], 0).astype(np.uint16)
    augmenter = Augmenter(("shift",), mask, seed=0)
    for index in range(5):
        draws = augmenter.draw(np.arange(2), epoch=1, index=index)
        out = numpy(apply_geometry({**{k: tf.constant(v) for k, v in base.items()},
                                    **{k: tf.constant(v) for k, v in draws.items()}}, VOLUMES))
        assert out["possible_dose_mask"].sum() == mask.sum()
        assert np.array_equal(out["dose"][..., 0] > 0, out["possible_dose_mask"])
        assert np.array_equal(out["ct"] > 0, out["possible_dose_mask"])
        assert np.isclose(out["dose"].sum(), base["dose"].sum(), rtol=1e-6)  # the same float32 values moved, summed in another order


def test_move_volume_equals_a_per_voxel_reference():
    rng = np.random.default_rng(1)
    size = 8
    volume = rng.uniform(1, 9, (2, size, size, size)).astype(np.float32)
    planes = [plane_sources(size, 3, True, (1, -2)), plane_sources(size, 6, False, (0, 2))]
    shifts = [3, -2]
    out = move_volume(tf.constant(volume), tf.constant(np.stack(planes)), tf.constant(shifts, tf.int32)).numpy()
    expected = np.zeros_like(volume)
    for p in range(2):
        for index in range(size * size):
            source = planes[p][index]
            for k in range(size):
                if source >= 0 and 0 <= k - shifts[p] < size:
                    expected[p].reshape(size * size, size)[index, k] = volume[p].reshape(size * size, size)[source, k - shifts[p]]
    assert np.array_equal(out, expected)


def test_every_mirror_pair_swaps_in_any_packing():
    """A site's mirror pairs (several; in a uint32 packing up to bit 31) each swap on a flip."""
    pairs = ((1 << 0, 1 << 5), (1 << 30, 1 << 31))
    masks = np.array([1 | (1 << 31), (1 << 5) | (1 << 30) | (1 << 7), (1 << 0) | (1 << 5), 0], np.uint32)
    out = swap_mirror_bits(tf.constant(masks.reshape(1, 1, 1, 4)), tf.constant([True]), pairs).numpy().reshape(-1)
    assert out.tolist() == [(1 << 5) | (1 << 30), 1 | (1 << 31) | (1 << 7), (1 << 0) | (1 << 5), 0]
    assert swap_mirror_bits(tf.constant(masks.reshape(1, 1, 1, 4)), tf.constant([True]), ()).numpy().reshape(-1).tolist() \
        == masks.tolist()  # a site without pairs: nothing to swap


def test_angles_move_with_the_patient_and_prescriptions_do_not():
    """A flip takes gantry g to -g, then a turn by r to g - r (mod 360); NaN slots stay NaN; a
    patient's prescriptions are facts no move changes."""
    from provided_code.data.tf_augment import move_angles

    angles = np.array([[0.0, 90.0, 350.0, np.nan], [10.0, 200.0, np.nan, np.nan]], np.float32)
    moved = move_angles(tf.constant(angles), tf.constant([True, False]), tf.constant([40.0, 80.0])).numpy()
    np.testing.assert_array_equal(moved, [[320.0, 230.0, 330.0, np.nan], [290.0, 120.0, np.nan, np.nan]])
    base = element()
    base.update(prescriptions=np.array([[50, 60, 70], [56, 63, 72]], np.float32), beam_angles=angles)
    specs = model_inputs(load_site("openkbp"), patient_prescriptions=True, beam_slots=4)
    draws = with_draws(base, [plane_sources(8, 1, True), plane_sources(8, 2, False)], [0, 0], [True, False])
    out = numpy(apply_geometry({**draws, "turn_degrees": tf.constant([40.0, 80.0])}, specs))
    np.testing.assert_array_equal(out["beam_angles"], moved)
    np.testing.assert_array_equal(out["prescriptions"], base["prescriptions"])
    assert "turn_degrees" not in out
