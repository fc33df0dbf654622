"""Cross-validation folds: the dealing of a model's training patients, made once and checked."""

import json

import pytest

from provided_code.folds import SPLITS_FILE, Dealing, FoldsError, deal, dealing_for, fold_folders, natural_key

PATIENTS = [f"pt_{n}" for n in (1, 2, 3, 10, 11, 20, 21, 30, 31, 40, 41)]


def test_every_patient_is_dealt_exactly_once_into_folds_of_near_equal_size():
    dealing = deal(PATIENTS, folds=5, seed=0)
    dealt = [patient for part in dealing.held_out for patient in part]
    assert sorted(dealt) == sorted(PATIENTS) and len(dealt) == len(set(dealt))
    assert sorted(len(part) for part in dealing.held_out) == [2, 2, 2, 2, 3]
    assert all(list(part) == sorted(part, key=natural_key) for part in dealing.held_out)
    assert dealing.fold_of("pt_10") == next(k + 1 for k, part in enumerate(dealing.held_out) if "pt_10" in part)


def test_the_dealing_depends_on_the_names_and_the_seed_only():
    assert deal(PATIENTS, 5, seed=0) == deal(list(reversed(PATIENTS)), 5, seed=0)  # not on the listing's order
    assert deal(PATIENTS, 5, seed=0).held_out != deal(PATIENTS, 5, seed=1).held_out
    assert Dealing.from_dict(deal(PATIENTS, 3, 2).to_dict(), "x") == deal(PATIENTS, 3, 2)


def test_too_few_patients_or_folds_are_refused():
    with pytest.raises(FoldsError, match="Expected 2 or more, and at most the 2 training patients"):
        deal(["pt_1", "pt_2"], folds=3, seed=0)
    with pytest.raises(FoldsError, match="Received: folds=1"):
        deal(PATIENTS, folds=1, seed=0)


def test_the_first_fold_writes_the_dealing_and_later_ones_are_held_to_it(tmp_path):
    model = tmp_path / "cv"
    first = dealing_for(model, PATIENTS, 5, 0, source="data/train-pats")
    assert json.loads((model / SPLITS_FILE).read_text())["held_out"] == [list(part) for part in first.held_out]
    assert dealing_for(model, list(reversed(PATIENTS)), 5, 0) == first
    with pytest.raises(FoldsError, match=r"dealt into 5 folds with --seed 0; requested --folds 4 --seed 0"):
        dealing_for(model, PATIENTS, 4, 0)
    with pytest.raises(FoldsError, match=r"dealt into 5 folds with --seed 0; requested --folds 5 --seed 3"):
        dealing_for(model, PATIENTS, 5, 3)
    with pytest.raises(FoldsError, match=r"the training patients changed since the folds were dealt \(pt_99 is in "
                                         r"data/train-pats but not dealt\)"):
        dealing_for(model, PATIENTS + ["pt_99"], 5, 0, source="data/train-pats")
    with pytest.raises(FoldsError, match=r"pt_1 was dealt but is not in the training split any more"):
        dealing_for(model, PATIENTS[1:], 5, 0)


def test_a_fold_started_at_the_same_moment_with_other_settings_is_held_to_the_first_dealing(tmp_path,
                                                                                          monkeypatch):
    """Two folds dealing at once: the one whose dealing reaches splits.json second is held to the
    first's (refused, naming its settings), not written over it."""
    import provided_code.folds as folds

    model = tmp_path / "cv"
    first = deal(PATIENTS, 5, 0)

    def dealt_meanwhile(*args, **kwargs):  # the other fold writes its dealing while this one deals
        (model / SPLITS_FILE).write_text(json.dumps(first.to_dict()))
        return deal(*args, **kwargs)

    model.mkdir()
    monkeypatch.setattr(folds, "deal", dealt_meanwhile)
    with pytest.raises(FoldsError, match=r"dealt into 5 folds with --seed 0; requested --folds 4 --seed 0"):
        dealing_for(model, PATIENTS, 4, 0)
    assert json.loads((model / SPLITS_FILE).read_text()) == first.to_dict()
    assert sorted(p.name for p in model.iterdir()) == [SPLITS_FILE]  # no temporary left


def test_a_damaged_dealing_is_named(tmp_path):
    (tmp_path / SPLITS_FILE).write_text('{"format": 1, "folds": 2, "seed": 0, "held_out": [["pt_1"], ["pt_1"]]}')
    with pytest.raises(FoldsError, match=f"{tmp_path / SPLITS_FILE}: not a dealing of folds \\(a patient is in two"):
        dealing_for(tmp_path, ["pt_1"], 2, 0)


