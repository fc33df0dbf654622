import os
import re

import pytest
from click.testing import CliRunner

from provided_code.apps.demo import main
from tests.kit.cache_files import linked_cache


@pytest.mark.slow
def test_demo_runs_the_whole_pipeline_and_ends_with_the_dose_score(phantom_data, phantom_cache, tmp_path):
    """The same code path as `bash scripts/demo`, smaller: phantoms, train, predict, score, plots.
    The demo writes only the phantoms it misses: its training phantoms are phantom_data's (the same
    seeds; their folder a link to it, so that they are found cached too), one validation phantom is
    there already and it writes the other."""
    data = tmp_path / "demo-data"
    data.mkdir()
    (data / "train-pats").symlink_to(phantom_data / "train-pats", target_is_directory=True)
    (data / "validation-pats" / "pt_201").mkdir(parents=True)
    for path in (phantom_data / "validation-pats" / "pt_201").iterdir():
        os.link(path, data / "validation-pats" / "pt_201" / path.name)
    linked_cache(phantom_cache, tmp_path / "cache")  # $OPENKBP_CACHE_DIR in the tests
    result = CliRunner().invoke(main, ["--results-dir", str(tmp_path), "--train-patients", "4",
                                       "--validation-patients", "2", "--epochs", "3", "--filters", "4",
                                       "--arch", "generator"])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert re.search(r"dose score \d+\.\d+ Gy", last)
    assert (tmp_path / "demo" / "validation-predictions" / "scores.json").exists()
    assert (tmp_path / "demo" / "models" / "best.keras").exists() and "best.keras, epoch" in result.output
    assert len(list((tmp_path / "demo" / "validation-predictions").glob("pt_*.csv"))) == 2
    assert len(list((data / "train-pats").iterdir())) == 4
    written = data / "validation-pats" / "pt_202"
    assert sorted(os.listdir(written)) == sorted(os.listdir(phantom_data / "validation-pats" / "pt_202"))
    assert (written / "ct.csv").read_bytes() == (phantom_data / "validation-pats" / "pt_202" / "ct.csv").read_bytes()


@pytest.mark.slow
def test_demo_on_the_prostate_site(prostate_data, tmp_path):
    """`--site prostate`: prostate phantoms (every fourth with a plan of its own), a model of that
    site, predictions and scores. The training phantoms are prostate_data's, which are what the
    demo writes (the same seeds and plans); it writes its one validation phantom, as prostate_data's."""
    import json

    data = tmp_path / "demo-data-prostate"
    data.mkdir()
    (data / "train-pats").symlink_to(prostate_data / "train-pats", target_is_directory=True)
    result = CliRunner().invoke(main, ["--results-dir", str(tmp_path), "--site", "prostate", "--train-patients", "4",
                                       "--validation-patients", "1", "--epochs", "2", "--filters", "4",
                                       "--arch", "generator"])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    scored = re.search(r"dose score (\d+\.\d+) Gy, DVH score \d+\.\d+ Gy on 1 held-out phantom(;.*)?$", last)
    assert scored  # two epochs of four filters may not have learned yet: then the line says so
    assert not scored[2] or scored[2].startswith("; WARNING: the model has")
    assert (data / "train-pats" / "pt_4" / "beams.csv").exists()
    assert not (data / "train-pats" / "pt_3" / "beams.csv").exists()
    assert (data / "train-pats" / "pt_1" / "PTV78.csv").exists()
    written, same = data / "validation-pats" / "pt_201", prostate_data / "validation-pats" / "pt_201"
    assert sorted(os.listdir(written)) == sorted(os.listdir(same))
    assert (written / "dose.csv").read_bytes() == (same / "dose.csv").read_bytes()
    config = json.loads((tmp_path / "demo-prostate" / "models" / "config.json").read_text())
    assert config["site"]["name"] == "prostate"
    assert (tmp_path / "demo-prostate" / "validation-predictions" / "scores.json").exists()


def test_demo_refuses_a_site_it_has_no_phantoms_for(tmp_path):
    site = tmp_path / "lung.json"
    site.write_text('{"name": "lung", "structures": [{"name": "Heart", "kind": "oar"}, '
                    '{"name": "PTV60", "kind": "target", "prescription_gy": 60}], "beams": {"type": "none"}}')
    result = CliRunner().invoke(main, ["--results-dir", str(tmp_path / "r"), "--site", str(site)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "Error: No phantoms for site lung: synthetic patients exist for the openkbp site and for sites with the " \
           "prostate's structures" in result.output
    assert not (tmp_path / "r" / "demo-data-lung" / "train-pats" / "pt_1").exists()


def test_the_last_line_warns_when_the_model_has_not_learned():
    from provided_code.apps.demo import learned_warning

    assert learned_warning(1.3, 4.86, 20) == ""
    hardly = learned_warning(3.0, 4.86, 20)
    assert hardly.startswith("; WARNING: the model has hardly learned: its dose score is more than 0.5 × predicting "
                             "zero dose everywhere's (4.860 Gy) after 20 epochs")
    assert "has not learned: its dose score is no better than predicting zero dose" in learned_warning(4.86, 4.86, 20)
