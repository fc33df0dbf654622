"""Shared fixtures: the real OpenKBP sample (skipped when absent) and synthetic phantom splits."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pytest

from provided_code.environment import configure_tensorflow

configure_tensorflow()  # oneDNN CPU kernels for every test and the processes tests start (before TensorFlow loads)

from provided_code.data.phantoms import write_phantom_split  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DIR = Path(os.environ.get("OPENKBP_SAMPLE_DIR", Path(__file__).resolve().parents[2] / "shared" / "openkbp-sample"))

requires_sample = pytest.mark.skipif(
    not (SAMPLE_DIR / "train-pats").is_dir(),
    reason=f"real OpenKBP sample not found at {SAMPLE_DIR} (a fresh clone without ../shared); "
           "the phantom tests cover the same code paths",
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test writes to the user's real cache folder."""
    monkeypatch.setenv("OPENKBP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def reset_keras():
    """After the test: Keras's global dtype policy back to float32, its session cleared (for tests
    that build models in this process; use with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    yield
    import keras

    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session()


def network_config(**fields):
    """The network and optimizer settings of ``TrainConfig``'s defaults, with ``fields`` changed,
    without its checks (so that tests can build at 16³)."""
    import dataclasses
    import types

    from provided_code.config import TrainConfig

    return types.SimpleNamespace(**{**dataclasses.asdict(TrainConfig()), **fields})


def log_epochs(run_dir: Path) -> list[int]:
    """The epochs in a run's ``training_log.csv``, in order."""
    with open(Path(run_dir) / "training_log.csv", newline="") as handle:
        return [int(row["epoch"]) for row in csv.DictReader(handle)]


@pytest.fixture(scope="session")
def phantom_data(tmp_path_factory) -> Path:
    """A read-only data folder: train-pats/ (4 phantoms) and validation-pats/ (2 phantoms)."""
    root = tmp_path_factory.mktemp("phantom-data")
    write_phantom_split(root / "train-pats", 4, first_number=1)
    write_phantom_split(root / "validation-pats", 2, first_number=201)
    return root


@pytest.fixture(scope="session")
def _phantom_template(tmp_path_factory) -> Path:
    split = tmp_path_factory.mktemp("phantom-template") / "split"
    write_phantom_split(split, 3, first_number=1, seed=7)
    return split


@pytest.fixture
def phantom_split(tmp_path, _phantom_template) -> Path:
    """A writable split of 3 phantoms (pt_1, pt_2, pt_3), for tests that break files."""
    return Path(shutil.copytree(_phantom_template, tmp_path / "split"))


def pytest_collection_modifyitems(items):
    """The slow tests first (stable otherwise), so that the two workers finish together."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
