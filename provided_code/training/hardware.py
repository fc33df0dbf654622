"""Which devices this process sees, which dtype policy and XLA setting suit them, and the strategy
a run places its replicas with (:func:`resolve_hardware`)."""

from __future__ import annotations

import dataclasses
import logging

import keras
import tensorflow as tf

from provided_code.config import TrainConfig
from provided_code.infra.tf_config import Cluster
from provided_code.training.strategy import Placement, make_placement

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Hardware:
    placement: Placement
    device: str  # what the log calls the device
    policy: str  # the dtype policy, concrete
    xla: bool
    xla_reason: str
    learning_rate: float  # the peak rate, scaled by the replica count with --scale-lr


def describe_devices() -> tuple[str, list[tuple[int, int]]]:
    """A one-line description of the visible devices and each GPU's compute capability."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU (no GPU visible)", []
    names, capabilities = [], []
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        capability = tuple(details.get("compute_capability", (0, 0)))
        capabilities.append(capability)
        names.append(f"{gpu.name} ({details.get('device_name', 'GPU')}, compute capability "
                     f"{capability[0]}.{capability[1]})")
    return ", ".join(names), capabilities


def resolve_precision(precision: str, gpu_capabilities: list[tuple[int, int]]) -> str:
    """``auto`` → ``mixed_float16`` when every GPU has tensor cores (compute capability >= 7.0),
    else ``float32`` (on this project's CPUs mixed_float16 measured 34× slower per step: docs/performance.md)."""
    if precision != "auto":
        return precision
    if gpu_capabilities and all(capability >= (7, 0) for capability in gpu_capabilities):
        return "mixed_float16"
    return "float32"


def resolve_hardware(config: TrainConfig, cluster: Cluster | None = None, saved: TrainConfig | None = None) -> Hardware:
    """The strategy first (it may split the CPU or join a cluster), then precision and XLA; sets
    the dtype policy, the seeds and, on a CPU without XLA, deterministic ops. ``saved``: a resumed
    run's config, whose policy a resume with ``--precision auto`` keeps."""
    placement = make_placement(config.devices, cluster, config.collective_timeout)
    device, capabilities = describe_devices()
    if saved is not None and config.precision == "auto":
        policy = saved.precision  # resume under the checkpoint's policy, whatever this machine would pick
    else:
        policy = resolve_precision(config.precision, capabilities)
    keras.mixed_precision.set_global_policy(policy)  # loading under it restores the loss-scale optimizer
    keras.utils.set_random_seed(config.seed)
    xla, xla_reason = resolve_xla(config.xla, bool(capabilities))
    if not capabilities and not xla:  # deterministic ops: a resumed run equals an uninterrupted one
        tf.config.experimental.enable_op_determinism()
    learning_rate = config.learning_rate * (placement.replicas if config.scale_lr else 1)
    global_batch = config.batch_size * placement.replicas
    logger.info("Strategy: %s; batch %d per device × %d replica(s) = %d global%s; learning rate %g%s",
                placement.description, config.batch_size, placement.replicas, global_batch,
                f" × {config.accumulate} accumulated = {global_batch * config.accumulate} per update"
                if config.accumulate > 1 else "", learning_rate,
                " (scaled by the replica count)" if config.scale_lr and placement.replicas > 1 else "")
    return Hardware(placement, device, policy, xla, xla_reason, learning_rate)


def resolve_xla(setting: str, have_gpu: bool) -> tuple[bool, str]:
    if setting == "on":
        return True, "--xla on" + ("" if have_gpu else "; on a CPU XLA measured far slower than oneDNN")
    if setting == "off":
        return False, "--xla off"
    return have_gpu, "--xla auto: " + ("a GPU is visible" if have_gpu else "no GPU, and XLA:CPU is slower than oneDNN")
