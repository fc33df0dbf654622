"""Choosing the ``tf.distribute`` strategy: one device, several GPUs of one machine, or several machines.

On a machine without GPUs, ``devices > 1`` splits the processor into that many logical CPU
devices: a testing aid that runs the same MirroredStrategy code path as that many GPUs.
Several machines: ``MultiWorkerMirroredStrategy`` from the standard ``TF_CONFIG``; worker 0 is
the chief, the only one that writes checkpoints and logs.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from provided_code.config import ConfigError
from provided_code.infra.tf_config import Cluster


@dataclasses.dataclass
class Placement:
    strategy: tf.distribute.Strategy
    description: str
    replicas: int  # in sync, over every worker
    is_chief: bool = True  # writes checkpoints, logs and TensorBoard
    workers: int = 1


def make_placement(devices: str, cluster: Cluster | None = None, collective_timeout: float = 600.0) -> Placement:
    """The strategy for ``--devices`` (``"1"``, ``"N"`` or ``"all"``), or with ``cluster``
    (``--multi-worker``: ``TF_CONFIG`` read) over its machines.

    Call before TensorFlow runs any op: splitting the CPU into logical devices, and joining a
    cluster, are only possible before its runtime starts.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if cluster is not None:
        if devices != "1":
            raise ConfigError(f"Invalid `devices` with --multi-worker. Expected the default: each worker uses "
                              f"every GPU it sees (limit them with CUDA_VISIBLE_DEVICES). Received: devices={devices}")
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        replicas = strategy.num_replicas_in_sync
        local = f"{len(gpus)} GPU(s)" if gpus else "the CPU"
        return Placement(strategy, f"MultiWorkerMirroredStrategy, worker {cluster.index} of {len(cluster.workers)} "
                         f"({'chief' if cluster.is_chief else 'not chief'}), {local} each", replicas,
                         is_chief=cluster.is_chief, workers=len(cluster.workers))
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
