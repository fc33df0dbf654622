"""Multi-device training on logical CPU devices, in fresh processes (the CPU can only be split
before TensorFlow starts)."""

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from click.testing import CliRunner

from provided_code.apps.cli import main
from provided_code.config import ConfigError, read_tf_config
from provided_code.run_folder import RunFolder
from provided_code.training.epoch_log import read_log
from provided_code.training.train import model_weights
from tests.conftest import REPO, linked_cache, log_epochs


def cli_command(phantom_data, tmp_path, *args):
    return [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(phantom_data),
            "--results-dir", str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache"),
            "--filters", "4", "--resolution", "32", "--save-every", "1", "--dropout", "0", *args]


def run_cli(phantom_data, tmp_path, *args, env=None, check=True):
    result = subprocess.run(cli_command(phantom_data, tmp_path, *args), capture_output=True, text=True, timeout=600,
                            env=env)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def run_cli_together(phantom_data, tmp_path, *arg_lists, here=None):
    """Independent runs side by side (their start-up is mostly single-threaded); all must succeed.
    ``here``: one more run of the command line, on one device, in this process meanwhile (the CPU
    is split into logical devices only before TensorFlow starts, so a run on several needs a
    process of its own; one on one device does not, and saves a TensorFlow start): its result
    comes last, its log in ``caplog``."""
    processes = [subprocess.Popen(cli_command(phantom_data, tmp_path, *args), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for args in arg_lists]
    results = []
    try:
        if here is not None:
            in_process = run_cli_here(phantom_data, tmp_path, *here)
    finally:
        for process in processes:
            stdout, stderr = process.communicate(timeout=600)
            assert process.returncode == 0, stderr[-4000:]
            results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results + ([in_process] if here is not None else [])


def run_cli_here(phantom_data, tmp_path, *args):
    """The command line ``cli_command`` runs, in this process (on one device): a CompletedProcess
    whose stdout is what the command printed, its stderr the library's log lines."""
    log, logger = io.StringIO(), logging.getLogger("provided_code")
    handler, level = logging.StreamHandler(log), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        result = CliRunner().invoke(main, cli_command(phantom_data, tmp_path, *args)[2:])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy("float32")
    assert result.exit_code == 0, (result.output, log.getvalue()[-4000:], result.exception)
    return subprocess.CompletedProcess(args, result.exit_code, result.output, log.getvalue())


def final_weights(results, name):
    _, model = RunFolder(results / name).load_newest()
    weights = model_weights(model)
    keras.backend.clear_session()
    return weights


FULL_AUGMENT = ("--augment", "flip,rotate,shift", "--loss", "masked-mae")
# For the processes that compile with XLA: its LLVM back end without optimisation passes. These
# tests check what is compiled and what it computes, not how fast the machine code runs, and the
# step compiles in about half the time.
QUICK_XLA = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip())
NO_SCORING = ("--score-every", "0")


