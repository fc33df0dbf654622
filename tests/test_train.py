import csv
import dataclasses
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.data_folder import DataNotFoundError
from provided_code.run_folder import RunFolder
from provided_code.sites import openkbp
from provided_code.training.divergence import DivergenceError
from provided_code.training.epoch_log import read_log
from provided_code.training.train import model_weights, train, weights_fingerprint
from tests.kit.cache_files import linked_cache
from tests.kit.repo import REPO
from tests.kit.runs import LIGHT_BODY, LIGHT_FLAGS, log_epochs, predict
from tests.kit.skips import requires_float16_convolutions



pytestmark = pytest.mark.usefixtures("reset_keras")


@pytest.fixture
def config(phantom_data, phantom_cache, tmp_path) -> TrainConfig:
    return TrainConfig(**LIGHT_BODY, filters=4, resolution=32, epochs=3, save_every=1, keep=2, xla="off", score_every=0,
                       data_dir=str(phantom_data), results_dir=str(tmp_path / "results"),
                       model_name="tiny", cache_dir=str(linked_cache(phantom_cache, tmp_path / "cache")))


@pytest.fixture
def two_epochs(config, two_epoch_run) -> TrainConfig:
    """``config`` whose model is already trained to epoch 2: a copy of the shared run folder
    (conftest's ``two_epoch_run``: the same network and recipe as ``config``; other cadences, data
    folder and name, which a resume takes from the command)."""
    shutil.copytree(two_epoch_run.run_dir, config.run_dir)
    return config


@pytest.mark.slow
def test_short_run_rotates_checkpoints_and_logs_each_epoch(config):
    result = train(config)
    assert (result.first_epoch, result.last_epoch) == (0, 3)
    assert [epoch for epoch, _ in RunFolder(config.run_dir).checkpoints()] == [3, 2]  # keep=2
    assert log_epochs(config.run_dir) == [1, 2, 3]
    with open(config.run_dir / "training_log.csv", newline="") as handle:
        row = next(csv.DictReader(handle))
    assert set(row) == {"epoch", "loss", "val_loss", "val_dose_score", "val_dvh_score", "learning_rate",
                        "epoch_seconds", "samples_per_s", "peak_memory_mb"}
    assert float(row["val_loss"]) > 0 and float(row["learning_rate"]) == pytest.approx(2e-4)  # cosine: peak first (a float32 variable: 1e-6 relative)
    assert float(row["peak_memory_mb"]) > 50  # this process's peak resident memory (CPU)
    saved = TrainConfig.from_json((RunFolder(config.run_dir).models / "config.json").read_text())
    assert saved == dataclasses.replace(config, precision="float32", cost=saved.cost)  # auto, resolved on this CPU
    assert saved.cost["parameters"] > 0 and saved.cost["gmac_per_sample"] > 0  # what the run costs, counted at its start
    assert not [name for name in os.listdir(RunFolder(config.run_dir).models) if name.startswith(".")]

    again = train(config)  # already at --epochs: nothing to do, nothing written twice
    assert (again.first_epoch, again.last_epoch) == (3, 3)
    assert log_epochs(config.run_dir) == [1, 2, 3]


@pytest.mark.slow
def test_resumed_run_equals_an_uninterrupted_one_with_augmentation_and_cosine(config):
    recipe = dataclasses.replace(config, epochs=4, save_every=2, keep=5, loss="masked-mae",
                                 augment="flip,rotate,shift", lr_schedule="cosine", warmup_epochs=1, score_every=0)
    train(recipe)
    uninterrupted = model_weights(RunFolder(recipe.run_dir).load_newest()[1])
    rates = [row["learning_rate"] for row in read_log(recipe.run_dir / "training_log.csv")]
    assert len(set(rates)) == 4  # warm-up, then cosine: a different rate every epoch
    # The machine is lost after the epoch-2 checkpoint: the same command resumes from it.
    (RunFolder(recipe.run_dir).models / "epoch_4.keras").unlink()
    keras.backend.clear_session()
    result = train(recipe)
    assert result.first_epoch == 2
    assert [row["learning_rate"] for row in read_log(recipe.run_dir / "training_log.csv")] == rates
    _, resumed = RunFolder(recipe.run_dir).load_newest()
    for x, y in zip(uninterrupted, model_weights(resumed)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)  # one process, deterministic ops: in practice exact
    # --score-every 0: no scores, no best.keras, and asking for it says why.
    assert not any(row["val_dose_score"] for row in read_log(recipe.run_dir / "training_log.csv"))
    with pytest.raises(FileNotFoundError, match="No best checkpoint.*--score-every"):
        predict(recipe, stage="validation", epoch="best")


