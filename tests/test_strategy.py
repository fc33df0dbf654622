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
from provided_code.config import ConfigError
from provided_code.infra.tf_config import read_tf_config
from provided_code.run_folder import RunFolder
from provided_code.training.epoch_log import read_log
from provided_code.training.train import model_weights
from tests.kit.cache_files import linked_cache
from tests.kit.made_once import made_once
from tests.kit.repo import REPO
from tests.kit.runs import LIGHT_FLAGS, forget_models, log_epochs


def cli_command(phantom_data, tmp_path, *args):
    return [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(phantom_data),
            "--results-dir", str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache"),
            *LIGHT_FLAGS, "--filters", "4", "--resolution", "32", "--save-every", "1", "--dropout", "0", *args]


def run_cli(phantom_data, tmp_path, *args, env=None, check=True):
    result = subprocess.run(cli_command(phantom_data, tmp_path, *args), capture_output=True, text=True, timeout=600,
                            env=env)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


IN_TURN = """
import json, pathlib, sys, time
from provided_code.apps.cli import main
folder, runs = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2])
for k, args in enumerate(runs):
    deadline = time.monotonic() + 240
    while k and not (folder / f"go-{k}").exists():
        if time.monotonic() > deadline:
            sys.exit(f"run {k} was never let go")
        time.sleep(0.05)
    for stream in (sys.stdout, sys.stderr):
        print(f"=== run {k}", file=stream, flush=True)
    main(args, standalone_mode=False)
    import keras
    keras.backend.clear_session()
    (folder / f"ended-{k}").touch()
"""


class InTurn:
    """Runs of the command line (``runs``: their arguments) on several logical devices, one after
    the other in one process of their own (the CPU is split into logical devices only before
    TensorFlow starts, so they cannot run in the test's process; one TensorFlow start for them
    all). The first begins at once, each next one when the test lets it go (:meth:`go`), so that
    it may resume a model the test trained meanwhile. Use as a context manager: a test that fails
    midway stops the process."""

    def __init__(self, phantom_data, tmp_path, *runs):
        self.folder = tmp_path / "in-turn"
        self.folder.mkdir()
        self.runs = runs
        with open(self.folder / "stdout", "w") as stdout, open(self.folder / "stderr", "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", IN_TURN, str(self.folder),
                 json.dumps([cli_command(phantom_data, tmp_path, *args)[2:] for args in runs])],
                stdout=stdout, stderr=stderr, text=True, cwd=REPO)

    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        if kind is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        return False

    def log(self) -> str:
        return (self.folder / "stderr").read_text()

    def ended(self, k: int) -> None:
        """Wait (bounded) until run ``k`` has ended."""
        deadline = time.monotonic() + 240
        while not (self.folder / f"ended-{k}").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"run {k} did not end: {self.log()[-4000:]}")
            time.sleep(0.05)

    def go(self, k: int) -> None:
        """Let run ``k`` begin."""
        (self.folder / f"go-{k}").touch()

    def results(self) -> list[subprocess.CompletedProcess]:
        """Each run's output and log, once all have ended."""
        assert self.process.wait(timeout=300) == 0, self.log()[-4000:]
        stdout, stderr = (self.folder / "stdout").read_text(), self.log()
        outputs = zip(stdout.split("=== run ")[1:], stderr.split("=== run ")[1:])
        return [subprocess.CompletedProcess(args, 0, out, err) for args, (out, err) in zip(self.runs, outputs)]


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
        forget_models()
    assert result.exit_code == 0, (result.output, log.getvalue()[-4000:], result.exception)
    return subprocess.CompletedProcess(args, result.exit_code, result.output, log.getvalue())


def final_weights(results, name):
    _, model = RunFolder(results / name).load_newest()
    weights = model_weights(model)
    keras.backend.clear_session()
    return weights