@pytest.mark.slow
def test_two_replicas_of_batch_one_equal_one_device_of_batch_two(phantom_data, phantom_cache, tmp_path):
    """Synchronised batch norm (XLA off: its all-reduce cannot be compiled): two replicas give the
    weights one device gives. Augmentation is drawn per update and split between replicas like the
    patients, so it too gives the same weights. The same with XLA, instance norm and recomputation:
    INSTANCE_NORM_PROBE below at 16³; the command line with XLA in the next test. The runs on two
    replicas are processes of their own, those on one device run in this process meanwhile."""
    linked_cache(phantom_cache, tmp_path / "cache")
    recipe = ("--epochs", "2", "--xla", "off", *FULL_AUGMENT, "--norm", "batch")
    two, one = run_cli_together(phantom_data, tmp_path,
                                ("--model-name", "two", "--devices", "2", "--batch-size", "1", *recipe),
                                here=("--model-name", "one", "--devices", "1", "--batch-size", "2", *recipe))
    assert "batch 1 per device × 2 replica(s) = 2 global" in two.stderr
    assert "MirroredStrategy over 2 logical CPU devices" in two.stderr and "XLA off" in two.stderr
    assert "batch 2 per device × 1 replica(s) = 2 global" in one.stderr
    assert "CPU kernels: oneDNN" in two.stderr
    # Not a terminal: one plain line per epoch, no progress-bar frames or control characters.
    assert "epoch 2/2: loss" in two.stderr and "━" not in two.stdout
    assert "\r" not in two.stdout + two.stderr and "\x08" not in two.stdout + two.stderr
    results = tmp_path / "results"
    for name in ("two", "one"):
        assert log_epochs(results / name) == [1, 2]
        assert sorted(os.listdir(results / name / "models")) == ["best.json", "best.keras", "config.json",
                                                                  "epoch_1.keras", "epoch_2.keras"]
    # No dropout: only the summation order of the all-reduce and of batch norm's synchronised
    # statistics differs (float32, ~1e-7 relative per sum); 4 updates keep the weights within 1e-5.
    for x, y in zip(final_weights(results, "two"), final_weights(results, "one")):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)
    # The chief scores on two replicas as on one: the same weights (above) predict doses within
    # ~1e-5 Gy of each other, so the scores (tens of Gy) agree to 1e-4 relative with room to spare.
    scores = [read_log(results / name / "training_log.csv")[-1]["val_dose_score"] for name in ("two", "one")]
    assert float(scores[0]) == pytest.approx(float(scores[1]), rel=1e-4)
    # A 2-replica run resumes on one device, and a 1-device run on two.
    resume = ("--epochs", "3", *FULL_AUGMENT, *NO_SCORING, "--norm", "batch")
    one, two = run_cli_together(phantom_data, tmp_path,
                                ("--model-name", "one", "--devices", "2", "--batch-size", "1", *resume),
                                here=("--model-name", "two", "--devices", "1", "--batch-size", "2", *resume))
    assert "Resuming two from epoch 2" in two.stderr and "Resuming one from epoch 2" in one.stderr
    assert "batch 1 per device × 2 replica(s)" in one.stderr and "batch 2 per device × 1 replica(s)" in two.stderr
    assert log_epochs(results / "two") == [1, 2, 3] and log_epochs(results / "one") == [1, 2, 3]


@pytest.mark.slow
def test_xla_with_recomputation_trains_from_the_command_line(phantom_data, phantom_cache, tmp_path):
    """XLA from the command line: the whole step compiled (instance norm), its blocks recomputed, one
    epoch of two updates (XLA:CPU steps take seconds). On one device, compiled once; the step on two
    replicas, compiled and recomputed, equals one device in INSTANCE_NORM_PROBE below (16³). A
    process of its own: XLA on, without the deterministic ops this process's other runs turned on."""
    linked_cache(phantom_cache, tmp_path / "cache")
    run = run_cli(phantom_data, tmp_path, "--model-name", "xla", "--devices", "1", "--batch-size", "2", "--epochs", "1",
                  "--xla", "on", *FULL_AUGMENT, *NO_SCORING, "--recompute", "--norm", "instance", env=QUICK_XLA)
    assert "XLA on (--xla on; on a CPU XLA measured far slower than oneDNN)" in run.stderr
    assert "recomputing block activations in the backward pass" in run.stderr
    results = tmp_path / "results"
    assert log_epochs(results / "xla") == [1]
    assert sorted(os.listdir(results / "xla" / "models")) == ["config.json", "epoch_1.keras"]
    assert all(np.all(np.isfinite(w)) for w in final_weights(results, "xla"))


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(phantom_data, tmp_path, name, *args):
    ports = free_ports(2)
    workers = []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                                    "task": {"type": "worker", "index": index}}))
        command = [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(phantom_data),
                   "--results-dir", str(tmp_path / "results"), "--cache-dir", str(tmp_path / f"cache{index}"),
                   "--filters", "4", "--resolution", "32", "--dropout", "0", "--batch-size", "1",
                   "--model-name", name, "--multi-worker", *args]
        log = open(tmp_path / f"{name}-worker{index}.log", "w+")
        workers.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    return workers


