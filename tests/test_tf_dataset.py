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
