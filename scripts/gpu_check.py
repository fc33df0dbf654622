#!/usr/bin/env python
"""A five-minute check of a rented GPU before the long run: prints one JSON line on stdout and a
plain verdict on stderr.

    python scripts/gpu_check.py                         # the README's card: --filters 64 at 128³
    python scripts/gpu_check.py --preset v2             # any training flags: the run they describe
    python scripts/gpu_check.py --resolution 32 --filters 4 --steps 3    # on a CPU, in seconds

Takes ``runpod_train.py``'s flags and runs the project's own training step on them, in the manner
of nnU-Net's benchmark trainers: on synthetic phantoms (written at 128³, cached and brought to the
run's resolution as training does; nothing of the user's data is read), first through the whole
input pipeline (augmentation draws, batches, the device's unpacking), then on one batch already on
the device, so that a slow input shows as the difference. Reports, under names that say what they
are: the device (``device``, ``compute_capability``), the versions (``tensorflow``, ``cuda``,
``cudnn``), ``policy`` and ``xla``; ``compile_s`` (the first step: tracing, XLA's compilation and the
step); ``seconds_per_step`` and ``samples_per_second`` over ``--steps`` steps after ``--warmup``
(whole pipeline), ``device_seconds_per_step`` (the device alone) and ``input_share``;
``peak_memory_mb`` (the GPU's peak allocation, or on a CPU the process's peak resident memory);
``checkpoint_roundtrip`` (a ``.keras`` checkpoint saved and loaded back predicts the same doses);
the model's ``cost`` (``scripts/model_cost.py``'s); and ``estimated_hours``: the run's epochs
(``--epochs``, 100 by default) of ``--train-patients`` (OpenKBP's 200) at the measured step, and
the validation scorings (``--score-every``) at the measured forward pass, as ``verdict`` says.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VALIDATION_PATIENTS = 40  # OpenKBP's validation split, what --score-every predicts and scores


def parse(argv: list[str]):
    """``(config, steps, warmup, patients)`` from the training flags and this script's own."""
    import click

    from provided_code.apps.cli import main as train_command, settings
    from provided_code.apps.console import USER_ERRORS, one_line

    own = {"--steps": 20, "--warmup": 3, "--train-patients": 200}
    rest = []
    words = iter(argv)
    for word in words:
        name, _, value = word.partition("=")
        if name in own:
            try:
                own[name] = int(value or next(words))
            except (StopIteration, ValueError):
                raise SystemExit(f"Error: Invalid `{name[2:]}`. Expected a whole number >= 1. Received: {word}")
            if own[name] < 1:
                raise SystemExit(f"Error: Invalid `{name[2:]}`. Expected a whole number >= 1. Received: {own[name]}")
        else:
            rest.append(word)
    if "--help" in rest or "-h" in rest:
        print(__doc__.strip())
        print("\nOwn flags: --steps N (20), --warmup N (3), --train-patients N (200); then the training command's:")
    try:
        with train_command.make_context("gpu_check.py", rest) as ctx:
            config, _ = settings(ctx)
    except click.exceptions.Exit as done:
        raise SystemExit(done.exit_code) from None
    except click.ClickException as error:
        error.show()
        raise SystemExit(2) from None
    except USER_ERRORS as error:
        raise SystemExit(f"Error: {one_line(error)}") from None
    return config, own["--steps"], own["--warmup"], own["--train-patients"]


def versions() -> dict:
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    return {"tensorflow": tf.__version__, "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version")}


def device_details() -> dict:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        import platform

        return {"device": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
                "compute_capability": None, "gpus": 0}
    details = tf.config.experimental.get_device_details(gpus[0])
    capability = details.get("compute_capability")
    return {"device": details.get("device_name", gpus[0].name),
            "compute_capability": ".".join(map(str, capability)) if capability else None, "gpus": len(gpus)}


def peak_memory_mb() -> float:
    import tensorflow as tf

    from provided_code.training.memory import peak_rss_mb

    gpus = [device.name for device in tf.config.list_logical_devices("GPU")]
    if gpus:
        return round(max(tf.config.experimental.get_memory_info(gpu)["peak"] for gpu in gpus) / 2**20, 1)
    return round(peak_rss_mb(), 1)


def phantoms(workdir: Path, config, patients: int):
    """``patients`` phantoms of the run's site at 128³, cached, and at the run's resolution."""
    from provided_code.data.cache import load_split
    from provided_code.data.phantoms import write_site_phantom
    from provided_code.data.resample import downsample_split

    for number in range(1, patients + 1):
        write_site_phantom(workdir / "train-pats" / f"pt_{number}", seed=number, site=config.site)
    full = load_split(workdir / "train-pats", cache_dir=workdir / "cache", workers=1, site=config.site)
    return full, downsample_split(full, config.resolution)