def test_fold_folders_are_found_by_their_number(tmp_path):
    for name in ("fold-2", "fold-1", "fold-10", "commissioning", "fold-x"):
        (tmp_path / name).mkdir()
    assert list(fold_folders(tmp_path)) == [1, 2, 10]


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_each_patients_out_of_fold_prediction_comes_from_the_fold_that_never_saw_it(cv_model, phantom_data,
                                                                                  phantom_cache):
    """Each fold trained on the other fold's patients and predicted its own held-out ones: a
    patient's out-of-fold CSV is what its own fold's model predicts, not the other fold's (the two
    models differ: trained on other patients), made with the fold's final checkpoint (its best was
    picked on those very patients)."""
    import numpy as np

    from provided_code.data.cache import load_split
    from provided_code.data.csv_io import read_sparse_csv
    from provided_code.folds import read_dealing
    from provided_code.inference import predict_full_resolution
    from provided_code.sites import openkbp
    from provided_code.run_folder import RunFolder

    dealing = read_dealing(cv_model)
    assert dealing.folds == 2 and sorted(dealing.patients) == ["pt_1", "pt_2", "pt_3", "pt_4"]
    arrays = load_split(phantom_data / "train-pats", cache_dir=phantom_cache, site=openkbp())
    folds = {k: RunFolder(cv_model / f"fold-{k}").load_trained_model(None) for k in (1, 2)}  # the newest
    for k, fold in folds.items():
        held_out = dealing.held_out_of(k)
        assert sorted(p.name for p in (cv_model / f"fold-{k}" / "held-out-predictions").glob("pt_*.csv")) == \
            sorted(f"{pid}.csv" for pid in held_out)
        scores = json.loads((cv_model / f"fold-{k}" / "held-out-predictions" / "scores.json").read_text())
        assert scores["epoch"] == fold.epoch == fold.config.epochs and scores["patients"] == len(held_out)
        rows = [row for row, pid in enumerate(arrays.patient_ids) if pid in held_out]
        part = arrays.select(rows)
        own = predict_full_resolution(fold.model, part, fold.spec, batch_size=2)
        other = predict_full_resolution(folds[3 - k].model, part, fold.spec, batch_size=2)
        for row, pid in enumerate(part.patient_ids):
            indices, values = read_sparse_csv(cv_model / f"fold-{k}" / "held-out-predictions" / f"{pid}.csv", pid,
                                              with_values=True)
            # the CSV holds the float32 doses' shortest decimals: an ulp (8e-6 Gy at 70 Gy) at most
            np.testing.assert_allclose(values, own[row].reshape(-1)[indices], atol=1e-5)
            assert np.abs(values - other[row].reshape(-1)[indices]).max() > 1e-3  # the other fold's would differ


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_excluded_patients_are_left_out_of_a_fold_recorded_and_another_list_is_refused(cv_model, phantom_data,
                                                                                     phantom_cache, tmp_path):
    """--exclude: the patient is in neither the fold's training nor its held-out predictions; the
    list, its file and the command are in config.json; a fold of the same model with another list
    is refused in one line unless --change-recipe."""
    import shutil

    from click.testing import CliRunner

    import provided_code.apps.cli as cli
    from provided_code.folds import read_dealing
    from provided_code.run_folder import RunFolder
    from tests.conftest import CV_RUN
    from tests.kit.runs import forget_models

    model = tmp_path / "results" / "cv"
    model.mkdir(parents=True)
    shutil.copy(cv_model / SPLITS_FILE, model / SPLITS_FILE)  # the dealing, no fold trained yet
    patient = read_dealing(model).held_out_of(1)[0]
    exclusions = tmp_path / "exclude.csv"
    exclusions.write_text(f"patient,reason\n{patient},parotid contour to redo\n")
    where = [*CV_RUN, "--data-dir", str(phantom_data), "--results-dir", str(tmp_path / "results"), "--cache-dir",
             str(phantom_cache)]
    result = CliRunner().invoke(cli.main, [*where, "--fold", "1", "--exclude", str(exclusions)])
    forget_models()
    assert result.exit_code == 0, result.output
    written = sorted(p.stem for p in (model / "fold-1" / "held-out-predictions").glob("pt_*.csv"))
    assert patient not in written and written == sorted(set(read_dealing(model).held_out_of(1)) - {patient})
    saved = RunFolder(model / "fold-1").read_config()
    assert saved.excluded == ({"patient": patient, "reason": "parotid contour to redo"},)
    assert saved.excluded_by["file"] == str(exclusions.resolve())
    assert f"--fold 1" in saved.excluded_by["command"] and f"--exclude {exclusions}" in saved.excluded_by["command"]
    refused = CliRunner().invoke(cli.main, [*where, "--fold", "2"])  # no list: another one than fold 1's
    assert refused.exit_code == 1 and "\n" not in refused.output.strip()
    assert (f"Cannot train fold 2 of model 'cv' with another exclusion list than fold 1's (excluded there: "
            f"{patient}; here: none)") in refused.output
    assert not (model / "fold-2" / "models").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_fold_with_another_network_or_in_a_single_runs_folder_is_refused_before_training(cv_model, phantom_data,
                                                                                         phantom_cache, tmp_path):
    """A model's folder holds one model: a fold whose network is not its other folds', a single run
    where folds were dealt and a fold where a single run was trained are each refused in one line,
    naming what differs, before anything is trained."""
    import shutil

    from click.testing import CliRunner

    import provided_code.apps.cli as cli
    from tests.conftest import CV_RUN

    results = tmp_path / "results"
    shutil.copytree(cv_model / "fold-1", results / "cv" / "fold-1")
    shutil.copy(cv_model / SPLITS_FILE, results / "cv" / SPLITS_FILE)
    where = ["--data-dir", str(phantom_data), "--results-dir", str(results), "--cache-dir", str(phantom_cache)]
    wider = [*(value if value != "4" else "8" for value in CV_RUN), "--fold", "2", *where]  # --filters 8
    refused = CliRunner().invoke(cli.main, wider)
    assert refused.exit_code == 1 and "\n" not in refused.output.strip()
    assert "Cannot train fold 2 of model 'cv' with other settings than fold 1's (filters: fold 1 4, requested 8)" \
        in refused.output
    single = [value for value in CV_RUN if value not in ("--folds", "2")]
    refused = CliRunner().invoke(cli.main, [*single, *where])
    assert refused.exit_code == 1 and "holds a cross-validated model (its splits.json and fold folders)" \
        in refused.output
    shutil.copytree(cv_model / "fold-1" / "models", results / "solo" / "models")  # a single run's folder
    solo = [*(value if value != "cv" else "solo" for value in CV_RUN), "--fold", "1", *where]
    refused = CliRunner().invoke(cli.main, solo)
    assert refused.exit_code == 1 and "a single run was trained there" in refused.output
    assert not (results / "cv" / "fold-2" / "models").exists() and not (results / "solo" / "fold-1" / "models").exists()


