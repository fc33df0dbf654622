"""Choosing the ``tf.distribute`` strategy: one device, several GPUs, or several machines.

On a machine without GPUs, ``devices > 1`` splits the processor into that many logical CPU
devices: a testing aid that runs the same MirroredStrategy code path as that many GPUs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import tensorflow as tf

from provided_code.config import ConfigError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Placement:
    strategy: tf.distribute.Strategy
    description: str
    replicas: int  # in sync, over all workers
    worker_index: int  # this process's index among the workers (0 on one machine)
    workers: int
    is_chief: bool  # writes checkpoints, the log and the config

    @property
    def local_replicas(self) -> int:
        return self.replicas // self.workers


def make_placement(devices: str, multi_worker: bool) -> Placement:
    """The strategy for ``--devices`` (``"1"``, ``"N"`` or ``"all"``) and ``--multi-worker``.

    Call before TensorFlow runs any op: splitting the CPU into logical devices is only possible
    before its runtime starts.
    """
    if multi_worker:
        return _multi_worker()
    gpus = tf.config.list_physical_devices("GPU")
    if devices == "all":
        count = max(1, len(gpus))
    else:
        count = int(devices)
    if count == 1:
        return Placement(tf.distribute.get_strategy(), "one device", 1, 0, 1, True)
    if gpus:
        if count > len(gpus):
            raise ConfigError(f"Invalid `devices`. Expected at most the {len(gpus)} visible GPU(s). "
                              f"Received: devices={devices}")
        names = [f"/gpu:{i}" for i in range(count)]
        strategy = tf.distribute.MirroredStrategy(names)
        return Placement(strategy, f"MirroredStrategy over {count} GPUs", count, 0, 1, True)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        if len(tf.config.list_logical_devices("CPU")) != count:
            raise ConfigError(f"Cannot split the CPU into {count} logical devices: TensorFlow already "
                              f"started in this process ({error}).") from None
    names = [f"/cpu:{i}" for i in range(count)]
    strategy = tf.distribute.MirroredStrategy(names, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return Placement(strategy, f"MirroredStrategy over {count} logical CPU devices (no GPU: a testing aid)",
                     count, 0, 1, True)


def _multi_worker() -> Placement:
    if not os.environ.get("TF_CONFIG"):
        raise ConfigError("--multi-worker needs the TF_CONFIG environment variable (see the README).")
    try:
        tf_config = json.loads(os.environ["TF_CONFIG"])
        workers = len(tf_config["cluster"]["worker"]) + len(tf_config["cluster"].get("chief", []))
        task = tf_config["task"]
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"Invalid TF_CONFIG ({error}). Expected "
                          '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}') from None
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    has_chief = "chief" in tf_config["cluster"]
    index = task["index"] + (1 if has_chief and task["type"] == "worker" else 0)
    is_chief = task["type"] == "chief" or (not has_chief and task["index"] == 0)
    return Placement(strategy, f"MultiWorkerMirroredStrategy, worker {index} of {workers}",
                     strategy.num_replicas_in_sync, index, workers, is_chief)
