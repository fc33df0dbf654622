import dataclasses
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest

from provided_code.apps.score_folder import score_prediction_folder
from provided_code.config import ConfigError, TrainConfig
from provided_code.data.cache import load_split
from provided_code.data.csv_io import read_sparse_csv
from provided_code.data.resample import downsample_split, upsample_dose
from provided_code.errors import RunLockedError
from provided_code.inference import PredictionError, mirror_left_right, predict_arrays
from provided_code.run_folder import CheckpointError, RunFolder
from provided_code.sites import load_site, openkbp
from provided_code.training.train import train
from tests.kit.repo import console_script
from tests.kit.runs import LIGHT_BODY, copy_of_run, predict

STRUCTURES = load_site("openkbp").names  # OpenKBP's channel order
MIRROR_BITS = load_site("openkbp").mirror_bits  # the parotids


@pytest.fixture(scope="session")
def trained(two_epoch_run) -> TrainConfig:
    """The run these tests predict with: conftest's ``two_epoch_run`` (two epochs, the newest, 2,
    also the best; two test patients; its validation and test predictions written). Read-only (its
    copy: ``run``)."""
    return two_epoch_run


@pytest.fixture
def run(trained, tmp_path) -> TrainConfig:
    """This test's copy of the trained run and its predictions (this test's written there)."""
    return copy_of_run(trained, tmp_path)


