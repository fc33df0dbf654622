import re

import pytest
from click.testing import CliRunner

from provided_code.apps.demo import main


@pytest.mark.slow
def test_demo_runs_the_whole_pipeline_and_ends_with_the_dose_score(tmp_path):
    """The same code path as `bash scripts/demo`, smaller: phantoms, train, predict, score, plots."""
    result = CliRunner().invoke(main, ["--results-dir", str(tmp_path), "--train-patients", "4",
                                       "--validation-patients", "2", "--epochs", "3", "--filters", "4"])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert re.search(r"dose score \d+\.\d+ Gy", last)
    assert (tmp_path / "demo" / "validation-predictions" / "scores.json").exists()
    assert (tmp_path / "demo" / "models" / "best.keras").exists() and "best.keras, epoch" in result.output
    assert len(list((tmp_path / "demo" / "validation-predictions").glob("pt_*.csv"))) == 2
    assert len(list((tmp_path / "demo-data" / "train-pats").iterdir())) == 4


@pytest.mark.slow
def test_demo_on_the_prostate_site(tmp_path):
    """`--site prostate`: prostate phantoms (every fourth with a plan of its own), a model of that
    site, predictions and scores."""
    import json

    result = CliRunner().invoke(main, ["--results-dir", str(tmp_path), "--site", "prostate", "--train-patients", "4",
                                       "--validation-patients", "2", "--epochs", "2", "--filters", "4"])
    assert result.exit_code == 0, result.output
    assert re.search(r"dose score \d+\.\d+ Gy", result.output.strip().splitlines()[-1])
    data = tmp_path / "demo-data-prostate"
    assert (data / "train-pats" / "pt_4" / "beams.csv").exists()
    assert not (data / "train-pats" / "pt_3" / "beams.csv").exists()
    assert (data / "train-pats" / "pt_1" / "PTV78.csv").exists()
    config = json.loads((tmp_path / "demo-prostate" / "models" / "config.json").read_text())
    assert config["site"]["name"] == "prostate"
    assert (tmp_path / "demo-prostate" / "validation-predictions" / "scores.json").exists()


def test_demo_refuses_a_site_it_has_no_phantoms_for(tmp_path):
    site = tmp_path / "lung.json"
    site.write_text('{"name": "lung", "structures": [{"name": "Heart", "kind": "oar"}, '
                    '{"name": "PTV60", "kind": "target", "prescription_gy": 60}]}')
    result = CliRunner().invoke(main, ["--results-dir", str(tmp_path / "r"), "--site", str(site)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "Error: No phantoms for site lung: synthetic patients exist for the openkbp site and for sites with the " \
           "prostate's structures" in result.output
    assert not (tmp_path / "r" / "demo-data-lung" / "train-pats" / "pt_1").exists()
