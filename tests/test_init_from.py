"""--init-from: the layers a new model takes from a trained one (exactly, by name and shape), the
refusals, the parent recorded in config.json, a resume that keeps the fine-tuned weights, and the
folds of one model all starting alike."""

import dataclasses
import logging
import shutil

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import provided_code.apps.cli as cli
from provided_code.config import ConfigError, TrainConfig
from provided_code.infra.checksum import file_checksum
from provided_code.run_folder import RunFolder
from provided_code.sites import load_site
from provided_code.training.init_from import (
    InitFromError,
    ParentWeights,
    layer_weights,
    layers_fingerprint,
    load_parent,
    match_layers,
    resolve_parent,
    take_weights,
)
from provided_code.training.model import new_model
from provided_code.training.admission import started_from
from provided_code.training.train import model_weights, train
from tests.kit.cache_files import linked_cache
from tests.kit.runs import LIGHT_BODY, model_spec

pytestmark = pytest.mark.usefixtures("reset_keras")

SPEC = model_spec(resolution=16, filters=4)


def _model(spec, seed):
    keras.utils.set_random_seed(seed)
    return new_model(spec, 1e-3)


def _parent(spec, seed=1) -> tuple[keras.Model, ParentWeights]:
    model = _model(spec, seed)
    return model, ParentWeights({"model": "parent", "folder": "/nowhere", "epoch": 3,
                                 "checkpoint": "models/epoch_3.keras"}, spec, layer_weights(model))


def test_the_same_network_takes_every_weight_exactly():
    _, parent = _parent(SPEC)
    child = _model(SPEC, seed=2)
    assert layers_fingerprint(layer_weights(child), list(parent.weights)) != layers_fingerprint(
        parent.weights, list(parent.weights))  # another seed: other weights, before
    matching = take_weights(child, SPEC, parent)
    assert matching.taken == tuple(parent.weights) and not matching.not_taken and not matching.unused
    assert layers_fingerprint(layer_weights(child), matching.taken) == layers_fingerprint(parent.weights,
                                                                                          matching.taken)
    assert matching.describe("parent 'p'") == [f"Every weight taken from parent 'p': the same network "
                                               f"({len(parent.weights)} layers with weights)"]


def test_another_site_takes_everything_but_the_first_convolution_and_says_so():
    """A prostate model started from an OpenKBP one: its first convolution reads other input
    channels (3 structures and no beams' count against 10 and one), so it keeps its own weights."""
    _, parent = _parent(SPEC)
    prostate = dataclasses.replace(SPEC, site=load_site("prostate"))
    child = _model(prostate, seed=2)
    before = layer_weights(child)["encoder_1_conv"]
    matching = take_weights(child, prostate, parent)
    assert [layer for layer, _ in matching.not_taken] == ["encoder_1_conv"]
    assert set(matching.taken) == set(parent.weights) - {"encoder_1_conv"} and not matching.unused
    assert layers_fingerprint(layer_weights(child), matching.taken) == layers_fingerprint(parent.weights,
                                                                                          matching.taken)
    after = layer_weights(child)["encoder_1_conv"]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(before, after))  # initialised as usual, kept
    kernel = parent.weights["encoder_1_conv"][0][1].shape
    theirs, ours = "×".join(map(str, kernel)), "×".join(map(str, after[0][1].shape))
    taken_line, left_line = matching.describe("parent 'p'")
    assert taken_line.startswith(f"Taken from parent 'p': {len(parent.weights) - 1} of {len(parent.weights)} layers")
    assert left_line == (f"Not taken from parent 'p' (initialised as usual): encoder_1_conv (kernel {theirs} in the "
                         f"parent, {ours} here)")