FULL_AUGMENT = ("--augment", "flip,rotate,shift", "--loss", "masked-mae")
# For the processes that compile with XLA: its LLVM back end without optimisation passes, and XLA:CPU's
# older loop emitters for its fusions in place of the MLIR fusion emitters (their own lowering passes
# per fusion). These tests check what is compiled and what it computes, not how fast the machine code
# runs: the step compiles in about half the time without the optimisation passes, and without the
# MLIR emitters the two-device probe below took two thirds of its time again (AVX2 EPYC: the residual
# U-Net's replica steps 63 -> 38 s, the command line's 45 -> 28 s, the U-Net's 19 -> 12 s).
QUICK_XLA = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0 "
                                       f"--xla_cpu_use_fusion_emitters=false".strip())
NO_SCORING = ("--score-every", "0")


@pytest.mark.slow
def test_two_replicas_of_batch_one_equal_one_device_of_batch_two(phantom_data, phantom_cache, tmp_path):
    """Synchronised batch norm (XLA off: its all-reduce cannot be compiled): two replicas give the
    weights one device gives. Augmentation is drawn per update and split between replicas like the
    patients, so it too gives the same weights. The same with XLA, instance norm and recomputation:
    TWO_DEVICE_PROBE below, at 16³. The runs on two replicas share a process of their own
    (:class:`InTurn`), those on one device run in this process meanwhile."""
    linked_cache(phantom_cache, tmp_path / "cache")
    recipe = ("--epochs", "2", "--xla", "off", *FULL_AUGMENT, "--norm", "batch")
    resume = ("--epochs", "3", *FULL_AUGMENT, *NO_SCORING, "--norm", "batch")
    results = tmp_path / "results"
    with InTurn(phantom_data, tmp_path, ("--model-name", "two", "--devices", "2", "--batch-size", "1", *recipe),
                ("--model-name", "one", "--devices", "2", "--batch-size", "1", *resume)) as there:
        one = run_cli_here(phantom_data, tmp_path, "--model-name", "one", "--devices", "1", "--batch-size", "2", *recipe)
        there.ended(0)
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
        # A 2-replica run resumes on one device (here), and a 1-device run on two (there).
        there.go(1)
        two_resumed = run_cli_here(phantom_data, tmp_path, "--model-name", "two", "--devices", "1", "--batch-size",
                                   "2", *resume)
        two, one_resumed = there.results()
    assert "batch 1 per device × 2 replica(s) = 2 global" in two.stderr
    assert "MirroredStrategy over 2 logical CPU devices" in two.stderr and "XLA off" in two.stderr
    assert "batch 2 per device × 1 replica(s) = 2 global" in one.stderr
    assert "CPU kernels: oneDNN" in two.stderr
    # Not a terminal: one plain line per epoch, no progress-bar frames or control characters.
    assert "epoch 2/2: loss" in two.stderr and "━" not in two.stdout
    assert "\r" not in two.stdout + two.stderr and "\x08" not in two.stdout + two.stderr
    assert "Resuming two from epoch 2" in two_resumed.stderr and "Resuming one from epoch 2" in one_resumed.stderr
    assert "batch 1 per device × 2 replica(s)" in one_resumed.stderr
    assert "batch 2 per device × 1 replica(s)" in two_resumed.stderr
    assert log_epochs(results / "two") == [1, 2, 3] and log_epochs(results / "one") == [1, 2, 3]


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
                   *LIGHT_FLAGS, "--filters", "4", "--resolution", "32", "--dropout", "0", "--batch-size", "1",
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


