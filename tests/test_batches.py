import numpy as np
import pytest

from provided_code.data.batches import epoch_batches, take_batch
from provided_code.data.cache import load_split
from provided_code.model_spec import model_inputs
from provided_code.sites import openkbp


def test_every_patient_once_per_epoch_and_seeded():
    batches = epoch_batches(7, 2, seed=3, epoch=0)
    assert [len(b) for b in batches] == [2, 2, 2, 1]
    assert sorted(np.concatenate(batches).tolist()) == list(range(7))
    again = epoch_batches(7, 2, seed=3, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    orders = {tuple(np.concatenate(epoch_batches(7, 2, seed=3, epoch=e))) for e in range(5)}
    assert len(orders) > 1  # epochs differ
    assert np.concatenate(epoch_batches(5, 2, seed=0, epoch=4, shuffle=False)).tolist() == [0, 1, 2, 3, 4]


def test_bad_batch_size():
    with pytest.raises(ValueError, match="Invalid `batch_size`"):
        epoch_batches(4, 0, seed=0, epoch=0)


def test_take_batch_is_compact_fancy_indexing(phantom_data, tmp_path):
    arrays = load_split(phantom_data / "train-pats", cache_dir=tmp_path / "c", workers=1, site=openkbp())
    inputs, dose = take_batch(arrays, np.array([2, 0]), model_inputs(openkbp()))
    assert inputs["ct"].dtype == np.uint16 and inputs["structure_masks"].dtype == np.uint16
    assert np.array_equal(inputs["ct"][0], arrays.ct[2]) and np.array_equal(dose[1, ..., 0], arrays.dose[0])
    assert dose.shape == (2, 128, 128, 128, 1) and dose.dtype == np.float32


def test_numpy_data_layer_imports_without_tensorflow():
    import subprocess
    import sys

    probe = ("import sys; import provided_code.data.batches, provided_code.data.cache, "
             "provided_code.data.resample, provided_code.data.phantoms; "
             "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