def test_layers_match_by_name_and_every_weight_shape_and_the_others_are_listed():
    parent = {"a": [("kernel", (3, 3)), ("bias", (3,))], "b": [("kernel", (2, 2))], "gone": [("gamma", (4,))]}
    model = {"a": [("kernel", (3, 3)), ("bias", (3,))], "b": [("kernel", (2, 5))], "new": [("gamma", (4,))],
             "c": [("kernel", (3, 3))]}
    matching = match_layers(parent, model)
    assert matching.taken == ("a",)
    assert matching.not_taken == (("b", "kernel 2×2 in the parent, 2×5 here"), ("new", "not in the parent"),
                                  ("c", "not in the parent"))
    assert matching.unused == ("gone",)
    assert match_layers({"a": [("kernel", (3, 3))]}, {"a": [("kernel", (3, 3)), ("bias", (3,))]}).not_taken == (
        ("a", "weights kernel in the parent, kernel, bias here"),)
    assert "the parent's gone (no layer of that name here)" in matching.describe("p")[1]


def test_a_model_that_takes_nothing_is_refused_in_one_line():
    _, parent = _parent(SPEC)
    wider = dataclasses.replace(SPEC, filters=8)
    with pytest.raises(InitFromError) as refused:
        take_weights(_model(wider, seed=2), wider, parent)
    message = str(refused.value)
    assert "\n" not in message and "parent 'parent' (epoch 3" in message
    assert "4 filters × widths 1,2,4,8,8,8 at 16³" in message and "8 filters × widths 1,2,4,8,8,8 at 16³" in message


def test_a_generator_parent_gives_a_residual_unet_nothing_and_is_refused_naming_both_bodies():
    """The residual U-Net's layers have names of their own (networks/resunet.py): no generator weight
    lands in it by a shared name."""
    _, parent = _parent(SPEC)
    residual = dataclasses.replace(SPEC, arch="resunet", dropout=0.0)
    with pytest.raises(InitFromError) as refused:
        take_weights(_model(residual, seed=2), residual, parent)
    message = str(refused.value)
    assert "\n" not in message and "generator, 4 filters" in message and "resunet, 4 filters" in message


# -- the parent's folder ------------------------------------------------------------------------
@pytest.mark.slow
def test_a_folder_without_a_model_or_the_checkpoint_asked_for_is_refused_in_one_line(tiny_model, tmp_path):
    (tmp_path / "cv" / "fold-1").mkdir(parents=True)
    refusals = [(tmp_path / "none", "best", r"Invalid `init_from`. Expected a trained model's folder, with "
                                            r"models/config.json. Received: init_from="),
                (tmp_path / "cv", "best", r"is a cross-validated model: start from one of its folds, e.g. "
                                          r"--init-from .*fold-1"),
                (tiny_model, "best", r"Invalid `init_epoch`. .*it has no best.keras \(no validation scoring\), "
                                     r"epochs 1; pass --init-epoch N. Received: init_epoch='best'"),
                (tiny_model, 7, r"Invalid `init_epoch`. Expected a checkpoint .* has: epochs 1. Received: "
                                r"init_epoch=7")]
    for folder, epoch, expected in refusals:
        with pytest.raises(InitFromError, match=expected) as refused:
            resolve_parent(str(folder), epoch)
        assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_without_init_epoch_a_parent_without_a_best_checkpoint_gives_its_final_one_saying_so(tiny_model, caplog):
    """No --init-epoch (the default, not chosen): the parent's best where it has one, else its final
    checkpoint (tiny_model was trained without validation patients: no best.keras), in one line."""
    with caplog.at_level(logging.INFO, logger="provided_code.training.init_from"):
        record, _ = resolve_parent(str(tiny_model), "best", chosen=False)
    assert (record["epoch"], record["checkpoint"]) == (1, "models/epoch_1.keras")
    assert record["sha256"] == file_checksum(tiny_model / "models" / "epoch_1.keras")
    said = [r.getMessage() for r in caplog.records if "final checkpoint" in r.getMessage()]
    assert said == [f"Starting from {tiny_model}'s final checkpoint, epoch 1 (it has no best.keras: no validation "
                    f"scoring; no --init-epoch)"]


