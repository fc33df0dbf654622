import dataclasses
import json
import shutil
from pathlib import Path

import keras
import pytest
from click.testing import CliRunner

from provided_code.apps.cli import main
from provided_code.config import TrainConfig
from provided_code.data.csv_io import PatientDataError
from provided_code.apps.score_folder import score_prediction_folder
from provided_code.run_folder import RunFolder
from provided_code.training.epoch_log import read_log
from provided_code.training.train import train
from provided_code.training.validation_scores import is_scoring_epoch
from tests.conftest import predict


pytestmark = pytest.mark.usefixtures("reset_keras")


def scored_rows(config):
    return {int(row["epoch"]): (float(row["val_dose_score"]), float(row["val_dvh_score"]))
            for row in read_log(config.run_dir / "training_log.csv") if row["val_dose_score"]}


def test_a_reference_dose_outside_its_mask_is_refused_when_loaded_not_at_the_first_scoring(phantom_data, tmp_path):
    data = Path(shutil.copytree(phantom_data, tmp_path / "data"))
    dose = data / "validation-pats" / "pt_202" / "dose.csv"
    dose.write_text(dose.read_text() + "0,2.5\n")  # voxel 0, a corner: outside the possible-dose mask
    config = TrainConfig(filters=4, resolution=32, epochs=1, score_every=1, xla="off", data_dir=str(data),
                         results_dir=str(tmp_path / "results"), model_name="m", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(PatientDataError, match=r"^Patient pt_202: .*pt_202/dose\.csv: the dose is non-zero in 1 "
                                               r"voxel\(s\) outside the possible-dose mask"):
        train(config)
    assert not RunFolder(config.run_dir).checkpoints()  # before training, so a resume cannot die there each time


def test_scoring_epochs_are_every_n_and_the_last():
    assert [e for e in range(1, 12) if is_scoring_epoch(e, 5, 11)] == [5, 10, 11]
    assert not any(is_scoring_epoch(e, 0, 11) for e in range(1, 12))


@pytest.mark.slow
def test_scores_match_openkbp_score_and_best_keras_survives_rotation_and_resumes(phantom_data, tmp_path):
    config = TrainConfig(filters=4, resolution=32, epochs=2, save_every=1, keep=5, score_every=1, xla="off",
                         learning_rate=2e-3, data_dir=str(phantom_data), results_dir=str(tmp_path / "results"),
                         model_name="scored", cache_dir=str(tmp_path / "cache"))
    train(config)
    rows = scored_rows(config)
    assert sorted(rows) == [1, 2]
    assert (config.run_dir / "training_curves.png").stat().st_size > 0

    # The log's scores of an epoch are openkbp-score's on that epoch's --predict-only output.
    report = predict(config, stage="validation", epoch=2)
    standalone = score_prediction_folder(Path(config.data_dir) / "validation-pats", report.predictions_dir,
                                         cache_dir=config.cache_dir)
    # the log scores in-memory float32 predictions; openkbp-score reads their CSV decimals (within half an ulp,
    # 6e-8 relative per voxel) predicted again in another process path: a few ulps of a score, under 1e-6.
    assert standalone.dose_score == pytest.approx(rows[2][0], rel=1e-6)
    assert standalone.dvh_score == pytest.approx(rows[2][1], rel=1e-6)

    # best.keras is the lowest dose score, and --epoch best predicts with it.
    best_epoch = min(rows, key=lambda epoch: rows[epoch][0])
    assert RunFolder(config.run_dir).read_best()["epoch"] == best_epoch
    best = predict(config, stage="validation", epoch="best")
    assert best.epoch == best_epoch
    command = ["--predict-only", "--epoch", "best", "--data-dir", config.data_dir, "--results-dir", config.results_dir,
               "--model-name", config.model_name, "--cache-dir", config.cache_dir]
    result = CliRunner().invoke(main, command)  # the command line a user types
    assert result.exit_code == 0, result.output
    assert f"with the epoch {best_epoch} checkpoint" in result.output
    assert best.scores.dose_score == pytest.approx(rows[best_epoch][0], rel=1e-6)  # as above: CSV decimals, ulps
    assert json.loads((config.run_dir / "validation-predictions" / "scores.json").read_text())["dose_score"] == pytest.approx(
        rows[best_epoch][0], rel=1e-6)

    # Rotation (keep 1) never removes it; a resumed run continues from the best so far.
    keras.backend.clear_session()
    longer = dataclasses.replace(config, epochs=3, keep=1)
    train(longer)
    assert [epoch for epoch, _ in RunFolder(config.run_dir).checkpoints()] == [3]
    rows = scored_rows(config)
    assert sorted(rows) == [1, 2, 3]
    assert RunFolder(config.run_dir).read_best()["epoch"] == min(rows, key=lambda epoch: rows[epoch][0])
    assert (RunFolder(config.run_dir).models / "best.keras").is_file()


    # A resumed run knows the best score so far: say it was perfect, and no later epoch replaces it.
    record = RunFolder(config.run_dir).read_best()
    (RunFolder(config.run_dir).models / "best.json").write_text(json.dumps({**record, "val_dose_score": 0.0}))
    saved = (RunFolder(config.run_dir).models / "best.keras").read_bytes()
    keras.backend.clear_session()
    train(dataclasses.replace(longer, epochs=5))
    assert sorted(scored_rows(config)) == [1, 2, 3, 4, 5]
    assert RunFolder(config.run_dir).read_best()["epoch"] == record["epoch"]
    assert (RunFolder(config.run_dir).models / "best.keras").read_bytes() == saved
