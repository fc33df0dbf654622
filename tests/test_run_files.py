"""What a run writes, after the machine or the user broke it: a cut-off log line, a log that does
not parse, a deleted config.json, checkpoints that no longer load, a changed schedule. Each
scenario breaks its own copy of one two-epoch run (trained once per test run); the log's repair is
also tried alone, on a log written by hand (the quick tier's test of this module)."""

import dataclasses
import logging

import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.run_folder import CheckpointError, RunFolder
from provided_code.training.epoch_log import COLUMNS, LogError, read_log, read_log_rows, repair_log
from provided_code.training.train import train
from tests.kit.runs import copy_of_run, trained_once


pytestmark = pytest.mark.usefixtures("reset_keras")


@pytest.fixture(scope="session")
def trained(phantom_data, phantom_cache, tmp_path_factory) -> TrainConfig:
    """Two epochs, a checkpoint after each (constant rate, no scores), trained once per test run:
    not to be changed, copy it."""
    return trained_once(tmp_path_factory, "run-files-run", lambda root: TrainConfig(
        arch="generator", filters=2, resolution=32, epochs=2, save_every=1, xla="off", score_every=0, dropout=0.0,
        learning_rate=2e-4,
        lr_schedule="constant", data_dir=str(phantom_data), results_dir=str(root / "results"), model_name="m",
        cache_dir=str(phantom_cache)))


@pytest.fixture
def config(trained, tmp_path) -> TrainConfig:
    """This test's copy of the trained run."""
    return copy_of_run(trained, tmp_path)


def test_the_repair_before_a_resume_leaves_out_a_cut_off_row_and_the_epochs_after_it(tmp_path, caplog):
    """The log as a crash while epoch 4's row was written left it, repaired for a resume from epoch 2
    (the newest checkpoint): the cut-off row and epoch 3's row go, each said in the log; the complete
    rows before stay as they were."""
    log = tmp_path / "training_log.csv"
    rows = [f"{epoch},0.5,0.4,,,0.0002,1.5,2.5,100" for epoch in (1, 2, 3)]
    log.write_text(",".join(COLUMNS) + "\n" + "\n".join(rows) + "\n4,0.3,0.")
    complete, cut = read_log_rows(log)
    assert [row["epoch"] for row in complete] == ["1", "2", "3"] and cut
    with caplog.at_level(logging.INFO):
        repair_log(log, 2)
    assert "ended in a cut-off row (a crash while it was written): left out" in caplog.text
    assert "Dropping 1 log row(s) after epoch 2" in caplog.text
    assert log.read_text() == ",".join(COLUMNS) + "\n" + "\n".join(rows[:2]) + "\n"


def _epochs(config):
    return [int(row["epoch"]) for row in read_log(RunFolder(config.run_dir).log)]


@pytest.mark.slow
def test_a_row_cut_off_by_a_crash_is_left_out_and_the_epoch_trained_again(config, caplog):
    folder = RunFolder(config.run_dir)
    # A crash while epoch 2's row was written (so before its checkpoint): the row is cut off.
    folder.checkpoint(2).unlink()
    folder.log.write_text(folder.log.read_text()[:-7])
    with caplog.at_level(logging.WARNING):
        train(config)
    assert "cut-off row" in caplog.text
    rows = read_log(folder.log)
    assert _epochs(config) == [1, 2] and all(float(row["learning_rate"]) == pytest.approx(2e-4) for row in rows)  # float32 rate, as text


@pytest.mark.slow
def test_a_cosine_schedule_resumed_with_other_epochs_is_said(config, caplog):
    # A cosine schedule resumed with another --epochs (a recipe change, so --change-recipe): said, not silent.
    with caplog.at_level(logging.WARNING):
        train(dataclasses.replace(config, epochs=3, lr_schedule="cosine"), change_recipe=True)
    assert "schedule changes on this resume (saved: constant over 2 epochs, now: cosine over 3)" in caplog.text


@pytest.mark.slow
def test_a_log_that_does_not_parse_is_one_line_naming_the_file(config):
    log = RunFolder(config.run_dir).log
    good = log.read_text()
    log.write_text("hello\nworld\n")
    with pytest.raises(LogError, match=r"training_log.csv: not a training log \(header 'hello'\)"):
        train(dataclasses.replace(config, epochs=3))
    log.write_text(good.replace("\n2,", "\ntwo,"))
    with pytest.raises(LogError, match=r"training_log.csv: line 3 is not a log row"):
        train(dataclasses.replace(config, epochs=3))


@pytest.mark.slow
def test_checkpoints_without_config_json_are_refused_not_read_with_the_flags(config):
    # config.json deleted, checkpoints kept: the flags (another --filters) must not pass for the model's.
    config_file = RunFolder(config.run_dir).config_file
    config_file.unlink()
    with pytest.raises(ConfigError, match="holds checkpoints but no config.json"):
        train(dataclasses.replace(config, filters=4, epochs=4))
    assert not config_file.exists()


def _break_every_checkpoint(config):
    for _, path in RunFolder(config.run_dir).checkpoints():
        path.write_bytes(b"not a keras file")


@pytest.mark.slow
def test_no_checkpoint_that_loads_is_refused_with_the_reason(config):
    # Every checkpoint unreadable: refused with the reason; the log and files stay.
    _break_every_checkpoint(config)
    with pytest.raises(CheckpointError, match=r"No checkpoint in .* loads: epoch_2.keras .*--start-over"):
        train(dataclasses.replace(config, epochs=3))
    assert _epochs(config) == [1, 2]


@pytest.mark.slow
def test_start_over_moves_the_old_files_aside_and_trains_anew(config):
    # --start-over (what no checkpoint that loads needs): the old files move aside, training begins
    # at epoch 0 with a fresh log.
    _break_every_checkpoint(config)
    result = train(config, start_over=True)
    assert result.first_epoch == 0 and _epochs(config) == [1, 2]
    abandoned = [p for p in config.run_dir.iterdir() if p.name.startswith("abandoned-")]
    assert len(abandoned) == 1
    assert {"config.json", "epoch_2.keras", "training_log.csv"} <= {p.name for p in abandoned[0].iterdir()}