@pytest.mark.slow
def test_a_parent_checkpoint_changed_since_it_was_recorded_is_refused_naming_it(tiny_model, tmp_path):
    parent = tmp_path / "parent"
    shutil.copytree(tiny_model, parent)
    record, _ = resolve_parent(str(parent), 1)
    checkpoint = RunFolder(parent).checkpoint(1)
    assert record["sha256"] == file_checksum(checkpoint) and record["checkpoint"] == "models/epoch_1.keras"
    checkpoint.write_bytes(checkpoint.read_bytes() + b"\0")
    with pytest.raises(InitFromError, match=r"The parent's checkpoint .*epoch_1.keras changed since it was "
                                            r"recorded \(SHA-256 .*, now .*\); do this") as refused:
        load_parent(record, "do this")
    assert "\n" not in str(refused.value)


# -- runs ----------------------------------------------------------------------------------------
@pytest.fixture
def child(tiny_model, phantom_data, phantom_cache, tmp_path) -> TrainConfig:
    """A new model on the phantoms started from ``tiny_model``'s epoch 1 (4 filters at 32³)."""
    return TrainConfig(**LIGHT_BODY, filters=4, resolution=32, epochs=2, save_every=1, keep=5, xla="off", score_every=0,
                       data_dir=str(phantom_data), results_dir=str(tmp_path / "results"), model_name="child",
                       cache_dir=str(linked_cache(phantom_cache, tmp_path / "cache")), init_from=str(tiny_model),
                       init_epoch=1)


@pytest.mark.slow
def test_a_fine_tune_takes_the_parents_network_and_records_the_parent_in_config_json(child, tiny_model, caplog):
    """Only --init-from and --init-epoch given (the command line's defaults: 64 filters at 128³): the
    network is the parent's, every weight taken, and config.json says from what."""
    defaults = dataclasses.replace(child, filters=64, resolution=128, epochs=1)
    with caplog.at_level(logging.INFO):
        train(defaults, given={"init_from", "init_epoch", "epochs", "save_every", "keep", "xla", "score_every",
                               "data_dir", "results_dir", "model_name", "cache_dir"})
    saved = RunFolder(child.run_dir).read_config()
    assert (saved.filters, saved.resolution) == (4, 32)
    assert "filters 4, resolution 32" in caplog.text
    parent = saved.parent
    checkpoint = RunFolder(tiny_model).checkpoint(1)
    assert {key: parent[key] for key in ("model", "folder", "site", "epoch", "checkpoint", "sha256")} == {
        "model": "m", "folder": str(tiny_model.resolve()), "site": "openkbp", "epoch": 1,
        "checkpoint": "models/epoch_1.keras", "sha256": file_checksum(checkpoint)}
    weights = layer_weights(RunFolder(tiny_model).load_checkpoint(1))
    assert parent["taken"] == list(weights) and parent["not_taken"] == []
    assert parent["taken_fingerprint"] == layers_fingerprint(weights, parent["taken"])
    assert "Every weight taken from parent 'm' (epoch 1" in caplog.text
    # no rate given: the run's own, which no fine-tuning comparison measured, said as such
    assert f"Fine-tuning at the default learning rate {child.learning_rate:g}," in caplog.text


@pytest.mark.slow
def test_a_fine_tune_at_a_rate_given_or_a_presets_is_not_warned_about_its_rate(child, caplog):
    with caplog.at_level(logging.INFO):
        config = started_from(child, given={"init_from", "init_epoch", "learning_rate"})
    assert config.parent["model"] == "m"  # the parent was read and recorded
    assert "Fine-tuning at the default learning rate" not in caplog.text


