import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from provided_code.apps.cli import main
from provided_code.apps.score_folder import score_prediction_folder
from provided_code.config import TrainConfig
from provided_code.data.csv_io import PatientDataError
from provided_code.run_folder import RunFolder
from provided_code.sites import openkbp
from provided_code.training.epoch_log import read_log
from provided_code.training.train import train
from provided_code.training.validation_scores import is_scoring_epoch
from tests.kit.runs import LIGHT_BODY, copy_of_run, predict, trained_once


pytestmark = pytest.mark.usefixtures("reset_keras")


def scored_rows(config):
    return {int(row["epoch"]): (float(row["val_dose_score"]), float(row["val_dvh_score"]))
            for row in read_log(config.run_dir / "training_log.csv") if row["val_dose_score"]}


def test_a_reference_dose_outside_its_mask_is_refused_when_loaded_not_at_the_first_scoring(phantom_data, tmp_path):
    data = Path(shutil.copytree(phantom_data, tmp_path / "data"))
    dose = data / "validation-pats" / "pt_202" / "dose.csv"
    dose.write_text(dose.read_text() + "0,2.5\n")  # voxel 0, a corner: outside the possible-dose mask
    config = TrainConfig(**LIGHT_BODY, filters=4, resolution=32, epochs=1, score_every=1, xla="off", data_dir=str(data),
                         results_dir=str(tmp_path / "results"), model_name="m", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(PatientDataError, match=r"^Patient pt_202: .*pt_202/dose\.csv: the dose is non-zero in 1 "
                                               r"voxel\(s\) outside the possible-dose mask"):
        train(config)
    assert not RunFolder(config.run_dir).checkpoints()  # before training, so a resume cannot die there each time


def test_scoring_epochs_are_every_n_and_the_last():
    assert [e for e in range(1, 12) if is_scoring_epoch(e, 5, 11)] == [5, 10, 11]
    assert not any(is_scoring_epoch(e, 0, 11) for e in range(1, 12))


@pytest.fixture(scope="session")
def scored(phantom_data, phantom_cache, tmp_path_factory) -> TrainConfig:
    """Two epochs, each scored and checkpointed, trained once per test run: not to be changed, copy
    it (:func:`copy_of`)."""
    return trained_once(tmp_path_factory, "scored-run", lambda root: TrainConfig(
        arch="generator", dropout=0.2, filters=4, resolution=32, epochs=2, save_every=1, keep=5, score_every=1, xla="off",
        learning_rate=2e-3,
        data_dir=str(phantom_data), results_dir=str(root / "results"), model_name="scored",
        cache_dir=str(phantom_cache)))


@pytest.fixture
def copy_of(scored, tmp_path) -> TrainConfig:
    """This test's copy of the scored run."""
    return copy_of_run(scored, tmp_path)


@pytest.mark.slow
def test_every_scoring_epoch_is_logged_and_drawn(scored):
    assert sorted(scored_rows(scored)) == [1, 2]
    assert RunFolder(scored.run_dir).curves.stat().st_size > 0


@pytest.mark.slow
def test_the_logged_scores_are_openkbp_scores_of_that_epochs_predictions(copy_of):
    config = copy_of
    rows = scored_rows(config)
    # The log's scores of an epoch are openkbp-score's on that epoch's --predict-only output.
    report = predict(config, stage="validation", epoch=2)
    standalone = score_prediction_folder(Path(config.data_dir) / "validation-pats", report.predictions_dir,
                                         cache_dir=config.cache_dir, site=openkbp())
    # the log scores in-memory float32 predictions; openkbp-score reads their CSV decimals (within half an ulp,
    # 6e-8 relative per voxel) predicted again in another process path: a few ulps of a score, under 1e-6.
    assert standalone.dose_score == pytest.approx(rows[2][0], rel=1e-6)
    assert standalone.dvh_score == pytest.approx(rows[2][1], rel=1e-6)


@pytest.mark.slow
def test_best_keras_is_the_lowest_dose_score_and_epoch_best_predicts_with_it(copy_of):
    config = copy_of
    rows = scored_rows(config)
    best_epoch = min(rows, key=lambda epoch: rows[epoch][0])
    assert RunFolder(config.run_dir).read_best()["epoch"] == best_epoch
    command = ["--predict-only", "--epoch", "best", "--data-dir", config.data_dir, "--results-dir", config.results_dir,
               "--model-name", config.model_name, "--cache-dir", config.cache_dir]
    result = CliRunner().invoke(main, command)  # the command line a user types (predict_stage's epoch="best")
    assert result.exit_code == 0, result.output
    assert f"with the epoch {best_epoch} checkpoint" in result.output
    written = json.loads((config.run_dir / "validation-predictions" / "scores.json").read_text())
    assert written["epoch"] == best_epoch
    assert written["dose_score"] == pytest.approx(rows[best_epoch][0], rel=1e-6)  # as above: CSV decimals, ulps


@pytest.mark.slow
def test_rotation_never_removes_best_keras_and_a_resume_scores_against_the_best_so_far(copy_of):
    # Rotation (keep 1) never removes it; a resumed run continues from the best so far.
    config = copy_of
    folder = RunFolder(config.run_dir)
    train(dataclasses.replace(config, epochs=3, keep=1))
    assert [epoch for epoch, _ in folder.checkpoints()] == [3]
    rows = scored_rows(config)
    assert sorted(rows) == [1, 2, 3]
    assert folder.read_best()["epoch"] == min(rows, key=lambda epoch: rows[epoch][0])
    assert folder.best_checkpoint.is_file()


@pytest.mark.slow
def test_a_resumed_run_knows_the_best_score_so_far(copy_of):
    # A resumed run knows the best score so far: say it was perfect, and no later epoch replaces it.
    config = copy_of
    folder = RunFolder(config.run_dir)
    record = folder.read_best()
    folder.best_record.write_text(json.dumps({**record, "val_dose_score": 0.0}))
    saved = folder.best_checkpoint.read_bytes()
    train(dataclasses.replace(config, epochs=4, keep=1))
    assert sorted(scored_rows(config)) == [1, 2, 3, 4]
    assert folder.read_best()["epoch"] == record["epoch"]
    assert folder.best_checkpoint.read_bytes() == saved
