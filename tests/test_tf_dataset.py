import numpy as np

from provided_code.data.batches import epoch_batches
from provided_code.data.cache import load_split
from provided_code.data.resample import downsample_split
from provided_code.data.tf_dataset import steps_per_epoch, training_dataset


def test_training_dataset_follows_the_seeded_schedule(phantom_data, tmp_path):
    arrays = downsample_split(load_split(phantom_data / "train-pats", cache_dir=tmp_path / "c", workers=1), 32)
    dataset = training_dataset(arrays, batch_size=3, seed=1, first_epoch=1, epochs=3)
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == 2 * steps_per_epoch(4, 3)
    expected = epoch_batches(4, 3, seed=1, epoch=1) + epoch_batches(4, 3, seed=1, epoch=2)
    for (inputs, dose), rows in zip(batches, expected):
        assert inputs["ct"].dtype == np.uint16 and inputs["structure_masks"].dtype == np.uint16
        assert np.array_equal(inputs["ct"], arrays.ct[rows])
        assert np.array_equal(dose[..., 0], arrays.dose[rows])


def test_full_batches_top_up_the_last_batch(phantom_data, tmp_path):
    arrays = downsample_split(load_split(phantom_data / "train-pats", cache_dir=tmp_path / "c", workers=1), 32)
    dataset = training_dataset(arrays, batch_size=3, seed=2, first_epoch=0, epochs=1, full_batches=True)
    batches = [dose for _, dose in dataset.as_numpy_iterator()]
    assert [len(b) for b in batches] == [3, 3]  # 4 patients: 3, then 1 topped up with the epoch's first 2
    first, last = epoch_batches(4, 3, seed=2, epoch=0)
    assert np.array_equal(batches[1][..., 0], arrays.dose[np.concatenate([last, first[:2]])])
