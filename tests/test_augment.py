import numpy as np
import pytest

from provided_code.data.augment import Augmenter, max_shift, parse_augment, plane_sources
from provided_code.sites import openkbp


def phantom_masks(count=3, size=16):
    """Possible-dose masks: off-centre boxes of different sizes."""
    masks = np.zeros((count, size, size, size), bool)
    for n in range(count):
        masks[n, 2 + n:9 + n, 3:12 - n, 1 + n:6 + 2 * n] = True
    return masks


def test_parse_augment_canonical_order_and_errors():
    assert parse_augment("none") == () and parse_augment("") == ()
    assert parse_augment("shift, flip") == ("flip", "shift")
    with pytest.raises(ValueError, match="Received: augment='spin'"):
        parse_augment("spin")


def test_shift_scales_with_resolution():
    assert (max_shift(128), max_shift(64), max_shift(32)) == (20, 10, 5)


def test_identity_maps_for_no_rotation_no_shift():
    assert np.array_equal(plane_sources(8, 0, False), np.arange(64))
    assert np.array_equal(plane_sources(8, 9, False), np.arange(64))  # 9 × 40° is a full turn


def test_mirror_maps_axis_1_and_twice_is_identity():
    mirrored = plane_sources(8, 0, True)
    assert np.array_equal(mirrored.reshape(8, 8), np.arange(64).reshape(8, 8)[:, ::-1])
    assert np.array_equal(mirrored[mirrored], np.arange(64))


def test_rotation_sources_are_inside_or_marked_outside():
    for turn in range(9):
        sources = plane_sources(16, turn, False)
        assert sources.min() >= -1 and sources.max() < 256
        inside = sources[sources >= 0]
        # nearest neighbour of a rotation: (almost) one-to-one near the centre, no source invented
        assert len(np.unique(inside)) > 0.8 * inside.size


def test_same_seed_epoch_step_gives_the_same_draw_and_others_differ():
    augmenter = Augmenter(("flip", "rotate", "shift"), phantom_masks(), seed=3)
    rows = np.array([0, 2, 1, 1])
    first, again = augmenter.draw(rows, epoch=4, index=2), augmenter.draw(rows, epoch=4, index=2)
    for name in first:
        assert np.array_equal(first[name], again[name])
    other = Augmenter(("flip", "rotate", "shift"), phantom_masks(), seed=3).draw(rows, epoch=4, index=3)
    assert any(not np.array_equal(first[name], other[name]) for name in first)


def test_disabled_moves_are_not_drawn():
    masks = phantom_masks()
    flips_only = Augmenter(("flip",), masks, seed=0).draw(np.arange(3), 0, 0)
    assert all(np.array_equal(plane, plane_sources(16, 0, bool(flip)))
               for plane, flip in zip(flips_only["plane_source"], flips_only["mirrored"]))
    assert not flips_only["slice_shift"].any()
    none = Augmenter((), masks, seed=0).draw(np.arange(3), 0, 0)
    assert not none["mirrored"].any() and np.array_equal(none["plane_source"], np.tile(np.arange(256), (3, 1)))


def test_shifts_keep_the_possible_dose_mask_whole():
    masks = phantom_masks()
    augmenter = Augmenter(("shift",), masks, seed=1)
    moved_any = False
    for index in range(30):
        draws = augmenter.draw(np.arange(3), epoch=0, index=index)
        for n in range(3):
            plane, shift = draws["plane_source"][n], int(draws["slice_shift"][n])
            flat = masks[n].reshape(256, 16)
            moved = np.where((plane >= 0)[:, None], flat[np.maximum(plane, 0)], False)
            shifted = np.zeros_like(moved)  # translate along axis 2, zero-filled
            if shift >= 0:
                shifted[:, shift:] = moved[:, :16 - shift]
            else:
                shifted[:, :16 + shift] = moved[:, -shift:]
            moved = shifted
            assert moved.sum() == masks[n].sum()  # nothing pushed out of the volume
            moved_any |= not np.array_equal(moved.reshape(masks[n].shape), masks[n])
    assert moved_any


def test_a_worker_reads_only_the_masks_of_the_patients_it_draws_for(phantom_split, tmp_path):
    from provided_code.data.cache import load_split

    masks = load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp()).possible_dose_mask
    rows = np.array([2, 0, 1, 0])
    needed = np.array([False, True, False, True])  # this worker's replicas: the 2nd and 4th patients
    mine = Augmenter(("flip", "rotate", "shift"), masks, seed=3).draw(rows, epoch=1, index=4, needed=needed)
    assert masks.verified_rows().tolist() == [0]  # only patient 0's mask was read
    everyone = Augmenter(("flip", "rotate", "shift"), masks[:], seed=3).draw(rows, epoch=1, index=4)
    for name in ("plane_source", "slice_shift", "mirrored"):
        assert np.array_equal(mine[name][needed], everyone[name][needed])
    assert np.array_equal(mine["mirrored"], everyone["mirrored"])  # every patient's draws drawn
