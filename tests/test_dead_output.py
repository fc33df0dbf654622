"""A run whose output has died stops and says so (training/dead_output.py)."""

import logging

import numpy as np
import pytest

from provided_code.config import TrainConfig
from provided_code.data.split_arrays import SplitArrays
from provided_code.run_folder import RunFolder
from provided_code.sites import openkbp
from provided_code.training.dead_output import PATIENCE, DeadOutputError, DeadOutputGuard
from tests.kit.cache_files import linked_cache
from tests.kit.runs import log_epochs, model_spec

pytestmark = pytest.mark.usefixtures("reset_keras")


def probe_arrays(count=3, size=8):
    mask = np.zeros((count, size, size, size), bool)
    mask[:, 2:6, 2:6, 2:6] = True
    zeros = np.zeros((count, size, size, size))
    return SplitArrays(patient_ids=[f"pt_{k}" for k in range(1, count + 1)], ct=zeros.astype(np.uint16),
                       structure_masks=zeros.astype(np.uint16), possible_dose_mask=mask, dose=zeros.astype(np.float32),
                       has_dose=np.ones(count, bool), dose_decimals=np.zeros(count, np.int8),
                       voxel_dimensions=np.full((count, 3), 3.5, np.float32),
                       structure_present=np.ones((count, 10), bool), site=openkbp())


def guard_of(doses_by_call, head="relu"):
    calls = iter(doses_by_call)
    spec = model_spec(resolution=8, arch="resunet", head=head, gantry_angles=(), prescription_channel=False)
    return DeadOutputGuard(probe_arrays(), 2, lambda inputs: next(calls)(inputs["ct"].shape), spec,
                           newest_checkpoint=lambda: "models/epoch_1.keras")


def constant(value):
    return lambda shape: np.full((*shape, 1), value, np.float32)


def varying(shape):
    return np.random.default_rng(0).uniform(0, 70, (*shape, 1)).astype(np.float32)


def test_a_constant_output_is_said_then_stops_the_run_with_what_to_try(caplog):
    guard = guard_of([constant(0.0)] * PATIENCE)
    assert guard.inputs["ct"].shape[0] == 2  # the first batch of the training patients
    with caplog.at_level(logging.WARNING):
        guard.end_updates(0)
    assert "Epoch 1: the model predicts 0 Gy on every voxel of training patients pt_1, pt_2" in caplog.text
    with pytest.raises(DeadOutputError) as caught:
        guard.end_updates(1)
    message = str(caught.value)
    assert message.startswith("Training stopped at epoch 2: the model's output has died. Since epoch 1 it predicts "
                              "0 Gy on every voxel inside the possible-dose masks of training patients pt_1, pt_2")
    assert "--head leaky or --head softplus" in message and "the newest checkpoint, models/epoch_1.keras, is kept" in message
    assert "\n" not in message


def test_a_softplus_model_stuck_on_one_dose_is_told_to_lower_the_rate():
    guard = guard_of([constant(17.5)] * PATIENCE, head="softplus")
    guard.end_updates(4)
    with pytest.raises(DeadOutputError, match=r"predicts 17\.5 Gy .*lower --learning-rate") as caught:
        guard.end_updates(5)
    assert "--head softplus" not in str(caught.value)


def test_a_model_whose_doses_vary_or_recover_is_left_alone():
    guard = guard_of([varying, constant(0.0), varying, constant(0.0), varying])
    for epoch in range(5):  # constant twice, but never twice in a row
        guard.end_updates(epoch)
    outside_only = guard_of([lambda shape: np.where(probe_arrays().possible_dose_mask[:2, ..., None], 3.0,
                                                    np.arange(np.prod(shape)).reshape(*shape, 1))] * PATIENCE)
    outside_only.end_updates(0)
    with pytest.raises(DeadOutputError, match="predicts 3 Gy"):  # what varies outside the masks is not scored
        outside_only.end_updates(1)


@pytest.mark.slow
def test_a_run_whose_relu_head_died_stops_before_saving_the_epoch(phantom_data, phantom_cache, tmp_path, monkeypatch):
    """A network ending in a ReLU (the generator's; the residual U-Net's before the softplus head),
    its last convolution's bias pushed far below zero: it predicts 0 Gy everywhere from the start,
    and the run stops at the second epoch, before that epoch's checkpoint or log row. The guard
    reads the predictions, not the body (the generator: a third of the residual U-Net's step)."""
    from provided_code.training import train as train_module

    made = train_module.new_model

    def dead_model(*args, **kwargs):
        model = made(*args, **kwargs)
        kernel, bias = model.get_layer("dose_conv").get_weights()
        model.get_layer("dose_conv").set_weights([kernel, bias - 100.0])
        return model

    monkeypatch.setattr(train_module, "new_model", dead_model)
    config = TrainConfig(arch="generator", head="relu", filters=4, resolution=32, epochs=4, save_every=1, xla="off",
                         score_every=1, data_dir=str(phantom_data), results_dir=str(tmp_path / "results"),
                         model_name="dead", cache_dir=str(linked_cache(phantom_cache, tmp_path / "cache")))
    with pytest.raises(DeadOutputError, match="Training stopped at epoch 2: the model's output has died"):
        train_module.train(config)
    assert [epoch for epoch, _ in RunFolder(config.run_dir).checkpoints()] == [1]
    assert log_epochs(config.run_dir) == [1]
