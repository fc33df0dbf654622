"""What a run writes, after the machine or the user broke it: a cut-off log line, a log that does
not parse, a deleted config.json, checkpoints that no longer load, a changed schedule."""

import dataclasses
import logging

import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.run_folder import CheckpointError, RunFolder
from provided_code.training.epoch_log import LogError, read_log
from provided_code.training.train import train


pytestmark = pytest.mark.usefixtures("reset_keras")


@pytest.fixture
def config(phantom_data, tmp_path) -> TrainConfig:
    return TrainConfig(filters=2, resolution=32, epochs=2, save_every=1, xla="off", score_every=0, dropout=0.0,
                       lr_schedule="constant", data_dir=str(phantom_data), results_dir=str(tmp_path / "results"), model_name="m",
                       cache_dir=str(tmp_path / "cache"))


def _epochs(config):
    return [int(row["epoch"]) for row in read_log(config.run_dir / "training_log.csv")]


@pytest.mark.slow
def test_a_broken_run_folder_is_repaired_or_refused_never_silently_restarted(config, caplog):
    log = config.run_dir / "training_log.csv"
    train(config)
    # A crash while epoch 2's row was written (so before its checkpoint): the row is cut off.
    (RunFolder(config.run_dir).models / "epoch_2.keras").unlink()
    text = log.read_text()
    log.write_text(text[:-7])
    with caplog.at_level(logging.WARNING):
        train(config)
    assert "cut-off row" in caplog.text
    rows = read_log(log)
    assert _epochs(config) == [1, 2] and all(float(row["learning_rate"]) == pytest.approx(2e-4) for row in rows)  # float32 rate, as text

    # A cosine schedule resumed with another --epochs (a recipe change, so --change-recipe): said, not silent.
    cosine = dataclasses.replace(config, epochs=3, lr_schedule="cosine")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train(cosine, change_recipe=True)
    assert "schedule changes on this resume (saved: constant over 2 epochs, now: cosine over 3)" in caplog.text

    # A log that does not parse at all: one line naming the file.
    good = log.read_text()
    log.write_text("hello\nworld\n")
    with pytest.raises(LogError, match=r"training_log.csv: not a training log \(header 'hello'\)"):
        train(dataclasses.replace(cosine, epochs=4))
    log.write_text(good.replace("\n3,", "\nthree,"))
    with pytest.raises(LogError, match=r"training_log.csv: line 4 is not a log row"):
        train(dataclasses.replace(cosine, epochs=4))
    log.write_text(good)

    # config.json deleted, checkpoints kept: the flags (another --filters) must not pass for the model's.
    (RunFolder(config.run_dir).models / "config.json").unlink()
    with pytest.raises(ConfigError, match="holds checkpoints but no config.json"):
        train(dataclasses.replace(config, filters=4, epochs=4))
    assert not (RunFolder(config.run_dir).models / "config.json").exists()

    # Every checkpoint unreadable: refused with the reason; the log and files stay.
    train_config = dataclasses.replace(config, epochs=3, precision="float32")
    (RunFolder(config.run_dir).models / "config.json").write_text(train_config.to_json())
    for _, path in RunFolder(config.run_dir).checkpoints():
        path.write_bytes(b"not a keras file")
    with pytest.raises(CheckpointError, match=r"No checkpoint in .* loads: epoch_3.keras .*--start-over"):
        train(train_config)
    assert _epochs(config) == [1, 2, 3]

    # --start-over: the old files move aside, training begins at epoch 0 with a fresh log.
    result = train(train_config, start_over=True)
    assert result.first_epoch == 0 and _epochs(config) == [1, 2, 3]
    abandoned = [p for p in config.run_dir.iterdir() if p.name.startswith("abandoned-")]
    assert len(abandoned) == 1
    assert {"config.json", "epoch_3.keras", "training_log.csv"} <= {p.name for p in abandoned[0].iterdir()}
