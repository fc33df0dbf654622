"""The divergence rule: a non-finite epoch loss, or one more than 100 × the run's lowest, stops the
run; under loss scaling, the steps the loss scale skipped do not count."""

import math

import pytest
import tensorflow as tf

from provided_code.errors import UserError
from provided_code.training.divergence import DivergenceError, DivergenceGuard, epoch_mean_loss, loss_history


def test_under_loss_scaling_a_skipped_steps_infinite_loss_is_left_out_of_the_epochs_mean(caplog):
    losses = [tf.constant(1.0), tf.constant(math.inf), tf.constant(3.0)]
    assert epoch_mean_loss(losses, loss_scaling=True, epoch=4) == 2.0
    assert "Epoch 5: 1 of 3 steps had a non-finite loss and were skipped by the loss scale" in caplog.text
    assert math.isinf(epoch_mean_loss(losses, loss_scaling=False))  # float32: the update was applied
    assert math.isnan(epoch_mean_loss([tf.constant(math.nan)] * 2, loss_scaling=True))  # every step skipped
    assert epoch_mean_loss([tf.constant(1.0), tf.constant(2.0)]) == 1.5


def test_a_loss_a_hundred_times_the_runs_lowest_or_not_finite_stops_naming_the_epoch_and_figure():
    rows = [{"epoch": "1", "loss": "9.0"}, {"epoch": "2", "loss": "0.5"}, {"epoch": "3", "loss": "7.0"},
            {"epoch": "4", "loss": "0.01"}]
    guard = DivergenceGuard(loss_history(rows, 1, 3), newest_checkpoint=lambda: "models/epoch_3.keras")
    guard.check(3, 40.0)  # 80 × the lowest (0.5 at epoch 2; the log's epoch 4 was not checkpointed)
    with pytest.raises(DivergenceError, match=r"^Training diverged at epoch 5: its mean training loss 51 is more "
                                              r"than 100 × the lowest of this run \(0.5 at epoch 2\)\. Stopped "
                                              r"before saving that epoch; the newest checkpoint, "
                                              r"models/epoch_3.keras, is kept\."):
        guard.check(4, 51.0)
    with pytest.raises(DivergenceError, match="at epoch 6: its mean training loss is nan"):
        DivergenceGuard([]).check(5, math.nan)
    assert issubclass(DivergenceError, UserError)  # the command line shows one line
    DivergenceGuard(loss_history(rows, 3, 3)).check(3, 600.0)  # since a loss change at epoch 3: 7.0 is the lowest


def test_a_loss_without_history_is_held_to_the_ceiling_of_its_doses():
    """The first epoch of a new run, or of a changed loss, has nothing to be compared with: a loss
    in Gy above 100 × the highest dose it compares (70 Gy × (1 + the DVH term's weight)) stops it."""
    DivergenceGuard([], highest_dose_gy=70.0 * 1.5).check(0, 10000.0)  # below 100 × 105 Gy
    with pytest.raises(DivergenceError, match=r"at epoch 2: its mean training loss 2.3e\+09 Gy is more than 100 × "
                                              r"the highest dose it compares \(1.05e\+04 Gy"):
        DivergenceGuard([], highest_dose_gy=70.0 * 1.5).check(1, 2.3e9)
    DivergenceGuard([]).check(0, 2.3e9)  # no ceiling given: the history alone, as before