@pytest.mark.slow
def test_a_resume_keeps_the_fine_tuned_weights_and_never_loads_the_parent_again(child, tiny_model, tmp_path):
    """A fine-tune that loses its last epoch's checkpoint resumes from the one before, though the
    parent's checkpoint is gone by then, and ends with the uninterrupted run's weights: the same
    command again is the resume; --init-from with another parent is refused."""
    parent = tmp_path / "parent"
    shutil.copytree(tiny_model, parent)
    started = dataclasses.replace(child, init_from=str(parent), epochs=3)
    train(started)
    expected = model_weights(RunFolder(started.run_dir).load_newest()[1])
    RunFolder(started.run_dir).checkpoint(3).unlink()  # the machine is lost after the epoch-2 checkpoint
    RunFolder(parent).checkpoint(1).unlink()
    keras.backend.clear_session()
    with pytest.raises(ConfigError, match=r"with --init-from .*: it started from 'parent' \(epoch 1\), and a resume "
                                          r"continues from its own checkpoints") as refused:
        train(dataclasses.replace(started, init_from=str(tiny_model)))
    assert "\n" not in str(refused.value)
    result = train(started)  # the command that started it
    assert (result.first_epoch, result.last_epoch) == (2, 3)
    assert RunFolder(started.run_dir).read_config().parent["model"] == "parent"  # kept
    for x, y in zip(expected, model_weights(RunFolder(started.run_dir).load_newest()[1])):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)  # one process, deterministic ops: in practice exact


@pytest.mark.slow
def test_a_run_that_starts_from_the_parent_again_refuses_a_changed_parent(child, tiny_model, tmp_path):
    """A fine-tune that stopped before its first checkpoint starts from the recorded parent again:
    not from one whose checkpoint changed since."""
    parent = tmp_path / "parent"
    shutil.copytree(tiny_model, parent)
    started = dataclasses.replace(child, init_from=str(parent))
    record, _ = resolve_parent(str(parent), 1)
    RunFolder(started.run_dir).write_config(dataclasses.replace(started, parent=record, precision="float32"))
    checkpoint = RunFolder(parent).checkpoint(1)
    checkpoint.write_bytes(checkpoint.read_bytes() + b"\0")
    with pytest.raises(InitFromError, match=r"changed since it was recorded .*; pass --start-over \(with "
                                            r"--init-from\) to start from it as it is now"):
        train(dataclasses.replace(started, init_from="", init_epoch="best"))


@pytest.mark.slow
def test_every_fold_starts_from_the_parent_and_a_fold_from_another_start_is_refused(tiny_model, phantom_data,
                                                                                    phantom_cache, tmp_path):
    common = ["--folds", "2", "--filters", "4", "--resolution", "32", "--xla", "off", "--epochs", "1",
              "--score-every", "0", "--model-name", "tuned", "--data-dir", str(phantom_data), "--results-dir",
              str(tmp_path / "results"), "--cache-dir", str(linked_cache(phantom_cache, tmp_path / "cache"))]
    result = CliRunner().invoke(cli.main, [*common, "--fold", "1", "--init-from", str(tiny_model), "--init-epoch", "1"])
    assert result.exit_code == 0, result.output
    first = RunFolder(tmp_path / "results" / "tuned" / "fold-1").read_config().parent
    assert first["model"] == "m" and first["epoch"] == 1
    result = CliRunner().invoke(cli.main, [*common, "--fold", "2"])
    assert result.exit_code == 1
    line = result.output.strip()
    assert "\n" not in line and line.startswith("Error: Cannot train fold 2 of model 'tuned' from another start than "
                                                "fold 1's (fold 1: 'm' epoch 1, models/epoch_1.keras, SHA-256 ")
    assert "here: random weights" in line


def test_the_command_line_refuses_a_bad_parent_in_one_line(tmp_path, phantom_data):
    result = CliRunner().invoke(cli.main, ["--data-dir", str(phantom_data), "--results-dir", str(tmp_path / "r"),
                                           "--init-from", str(tmp_path / "nothing")])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith("Error: Invalid `init_from`. Expected a trained model's folder")
    result = CliRunner().invoke(cli.main, ["--data-dir", str(phantom_data), "--results-dir", str(tmp_path / "r"),
                                           "--init-from", str(tmp_path), "--init-epoch", "last"])
    assert result.exit_code == 2 and "Expected a checkpoint epoch (an integer) or 'best'. Received: 'last'" in \
        result.output
    with pytest.raises(ConfigError, match=r"Invalid `init_epoch`. Expected --init-epoch only with --init-from"):
        TrainConfig(init_epoch=3)