TWO_DEVICE_PROBE = """
import sys
from types import SimpleNamespace
import numpy as np
from provided_code.infra.environment import configure_tensorflow
configure_tensorflow()
import keras, tensorflow as tf
from provided_code.training.strategy import make_placement
two = make_placement("2").strategy
one = tf.distribute.OneDeviceStrategy("/cpu:0")
from provided_code.apps.cli import main
from provided_code.data.batches import fit_vectors
from provided_code.data.tf_dataset import take_element
from provided_code.losses import mean_absolute_error
from provided_code.training.model import new_model
from provided_code.training.step import TrainStep
from provided_code.training.train import replicas_agree
from tests.kit.runs import model_spec

# 1. Replicas agree on a large epoch and see a difference. float32 squares were exact only while
# v² < 2²⁴: at epoch 4097 two replicas disagreed with themselves.
same = replicas_agree(two, lambda: tf.constant(4097, tf.int64))
def differ():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return 4097 + tf.cast(tf.equal(replica, 1), tf.int64)
print("AGREE", same, replicas_agree(two, differ))

# 2. Instance norm: the whole replica step of the default body with the physics channel (its inputs:
# each patient's voxel size) compiled with XLA and recomputed on two replicas equals one device without
# either (at 16³). The generator's step on two replicas is compiled by the same TrainStep; the command
# line below compiles it on one device.
rng = np.random.default_rng(0)
ARRAYS = SimpleNamespace(  # four patients: fit_vectors gives each spec a copy with its vector inputs
    ct=rng.integers(0, 4096, (4, 16, 16, 16)).astype(np.uint16),
    structure_masks=np.where(rng.uniform(size=(4, 16, 16, 16)) < 0.2, 512, 0).astype(np.uint16),  # PTV70 voxels
    dose=rng.uniform(0, 70, (4, 16, 16, 16)).astype(np.float32),
    voxel_dimensions=np.array([[3.5, 3.5, 2.0], [3.0, 3.0, 2.5], [4.0, 4.0, 3.0], [3.2, 3.4, 2.0]], np.float32))

def run(strategy, batch, xla, spec, recompute=False):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = new_model(spec, 1e-3)
        model.optimizer.build(model.trainable_variables)
    step = TrainStep(model, strategy, batch, xla=xla, recompute=recompute, loss_fn=mean_absolute_error, spec=spec)
    arrays = fit_vectors(ARRAYS, spec.inputs)
    losses = []
    for rows in ([0, 1], [2, 3]):
        per_replica = np.array(rows).reshape(strategy.num_replicas_in_sync, batch)
        element = strategy.experimental_distribute_values_from_function(lambda context: take_element(
            arrays, per_replica[context.replica_id_in_sync_group], np.full(batch, 0.5, np.float32), spec.inputs))
        losses.append(float(step.train(element)))
    whole = bool(getattr(step._loss_and_grads, "_jit_compile", False))
    return losses, [np.array(w) for w in model.weights], whole

RESUNET = model_spec(resolution=16, filters=2, dropout=0.0, norm="instance", arch="resunet", physics=True)
one_losses, one_weights, _ = run(one, 2, xla=False, spec=RESUNET)
two_losses, two_weights, whole = run(two, 1, xla=True, recompute=True, spec=RESUNET)
worst = max(float(np.abs(a - b).max()) for a, b in zip(one_weights, two_weights))
# Tolerances: XLA fuses and reorders float32 sums (convolutions, instance norm, the all-reduce), ~1e-7
# relative each; over two updates the losses agree to 1e-5 relative and the weights to 1e-5.
print("RESUNET_PHYSICS", whole, np.allclose(one_losses, two_losses, rtol=1e-5), worst < 1e-5,
      one_losses[0] != one_losses[1])
# The generator with instance norm, recomputed on one device without XLA, equals it not recomputed.
GENERATOR = model_spec(resolution=16, filters=2, dropout=0.0, norm="instance")
plain, _, _ = run(one, 2, xla=False, spec=GENERATOR)
again, _, _ = run(one, 2, xla=False, recompute=True, spec=GENERATOR)
print("GENERATOR_RECOMPUTED", np.allclose(again, plain, rtol=1e-5), plain[0] != plain[1])
keras.backend.clear_session()
with two.scope():  # synchronised batch norm on two replicas: XLA is refused for the step, not half-applied
    bn = new_model(model_spec(resolution=16, filters=2, norm="batch"), 1e-3)
print("BATCH_NORM_COMPILED", bool(getattr(TrainStep(bn, two, 1, xla=True, loss_fn=mean_absolute_error,
                                                    spec=GENERATOR)._loss_and_grads, "_jit_compile", False)))
keras.backend.clear_session()

# 3. The command line with --xla on, on one device (this process's first): sys.argv[1:] its arguments.
print("CLI_STARTS", flush=True)
try:
    main(sys.argv[1:], standalone_mode=False)
    print("CLI_EXIT 0")
except Exception as error:
    print("CLI_EXIT 1", type(error).__name__, error)
"""


