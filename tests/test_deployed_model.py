"""The deployed model (provided_code/deployed_model.py): a single run or a cross-validated model's
folds, each member at one checkpoint known by its SHA-256, one predict that averages them, and
members of different sites refused. On the session's tiny run and 2-fold model (32³, one epoch)."""

import hashlib
import json
import re
import shutil

import keras
import numpy as np
import pytest

from provided_code import run_folder
from provided_code.config import ConfigError
from provided_code.data.cache import load_split
from provided_code.data_folder import split_dir
from provided_code.deployed_model import DeployedModel, recorded_members
from provided_code.folds import FoldsError
from provided_code.inference import predict_full_resolution
from provided_code.run_folder import CheckpointError, RunFolder
from provided_code.sites import load_site, openkbp


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_single_run_is_one_member_at_its_newest_checkpoint_by_sha256(tiny_model):
    model = DeployedModel.open(tiny_model)  # no best checkpoint (trained without scoring): its newest
    [member] = model.members
    folder = RunFolder(tiny_model)
    assert (member.epoch, member.checkpoint) == folder.checkpoints()[0]
    assert member.sha256 == _sha256(member.checkpoint) and member.fold is None
    assert member.spec == folder.spec() and member.spec.arch == "generator"
    assert (model.name, model.source, model.epoch, model.averages) == ("m", tiny_model, member.epoch, False)
    assert model.what() == {"epoch": member.epoch} and model.label == f"epoch {member.epoch}"


@pytest.mark.slow
def test_a_cross_validated_model_is_its_folds_each_at_its_final_checkpoint_by_sha256(cv_model):
    model = DeployedModel.open(cv_model)
    assert [member.name for member in model.members] == ["cv-fold-1", "cv-fold-2"]
    for number, member in enumerate(model.members, start=1):
        folder = RunFolder(cv_model / f"fold-{number}")
        assert member.checkpoint == folder.checkpoints()[0][1]  # its final, not its best (picked on its held-out)
        assert member.identity() == {"fold": number, "epoch": member.epoch, "sha256": _sha256(member.checkpoint)}
    assert model.members[0].sha256 != model.members[1].sha256
    assert model.averages and model.epoch is None and model.label == "2 folds"
    assert model.what() == {"members": [member.record() for member in model.members]}
    assert model.used() == "the 2 folds (cv-fold-1 epoch 1, cv-fold-2 epoch 1) averaged"


def _validation(phantom_data, phantom_cache):
    return load_split(split_dir(phantom_data, "validation"), cache_dir=phantom_cache, require_dose=False,
                      site=openkbp())


@pytest.mark.slow
def test_predict_is_the_mean_of_the_members_own_predictions(cv_model, phantom_data, phantom_cache):
    arrays = _validation(phantom_data, phantom_cache)
    model = DeployedModel.open(cv_model)
    averaged = model.predict(arrays, batch_size=1)
    own = []
    for member in model.members:
        trained = member.load()
        own.append(predict_full_resolution(trained.model, arrays, trained.spec, batch_size=1))
        keras.backend.clear_session()
    assert averaged.dtype == np.float32 and averaged.shape == own[0].shape
    assert np.abs(own[0] - own[1]).max() > 1e-3  # the folds differ: the mean is neither
    # The same float32 predictions summed and halved in float32: against their float64 mean, the sum's
    # rounding (half an ulp, 2^-24 relative) is all that differs; halving is exact. 1e-6 relative
    # leaves room for that and nothing else, and 1e-6 Gy absolute for doses near zero.
    np.testing.assert_allclose(averaged, (own[0].astype(np.float64) + own[1]) / 2, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_a_loaded_model_predicts_the_same_doses_without_reading_its_checkpoints(cv_model, phantom_data,
                                                                                phantom_cache, monkeypatch):
    """loaded() keeps each member's Keras model (the node's): its predictions are those of the model
    loading each member in turn, and no checkpoint is read again."""
    arrays = _validation(phantom_data, phantom_cache)
    model = DeployedModel.open(cv_model)
    expected = model.predict(arrays, batch_size=1)  # each member loaded in turn, let go after its prediction
    held = model.loaded()
    assert len(held.models) == 2 and held.loaded() is held and held == model  # the same members
    monkeypatch.setattr(run_folder, "_load", lambda *args: pytest.fail("a checkpoint was read again"))
    np.testing.assert_array_equal(held.predict(arrays, batch_size=1), expected)
    keras.backend.clear_session()


def _on_prostate(folder):
    """``folder``'s config.json saying the prostate site; returns the file."""
    path = folder / "models" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "site": load_site("prostate").to_dict()}))
    return path