@pytest.mark.slow
def test_predict_only_writes_predictions_zip_reports_and_matching_scores(run):
    report = predict(run, stage="validation")
    assert report.epoch == 2 and report.patients == 2
    files = sorted(p.name for p in report.predictions_dir.glob("pt_*.csv"))
    assert files == ["pt_201.csv", "pt_202.csv"]
    assert report.predictions_dir == Path(run.results_dir) / "m" / "validation-predictions"
    # The set in one folder: CSVs, zip and scores (moved into place together).
    assert report.submission == report.predictions_dir / "m_validation_epoch_2.zip"
    assert report.scores_path == report.predictions_dir / "scores.json"
    assert sorted(p.name for p in report.predictions_dir.iterdir()) == [
        "m_validation_epoch_2.zip", *files, "scores.csv", "scores.json"]
    with zipfile.ZipFile(report.submission) as archive:
        assert sorted(archive.namelist()) == files
    arrays = load_split(Path(run.data_dir) / "validation-pats", cache_dir=run.cache_dir, require_dose=False,
                        site=openkbp())
    for row, pid in enumerate(arrays.patient_ids):
        indices, values = read_sparse_csv(report.predictions_dir / f"{pid}.csv", pid, with_values=True)
        assert np.array_equal(indices, np.flatnonzero(arrays.possible_dose_mask[row]))  # 128³, inside the mask
        assert np.all(values >= 0)
    summary = json.loads(report.scores_path.read_text())
    assert summary["patients"] == 2 and summary["dose_score"] == report.scores.dose_score  # JSON keeps a float64 exactly
    assert (summary["model"], summary["stage"], summary["epoch"]) == ("m", "validation", 2)
    assert summary["dose_ceiling"]["above"] == {} and "Warning" not in report.summary()  # plausible doses
    per_patient = pd.read_csv(report.predictions_dir / "scores.csv")
    assert per_patient["patient_id"].tolist() == ["pt_201", "pt_202"]
    assert "PTV70_D_99_difference" in per_patient.columns

    out = Path(run.results_dir) / "standalone.json"
    result = subprocess.run([*console_script("openkbp-score"), "--reference", str(Path(run.data_dir) / "validation-pats"),
                             "--predictions", str(report.predictions_dir), "--json", str(out),
                             "--cache-dir", run.cache_dir], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == json.loads(out.read_text())
    # --predict-only scores the CSVs it wrote, read back as openkbp-score reads them: one computation
    # on the same values in one machine, so the same number (exact).
    assert printed["dose_score"] == summary["dose_score"] and printed["dvh_score"] == summary["dvh_score"]
    assert out.with_suffix(".csv").exists()


@pytest.mark.slow
def test_stage_without_reference_doses_is_predicted_not_scored(run):
    report = predict(run, stage="test", epoch=1)
    assert report.epoch == 1 and report.scores is None
    assert sorted(p.name for p in report.predictions_dir.iterdir()) == ["m_test_epoch_1.zip", "pt_241.csv",
                                                                        "pt_242.csv"]
    assert "not scored" in report.summary()


def test_mirror_swaps_the_parotids():
    bits = np.zeros((1, 2, 4, 2), np.uint16)
    right, left = 1 << STRUCTURES.index("RightParotid"), 1 << STRUCTURES.index("LeftParotid")
    bits[0, 0, 0, 0] = right | 1
    bits[0, 1, 3, 1] = left
    mirrored = mirror_left_right(bits, 2, MIRROR_BITS)
    assert mirrored[0, 0, 3, 0] == left | 1 and mirrored[0, 1, 0, 1] == right
    assert np.array_equal(mirror_left_right(mirrored, 2, MIRROR_BITS), bits)


@pytest.mark.slow
def test_tta_prediction_is_left_right_equivariant(trained):
    _, model = RunFolder(trained.run_dir).load_newest(compile=False)
    arrays = downsample_split(load_split(Path(trained.data_dir) / "validation-pats", cache_dir=trained.cache_dir,
                                         site=openkbp()), 32)
    masks = mirror_left_right(arrays.structure_masks, 2, MIRROR_BITS)
    mirrored = dataclasses.replace(arrays, ct=np.ascontiguousarray(np.flip(arrays.ct, 2)),
                                   structure_masks=np.ascontiguousarray(masks))
    spec = trained.spec
    plain = predict_arrays(model, arrays, spec, batch_size=2, tta=True)
    flipped = predict_arrays(model, mirrored, spec, batch_size=2, tta=True)
    # mirrored inputs reach the convolutions in another memory order: float32 sums reassociated, ~1e-6 Gy.
    np.testing.assert_allclose(np.flip(flipped, 2), plain, atol=1e-5)
    assert not np.allclose(predict_arrays(model, arrays, spec, batch_size=2), plain, atol=1e-5)


@pytest.mark.slow
def test_plots_are_written_or_explained(run, monkeypatch):
    pytest.importorskip("matplotlib")
    report = predict(run, stage="validation", plots=True)
    plots = sorted(p.name for p in (report.predictions_dir.parent / "validation-plots").iterdir())
    assert plots == ["pt_201_dvh.png", "pt_201_slices.png", "pt_202_dvh.png", "pt_202_slices.png"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match="pip install 'provided_code\\[plots\\]'"):
        predict(run, stage="validation", plots=True)


@pytest.mark.slow
def test_unknown_model_is_a_clear_error(trained):
    with pytest.raises(FileNotFoundError, match="No trained model 'nope'"):
        predict(dataclasses.replace(trained, model_name="nope"))


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_is_named_before_the_patients_load(tiny_model, phantom_data, phantom_cache,
                                                                         tmp_path, monkeypatch):
    """--predict-only's newest checkpoint cut off (a copy killed mid-write): refused naming the file
    (what is hashed is what is loaded: no earlier checkpoint instead), before any patient is read."""
    import provided_code.apps.predict as predict_module

    copy = tmp_path / "results" / "m"
    shutil.copytree(tiny_model / "models", copy / "models")
    _, newest = RunFolder(copy).checkpoints()[0]
    with open(newest, "r+b") as handle:
        handle.truncate(newest.stat().st_size // 3)
    read = []
    monkeypatch.setattr(predict_module, "load_split", lambda *args, **kwargs: read.append(args))
    with pytest.raises(CheckpointError, match=rf"^Checkpoint {re.escape(str(newest))} does not load: not a complete "
                                              rf"\.keras file \(a zip archive\): truncated or corrupt"):
        predict_module.predict_stage(copy, phantom_data, stage="validation", cache_dir=phantom_cache)
    assert read == [] and not (copy / "validation-predictions").exists()


@pytest.mark.slow
def test_tta_predictions_average_the_mirrored_patient_and_cover_the_mask_at_128(run):
    plain = run.run_dir / "validation-predictions" / "pt_201.csv"  # the shared run's, without TTA
    _, plain_values = read_sparse_csv(plain, "pt_201", with_values=True)
    report = predict(run, stage="validation", tta=True)
    indices, values = read_sparse_csv(report.predictions_dir / "pt_201.csv", "pt_201", with_values=True)
    arrays = load_split(Path(run.data_dir) / "validation-pats", cache_dir=run.cache_dir, require_dose=False,
                        site=openkbp())
    assert np.array_equal(indices, np.flatnonzero(arrays.possible_dose_mask[0]))  # every mask voxel of 128³
    # By hand: the model on the 32³ patient and on its mirror (parotids swapped), mirrored back, averaged.
    low = downsample_split(arrays, 32)
    _, model = RunFolder(run.run_dir).load_newest(compile=False)
    direct = np.asarray(model.predict_on_batch({"ct": low.ct[:1], "structure_masks": low.structure_masks[:1]}))
    mirrored = np.asarray(model.predict_on_batch({
        "ct": np.ascontiguousarray(np.flip(low.ct[:1], 2)),
        "structure_masks": mirror_left_right(low.structure_masks[:1], 2, MIRROR_BITS)}))
    keras.backend.clear_session()
    expected = upsample_dose(0.5 * (direct[0, ..., 0] + np.flip(mirrored[0, ..., 0], 1)), arrays.possible_dose_mask[0])
    # the CSV's shortest decimals of float32 doses (half an ulp: 2e-6 Gy at 70 Gy) and another batch: 1e-5 Gy.
    assert np.allclose(values, expected.reshape(-1)[indices], atol=1e-5)
    assert not np.allclose(values, plain_values, atol=1e-5)


@pytest.mark.slow
def test_a_diverged_checkpoint_is_a_clear_error_and_writes_nothing(trained, tmp_path):
    broken = dataclasses.replace(trained, results_dir=str(tmp_path / "results"))
    shutil.copytree(trained.run_dir / "models", RunFolder(broken.run_dir).models)
    _, model = RunFolder(broken.run_dir).load_newest()
    kernel = model.get_layer("dose_conv").kernel
    kernel.assign(np.full(kernel.shape, np.nan, np.float32))
    model.save(RunFolder(broken.run_dir).models / "epoch_3.keras")
    keras.backend.clear_session()
    with pytest.raises(PredictionError, match=r"'m' at epoch 3 predicts NaN or infinite doses for pt_201, pt_202: this "
                                              r"checkpoint is unusable .*; nothing was written\.$"):
        predict(broken, stage="validation")
    assert not (broken.run_dir / "validation-predictions").exists()


@pytest.mark.slow
def test_an_ensemble_of_two_identical_members_scores_as_one_and_as_openkbp_score(run, tmp_path):
    single = json.loads((run.run_dir / "validation-predictions" / "scores.json").read_text())  # the run's own
    assert single["epoch"] == RunFolder(run.run_dir).read_best()["epoch"]  # its best epoch, as each member's below
    shutil.copytree(run.run_dir / "models", Path(run.results_dir) / "m2" / "models")
    ensemble = dataclasses.replace(run, model_name="ens")
    report = predict(ensemble, stage="validation", ensemble=["m", "m2"])  # each at its best epoch
    # JSON keeps a float64 exactly: the same arithmetic on the same predictions, the same number
    assert report.epoch is None and report.scores.dose_score == single["dose_score"]
    assert report.scores.dvh_score == single["dvh_score"]
    summary = json.loads(report.scores_path.read_text())
    best = hashlib.sha256((run.run_dir / "models" / "best.keras").read_bytes()).hexdigest()  # m2's is a copy
    assert summary["members"] == [{"model": "m", "epoch": single["epoch"], "sha256": best},
                                  {"model": "m2", "epoch": single["epoch"], "sha256": best}]
    assert "epoch" not in summary  # an ensemble has its members' epochs, none of its own
    assert report.predictions_dir == Path(run.results_dir) / "ens" / "validation-predictions"
    assert report.submission.name == "ens_validation_ensemble.zip"
    from provided_code.apps.score_folder import score_prediction_folder

    standalone = score_prediction_folder(Path(run.data_dir) / "validation-pats", report.predictions_dir,
                                         cache_dir=run.cache_dir, site=openkbp())
    # Both score the written CSVs through the same reader and arithmetic: exact.
    assert standalone.dose_score == report.scores.dose_score and standalone.dvh_score == report.scores.dvh_score
    with pytest.raises(ConfigError, match="Expected a name other than its members"):
        predict(dataclasses.replace(run, model_name="m2"), stage="validation", ensemble=["m", "m2"])

    with pytest.raises(ConfigError, match=r"Expected each member once \(m: it would weigh more than the others\). "
                                          r"Received: ensemble='m,m2,m'"):
        predict(ensemble, stage="validation", ensemble=["m", "m2", "m"])
    # one model named twice through its path: its folder, resolved, is the member
    for twice in (["m", "./m", "m2"], ["m2", "m2/"], ["m", f"../{Path(run.results_dir).name}/m"]):
        with pytest.raises(ConfigError, match=r"Expected each member once \(.* name one model: it would weigh more"):
            predict(ensemble, stage="validation", ensemble=twice)
    with pytest.raises(ConfigError, match="Expected a name other than its members"):  # not "in use by another run"
        predict(dataclasses.replace(run, model_name="m"), stage="validation", ensemble=["./m", "m2"])
    with pytest.raises(ConfigError, match=r"Expected the names of one or more trained runs. Received: ensemble=\[\]"):
        predict(ensemble, stage="validation", ensemble=[])


@pytest.mark.slow
def test_one_run_named_with_ensemble_records_its_member_and_writes_the_ensembles_zip(run):
    """--ensemble m (one ordinary run): its predictions in results/ens/ name the member that made
    them (model, epoch, SHA-256), not an epoch ens does not have, and the zip is the ensemble's."""
    report = predict(dataclasses.replace(run, model_name="ens"), stage="validation", ensemble=["m"])
    summary = json.loads(report.scores_path.read_text())
    epoch = RunFolder(run.run_dir).read_best()["epoch"]  # at its best by default
    best = hashlib.sha256((run.run_dir / "models" / "best.keras").read_bytes()).hexdigest()
    assert summary["members"] == [{"model": "m", "epoch": epoch, "sha256": best}] and "epoch" not in summary
    assert report.epoch is None and report.submission.name == "ens_validation_ensemble.zip"
    assert f"with an ensemble of 1 model (m epoch {epoch})." in report.summary()


def _copy_run(trained, results_dir: Path, name: str = "m") -> TrainConfig:
    """The trained model's checkpoints in a run folder of its own (its predictions apart from the fixture's)."""
    shutil.copytree(RunFolder(trained.run_dir).models, results_dir / name / "models")
    return dataclasses.replace(trained, results_dir=str(results_dir), model_name=name)


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def _assert_scores_describe_the_csvs(config, folder: Path, epoch: int) -> None:
    """The folder's scores.json is its own CSVs' scores (openkbp-score's, exactly) and names its epoch."""
    summary = json.loads((folder / "scores.json").read_text())
    standalone = score_prediction_folder(Path(config.data_dir) / "validation-pats", folder, cache_dir=config.cache_dir,
                                         site=openkbp())
    assert summary["epoch"] == epoch and (folder / f"m_validation_epoch_{epoch}.zip").is_file()
    assert (summary["dose_score"], summary["dvh_score"]) == (standalone.dose_score, standalone.dvh_score)


# Runs `--predict-only` with every prediction CSV followed by a pause and a line in a marker file,
# so that the test can kill it between two CSVs (the patch is the test's, not the library's).
SLOW_PREDICT = textwrap.dedent("""
    import sys, time
    from pathlib import Path

    import provided_code.data.csv_io as csv_io

    real, written = csv_io.write_dose_csv, []

    def write_then_wait(path, *args, **kwargs):
        real(path, *args, **kwargs)
        written.append(str(path))
        Path(sys.argv[1]).write_text("\\n".join(written))
        time.sleep(120)

    csv_io.write_dose_csv = write_then_wait  # before provided_code.apps.predict binds it
    from provided_code.apps.cli import main

    main(sys.argv[2:])
""")


@pytest.mark.slow
def test_a_killed_predict_only_leaves_the_previous_complete_set_and_the_next_run_tidies(trained, tmp_path):
    config = _copy_run(trained, tmp_path / "results")
    folder = config.run_dir / "validation-predictions"
    predict(config, stage="validation", epoch=1)
    previous = _files(folder)
    _assert_scores_describe_the_csvs(config, folder, epoch=1)

    marker = tmp_path / "written.txt"
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_PREDICT, str(marker), "--predict-only", "--stage", "validation", "--epoch", "2",
         "--data-dir", config.data_dir, "--results-dir", config.results_dir, "--model-name", "m",
         "--cache-dir", config.cache_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), process.communicate()[1] if process.poll() is not None else "no CSV in 240 s"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert len(marker.read_text().splitlines()) == 1  # killed with one CSV of epoch 2 written, one to go
    assert list(config.run_dir.glob(".validation-predictions.tmp-*"))  # where it was written

    assert _files(folder) == previous  # epoch 1's set, whole: CSVs, zip and its scores
    _assert_scores_describe_the_csvs(config, folder, epoch=1)

    report = predict(config, stage="validation", epoch=2)  # the next run removes what the killed one left
    assert not [path.name for path in config.run_dir.iterdir() if path.name.startswith(".validation-predictions")]
    assert report.scores_path == folder / "scores.json" and sorted(_files(folder)) == [
        "m_validation_epoch_2.zip", "pt_201.csv", "pt_202.csv", "scores.csv", "scores.json"]
    assert _files(folder)["pt_201.csv"] != previous["pt_201.csv"]
    _assert_scores_describe_the_csvs(config, folder, epoch=2)


@pytest.mark.slow
def test_start_over_moves_the_abandoned_models_predictions_and_scores_aside(run):
    config = run  # with the run's validation and test predictions
    train(TrainConfig(**LIGHT_BODY, filters=4, resolution=32, epochs=1, score_every=0, xla="off", data_dir=config.data_dir,
                      results_dir=config.results_dir, model_name="m", cache_dir=config.cache_dir), start_over=True)
    keras.backend.clear_session()
    (abandoned,) = config.run_dir.glob("abandoned-*")
    assert sorted(path.name for path in (abandoned / "validation-predictions").iterdir()) == [
        "m_validation_epoch_2.zip", "pt_201.csv", "pt_202.csv", "scores.csv", "scores.json"]
    assert (abandoned / "test-predictions" / "m_test_epoch_2.zip").is_file()
    assert not (config.run_dir / "validation-predictions").exists()
    assert not (config.run_dir / "test-predictions").exists()


@pytest.mark.slow
def test_a_stage_where_only_some_patients_have_reference_doses_scores_those(trained, tmp_path):
    data = Path(shutil.copytree(trained.data_dir, tmp_path / "data"))
    (data / "validation-pats" / "pt_202" / "dose.csv").unlink()
    config = dataclasses.replace(_copy_run(trained, tmp_path / "results"), data_dir=str(data),
                                 cache_dir=str(tmp_path / "cache"))  # its own: another split to cache
    report = predict(config, stage="validation")
    assert report.scores.patient_ids == ["pt_201"] and report.scores.without_reference == ["pt_202"]
    assert "Scored the 1 of 2 patients that have a reference dose (none for pt_202)." in report.summary()
    # the challenge's order: the dose score, then the DVH score; then the one line on why no bands
    assert len(report.trust) == 1 and report.trust[0].startswith("No prediction bands")
    assert report.summary().splitlines()[-2] == (f"dose score {report.scores.dose_score:.4f} Gy, "
                                                 f"DVH score {report.scores.dvh_score:.4f} Gy")
    summary = json.loads(report.scores_path.read_text())
    assert summary["patients"] == 1 and summary["patients_without_reference_dose"] == ["pt_202"]
    standalone = score_prediction_folder(data / "validation-pats", report.predictions_dir, cache_dir=config.cache_dir,
                                         site=openkbp())
    assert standalone.dose_score == report.scores.dose_score and standalone.patient_ids == ["pt_201"]


@pytest.mark.slow
def test_an_ensemble_member_still_training_refuses_it_and_ensembles_share_a_member(trained, tmp_path):
    for name in ("a", "b"):
        _copy_run(trained, tmp_path / "results", name)
    ensemble = dataclasses.replace(trained, results_dir=str(tmp_path / "results"), model_name="ens")
    member = tmp_path / "results" / "b"
    with RunFolder(member).lock("training"):
        with pytest.raises(RunLockedError) as caught:
            predict(ensemble, stage="validation", ensemble=["a", "b"])
    message = str(caught.value)
    assert message.startswith(f"{member} is in use by another run (pid ") and "training since" in message
    assert "\n" not in message and not (ensemble.run_dir / "validation-predictions").exists()
    with RunFolder(member).lock("read by the ensemble 'other'", shared=True):  # another ensemble reading b meanwhile
        report = predict(ensemble, stage="validation", ensemble=["a", "b"])
    assert [m["model"] for m in json.loads(report.scores_path.read_text())["members"]] == ["a", "b"]
    with RunFolder(member).lock("training"):  # released when the ensemble is done
        pass


@pytest.mark.slow
def test_predictions_above_the_sites_plausible_ceiling_are_warned_of_in_the_log_the_summary_and_the_scores(
        run, monkeypatch, caplog):
    """A badly trained model's doses (the run's plus 860 Gy inside the body) are written and scored as
    always, and each patient above OpenKBP's ceiling (1.3 × 70 Gy) is named in the log, the summary
    and scores.json."""
    import logging

    from provided_code.deployed_model import DeployedModel

    predict_doses = DeployedModel.predict

    def implausible(self, arrays, *args, **kwargs):
        return predict_doses(self, arrays, *args, **kwargs) + np.where(arrays.possible_dose_mask, 860, 0).astype(
            np.float32)

    monkeypatch.setattr(DeployedModel, "predict", implausible)
    with caplog.at_level(logging.WARNING, logger="provided_code"):
        report = predict(run, stage="validation")
    found = json.loads(report.scores_path.read_text())["dose_ceiling"]
    assert found["ceiling_gy"] == pytest.approx(91.0) and sorted(found["above"]) == ["pt_201", "pt_202"]
    assert all(entry["max_gy"] > 91 and entry["voxels"] > 0 for entry in found["above"].values())
    warned = [r.getMessage() for r in caplog.records if "plausible ceiling" in r.getMessage()]
    assert [line.split(":")[0] for line in warned] == ["pt_201", "pt_202"]
    assert warned[0].startswith(f"pt_201: predicted dose above the plausible ceiling: "
                                f"{found['above']['pt_201']['max_gy']:.1f} Gy at most, over 91 Gy")
    assert all(f"Warning: {line}" in report.summary() for line in warned)


@pytest.mark.slow
def test_plan_files_a_model_of_run_wide_beams_does_not_take_are_named_in_one_warning(trained, tmp_path, caplog):
    """A patient's beams.csv, predicted by a model trained on the run's angles: predicted as before
    (the run-wide beams), and one warning names the patient's file and why."""
    import logging

    from provided_code.data.patient_plan import write_beams

    data = Path(shutil.copytree(trained.data_dir, tmp_path / "data"))
    write_beams(data / "validation-pats" / "pt_202", [{"type": "static", "gantry_start": a} for a in (0.0, 90.0)])
    config = dataclasses.replace(_copy_run(trained, tmp_path / "results"), data_dir=str(data),
                                 cache_dir=str(tmp_path / "cache"))  # its own: another split to cache
    with caplog.at_level(logging.WARNING):
        predict(config, stage="validation")
    warnings = [r.getMessage() for r in caplog.records if "does not take" in r.getMessage()]
    assert warnings == [f"Model 'm' does not take the plan files of 1 patient (the first: "
                        f"{data / 'validation-pats' / 'pt_202' / 'beams.csv'}): beams.csv as it was trained with the "
                        f"run-wide beams (gantry 0,40,80,120,160,200,240,280,320°); those patients get the run-wide "
                        f"values"]


@pytest.mark.slow
def test_a_commissioned_models_folds_write_each_patients_bands_and_check_and_sum_them_up(
        commissioned_cv, phantom_data, phantom_cache, tmp_path):
    from provided_code.metrics.calibration import band
    from provided_code.metrics.scoring import dvh_metrics, structure_indices

    model = tmp_path / "results" / "cv"
    shutil.copytree(commissioned_cv, model)
    bands = json.loads((model / "commissioning" / "bands.json").read_text())
    cohort = json.loads((model / "commissioning" / "cohort.json").read_text())
    report = predict_stage_of(model, phantom_data, phantom_cache, band=0.5)  # 4 training patients: 60 % at most
    arrays = load_split(phantom_data / "validation-pats", cache_dir=phantom_cache, site=openkbp())
    site, held, p_values = arrays.site, [], {}
    for row, pid in enumerate(arrays.patient_ids):
        table = json.loads((report.predictions_dir / "dvh" / f"{pid}.json").read_text())
        csv = pd.read_csv(report.predictions_dir / "dvh" / f"{pid}.csv").set_index("structure")
        indices, values = read_sparse_csv(report.predictions_dir / f"{pid}.csv", pid, with_values=True)
        predicted = np.zeros(arrays.dose[row].size)
        predicted[indices] = values
        expected = dvh_metrics(lambda v: predicted[v], structure_indices(arrays.structure_masks[row], len(site.names)),
                               arrays.voxel_dimensions[row], site)
        for k, structure in enumerate(site.names):
            for m, metric in enumerate(site.metric_names):
                if np.isnan(expected[k, m]):
                    continue
                value = table["predicted"][structure][metric]
                assert value == pytest.approx(expected[k, m], rel=1e-12)
                low, high = band(value, bands["residuals"][structure][metric], 0.5)
                assert (table["band"]["low"][structure][metric], table["band"]["high"][structure][metric]) == (low, high)
                # the CSV keeps 3 decimals: half a unit of the last
                assert csv.loc[structure, [f"{metric}_low", f"{metric}_high"]].tolist() == pytest.approx(
                    [low, high], abs=5e-4)
        for structure, values in table["predicted"].items():  # the site's metrics and the clinical ones
            held += [table["band"]["low"][structure][metric] <= table["reference"][structure][metric]
                     <= table["band"]["high"][structure][metric] for metric in values]
        assert list(csv.columns[:4]) == ["D_0.1_cc_predicted", "D_0.1_cc_low", "D_0.1_cc_high", "D_0.1_cc_reference"]
        assert table["in_distribution"]["threshold"] == cohort["threshold"]
        p_values[pid] = table["in_distribution"]["p_value"]
    scores = json.loads(report.scores_path.read_text())
    assert scores["in_distribution"]["p_values"] == p_values and scores["in_distribution"]["alpha"] == cohort["alpha"]
    assert scores["band"]["coverage"] == 0.5 and scores["band"]["values"] == len(held)
    assert scores["band"]["observed"] == pytest.approx(np.mean(held))
    assert scores["in_distribution"]["patients"] == 2 and scores["in_distribution"]["threshold"] == cohort["threshold"]
    assert any(line.startswith("Bands of 50 % nominal coverage: the plans' values held") for line in report.trust)


@pytest.mark.slow
def test_a_model_without_commissioning_predicts_as_before_and_says_why_it_has_no_bands(
        cv_model, commissioned_cv, phantom_data, phantom_cache, tmp_path):
    """The same folds with and without commissioning: the same predictions, byte for byte, and the
    same scores; without, nothing more is written and one line says why."""
    plain, commissioned = tmp_path / "plain" / "cv", tmp_path / "commissioned" / "cv"
    shutil.copytree(cv_model, plain)
    shutil.copytree(commissioned_cv, commissioned)
    without = predict_stage_of(plain, phantom_data, phantom_cache)
    with_bands = predict_stage_of(commissioned, phantom_data, phantom_cache, band=0.5)
    assert sorted(p.name for p in without.predictions_dir.iterdir()) == sorted(
        p.name for p in with_bands.predictions_dir.iterdir() if p.name != "dvh")
    for path in without.predictions_dir.glob("pt_*.csv"):
        assert path.read_bytes() == (with_bands.predictions_dir / path.name).read_bytes()
    scores = json.loads(with_bands.scores_path.read_text())
    assert json.loads(without.scores_path.read_text()) == {key: value for key, value in scores.items()
                                                          if key not in ("band", "in_distribution")}
    assert without.trust == [f"No prediction bands or in-distribution check: cv is not commissioned (no "
                             f"{plain}/commissioning/bands.json): run openkbp-commission {plain}"]
    assert without.summary().endswith(without.trust[0])


def predict_stage_of(model, phantom_data, phantom_cache, **options):
    """The validation phantoms predicted by the folds of the cross-validated ``model`` together."""
    from provided_code.apps.predict import predict_stage

    report = predict_stage(model, phantom_data, stage="validation", ensemble=[model.name], cache_dir=phantom_cache,
                           **options)
    keras.backend.clear_session()
    return report


@pytest.mark.slow
def test_an_ensemble_of_two_bodies_averages_their_predictions(run):
    """--ensemble of a generator (the fixture's m) and a residual U-Net (r, 1 epoch): each member
    predicts with its own network and inputs; the ensemble writes their mean."""
    residual = dataclasses.replace(run, model_name="r", arch="resunet", filters=2, dropout=0.0,
                                   epochs=1, score_every=1)
    train(residual)
    singles = {"m": run.run_dir / "validation-predictions"}  # the fixture's, at its best epoch (2)
    singles["r"] = predict(residual, stage="validation", epoch="best").predictions_dir
    singles = {member: {path.name: read_sparse_csv(path, path.stem, True) for path in sorted(folder.glob("pt_*.csv"))}
               for member, folder in singles.items()}
    ensemble = predict(dataclasses.replace(run, model_name="both"), stage="validation", ensemble=["m", "r"])
    written = {path.name: read_sparse_csv(path, path.stem, True)
               for path in sorted(ensemble.predictions_dir.glob("pt_*.csv"))}
    assert sorted(written) == sorted(singles["m"]) and written
    for name, (indices, values) in written.items():
        (m_indices, m_values), (r_indices, r_values) = singles["m"][name], singles["r"][name]
        np.testing.assert_array_equal(indices, m_indices)
        np.testing.assert_array_equal(indices, r_indices)
        # each file holds float32 values exactly (their shortest round-trip decimal), read as float64: the
        # ensemble's float32 mean differs from the float64 mean of the members by float32 rounding
        np.testing.assert_allclose(values, (m_values + r_values) / 2, rtol=1e-6, atol=1e-5)
        assert not np.allclose(m_values, r_values)  # two networks, two predictions


def test_no_bands_line_is_printed_at_a_coverage_no_metric_has_patients_enough_for(tmp_path):
    """--band 0.999 of a model commissioned on 4 patients: no band can exist; the summary says why
    once, and does not say "Bands of 99.9 %"."""
    from provided_code.apps.predict import _trust_lines
    from provided_code.trust import Trust

    trust = Trust("cv", 0.999, bands={"patients": 4, "residuals": {"PTV70": {"D_95": [-2.0, -1.0, 0.5, 1.0]}}},
                  why_no_check="no cohort")
    summary = {"band": {"coverage": 0.999, "method": "split conformal", "calibration_patients": 4, "values": 0,
                        "observed": None, "median_width": None}}
    lines = _trust_lines(summary, trust, tmp_path)
    assert not any(line.startswith("Bands of") for line in lines)
    assert lines[0].startswith("No prediction bands at 99.9 % nominal coverage: a metric's residuals come from 4")