@pytest.fixture(scope="session")
def two_device_probe(phantom_data, phantom_cache, tmp_path_factory):
    """One process of two logical CPU devices that compiles with XLA (its LLVM unoptimised), run once
    per test run for the tests below (a TensorFlow start each, and XLA's, saved): the replicas'
    agreement check; the default body's whole replica step (instance norm, the physics channel)
    compiled and recomputed on two replicas against one device; the command line with XLA on one
    device (a process without the deterministic ops that runs without XLA turn on in this one). Its
    output, and the command line's results folder."""
    def make(folder):
        linked_cache(phantom_cache, folder / "cache")
        command = [sys.executable, "-c", TWO_DEVICE_PROBE, *cli_command(phantom_data, folder)[2:],
                   "--model-name", "xla", "--devices", "1", "--batch-size", "2", "--epochs", "1", "--xla", "on",
                   *FULL_AUGMENT, *NO_SCORING, "--recompute", "--norm", "instance"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=QUICK_XLA, cwd=REPO)
        (folder / "stdout.txt").write_text(result.stdout)
        (folder / "stderr.txt").write_text(result.stderr)

    folder = made_once(tmp_path_factory, "two-device-probe", make)
    stdout, stderr = (folder / "stdout.txt").read_text(), (folder / "stderr.txt").read_text()
    return subprocess.CompletedProcess([], 0, stdout, stderr), folder / "results"


@pytest.mark.slow
def test_replicas_agree_on_a_large_epoch_and_see_a_difference(two_device_probe):
    """float32 sums were exact only while v² < 2²⁴ (three replicas at epoch 2401 were refused); float64's are."""
    probe, _ = two_device_probe
    assert "AGREE (True, 4097.0) (False, " in probe.stdout, (probe.stdout[-500:], probe.stderr[-3000:])


@pytest.mark.slow
def test_instance_norm_compiles_the_whole_replica_step_and_two_replicas_equal_one_device(two_device_probe):
    """The default body (the residual U-Net) with instance norm and the physics channel: the replica
    step compiled with XLA and recomputed on two replicas against one device without either, at 16³;
    the generator recomputed on one device against not recomputed."""
    probe, _ = two_device_probe
    assert "RESUNET_PHYSICS True True True True" in probe.stdout, (probe.stdout[-500:], probe.stderr[-3000:])
    assert "GENERATOR_RECOMPUTED True True" in probe.stdout


@pytest.mark.slow
def test_batch_norm_synchronised_over_two_replicas_is_not_compiled(two_device_probe):
    probe, _ = two_device_probe
    assert "BATCH_NORM_COMPILED False" in probe.stdout, (probe.stdout[-500:], probe.stderr[-3000:])
    assert "XLA off for the training step: batch norm synchronised over 2 replicas" in probe.stderr


@pytest.mark.slow
def test_xla_with_recomputation_trains_from_the_command_line(two_device_probe):
    """XLA from the command line: the whole step compiled (instance norm), its blocks recomputed, one
    epoch of two updates (XLA:CPU steps take seconds). On one device, compiled once; the step on two
    replicas, compiled and recomputed, equals one device in the test above (16³)."""
    probe, results = two_device_probe
    assert "CLI_EXIT 0" in probe.stdout, (probe.stdout[-2000:], probe.stderr[-3000:])
    cli = probe.stderr[probe.stderr.find("XLA on (--xla on"):]  # the command line's log
    assert "XLA on (--xla on; on a CPU XLA measured far slower than oneDNN)" in cli
    assert "recomputing block activations in the backward pass" in cli
    assert log_epochs(results / "xla") == [1]
    assert sorted(os.listdir(results / "xla" / "models")) == ["config.json", "epoch_1.keras"]
    assert all(np.all(np.isfinite(w)) for w in final_weights(results, "xla"))
