"""--freeze encoder --freeze-epochs N: the encoder's weights taken from the parent stay bit-identical
for N epochs and move after; the encoder's layers the parent did not give train from the start."""

import logging

import numpy as np
import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.run_folder import RunFolder
from provided_code.training.init_from import layer_weights
from provided_code.training.train import train

pytestmark = pytest.mark.usefixtures("reset_keras")


def _same(one, other) -> bool:
    return all(np.array_equal(a, b) for (_, a), (_, b) in zip(one, other))


@pytest.mark.slow
def test_the_encoder_stays_bit_identical_for_n_epochs_and_moves_after(tiny_model, prostate_data, tmp_path, caplog):
    """A prostate model started from the OpenKBP tiny model: its first convolution is its own (other
    input channels) and trains from the first update; the rest of the encoder is the parent's, exactly,
    for two epochs; the decoder trains throughout."""
    config = TrainConfig(site="prostate", arch="generator", dropout=0.2, filters=4, resolution=32, epochs=3, save_every=1,
                         keep=5, xla="off", score_every=0, batch_size=1, learning_rate=3e-3, lr_schedule="constant",
                         data_dir=str(prostate_data), results_dir=str(tmp_path / "results"), model_name="tuned",
                         cache_dir=str(tmp_path / "cache"), init_from=str(tiny_model), init_epoch=1,
                         freeze="encoder", freeze_epochs=2)
    with caplog.at_level(logging.INFO):
        train(config)
    parent = layer_weights(RunFolder(tiny_model).load_checkpoint(1))
    folder = RunFolder(config.run_dir)
    assert [entry["layer"] for entry in folder.read_config().parent["not_taken"]] == ["encoder_1_conv"]
    epochs = {epoch: layer_weights(folder.load_checkpoint(epoch)) for epoch in (1, 2, 3)}
    encoder = [name for name in parent if name.startswith("encoder_") and name != "encoder_1_conv"]
    decoder = [name for name in parent if name.startswith("decoder_")]
    assert encoder and decoder
    for epoch in (1, 2):
        assert all(_same(epochs[epoch][name], parent[name]) for name in encoder), epoch
    assert not any(_same(epochs[3][name], parent[name]) for name in encoder if "_conv" in name)
    assert not any(_same(epochs[1][name], parent[name]) for name in decoder if "_conv" in name)
    assert not _same(epochs[1]["encoder_1_conv"], epochs[2]["encoder_1_conv"])  # not frozen: not the parent's
    assert "Frozen for the first 2 epoch(s) (--freeze encoder): encoder_1_norm, encoder_2_conv" in caplog.text
    assert "training from the start, not taken from the parent: encoder_1_conv" in caplog.text
    assert "Epoch 3: the frozen layers train from now on (--freeze-epochs 2)" in caplog.text


def test_freeze_settings_are_checked_in_one_line():
    for settings, expected in (({"freeze": "encoder"}, r"Invalid `freeze_epochs`. Expected an integer >= 1 with "
                                                       r"--freeze encoder. Received: freeze_epochs=0"),
                               ({"freeze_epochs": 3}, r"Invalid `freeze_epochs`. Expected 0 without --freeze"),
                               ({"freeze": "decoder", "freeze_epochs": 1}, r"Invalid `freeze`. Expected one of")):
        with pytest.raises(ConfigError, match=expected):
            TrainConfig(**settings)
    concerns = TrainConfig(freeze="encoder", freeze_epochs=5, epochs=5).concerns()
    assert any("without --init-from: the encoder's random starting weights stay fixed for 5" in c for c in concerns)
    assert any("--freeze-epochs 5 with --epochs 5: the encoder never trains" in c for c in concerns)
    assert not TrainConfig(freeze="encoder", freeze_epochs=2, init_from="/parent").concerns()