def output(worker):
    process, log = worker
    log.seek(0)
    return log.read()


@pytest.mark.slow
def test_two_workers_train_in_step_then_survive_a_lost_worker(phantom_data, phantom_cache, tmp_path):
    for cache in ("cache0", "cache1", "cache"):  # each worker's own, as on two machines; the resume's
        linked_cache(phantom_cache, tmp_path / cache)
    workers = start_workers(phantom_data, tmp_path, "mw", "--epochs", "2", "--save-every", "1")
    for process, _ in workers:
        assert process.wait(timeout=300) == 0, output(workers[0])[-3000:] + output(workers[1])[-3000:]
    chief, other = output(workers[0]), output(workers[1])
    assert "worker 0 of 2 (chief)" in chief and "worker 1 of 2 (not chief)" in other
    assert "batch 1 per device × 2 replica(s) = 2 global" in chief
    fingerprints = [re.search(r"Weights fingerprint (\w+)", text).group(1) for text in (chief, other)]
    # exact: both workers apply the same all-reduced gradients to the same weights with the same ops on one
    # machine; a difference means they fell out of step, not rounding.
    assert fingerprints[0] == fingerprints[1]
    results = tmp_path / "results"
    assert log_epochs(results / "mw") == [1, 2]
    assert [e for e, _ in RunFolder(results / "mw").checkpoints()] == [2, 1]
    assert chief.count("Saved checkpoint") == 2 and "Saved checkpoint" not in other

    # A worker dies mid-run: the other stops with a clear error within the collective timeout.
    workers = start_workers(phantom_data, tmp_path, "lost", "--epochs", "400", "--save-every", "2", "--score-every", "0",
                            "--collective-timeout", "10")
    log = results / "lost" / "training_log.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (log.exists() and len(log.read_text().splitlines()) > 3):  # 3 epochs
        time.sleep(0.1)
    assert workers[0][0].poll() is None, output(workers[0])[-3000:]
    workers[1][0].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    code = workers[0][0].wait(timeout=120)
    waited = time.monotonic() - killed_at
    survivor = output(workers[0])
    assert code == 1 and "Multi-worker training stopped: a worker failed or stopped answering" in survivor
    assert "Traceback" not in survivor and waited < 60
    newest = RunFolder(results / "lost").checkpoints()[0][0]

    # Resume on one device from the multi-worker run's checkpoints (in this process: one device).
    resumed = run_cli_here(phantom_data, tmp_path, "--model-name", "lost", "--batch-size", "2", "--epochs", str(newest + 1))
    assert f"Resuming lost from epoch {newest}" in resumed.stderr
    assert log_epochs(results / "lost") == list(range(1, newest + 2))


@pytest.mark.parametrize("tf_config, problem", [
    ("{not json", "not JSON"),
    ('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}', "no task"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}', "task.index must be 0..0"),
    ('{"task": {"type": "worker", "index": 0}}', "cluster.worker"),
])
def test_bad_tf_config_is_named(tf_config, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        read_tf_config({"TF_CONFIG": tf_config})


def test_bad_tf_config_is_a_one_line_error(phantom_data, tmp_path):
    env = dict(os.environ, TF_CONFIG="{not json")
    result = run_cli(phantom_data, tmp_path, "--model-name", "mw", "--multi-worker", "--epochs", "1",
                     env=env, check=False)
    assert result.returncode == 1 and "Invalid TF_CONFIG: not JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cache").exists()  # before the data was touched


def test_bad_devices_value_is_clear(phantom_data, tmp_path):
    result = run_cli(phantom_data, tmp_path, "--model-name", "bad", "--devices", "zero", check=False)
    assert result.returncode == 1 and "Invalid `devices`" in result.stderr