@pytest.mark.slow
def test_runs_of_two_sites_named_with_ensemble_are_refused_as_the_ensemble_option(tiny_model, tmp_path):
    other = tmp_path / "prostate-m"
    shutil.copytree(tiny_model / "models", other / "models")
    config = _on_prostate(other)
    expected = (f"Invalid `ensemble`. Expected models trained on one site. Received: ensemble='m,prostate-m' ('m' on "
                f"openkbp: {tiny_model / 'models' / 'config.json'}, 'prostate-m' on prostate: {config})")
    with pytest.raises(ConfigError) as caught:
        DeployedModel.of_runs("m,prostate-m", [RunFolder(tiny_model), RunFolder(other)], [None, None], ensemble=True)
    assert str(caught.value) == expected


@pytest.mark.slow
def test_folds_of_two_sites_are_refused_as_the_model_dir_option(cv_model, tmp_path):
    copy = tmp_path / "cv"
    shutil.copytree(cv_model, copy)
    config = _on_prostate(copy / "fold-2")
    expected = (f"Invalid `model_dir`. Expected models trained on one site. Received: model_dir='{copy}' "
                f"('cv-fold-1' on openkbp: {copy / 'fold-1' / 'models' / 'config.json'}, 'cv-fold-2' on prostate: "
                f"{config})")
    with pytest.raises(ConfigError) as caught:
        DeployedModel.open(copy)
    assert str(caught.value) == expected


@pytest.mark.slow
def test_a_missing_checkpoint_is_named_before_anything_loads(tiny_model, monkeypatch):
    monkeypatch.setattr(run_folder, "_load", lambda *args: pytest.fail("a checkpoint was loaded"))
    with pytest.raises(FileNotFoundError, match=r"^No checkpoint for epoch 9 in .*models \(have: \[1\]\)$"):
        DeployedModel.open(tiny_model, epoch=9)


@pytest.mark.slow
def test_a_missing_best_checkpoint_says_when_one_is_written(tiny_model):
    with pytest.raises(FileNotFoundError, match=r"^No best checkpoint in .*--score-every\)\.$"):
        DeployedModel.open(tiny_model, epoch="best")


@pytest.mark.slow
def test_a_cross_validated_model_missing_a_fold_is_named_as_it_is_opened(cv_model, tmp_path):
    copy = tmp_path / "cv"
    shutil.copytree(cv_model, copy, ignore=lambda folder, names: ["fold-2"] if folder == str(cv_model) else [])
    with pytest.raises(FoldsError, match=rf"^{re.escape(str(copy))}: the cross-validated model's fold 2 of 2 is "
                                         rf"missing \(fold-<K>/\): its folds serve together$"):
        DeployedModel.open(copy)


@pytest.mark.slow
def test_runs_named_together_have_no_commissioning_and_say_why(tiny_model, tmp_path):
    other = tmp_path / "m2"
    shutil.copytree(tiny_model / "models", other / "models")
    model = DeployedModel.of_runs("m,m2", [RunFolder(tiny_model), RunFolder(other)], [None, None], ensemble=True)
    trust = model.trust(0.9)
    assert trust.bands is None and trust.cohort is None and trust.uncommissioned
    assert trust.lines() == ["No prediction bands or in-distribution check: an ensemble of 2 models (m, m2): no "
                             "commissioning assesses it"]


@pytest.mark.slow
def test_a_truncated_checkpoint_is_named_as_the_model_is_opened_without_loading_it(tiny_model, tmp_path,
                                                                                   monkeypatch):
    copy = tmp_path / "m"
    shutil.copytree(tiny_model / "models", copy / "models")
    _, newest = RunFolder(copy).checkpoints()[0]
    newest.write_bytes(newest.read_bytes()[:1000])
    monkeypatch.setattr(run_folder, "_load", lambda *args: pytest.fail("a checkpoint was loaded"))
    with pytest.raises(CheckpointError, match=rf"^Checkpoint {re.escape(str(newest))} does not load: not a complete "
                                              rf"\.keras file \(a zip archive\): truncated or corrupt, 1000 bytes$"):
        DeployedModel.open(copy)


def test_the_members_a_prediction_recorded_read_alike_today_and_the_old_way():
    members = [{"model": "cv-fold-1", "epoch": 3}, {"model": "cv-fold-2", "epoch": 4}]
    assert recorded_members({"model": "cv", "members": members}) == members
    assert recorded_members({"model": "cv", "epoch": "ensemble", "members": members}) == members  # before
    assert recorded_members({"model": "m", "epoch": 2}) == [{"model": "m", "epoch": 2}]
