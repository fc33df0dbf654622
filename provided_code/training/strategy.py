"""Choosing the ``tf.distribute`` strategy: one device or several GPUs of one machine.

On a machine without GPUs, ``devices > 1`` splits the processor into that many logical CPU
devices: a testing aid that runs the same MirroredStrategy code path as that many GPUs.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from provided_code.config import ConfigError

MULTI_WORKER_UNAVAILABLE = (
    "--multi-worker is not available: with Keras 3.15 and TensorFlow 2.21, Keras's fit fails under "
    "MultiWorkerMirroredStrategy (keras-team/keras#20329: it reduces the first (x, y) batch across "
    "workers; it reduces scalar step logs along axis 0; past those, tensors are mis-paired between "
    "workers). Use --devices N on one machine; see the README.")


@dataclasses.dataclass
class Placement:
    strategy: tf.distribute.Strategy
    description: str
    replicas: int  # in sync


def make_placement(devices: str, multi_worker: bool) -> Placement:
    """The strategy for ``--devices`` (``"1"``, ``"N"`` or ``"all"``) and ``--multi-worker``.

    Call before TensorFlow runs any op: splitting the CPU into logical devices is only possible
    before its runtime starts.
    """
    if multi_worker:
        raise ConfigError(MULTI_WORKER_UNAVAILABLE)
    gpus = tf.config.list_physical_devices("GPU")
    if devices == "all":
        count = max(1, len(gpus))
    else:
        count = int(devices)
    if count == 1:
        return Placement(tf.distribute.get_strategy(), "one device", 1)
    if gpus:
        if count > len(gpus):
            raise ConfigError(f"Invalid `devices`. Expected at most the {len(gpus)} visible GPU(s). "
                              f"Received: devices={devices}")
        names = [f"/gpu:{i}" for i in range(count)]
        strategy = tf.distribute.MirroredStrategy(names)
        return Placement(strategy, f"MirroredStrategy over {count} GPUs", count)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        if len(tf.config.list_logical_devices("CPU")) != count:
            raise ConfigError(f"Cannot split the CPU into {count} logical devices: TensorFlow already "
                              f"started in this process ({error}).") from None
    names = [f"/cpu:{i}" for i in range(count)]
    strategy = tf.distribute.MirroredStrategy(names, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return Placement(strategy, f"MirroredStrategy over {count} logical CPU devices (no GPU: a testing aid)", count)