def _fold_command(cv_model, phantom_data, phantom_cache, tmp_path, *folds):
    """The model's dealing and ``folds`` copied into ``tmp_path/results/cv``; the fold command's flags there."""
    import shutil

    from tests.conftest import CV_RUN

    results = tmp_path / "results"
    for fold in folds:
        shutil.copytree(cv_model / f"fold-{fold}", results / "cv" / f"fold-{fold}")
    (results / "cv").mkdir(parents=True, exist_ok=True)
    shutil.copy(cv_model / SPLITS_FILE, results / "cv" / SPLITS_FILE)
    return results, [*CV_RUN, "--data-dir", str(phantom_data), "--results-dir", str(results), "--cache-dir",
                     str(phantom_cache)]


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_new_fold_with_another_seed_is_not_offered_change_recipe(cv_model, phantom_data, phantom_cache, tmp_path):
    """--seed deals the patients: --change-recipe, which would be refused by the dealing, is not offered."""
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    _, command = _fold_command(cv_model, phantom_data, phantom_cache, tmp_path, 1)
    refused = CliRunner().invoke(cli.main, [*command, "--fold", "2", "--seed", "3"])
    assert refused.exit_code == 1 and "\n" not in refused.output.strip()
    assert "--seed 3" in refused.output or "seed: fold 1 " in refused.output
    assert "--change-recipe" not in refused.output


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_new_fold_with_another_body_and_rate_is_not_offered_change_recipe(cv_model, phantom_data, phantom_cache,
                                                                            tmp_path):
    """--change-recipe lets the rate differ but never the network: with both changed it is not offered
    (it would be refused again for the network); with the rate alone it is."""
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    _, command = _fold_command(cv_model, phantom_data, phantom_cache, tmp_path, 1)
    wider = [value if value != "4" else "8" for value in command]  # --filters 8: not fold 1's network
    refused = CliRunner().invoke(cli.main, [*wider, "--fold", "2", "--learning-rate", "2e-3"])
    assert refused.exit_code == 1 and "filters: fold 1 4, requested 8" in refused.output
    assert "learning_rate: fold 1 " in refused.output and "--change-recipe" not in refused.output
    refused = CliRunner().invoke(cli.main, [*command, "--fold", "2", "--learning-rate", "2e-3"])
    assert refused.exit_code == 1 and "(a recipe change: --change-recipe)" in refused.output


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_fold_resumed_with_another_seed_is_not_offered_change_recipe(cv_model, phantom_data, phantom_cache, tmp_path):
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    _, command = _fold_command(cv_model, phantom_data, phantom_cache, tmp_path, 1)
    refused = CliRunner().invoke(cli.main, [*command, "--fold", "1", "--seed", "3", "--epochs", "2"])
    assert refused.exit_code == 1 and "\n" not in refused.output.strip()
    assert "dealt into its folds with --seed 0" in refused.output and "--change-recipe does not change" in refused.output


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_refused_fold_leaves_no_folder_behind(cv_model, phantom_data, phantom_cache, tmp_path):
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    results, command = _fold_command(cv_model, phantom_data, phantom_cache, tmp_path, 1)
    wider = [value if value != "4" else "8" for value in command]  # --filters 8: not fold 1's network
    refused = CliRunner().invoke(cli.main, [*wider, "--fold", "2"])
    assert refused.exit_code == 1 and "with other settings than fold 1's" in refused.output
    assert sorted(p.name for p in (results / "cv").iterdir()) == ["fold-1", SPLITS_FILE]
