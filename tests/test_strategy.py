"""Multi-device training on logical CPU devices, in fresh processes (the CPU can only be split
before TensorFlow starts)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np

from provided_code.training.checkpoints import list_checkpoints, load_newest
from provided_code.training.train import model_weights

REPO = Path(__file__).resolve().parents[1]


def run_cli(phantom_data, tmp_path, *args, env=None, check=True):
    command = [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(phantom_data),
               "--results-dir", str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache"),
               "--filters", "4", "--resolution", "32", "--no-xla", "--save-every", "1", "--dropout", "0", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def log_epochs(run_dir):
    with open(run_dir / "training_log.csv", newline="") as handle:
        return [int(row["epoch"]) for row in csv.DictReader(handle)]


def test_two_replicas_of_batch_one_equal_one_device_of_batch_two(phantom_data, tmp_path):
    two = run_cli(phantom_data, tmp_path, "--model-name", "two", "--devices", "2", "--batch-size", "1", "--epochs", "2")
    assert "batch 1 per device × 2 replica(s) = 2 global" in two.stderr
    assert "MirroredStrategy over 2 logical CPU devices" in two.stderr
    run_cli(phantom_data, tmp_path, "--model-name", "one", "--devices", "1", "--batch-size", "2", "--epochs", "2")
    results = tmp_path / "results"
    for name in ("two", "one"):
        assert log_epochs(results / name) == [1, 2]
        assert [e for e, _ in list_checkpoints(results / name / "models")] == [2, 1]
        assert sorted(os.listdir(results / name / "models")) == ["config.json", "epoch_1.keras", "epoch_2.keras"]
    _, a = load_newest(results / "two" / "models")
    _, b = load_newest(results / "one" / "models")
    keras.backend.clear_session()
    # Synchronised batch norm and no dropout: only the summation order of the all-reduce differs.
    for x, y in zip(model_weights(a), model_weights(b)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)

    # A 2-replica run resumes on one device, and a 1-device run on two.
    resumed = run_cli(phantom_data, tmp_path, "--model-name", "two", "--devices", "1", "--batch-size", "2",
                      "--epochs", "3")
    assert "Resuming two from epoch 2" in resumed.stderr
    assert log_epochs(results / "two") == [1, 2, 3]
    resumed = run_cli(phantom_data, tmp_path, "--model-name", "one", "--devices", "2", "--batch-size", "1",
                      "--epochs", "3")
    assert "Resuming one from epoch 2" in resumed.stderr
    assert log_epochs(results / "one") == [1, 2, 3]


def test_multi_worker_is_refused_with_the_reason(phantom_data, tmp_path):
    """Multi-worker training is blocked upstream (Keras 3.15 fit under MultiWorkerMirroredStrategy)."""
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                                 "task": {"type": "worker", "index": 0}}))
    result = run_cli(phantom_data, tmp_path, "--model-name", "mw", "--multi-worker", "--epochs", "1",
                     env=env, check=False)
    assert result.returncode == 1
    assert "--multi-worker is not available" in result.stderr and "keras-team/keras#20329" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_devices_value_is_clear(phantom_data, tmp_path):
    result = run_cli(phantom_data, tmp_path, "--model-name", "bad", "--devices", "zero", check=False)
    assert result.returncode == 1 and "Invalid `devices`" in result.stderr


def test_mixed_precision_under_two_replicas_and_xla_refused_clearly(phantom_data, tmp_path):
    result = run_cli(phantom_data, tmp_path, "--model-name", "fast", "--devices", "2", "--batch-size", "1",
                     "--epochs", "1", "--xla", "--precision", "mixed_float16")
    assert "dtype policy mixed_float16 (LossScaleOptimizer); XLA off" in result.stderr
    assert "XLA off: Keras 3's fit cannot jit-compile a step that spans several replicas" in result.stderr
    assert "MirroredStrategy over 2 logical CPU devices" in result.stderr
    assert log_epochs(tmp_path / "results" / "fast") == [1]
