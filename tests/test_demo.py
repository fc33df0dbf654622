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