@pytest.mark.slow
def test_ema_scores_keeps_and_predicts_the_averaged_weights_and_trains_on_the_raw_ones(config):
    """--ema (here with the beam channels, end to end): best.keras holds the optimizer's averages,
    the epoch checkpoint the raw weights (and the averages, in its optimizer), and predicting from
    either uses the averages."""
    recipe = dataclasses.replace(config, epochs=2, score_every=2, ema=True, beams=9, beam_channels="each")
    train(recipe)
    _, raw = RunFolder(recipe.run_dir).load_newest()
    averages = [keras.ops.convert_to_numpy(v) for v in raw.optimizer._model_variables_moving_average]
    raw_weights = [keras.ops.convert_to_numpy(v) for v in raw.trainable_variables]
    assert any(not np.array_equal(a, w) for a, w in zip(averages, raw_weights))
    assert raw.get_layer("compact_inputs").beam_angles == tuple(float(40 * k) for k in range(9))
    for epoch in ("best", 2):
        trained = RunFolder(recipe.run_dir).load_trained_model(epoch)
        assert trained.epoch == 2 and trained.config.ema
        for average, weight in zip(averages, trained.model.trainable_variables):
            np.testing.assert_array_equal(average, keras.ops.convert_to_numpy(weight))
    best_row = [row for row in read_log(recipe.run_dir / "training_log.csv") if row["val_dose_score"]][0]
    report = predict(recipe, stage="validation", epoch=2)
    # the log scores in-memory float32 predictions, --predict-only the CSVs' decimals of another batch's: ~1e-6 Gy
    assert report.scores.dose_score == pytest.approx(float(best_row["val_dose_score"]), rel=1e-4)


