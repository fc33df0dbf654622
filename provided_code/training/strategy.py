"""Choosing the ``tf.distribute`` strategy: one device, several GPUs of one machine, or several machines.

On a machine without GPUs, ``devices > 1`` splits the processor into that many logical CPU
devices: a testing aid that runs the same MirroredStrategy code path as that many GPUs.
Several machines: ``MultiWorkerMirroredStrategy`` from the standard ``TF_CONFIG``; worker 0 is
the chief, the only one that writes checkpoints and logs.
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf

from provided_code.config import ConfigError


@dataclasses.dataclass
class Placement:
    strategy: tf.distribute.Strategy
    description: str
    replicas: int  # in sync, over every worker
    is_chief: bool = True  # writes checkpoints, logs and TensorBoard
    workers: int = 1


def read_tf_config(environ=os.environ) -> tuple[list[str], int]:
    """``(worker addresses, this worker's index)`` from ``TF_CONFIG``; a one-line ConfigError if bad."""
    text = environ.get("TF_CONFIG")
    if not text:
        raise ConfigError("--multi-worker needs TF_CONFIG, e.g. TF_CONFIG='{\"cluster\": {\"worker\": "
                          "[\"hostA:12345\", \"hostB:12345\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}' "
                          "(see the README)")
    try:
        spec = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"Invalid TF_CONFIG: not JSON ({error}). Received: TF_CONFIG={text!r}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"Invalid TF_CONFIG: expected a JSON object. Received: TF_CONFIG={text!r}")
    workers = (spec.get("cluster") or {}).get("worker") if isinstance(spec.get("cluster"), dict) else None
    if not (isinstance(workers, list) and workers and all(isinstance(w, str) and ":" in w for w in workers)):
        raise ConfigError(f"Invalid TF_CONFIG: expected cluster.worker, a list of \"host:port\". "
                          f"Received: cluster={spec.get('cluster')!r}")
    extra = sorted(set(spec["cluster"]) - {"worker"})
    if extra:
        raise ConfigError(f"Invalid TF_CONFIG: only \"worker\" tasks are used (worker 0 is the chief). "
                          f"Received cluster task types: {extra}")
    task = spec.get("task")
    if not isinstance(task, dict):
        raise ConfigError(f"Invalid TF_CONFIG: no task (expected \"task\": {{\"type\": \"worker\", \"index\": N}}). "
                          f"Received: TF_CONFIG={text!r}")
    if task.get("type") != "worker":
        raise ConfigError(f"Invalid TF_CONFIG: task.type must be \"worker\". Received: task={task!r}")
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
        raise ConfigError(f"Invalid TF_CONFIG: task.index must be 0..{len(workers) - 1} for "
                          f"{len(workers)} workers. Received: task={task!r}")
    return workers, index


def make_placement(devices: str, multi_worker: bool, collective_timeout: float = 600.0) -> Placement:
    """The strategy for ``--devices`` (``"1"``, ``"N"`` or ``"all"``) and ``--multi-worker``.

    Call before TensorFlow runs any op: splitting the CPU into logical devices, and joining a
    cluster, are only possible before its runtime starts.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if multi_worker:
        if devices != "1":
            raise ConfigError(f"Invalid `devices` with --multi-worker. Expected the default: each worker uses "
                              f"every GPU it sees (limit them with CUDA_VISIBLE_DEVICES). Received: devices={devices}")
        workers, index = read_tf_config()
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        replicas = strategy.num_replicas_in_sync
        local = f"{len(gpus)} GPU(s)" if gpus else "the CPU"
        return Placement(strategy, f"MultiWorkerMirroredStrategy, worker {index} of {len(workers)} "
                         f"({'chief' if index == 0 else 'not chief'}), {local} each", replicas,
                         is_chief=index == 0, workers=len(workers))
    count = max(1, len(gpus)) if devices == "all" else int(devices)
    if count == 1:
        return Placement(tf.distribute.get_strategy(), "one device", 1)
    if gpus:
        if count > len(gpus):
            raise ConfigError(f"Invalid `devices`. Expected at most the {len(gpus)} visible GPU(s). "
                              f"Received: devices={devices}")
        strategy = tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(count)])
        return Placement(strategy, f"MirroredStrategy over {count} GPUs", count)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        if len(tf.config.list_logical_devices("CPU")) != count:
            raise ConfigError(f"Cannot split the CPU into {count} logical devices: TensorFlow already "
                              f"started in this process ({error}).") from None
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(count)],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    return Placement(strategy, f"MirroredStrategy over {count} logical CPU devices (no GPU: a testing aid)", count)
