"""Checkpoint files: rotation keeps the last finite one; a file that does not load says why."""

import json
import math

import keras
import pytest

from provided_code.training.checkpoints import CheckpointError, RotatingCheckpoint, list_checkpoints, load_best


def _tiny_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_an_epoch_with_a_non_finite_loss_is_not_saved_and_rotates_nothing_away(tmp_path):
    rotating = RotatingCheckpoint(tmp_path, save_every=1, keep=1, epochs=5)
    rotating.set_model(_tiny_model())
    rotating.on_train_begin()
    rotating.on_epoch_end(0, {"loss": 1.0})
    rotating.on_epoch_end(1, {"loss": math.nan})
    rotating.on_epoch_end(2, {"loss": math.inf})
    assert [epoch for epoch, _ in list_checkpoints(tmp_path)] == [1]  # --keep 1: still the last finite one


def test_a_truncated_best_checkpoint_is_reported_as_one_that_does_not_load_not_as_missing(tmp_path):
    path = tmp_path / "best.keras"
    _tiny_model().save(path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3])
    (tmp_path / "best.json").write_text(json.dumps({"epoch": 4, "val_dose_score": 5.0, "val_dvh_score": 7.0}))
    with pytest.raises(CheckpointError) as caught:
        load_best(tmp_path)
    message = str(caught.value)
    assert f"Checkpoint {path} does not load: not a complete .keras file" in message
    assert "truncated or corrupt" in message and "File not found" not in message
