import numpy as np
import pytest
import tensorflow as tf

from provided_code.config import TrainConfig
from provided_code.data.batches import epoch_batches
from provided_code.data.cache import load_split
from provided_code.data.resample import downsample_split
from provided_code.data.tf_dataset import distributed_dataset, update_schedule, updates_per_epoch
from provided_code.sites import openkbp

SPEC = TrainConfig().spec  # OpenKBP's default model: it eats the CT and the packed structures


def test_schedule_follows_the_seeded_order_and_weighs_padding_zero():
    schedule = update_schedule(5, batch_size=2, replicas=1, accumulate=1, seed=1, first_epoch=1, epochs=3)
    assert len(schedule) == 2 * updates_per_epoch(5, 2)
    expected = np.concatenate(epoch_batches(5, 2, seed=1, epoch=1))
    rows = np.concatenate([rows.reshape(-1) for rows, *_ in schedule[:3]])
    assert np.array_equal(rows[:5], expected)
    assert np.array_equal(rows[5:], expected[:1])  # the last update topped up with the epoch's first patient
    assert [(epoch, index) for *_, epoch, index in schedule] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    for _, weights, *_ in schedule[:3]:
        assert weights.sum() == pytest.approx(1.0)  # float32 shares of one: a few ulps
    assert schedule[2][1].reshape(-1).tolist() == [1.0, 0.0]
    sums = update_schedule(5, batch_size=2, replicas=1, accumulate=1, seed=0, first_epoch=0, epochs=1, mean=False)
    assert sum(weights.sum() for _, weights, *_ in sums) == 5


def test_one_update_spans_replicas_and_micro_batches():
    (rows, weights, _, _), = update_schedule(8, batch_size=1, replicas=2, accumulate=4, seed=3, first_epoch=0, epochs=1)
    assert rows.shape == weights.shape == (4, 2, 1)
    assert sorted(rows.reshape(-1).tolist()) == list(range(8)) and np.allclose(weights, 1 / 8)
    assert np.array_equal(rows.reshape(-1), np.concatenate(epoch_batches(8, 8, seed=3, epoch=0)))


def test_distributed_dataset_gives_each_replica_its_rows(phantom_data, tmp_path):
    arrays = downsample_split(load_split(phantom_data / "train-pats", cache_dir=tmp_path / "c", workers=1,
                                         site=openkbp()), 32)
    schedule = update_schedule(4, batch_size=1, replicas=1, accumulate=2, seed=2, first_epoch=0, epochs=1)
    elements = list(distributed_dataset(tf.distribute.get_strategy(), arrays, schedule, SPEC))
    assert len(elements) == len(schedule) == 2
    for element, (rows, weights, *_) in zip(elements, schedule):
        assert element["ct"].dtype == tf.uint16 and element["structure_masks"].dtype == tf.uint16
        assert np.array_equal(element["ct"].numpy(), arrays.ct[rows.reshape(-1)])
        assert np.array_equal(element["dose"].numpy()[..., 0], arrays.dose[rows.reshape(-1)])
        assert np.array_equal(element["weight"].numpy(), weights.reshape(-1))


def test_elements_carry_the_masks_and_the_updates_draws(phantom_data, tmp_path):
    """(Split between replicas like the patients: test_strategy's 2 devices × 1 = 1 device × 2.)"""
    from provided_code.data.augment import Augmenter

    arrays = downsample_split(load_split(phantom_data / "train-pats", cache_dir=tmp_path / "c", workers=1,
                                         site=openkbp()), 32)
    augmenter = Augmenter(("flip", "rotate", "shift"), arrays.possible_dose_mask, seed=4)
    schedule = update_schedule(4, batch_size=2, replicas=1, accumulate=1, seed=2, first_epoch=0, epochs=1)
    whole = list(distributed_dataset(tf.distribute.get_strategy(), arrays, schedule, SPEC, with_mask=True,
                                     augmenter=augmenter))
    rows, weights, epoch, index = schedule[0]
    drawn = augmenter.draw(rows.reshape(-1), epoch, index)
    for name in ("plane_source", "slice_shift", "mirrored"):
        assert np.array_equal(whole[0][name].numpy(), drawn[name])
    assert np.array_equal(whole[0]["possible_dose_mask"].numpy(), arrays.possible_dose_mask[rows.reshape(-1)])