@pytest.mark.slow
def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(two_epochs, caplog):
    config = two_epochs
    newest = RunFolder(config.run_dir).models / "epoch_2.keras"
    with open(newest, "r+b") as handle:
        handle.truncate(newest.stat().st_size // 3)
    keras.backend.clear_session()
    with caplog.at_level(logging.WARNING):
        result = train(config)
    assert "epoch_2.keras does not load" in caplog.text
    assert result.first_epoch == 1
    assert log_epochs(config.run_dir) == [1, 2, 3]  # the row of the lost epoch 2 was replaced, not duplicated


@pytest.mark.slow
def test_resume_with_other_architecture_is_an_error(two_epochs):
    config = two_epochs
    with pytest.raises(ConfigError, match="filters: saved 4, requested 8"):
        train(dataclasses.replace(config, filters=8))


@pytest.mark.slow
def test_a_diverging_resume_stops_before_saving_it_and_keeps_the_last_finite_checkpoint(two_epochs):
    """A resume with --learning-rate 1e4 (2e-4 meant), --keep 1: the first epoch's loss is ~1e9;
    the run stops in one line before that epoch's checkpoint, and epoch_2.keras is not rotated
    away. config.json goes back to the saved recipe, so the plain command resumes as before."""
    config = two_epochs
    first = dataclasses.replace(config, epochs=2, keep=1)
    (RunFolder(config.run_dir).models / "epoch_1.keras").unlink()  # as --keep 1 would have left it
    saved_config = (RunFolder(config.run_dir).models / "config.json").read_text()
    keras.backend.clear_session()
    with pytest.raises(DivergenceError) as caught:
        train(dataclasses.replace(first, epochs=4, learning_rate=1e4), change_recipe=True)
    message = str(caught.value)
    assert message.startswith("Training diverged at epoch 3: its mean training loss ") and "\n" not in message
    assert f"the newest checkpoint, {RunFolder(config.run_dir).models / 'epoch_2.keras'}, is kept" in message
    assert [epoch for epoch, _ in RunFolder(config.run_dir).checkpoints()] == [2]
    assert log_epochs(config.run_dir) == [1, 2]
    assert (RunFolder(config.run_dir).models / "config.json").read_text() == saved_config
    with pytest.raises(ConfigError, match="Invalid `learning_rate`. Expected a finite number > 0"):
        dataclasses.replace(first, learning_rate=float("inf"))


@pytest.mark.slow
def test_a_resume_that_changes_the_loss_and_the_rate_is_held_to_the_ceiling(two_epochs):
    """--change-recipe --loss mae --learning-rate 1e5 --keep 1: the new loss has no history to be
    compared with, so its first epoch is held to the ceiling (100 × the highest prescription, in
    Gy); the run stops there, before anything of that epoch is written (it used to exit 0 at
    losses of 1e9 and rotate the good checkpoints away)."""
    config = dataclasses.replace(two_epochs, keep=1)
    (RunFolder(config.run_dir).models / "epoch_1.keras").unlink()
    keras.backend.clear_session()
    with pytest.raises(DivergenceError) as caught:
        train(dataclasses.replace(config, epochs=4, loss="mae", learning_rate=1e5), change_recipe=True)
    assert "Gy is more than 100 × the highest dose it compares (7000 Gy" in str(caught.value)
    assert [epoch for epoch, _ in RunFolder(config.run_dir).checkpoints()] == [2]
    assert log_epochs(config.run_dir) == [1, 2]


@pytest.mark.slow
def test_the_checkpoint_before_a_recipe_change_is_kept_until_the_new_recipe_is_scored(two_epochs, caplog):
    """A change that trains worse models without diverging (a far lower rate here) must not rotate
    the model from before it away with --keep 1 before an epoch of the new recipe is scored."""
    config = dataclasses.replace(two_epochs, keep=1)
    keras.backend.clear_session()
    with caplog.at_level(logging.INFO):
        train(dataclasses.replace(config, epochs=4, learning_rate=1e-6), change_recipe=True)
    assert [epoch for epoch, _ in RunFolder(config.run_dir).checkpoints()] == [4, 2]
    assert "the newest checkpoint before the recipe change, until an epoch of the new recipe is scored" in caplog.text
    keras.backend.clear_session()
    train(dataclasses.replace(config, epochs=6, learning_rate=1e-6, score_every=1))  # epoch 5 is scored
    assert [epoch for epoch, _ in RunFolder(config.run_dir).checkpoints()] == [6]


@pytest.mark.slow
def test_change_recipe_with_nothing_to_train_leaves_the_saved_recipe(two_epochs, caplog):
    """A run already at --epochs says so, and a --change-recipe it carries is not written into
    config.json (the next plain resume would train with it)."""
    saved = (RunFolder(two_epochs.run_dir).models / "config.json").read_text()
    keras.backend.clear_session()
    with caplog.at_level(logging.INFO):
        result = train(dataclasses.replace(two_epochs, epochs=2, seed=7), change_recipe=True)
    assert result.first_epoch == result.last_epoch == 2
    assert "nothing to do; the recipe change (seed) is not recorded" in caplog.text
    assert (RunFolder(two_epochs.run_dir).models / "config.json").read_text() == saved


@pytest.mark.slow
def test_a_full_disk_while_saving_a_checkpoint_names_the_file(config, monkeypatch):
    from provided_code.apps.console import one_line

    def disk_full(self, filepath, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # as zipfile raises it: no file name

    monkeypatch.setattr(keras.Model, "save", disk_full)
    with pytest.raises(OSError) as caught:
        train(dataclasses.replace(config, epochs=1))
    assert one_line(caught.value) == f"{RunFolder(config.run_dir).models / 'epoch_1.keras'}: No space left on device"
    assert RunFolder(config.run_dir).checkpoints() == []


def test_toggling_ema_on_a_resume_is_refused_before_any_work(config):
    RunFolder(config.run_dir).models.mkdir(parents=True)
    (RunFolder(config.run_dir).models / "config.json").write_text(dataclasses.replace(config, precision="float32").to_json())
    for change_recipe in (False, True):
        with pytest.raises(ConfigError, match="with --ema: it was trained without weight averaging"):
            train(dataclasses.replace(config, ema=True), change_recipe=change_recipe)


def test_settings_no_one_means_are_warned_before_the_data_loads(config, tmp_path, caplog):
    odd = dataclasses.replace(config, beams=40, beam_angles="", warmup_epochs=3, epochs=3, data_dir=str(tmp_path / "nowhere"))
    with caplog.at_level(logging.WARNING), pytest.raises(DataNotFoundError):
        train(odd)
    assert "--warmup-epochs 3 with --epochs 3: the rate rises until epoch 4" in caplog.text
    assert "40 beams: more than 36" in caplog.text


@requires_float16_convolutions
@pytest.mark.slow
def test_mixed_float16_runs_end_to_end_and_resumes(config, caplog):
    mixed = dataclasses.replace(config, precision="mixed_float16", epochs=1, tensorboard=True)
    result = train(mixed)
    assert result.policy == "mixed_float16"
    assert any((config.run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy("float32")
    epoch, model = RunFolder(config.run_dir).load_newest(compile=False)
    assert epoch == 1
    assert model.get_layer("encoder_1_conv").dtype_policy.name == "mixed_float16"
    ct = np.zeros((1, 32, 32, 32), np.uint16)
    assert model({"ct": ct, "structure_masks": ct}).dtype == "float32"
    keras.backend.clear_session()
    # precision auto on resume: the saved policy wins, and loss scaling comes back with it.
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = train(dataclasses.replace(mixed, epochs=2, precision="auto"))
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]  # optimizer state restored
    assert resumed.first_epoch == 1 and resumed.policy == "mixed_float16"
    assert "dtype policy mixed_float16 (LossScaleOptimizer)" in caplog.text
    assert log_epochs(config.run_dir) == [1, 2]


@pytest.mark.slow
def test_validation_split_without_doses_is_not_an_error(config, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(config.data_dir, data)
    for dose in (data / "validation-pats").glob("pt_*/dose.csv"):
        dose.unlink()
    result = train(dataclasses.replace(config, data_dir=str(data), epochs=1))
    assert result.last_epoch == 1
    with open(config.run_dir / "training_log.csv", newline="") as handle:
        assert next(csv.DictReader(handle))["val_loss"] == ""


def test_missing_data_says_where_openkbp_comes_from(config, tmp_path):
    with pytest.raises(DataNotFoundError, match="provided-data/.*--data-dir"):
        train(dataclasses.replace(config, data_dir=str(tmp_path / "nowhere")))


@pytest.mark.slow
def test_a_training_patient_whose_dose_lies_outside_its_body_is_named_with_the_way_out_which_works(config, tmp_path):
    """Another patient's plan in pt_2's folder (its dose outside pt_2's possible-dose mask) stops
    the fold, naming pt_2 and --exclude; with pt_2 excluded the fold trains, pt_2 dealt all the same."""
    from provided_code.data.csv_io import PatientDataError
    from provided_code.folds import read_dealing

    data = Path(shutil.copytree(config.data_dir, tmp_path / "data"))
    shutil.copy(data / "train-pats" / "pt_1" / "dose.csv", data / "train-pats" / "pt_2" / "dose.csv")
    fold = dataclasses.replace(config, data_dir=str(data), epochs=1, folds=2, fold=1)
    with pytest.raises(PatientDataError, match=r"^Patient pt_2: .*pt_2/dose.csv: the dose is non-zero in \d+ "
                                               r"voxel\(s\) outside the possible-dose mask .*; to train without "
                                               r"pt_2, list it with a reason in an exclusion file \(patient,reason\) "
                                               r"and pass --exclude FILE \(docs/commissioning.md\)$"):
        train(fold)
    assert not (fold.model_dir / "fold-1" / "models").exists()
    excluded = ({"patient": "pt_2", "reason": "another patient's plan: to be fixed"},)
    result = train(dataclasses.replace(fold, excluded=excluded, excluded_by={"file": str(tmp_path / "exclude.csv")}))
    assert result.last_epoch == 1
    assert sorted(read_dealing(fold.model_dir).patients) == ["pt_1", "pt_2", "pt_3", "pt_4"]


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_finishes_with_each_epoch_once(config, caplog):
    from click.testing import CliRunner

    from provided_code.apps.cli import main

    command = [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", config.data_dir,
               "--results-dir", config.results_dir, "--model-name", "killed", "--cache-dir", config.cache_dir,
               *LIGHT_FLAGS, "--filters", "4", "--resolution", "32", "--no-xla", "--epochs", "6", "--save-every", "2", "--score-every", "0",
               "--keep", "2"]
    log = Path(config.results_dir) / "killed" / "training_log.csv"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) > 3:  # header + 3 epochs
            break
        time.sleep(0.05)
    assert process.poll() is None, "training finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = len(log.read_text().splitlines()) - 1
    assert 3 <= killed_at < 6

    # The same command again, in this process (what is killed is the first process, not this one).
    with caplog.at_level(logging.INFO):
        rerun = CliRunner().invoke(main, command[2:])
    assert rerun.exit_code == 0, rerun.output
    assert "Resuming killed from epoch" in caplog.text
    killed = dataclasses.replace(config, model_name="killed")
    assert log_epochs(killed.run_dir) == list(range(1, 7))
    assert [epoch for epoch, _ in RunFolder(killed.run_dir).checkpoints()] == [6, 4]


@pytest.mark.slow
def test_training_from_the_memory_mapped_cache_gives_the_weights_of_training_from_memory(config, caplog):
    recipe = dataclasses.replace(config, epochs=2, augment="flip,rotate,shift", score_every=1)
    in_memory = train(recipe)
    keras.backend.clear_session()
    with caplog.at_level(logging.INFO):
        mapped = train(dataclasses.replace(recipe, memory_map=True, model_name="mapped"))
    assert "Data: mapped from the cache files (--memory-map)" in caplog.text
    assert list(Path(config.cache_dir).glob("train-pats-*-32.h5"))  # the 32³ volumes, mapped from their own file
    fingerprints = [weights_fingerprint(RunFolder(result.checkpoint.parents[1]).load_newest()[1])
                    for result in (in_memory, mapped)]
    assert fingerprints[0] == fingerprints[1]
    logs = [read_log(RunFolder(result.checkpoint.parents[1]).log) for result in (in_memory, mapped)]
    for name in ("loss", "val_loss", "val_dose_score", "val_dvh_score"):
        assert [row[name] for row in logs[0]] == [row[name] for row in logs[1]]


@pytest.mark.slow
def test_a_corrupt_mapped_chunk_stops_training_naming_file_patient_and_volume(config, phantom_data):
    from provided_code.data.cache import load_split
    from provided_code.data.mapped import CorruptChunkError, downsampled
    from tests.kit.cache_files import flip_a_byte

    low = downsampled(load_split(phantom_data / "train-pats", cache_dir=config.cache_dir, memory_map=True,
                                 site=openkbp()), 32)
    path = low.ct.path
    flip_a_byte(path, "structure_masks", 2)
    with pytest.raises(CorruptChunkError, match=f"{path}: patient pt_3's structure_masks chunk fails its checksum"):
        train(dataclasses.replace(config, epochs=1, memory_map=True))
    assert not path.exists()  # the next run writes it again


def test_arrays_that_would_not_fit_are_mapped_and_the_log_says_why(config, phantom_data, monkeypatch, caplog):
    from provided_code.training import train as train_module

    monkeypatch.setattr(train_module, "available_memory", lambda: (100e6, "MemAvailable"))
    with caplog.at_level(logging.INFO):
        assert train_module._memory_map(config, phantom_data / "train-pats", phantom_data / "validation-pats")
    assert ("6 patients stacked would take 0.1 GB; 0.1 GB available (MemAvailable), more than 50% of it"
            in caplog.text)
    monkeypatch.setattr(train_module, "available_memory", lambda: (20e9, "MemAvailable"))
    with caplog.at_level(logging.INFO):
        assert not train_module._memory_map(config, phantom_data / "train-pats", phantom_data / "validation-pats")
    assert "Data: stacked in memory; 6 patients stacked would take" in caplog.text


def test_change_recipe_on_a_new_run_is_said_not_ignored(config, caplog):
    from provided_code.training.admission import admit

    with caplog.at_level(logging.WARNING):
        admit(config, RunFolder(config.run_dir), given=None, change_recipe=True)
    assert f"--change-recipe changes nothing: model 'tiny' in {config.run_dir} is new" in caplog.text


@pytest.mark.slow
def test_a_residual_unet_with_the_physics_channel_resumes_as_if_uninterrupted(config, caplog):
    """--arch resunet --physics (2 filters: the step's own size is not what is tested): killed after
    the epoch-1 checkpoint, the same command resumes to the weights an uninterrupted run reaches;
    the log's network line names the channel, on the resume too."""
    recipe = dataclasses.replace(config, filters=2, epochs=2, arch="resunet", physics=True,
                                 dropout=0.0, augment="flip,rotate")
    with caplog.at_level(logging.INFO, logger="provided_code.training.train"):
        train(recipe)
    uninterrupted = model_weights(RunFolder(recipe.run_dir).load_newest()[1])
    saved = TrainConfig.from_json((RunFolder(recipe.run_dir).models / "config.json").read_text())
    assert (saved.arch, saved.physics, saved.spec.input_names[-1]) == ("resunet", True, "voxel_dimensions")
    (RunFolder(recipe.run_dir).models / "epoch_2.keras").unlink()
    keras.backend.clear_session()
    bare = dataclasses.replace(recipe, arch=TrainConfig().arch, physics=False)  # the bare command: the saved network
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="provided_code.training.train"):
        assert train(bare, given=set()).first_epoch == 1
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Network: ")]
    assert line.startswith("Network: resunet, 2 filters") and line.endswith(", the beams' primary fluence (--physics)")
    _, resumed = RunFolder(recipe.run_dir).load_newest()
    assert resumed.name == "resunet" and resumed.get_layer("compact_inputs").physics
    for x, y in zip(uninterrupted, model_weights(resumed)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)  # one process, deterministic ops: in practice exact


@pytest.mark.slow
@pytest.mark.parametrize("site", ["openkbp", "prostate"])
def test_the_default_body_learns_each_sites_phantoms(site, request, tmp_path):
    """The default network (its body, widths and head as TrainConfig has them), trained briefly on
    four phantoms of each site, predicts the held-out two with a dose score under half of zero
    dose's (measured after 10 epochs: 0.22 and 0.30 of it, after 20: 0.20 to 0.32; the residual
    U-Net's ReLU head stayed at zero dose's on the prostate's)."""
    from provided_code.data.cache import load_split
    from provided_code.metrics.scoring import score_split

    data = request.getfixturevalue("phantom_data" if site == "openkbp" else "prostate_data")
    defaults = TrainConfig()
    config = TrainConfig(site=site, filters=8, resolution=32, epochs=10, batch_size=1, learning_rate=3e-3, xla="off",
                         score_every=10, save_every=10, data_dir=str(data), results_dir=str(tmp_path / "results"),
                         model_name="learns", cache_dir=str(tmp_path / "cache"))
    assert (config.arch, config.widths, config.head) == (defaults.arch, defaults.widths, defaults.head)
    train(config)
    validation = load_split(data / "validation-pats", cache_dir=config.cache_dir, site=config.site)
    zero = score_split(validation, lambda row: np.zeros(validation.dose[row].size)).dose_score
    scored = float(read_log(RunFolder(config.run_dir).log)[-1]["val_dose_score"])
    assert scored < 0.5 * zero, (scored, zero)
