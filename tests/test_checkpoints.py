"""Checkpoints while training: rotation keeps the last finite one."""

import math

import keras

from provided_code.run_folder import RunFolder
from provided_code.training.checkpoints import RotatingCheckpoint


def _tiny_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_an_epoch_with_a_non_finite_loss_is_not_saved_and_rotates_nothing_away(tmp_path):
    folder = RunFolder(tmp_path)
    rotating = RotatingCheckpoint(folder, save_every=1, keep=1, epochs=5)
    rotating.set_model(_tiny_model())
    rotating.on_train_begin()
    rotating.on_epoch_end(0, {"loss": 1.0})
    rotating.on_epoch_end(1, {"loss": math.nan})
    rotating.on_epoch_end(2, {"loss": math.inf})
    assert [epoch for epoch, _ in folder.checkpoints()] == [1]  # --keep 1: still the last finite one
