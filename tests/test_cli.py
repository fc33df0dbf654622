import subprocess
import sys

from tests.conftest import REPO


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

    from provided_code.cli import score_command
    from provided_code.data.csv_io import read_patient, write_dose_csv

    for pid in ("pt_1", "pt_2", "pt_3"):
        write_dose_csv(tmp_path / "pred" / f"{pid}.csv", read_patient(phantom_split / pid).dose)
    result = CliRunner().invoke(score_command, ["--reference", str(phantom_split), "--predictions",
                                                str(tmp_path / "pred"), "--json", "/proc/nope/s.json",
                                                "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # not an OSError
    assert json.loads(result.stdout)["patients"] == 3
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: Could not write the scores to /proc/nope/s.json (they are printed above): ")
    assert "Traceback" not in result.stderr
