"""A run's folder: its saved config and its best checkpoint read back, or refused in one line."""

import json

import keras
import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.run_folder import CheckpointError, RunFolder


def _tiny_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.parametrize("text", ["[]", "null", '"unet"', "3"])
def test_a_saved_config_that_is_not_a_json_object_is_one_line_naming_the_file(tmp_path, text):
    folder = RunFolder(tmp_path)
    folder.models.mkdir()
    folder.config_file.write_text(text)
    with pytest.raises(ConfigError, match=f"Invalid saved config {folder.config_file}: expected a JSON object"):
        folder.read_config()


def test_unknown_fields_in_a_saved_config_are_named_in_one_warning(tmp_path, caplog):
    folder = RunFolder(tmp_path)
    folder.models.mkdir()
    values = {**json.loads(TrainConfig(filters=8, resolution=32).to_json()), "filtres": 16, "mystery": True}
    folder.config_file.write_text(json.dumps(values))
    assert folder.read_config() == TrainConfig(filters=8, resolution=32)
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and "settings this version does not know, left out: filtres, mystery" in warnings[0]


def test_a_truncated_best_checkpoint_is_reported_as_one_that_does_not_load_not_as_missing(tmp_path):
    folder = RunFolder(tmp_path)
    path = folder.best_checkpoint
    path.parent.mkdir()
    _tiny_model().save(path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3])
    folder.best_record.write_text(json.dumps({"epoch": 4, "val_dose_score": 5.0, "val_dvh_score": 7.0}))
    with pytest.raises(CheckpointError) as caught:
        folder.load_best()
    message = str(caught.value)
    assert f"Checkpoint {path} does not load: not a complete .keras file" in message
    assert "truncated or corrupt" in message and "File not found" not in message


def test_the_models_spec_and_site_are_its_configs_and_another_requested_is_refused_in_one_line(tmp_path):
    folder = RunFolder(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="No trained model 'm'"):
        folder.spec()
    folder.models.mkdir(parents=True)
    folder.write_config(TrainConfig(site="prostate", filters=8, resolution=32))
    assert folder.spec().site.name == "prostate" and folder.spec("prostate").site.name == "prostate"
    assert folder.spec() == TrainConfig(site="prostate", filters=8, resolution=32).spec
    with pytest.raises(ConfigError) as refused:
        folder.spec("openkbp")
    assert str(refused.value) == (f"Invalid `site`. Expected the model's own site, prostate ({folder.config_file}), "
                                  f"or no --site. Received: site='openkbp'")
    values = json.loads(folder.config_file.read_text())
    del values["site"]  # a model saved before sites: OpenKBP's
    folder.config_file.write_text(json.dumps(values))
    assert folder.spec().site.name == "openkbp"


def test_a_fold_applies_its_final_checkpoint_and_a_single_run_its_best(tmp_path):
    """A fold's best was picked on its own held-out patients, whose out-of-fold predictions the
    commissioning is made of: its model is its final checkpoint. A single run's is its best."""
    from provided_code.folds import SPLITS_FILE

    for folder in (tmp_path / "single", tmp_path / "cv" / "fold-1"):
        (folder / "models").mkdir(parents=True)
        (folder / "models" / "config.json").write_text("{}")
        (folder / "models" / "best.keras").write_bytes(b"")
    (tmp_path / "cv" / SPLITS_FILE).write_text("{}")
    assert RunFolder(tmp_path / "single").epoch_to_apply() == "best"
    assert RunFolder(tmp_path / "cv" / "fold-1").epoch_to_apply() is None  # the newest: the final
    assert RunFolder(tmp_path / "cv" / "fold-1").epoch_to_apply(3) == 3  # one asked for is taken
    assert "is a cross-validated model: its folds are its models" in str(RunFolder(tmp_path / "cv").missing_model())


def _checkpoints(tmp_path) -> RunFolder:
    """A run folder with checkpoints of epochs 2 and 10 and a best of epoch 2 (no file is loaded)."""
    folder = RunFolder(tmp_path / "m")
    folder.models.mkdir(parents=True)
    for epoch in (2, 10):
        folder.checkpoint(epoch).write_bytes(b"")
    folder.best_checkpoint.write_bytes(b"")
    folder.best_record.write_text(json.dumps({"epoch": 2, "val_dose_score": 3.0, "val_dvh_score": 5.0}))
    return folder


def test_the_checkpoint_file_of_an_epoch_is_its_own(tmp_path):
    folder = _checkpoints(tmp_path)
    assert folder.checkpoint_file(2) == (2, folder.models / "epoch_2.keras")


def test_the_checkpoint_file_of_none_is_the_newest_by_epoch_not_by_name(tmp_path):
    folder = _checkpoints(tmp_path)
    assert folder.checkpoint_file(None) == (10, folder.models / "epoch_10.keras")


def test_the_checkpoint_file_of_best_is_best_keras_at_its_records_epoch(tmp_path):
    folder = _checkpoints(tmp_path)
    assert folder.checkpoint_file("best") == (2, folder.best_checkpoint)


def test_a_checkpoint_file_that_is_not_there_names_the_epochs_there_are(tmp_path):
    folder = _checkpoints(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"^No checkpoint for epoch 3 in {folder.models} \(have: \[10, 2\]\)$"):
        folder.checkpoint_file(3)


def test_a_folder_without_checkpoints_has_no_newest(tmp_path):
    folder = RunFolder(tmp_path / "m")
    folder.models.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=rf"^No checkpoint of model 'm' in {folder.models}\.$"):
        folder.checkpoint_file(None)