def test_replicas_agree_on_a_large_epoch_and_see_a_difference():
    """float32 sums were exact only while replicas × epoch² < 2²⁴: 3 replicas at epoch 2401 were refused."""
    probe = ("from provided_code.infra.environment import configure_tensorflow; configure_tensorflow()\n"
             "import tensorflow as tf\n"
             "from provided_code.training.strategy import make_placement\n"
             "strategy = make_placement('3').strategy\n"
             "from provided_code.training.train import replicas_agree\n"
             "same = replicas_agree(strategy, lambda: tf.constant(2401, tf.int64))\n"
             "def differ():\n"
             "    replica = tf.distribute.get_replica_context().replica_id_in_sync_group\n"
             "    return 2401 + tf.cast(tf.equal(replica, 2), tf.int64)\n"
             "print('RESULT', same, replicas_agree(strategy, differ))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "RESULT (True, 2401.0) (False, " in result.stdout, result.stderr[-2000:]


INSTANCE_NORM_PROBE = """
import numpy as np
from provided_code.infra.environment import configure_tensorflow
configure_tensorflow()
import keras, tensorflow as tf
from provided_code.training.strategy import make_placement
two = make_placement("2").strategy
one = tf.distribute.OneDeviceStrategy("/cpu:0")
from provided_code.data.tf_dataset import take_element
from provided_code.losses import mean_absolute_error
from provided_code.training.model import new_model
from provided_code.training.step import TrainStep
from tests.conftest import network_config

rng = np.random.default_rng(0)
class Arrays:
    ct = rng.integers(0, 4096, (4, 16, 16, 16)).astype(np.uint16)
    structure_masks = rng.integers(0, 1024, (4, 16, 16, 16)).astype(np.uint16)
    dose = rng.uniform(0, 70, (4, 16, 16, 16)).astype(np.float32)

def run(strategy, batch, xla, recompute=False):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = new_model(network_config(resolution=16, filters=2, dropout=0.0, norm="instance", learning_rate=1e-3))
        model.optimizer.build(model.trainable_variables)
    step = TrainStep(model, strategy, batch, xla=xla, recompute=recompute, loss_fn=mean_absolute_error)
    losses = []
    for rows in ([0, 1], [2, 3]):
        per_replica = np.array(rows).reshape(strategy.num_replicas_in_sync, batch)
        element = strategy.experimental_distribute_values_from_function(lambda context: take_element(
            Arrays, per_replica[context.replica_id_in_sync_group], np.full(batch, 0.5, np.float32)))
        losses.append(float(step.train(element)))
    whole = bool(getattr(step._loss_and_grads, "_jit_compile", False))
    return losses, [np.array(w) for w in model.weights], whole

one_losses, one_weights, _ = run(one, 2, xla=False)
two_losses, two_weights, whole = run(two, 1, xla=True, recompute=True)
keras.backend.clear_session()
with two.scope():  # synchronised batch norm on two replicas: XLA is refused for the step, not half-applied
    bn = new_model(network_config(resolution=16, filters=2, norm="batch"))
print("BATCH_NORM_COMPILED", bool(getattr(TrainStep(bn, two, 1, xla=True, loss_fn=mean_absolute_error)._loss_and_grads,
                                           "_jit_compile", False)))
again, _, _ = run(one, 2, xla=False, recompute=True)
worst = max(float(np.abs(a - b).max()) for a, b in zip(one_weights, two_weights))
# Tolerances: XLA fuses and reorders float32 sums (convolutions, instance norm, the all-reduce), ~1e-7
# relative each; over two updates the losses agree to 1e-5 relative and the weights to 1e-5.
print("RESULT", whole, np.allclose(one_losses, two_losses, rtol=1e-5), worst < 1e-5,
      np.allclose(again, one_losses, rtol=1e-5), one_losses[0] != one_losses[1])
"""


def test_instance_norm_compiles_the_whole_replica_step_and_two_replicas_equal_one_device():
    result = subprocess.run([sys.executable, "-c", INSTANCE_NORM_PROBE], capture_output=True, text=True, timeout=240,
                            env=QUICK_XLA)
    assert "RESULT True True True True True" in result.stdout, (result.stdout[-500:], result.stderr[-3000:])
    assert "BATCH_NORM_COMPILED False" in result.stdout
    assert "XLA off for the training step: batch norm synchronised over 2 replicas" in result.stderr