def timed_steps(step, next_element, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        loss = step.train(next_element())
    float(loss)  # wait for the device
    return (time.perf_counter() - start) / steps


def main(argv: list[str]) -> None:
    config, steps, warmup, train_patients = parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from provided_code.infra.environment import configure_tensorflow

    configure_tensorflow()
    import keras
    import numpy as np

    from provided_code.data.batches import take_inputs
    from provided_code.data.tf_dataset import updates_per_epoch
    from provided_code.losses import loss_function
    from provided_code.training.cost import model_cost
    from provided_code.training.feeds import fit_patient_inputs, training_input
    from provided_code.training.hardware import resolve_hardware
    from provided_code.training.model import new_model
    from provided_code.training.step import TrainStep

    hardware = resolve_hardware(config)
    strategy = hardware.placement.strategy
    replicas = strategy.num_replicas_in_sync
    per_update = config.batch_size * replicas * config.accumulate
    workdir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        _, arrays = phantoms(workdir, config, max(2, per_update))
        config, spec, (arrays,) = fit_patient_inputs(config, [arrays])
        with strategy.scope():
            model = new_model(spec, hardware.learning_rate, ema=config.ema)
            model.optimizer.build(model.trainable_variables)
        cost = model_cost(model, config)
        step = TrainStep(model, strategy, config.batch_size, xla=hardware.xla, accumulate=config.accumulate,
                         recompute=config.recompute, spec=spec, loss_fn=loss_function(config.loss, config.dvh_weight,
                                                                                      spec))
        pipeline = iter(training_input(strategy, arrays, config, spec, first_epoch=0,
                                       epochs=1 + (1 + warmup + 2 * steps) * per_update // len(arrays) + 1))
        start = time.perf_counter()
        float(step.train(next(pipeline)))  # trace, compile (XLA), first step
        compile_s = time.perf_counter() - start
        timed_steps(step, lambda: next(pipeline), warmup)
        whole = timed_steps(step, lambda: next(pipeline), steps)
        element = next(pipeline)  # one batch, already distributed: the device alone
        device_alone = timed_steps(step, lambda: element, steps)
        del pipeline  # a from_generator iterator left mid-stream blocks the interpreter's exit
        peak = peak_memory_mb()

        batch = take_inputs(arrays, np.arange(min(config.batch_size, len(arrays))), spec.inputs)
        predict = model.predict_on_batch
        start = time.perf_counter()
        before = np.asarray(predict(batch))
        forward_s = time.perf_counter() - start  # includes tracing: an upper bound of a scoring's per batch
        saved = workdir / "check.keras"
        model.save(saved)
        with strategy.scope():
            loaded = keras.saving.load_model(saved)
        after = np.asarray(loaded.predict_on_batch(batch))
        roundtrip = bool(before.shape == after.shape and np.array_equal(before, after))
        checkpoint_mb = round(saved.stat().st_size / 1e6, 1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    updates = updates_per_epoch(train_patients, config.batch_size, replicas, config.accumulate)
    scorings = 0 if not config.score_every else math.ceil(config.epochs / config.score_every)
    scoring_s = math.ceil(VALIDATION_PATIENTS / config.batch_size) * forward_s
    hours = (config.epochs * updates * whole + scorings * scoring_s) / 3600
    verdict = (f"{config.epochs} epochs of {train_patients} patients at {config.resolution}³, --filters "
               f"{config.filters} ({config.arch}, widths {config.widths}) on {device_details()['device']}: about "
               f"{hours:.1f} hours ({whole:.3g} s a step, {updates} steps an epoch"
               + (f", {scorings} scorings" if scorings else "") + "); the input pipeline takes "
               f"{max(0.0, 1 - device_alone / whole):.0%} of a step; checkpoint "
               + ("saved and reloaded alike" if roundtrip else "RELOADED DIFFERENTLY: do not train here"))
    result = {**device_details(), **versions(), "policy": hardware.policy, "xla": hardware.xla,
              "replicas": replicas, "batch_size": config.batch_size, "resolution": config.resolution,
              "filters": config.filters, "arch": config.arch, "widths": config.widths,
              "compile_s": round(compile_s, 2), "seconds_per_step": round(whole, 4),
              "samples_per_second": round(per_update / whole, 3), "device_seconds_per_step": round(device_alone, 4),
              "input_share": round(max(0.0, 1 - device_alone / whole), 3), "steps": steps, "warmup_steps": warmup,
              "peak_memory_mb": peak, "checkpoint_roundtrip": roundtrip, "checkpoint_mb": checkpoint_mb,
              "cost": cost, "train_patients": train_patients, "epochs": config.epochs,
              "estimated_hours": round(hours, 2), "verdict": verdict}
    print(json.dumps(result))
    print(verdict, file=sys.stderr)
    if not roundtrip:
        raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
