"""Training benchmark on this machine: prints one JSON object (seconds unless named otherwise).

    python scripts/bench_train.py [--resolution 32] [--filters 8] [--batch-size 2] [--steps 5]

Side by side in one run, on synthetic phantoms at a small config: samples per second and time to
first step (compile included) with XLA against without, float32 against mixed_float16, and the
first XLA step with Keras's built-in AveragePooling3D in place of the project's separable one
(same output, see networks/layers.py) at --pool-resolution. And the share of step time the input pipeline takes:
the time to pull one batch from the tf.data pipeline over the fastest step time measured here; and the fetch time of a batch at 128³, for reasoning
about larger steps. And steps per second at the same global batch on one device against a
MirroredStrategy over 2 logical CPU devices (the processor split in two, as --devices 2 does
without GPUs): the same code path as two GPUs, but both share this CPU's cores, so this says
what the strategy costs, not what GPUs gain. CPU figures only; nothing here says what a GPU does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from provided_code.config import TrainConfig  # noqa: E402
from provided_code.data.cache import load_split  # noqa: E402
from provided_code.data.phantoms import write_phantom_split  # noqa: E402
from provided_code.data.resample import downsample_split  # noqa: E402
from provided_code.data.tf_dataset import training_dataset  # noqa: E402
import provided_code.networks.unet as unet  # noqa: E402
from provided_code.training.strategy import make_placement  # noqa: E402


def measure(config: TrainConfig, batch, steps: int, policy: str, xla: bool, builtin_pool: bool = False,
            strategy: tf.distribute.Strategy | None = None) -> dict:
    """Time to first step (trace + compile + step) and steady samples per second."""
    strategy = strategy or tf.distribute.get_strategy()
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    original = unet.AveragePool3x3x3
    if builtin_pool:
        unet.AveragePool3x3x3 = lambda dtype, name: keras.layers.AveragePooling3D(
            3, strides=1, padding="same", dtype=dtype, name=name)
    try:
        with strategy.scope():
            model = unet.build_unet(config)
            model.compile(optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5, beta_2=0.999),
                          loss="mean_absolute_error", jit_compile=xla)
    finally:
        unet.AveragePool3x3x3 = original
    inputs, dose = batch
    start = time.perf_counter()
    model.train_on_batch(inputs, dose)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(inputs, dose)
    step = (time.perf_counter() - start) / steps
    keras.mixed_precision.set_global_policy("float32")
    return {"first_step_s": first, "step_s": step, "samples_per_s": len(dose) / step, "steps_per_s": 1 / step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--filters", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--pool-resolution", type=int, default=64,
                        help="size for the built-in vs separable pooling first-step comparison (filters 4)")
    args = parser.parse_args()
    # Split the CPU (as --devices 2 does) before TensorFlow starts; single-device runs use the first half.
    two_devices = make_placement("2", multi_worker=False).strategy

    workdir = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        write_phantom_split(workdir / "train-pats", 4)
        full = load_split(workdir / "train-pats", cache_dir=workdir / "cache", workers=1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    def first_batch(resolution):
        iterator = iter(training_dataset(downsample_split(full, resolution), args.batch_size, seed=0,
                                         first_epoch=0, epochs=50))
        inputs, dose = next(iterator)
        return iterator, ({name: np.asarray(value) for name, value in inputs.items()}, np.asarray(dose))

    def fetch_time(iterator):
        times = []
        for _ in range(20):
            start = time.perf_counter()
            next(iterator)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    config = TrainConfig(resolution=args.resolution, filters=args.filters, batch_size=args.batch_size)
    iterator, batch = first_batch(args.resolution)
    pool_config = TrainConfig(resolution=args.pool_resolution, filters=4, batch_size=1)
    _, pool_batch = first_batch(args.pool_resolution)
    pool_batch = ({name: value[:1] for name, value in pool_batch[0].items()}, pool_batch[1][:1])

    runs = {
        "xla_float32": measure(config, batch, args.steps, "float32", xla=True),
        "no_xla_float32": measure(config, batch, args.steps, "float32", xla=False),
        "no_xla_mixed_float16": measure(config, batch, args.steps, "mixed_float16", xla=False),
        "one_device_batch_2": measure(config, batch, args.steps, "float32", xla=False),
        "two_logical_devices_batch_1_each": measure(
            config, batch, args.steps, "float32", xla=False,
            strategy=two_devices),
        "pool_separable_xla": measure(pool_config, pool_batch, 1, "float32", xla=True),
        "pool_builtin_xla": measure(pool_config, pool_batch, 1, "float32", xla=True, builtin_pool=True),
    }
    fetch_s = fetch_time(iterator)
    fetch_128_s = fetch_time(first_batch(128)[0])
    fastest_step = min(runs[name]["step_s"] for name in ("xla_float32", "no_xla_float32", "no_xla_mixed_float16"))

    print(json.dumps({
        "config": {"resolution": args.resolution, "filters": args.filters, "batch_size": args.batch_size,
                   "device": "CPU", "cores": os.cpu_count()},
        "samples_per_s_xla": runs["xla_float32"]["samples_per_s"],
        "samples_per_s_no_xla": runs["no_xla_float32"]["samples_per_s"],
        "first_step_s_xla": runs["xla_float32"]["first_step_s"],
        "first_step_s_no_xla": runs["no_xla_float32"]["first_step_s"],
        "samples_per_s_float32": runs["no_xla_float32"]["samples_per_s"],
        "samples_per_s_mixed_float16": runs["no_xla_mixed_float16"]["samples_per_s"],
        "mixed_float16_over_float32_step_time": runs["no_xla_mixed_float16"]["step_s"] / runs["no_xla_float32"]["step_s"],
        "pool_comparison_resolution": args.pool_resolution,
        "first_step_s_xla_separable_pool": runs["pool_separable_xla"]["first_step_s"],
        "first_step_s_xla_builtin_pool": runs["pool_builtin_xla"]["first_step_s"],
        "builtin_over_separable_pool_first_step": (runs["pool_builtin_xla"]["first_step_s"]
                                                   / runs["pool_separable_xla"]["first_step_s"]),
        "steps_per_s_1_device": runs["one_device_batch_2"]["steps_per_s"],
        "steps_per_s_2_logical_cpu_devices": runs["two_logical_devices_batch_1_each"]["steps_per_s"],
        "parameter_bytes_float32_at_128_filters_64": 4 * unet.build_unet(TrainConfig()).count_params(),
        "batch_fetch_s": fetch_s,
        "input_pipeline_share": min(1.0, fetch_s / fastest_step),
        "batch_fetch_s_128": fetch_128_s,
        "runs": runs,
    }, indent=2))


if __name__ == "__main__":
    main()
