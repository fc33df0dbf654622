import subprocess
import sys

import pytest

from tests.kit.cache_files import linked_cache
from tests.kit.repo import REPO, console_script


def run(*args, **kwargs):
    return subprocess.run([sys.executable, str(REPO / "runpod_train.py"), *args], capture_output=True, text=True,
                          timeout=300, **kwargs)


def test_help_answers_without_importing_tensorflow():
    probe = ("import sys, runpy; sys.argv = ['runpod_train.py', '--help']\n"
             "try:\n    runpy.run_path(%r, run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in ('tensorflow', 'keras', 'h5py') if m in sys.modules))"
             % str(REPO / "runpod_train.py"))
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "--filters INTEGER" in result.stdout and "--predict-only" in result.stdout
    assert "LOADED []" in result.stdout


def test_the_console_scripts_are_the_commands():
    for name, says in (("openkbp-train", "--predict-only"), ("openkbp-score", "--reference"),
                       ("openkbp-dicom", "predict")):
        result = subprocess.run([*console_script(name), "--help"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert f"Usage: {name} " in result.stdout and says in result.stdout


def test_commission_help_says_the_tolerances_and_their_defaults_without_importing_tensorflow():
    probe = ("import sys\nfrom provided_code.apps.cli import commission_command\n"
             "try:\n    commission_command(['--help'], prog_name='openkbp-commission')\n"
             "except SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in ('tensorflow', 'keras', 'h5py') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    said = " ".join(result.stdout.split())
    assert "--tolerances FILE" in said and "structure,metric,within_gy,fraction" in said
    assert ("each organ's Dmean within 3 Gy of the plan for 90 % of patients; each target's D95 within 3 Gy of the "
            "plan for 90 % of patients") in said
    assert "LOADED []" in result.stdout


@pytest.mark.parametrize("alpha", ["nan", "inf", "-nan"])
def test_commission_with_an_alpha_that_is_no_level_says_so_in_one_line(tmp_path, alpha):
    """click's FloatRange lets NaN through its bounds: the level's own check refuses it as the
    command's error, before any folder is read, not as a traceback."""
    from click.testing import CliRunner

    from provided_code.apps.cli import commission_command

    result = CliRunner().invoke(commission_command, [str(tmp_path / "cv"), "--alpha", alpha])
    assert result.exit_code == 2 if alpha == "inf" else result.exit_code == 1
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("Error: Invalid") and "alpha" in lines[-1]
    assert "cv, which does not exist" not in result.output


def test_missing_data_folder_says_where_data_comes_from(tmp_path):
    result = run("--data-dir", str(tmp_path / "nope"), "--results-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert result.returncode == 1
    assert "No training data" in result.stderr and "open-kbp" in result.stderr and "--data-dir" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_flag_value_is_a_clear_error(tmp_path):
    result = run("--filters", "0", cwd=tmp_path)
    assert result.returncode == 1
    assert "Invalid `filters`. Expected an integer >= 1. Received: filters=0" in result.stderr


def test_bad_recipe_values_are_clear_errors(tmp_path):
    result = run("--augment", "flip,spin", cwd=tmp_path)
    assert result.returncode == 1 and "Received: augment='flip,spin'" in result.stderr
    result = run("--predict-only", "--epoch", "last", cwd=tmp_path)
    assert result.returncode == 2 and "Expected a checkpoint epoch (an integer) or 'best'" in result.stderr
    result = run("--ensemble", "a,b", cwd=tmp_path)
    assert result.returncode == 2 and "Expected --predict-only with --ensemble" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_empty_ensemble_is_refused_not_read_as_the_model_alone(tmp_path):
    for members in ("", ",", "a,,b"):
        result = run("--predict-only", "--ensemble", members, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "Expected a comma list of trained runs' names, none empty" in result.stderr
    result = run("--ensemble", "", cwd=tmp_path)
    assert result.returncode == 2 and "Expected --predict-only with --ensemble" in result.stderr


def test_openkbp_score_prints_the_scores_before_a_json_that_cannot_be_written(phantom_split, tmp_path):
    import json

    from click.testing import CliRunner

    from provided_code.apps.cli import score_command
    from provided_code.data.csv_io import read_patient, write_dose_csv
    from provided_code.sites import openkbp

    for pid in ("pt_1", "pt_2", "pt_3"):
        write_dose_csv(tmp_path / "pred" / f"{pid}.csv", read_patient(phantom_split / pid, site=openkbp()).dose)
    result = CliRunner().invoke(score_command, ["--reference", str(phantom_split), "--predictions",
                                                str(tmp_path / "pred"), "--json", "/proc/nope/s.json",
                                                "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # not an OSError
    assert json.loads(result.stdout)["patients"] == 3
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: Could not write the scores to /proc/nope/s.json (they are printed above): ")
    assert "Traceback" not in result.stderr


def test_change_recipe_with_predict_only_is_refused_not_ignored(tmp_path):
    result = run("--predict-only", "--change-recipe", cwd=tmp_path)
    assert result.returncode == 2 and "Expected --change-recipe only when resuming training" in result.stderr


def test_init_from_with_predict_only_is_refused_not_ignored(tmp_path):
    result = run("--predict-only", "--init-from", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "Expected --init-from and --init-epoch only when training a new model" \
        in result.stderr


def test_exclude_with_predict_only_is_refused_not_ignored(tmp_path):
    (tmp_path / "exclude.csv").write_text("patient,reason\npt_1,replanned\n")
    result = run("--predict-only", "--exclude", str(tmp_path / "exclude.csv"), cwd=tmp_path)
    assert result.returncode == 2 and "Expected --exclude only when training" in result.stderr
    assert len([line for line in result.stderr.splitlines() if "Error" in line]) == 1


def test_the_finetune_preset_without_a_parent_is_warned_about(tmp_path):
    result = run("--preset", "finetune", "--data-dir", str(tmp_path / "none"), cwd=tmp_path)
    assert "Warning: --preset finetune without --init-from" in result.stderr and result.returncode == 1


def test_a_gantry_angle_outside_0_to_360_is_refused_in_one_line(tmp_path):
    result = run("--beam-angles", "400", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "Invalid `beam_angles`. Expected a comma list of distinct gantry angles in degrees, each in [0, 360)" \
        in result.stderr


def test_beams_that_contradict_the_beam_angles_are_refused_in_one_line(tmp_path):
    result = run("--beams", "5", "--beam-angles", "0,120,240", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert ("Invalid `beams`. Expected the number of --beam-angles (3: '0,120,240'), or --beam-angles alone. "
            "Received: beams=5") in result.stderr


def test_an_infinite_learning_rate_or_dvh_weight_is_refused(tmp_path):
    for flag, field in (("--learning-rate", "learning_rate"), ("--dvh-weight", "dvh_weight")):
        result = run(flag, "inf", cwd=tmp_path)
        assert result.returncode == 1 and f"Invalid `{field}`. Expected a finite number" in result.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_preset_run_resumes_with_the_bare_command_and_a_changed_recipe_is_refused_or_recorded(phantom_data,
                                                                                                phantom_cache, tmp_path):
    """Started with --preset starter plus a flag: the bare command (no recipe or network flags)
    resumes it; --preset v1 (another loss) is refused naming the field, and with --change-recipe
    it is applied and recorded in config.json's history."""
    from click.testing import CliRunner

    import provided_code.apps.cli as cli
    from provided_code.config import TrainConfig

    where = ["--data-dir", str(phantom_data), "--results-dir", str(tmp_path / "results"), "--model-name", "p",
             "--cache-dir", str(linked_cache(phantom_cache, tmp_path / "cache")), "--score-every", "0", "--save-every", "1"]
    saved = tmp_path / "results" / "p" / "models" / "config.json"
    started = CliRunner().invoke(cli.main, where + ["--preset", "starter", "--augment", "flip", "--filters", "4",
                                                    "--resolution", "32", "--xla", "off", "--epochs", "1"])
    assert started.exit_code == 0, started.output

    bare = CliRunner().invoke(cli.main, where + ["--epochs", "2"])
    assert bare.exit_code == 0, bare.output
    assert "Trained p from epoch 1 to 2" in bare.output
    config = TrainConfig.from_json(saved.read_text())
    assert (config.loss, config.augment, config.norm, config.beams, config.filters, config.history) == \
        ("mae", "flip", "batch", 0, 4, ())

    refused = CliRunner().invoke(cli.main, where + ["--preset", "v1", "--epochs", "3"])
    assert refused.exit_code == 1
    assert "with another recipe (loss: saved 'mae', requested 'masked-mae')" in refused.output
    assert "--change-recipe" in refused.output and TrainConfig.from_json(saved.read_text()) == config

    changed = CliRunner().invoke(cli.main, where + ["--preset", "v1", "--epochs", "3", "--change-recipe"])
    assert changed.exit_code == 0, changed.output
    config = TrainConfig.from_json(saved.read_text())
    assert config.loss == "masked-mae"
    assert config.history == ({"epoch": 3, "field": "loss", "from": "mae", "to": "masked-mae"},)


# -- the prostate site, end to end (runpod_train.py --site prostate) ---------------------------------
def _invoke(*args):
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    return CliRunner().invoke(cli.main, [str(a) for a in args])


def _run_copy(run_dir, tmp_path):
    """A writable copy of a shared run folder: ``(results dir, model name)``."""
    import shutil

    shutil.copytree(run_dir, tmp_path / "results" / run_dir.name)
    return tmp_path / "results", run_dir.name


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_prostate_run_learns_and_predict_only_scores_it(prostate_model, prostate_data, tmp_path):
    import csv
    import json

    from provided_code.sites import load_site

    saved = json.loads((prostate_model / "models" / "config.json").read_text())
    assert saved["site"] == load_site("prostate").to_dict()  # the whole site travels with the model
    with open(prostate_model / "training_log.csv", newline="") as handle:
        log = list(csv.DictReader(handle))
    assert len(log) == 5  # the masked loss falls over a short run, on the training and the validation patients
    assert float(log[-1]["loss"]) < 0.9 * float(log[0]["loss"])
    assert float(log[-1]["val_loss"]) < float(log[0]["val_loss"])

    results, name = _run_copy(prostate_model, tmp_path)
    result = _invoke("--predict-only", "--data-dir", prostate_data, "--results-dir", results, "--model-name", name,
                     "--cache-dir", tmp_path / "cache", "--stage", "validation", "--epoch", "5")
    assert result.exit_code == 0, result.output
    predictions = results / name / "validation-predictions"
    assert sorted(p.name for p in predictions.glob("pt_*.csv")) == ["pt_201.csv", "pt_202.csv"]
    summary = json.loads((predictions / "scores.json").read_text())
    assert summary["patients"] == 2 and 0 < summary["dose_score"] < 78 and summary["dvh_score"] > 0
    with open(predictions / "scores.csv", newline="") as handle:
        columns = next(csv.reader(handle))
    assert "PTV78_D_99_difference" in columns and "Rectum_mean_difference" in columns
    assert not any(column.startswith("PTV70") for column in columns)


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_a_prostate_model_refuses_openkbp_data_and_an_openkbp_site_flag(prostate_model, phantom_data, prostate_data,
                                                                        tmp_path):
    results, name = _run_copy(prostate_model, tmp_path)
    where = ("--results-dir", results, "--model-name", name, "--cache-dir", tmp_path / "cache", "--stage", "validation")
    for refused, says in ((_invoke("--predict-only", "--data-dir", phantom_data, *where),
                           "Brainstem.csv: not a structure of site prostate"),
                          (_invoke("--predict-only", "--data-dir", prostate_data, "--site", "openkbp", *where),
                           f"Expected the model's own site, prostate ({results / name / 'models' / 'config.json'}), "
                           f"or no --site. Received: site='openkbp'")):
        assert refused.exit_code == 1 and "Traceback" not in refused.output
        error = [line for line in refused.output.splitlines() if line.startswith("Error:")]
        assert len(error) == 1 and says in error[0], refused.output
    assert not (results / name / "validation-predictions").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("reset_keras")
def test_an_openkbp_model_refuses_prostate_data(tiny_model, prostate_data, tmp_path):
    results, name = _run_copy(tiny_model, tmp_path)
    refused = _invoke("--predict-only", "--data-dir", prostate_data, "--results-dir", results, "--model-name", name,
                      "--cache-dir", tmp_path / "cache", "--stage", "validation")
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    error = [line for line in refused.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "Bladder.csv: not a structure of site openkbp" in error[0], refused.output
    assert not (results / name / "validation-predictions").exists()
