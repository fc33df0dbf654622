"""One training run, top to bottom: data, hardware, resume, model, fit."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from provided_code.atomic import write_text_atomic
from provided_code.config import CONFIG_FILE, ConfigError, TrainConfig, read_saved_config
from provided_code.data.cache import load_split
from provided_code.data.resample import downsample_split
from provided_code.data.tf_dataset import evaluation_dataset, steps_per_epoch, training_dataset
from provided_code.networks.unet import build_unet
from provided_code.progress import Progress, no_progress
from provided_code.training.checkpoints import RotatingCheckpoint, list_checkpoints, load_newest
from provided_code.training.epoch_log import EpochCSVLogger
from provided_code.training.epoch_seeds import ReseedDropoutEachEpoch
from provided_code.training.hardware import describe_devices, resolve_precision
from provided_code.training.strategy import make_placement

logger = logging.getLogger(__name__)

LOG_FILE = "training_log.csv"
OPENKBP_SOURCE = ("OpenKBP data comes from the challenge's public repository "
                  "(https://github.com/ababier/open-kbp, folder provided-data/). Download it and pass "
                  "--data-dir PATH, the folder that holds train-pats/ (and validation-pats/, test-pats/); "
                  "or run `bash scripts/demo` to try the whole pipeline on synthetic phantoms.")


class DataNotFoundError(FileNotFoundError):
    """The data folder or its training split is missing; the message says where data comes from."""


@dataclasses.dataclass
class TrainResult:
    first_epoch: int  # epochs already done when this run started
    last_epoch: int  # epochs done when it finished
    policy: str
    device: str
    checkpoint: Path | None  # the newest checkpoint


def train(config: TrainConfig, progress: Progress = no_progress, verbose: int | str = 0) -> TrainResult:
    """Train ``config.model_name`` up to ``config.epochs``, resuming from its newest checkpoint."""
    # -- 1. Settings: a resume must not silently change the model.
    saved = read_saved_config(config.models_dir)
    if saved is not None:
        config.check_resume(saved)

    if config.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install 'provided_code[tensorboard]' "
                          "(or pip install tensorboard)")

    # -- 2. Data: parsed once into the cache, stacked in memory, batches by fancy indexing.
    train_dir = Path(config.data_dir) / "train-pats"
    if not train_dir.is_dir():
        raise DataNotFoundError(f"No training data: {train_dir} does not exist. {OPENKBP_SOURCE}")
    train_arrays = downsample_split(load_split(train_dir, cache_dir=config.cache_dir, require_dose=True,
                                               skip_incomplete=config.skip_incomplete, progress=progress),
                                    config.resolution)
    validation_arrays = None
    validation_dir = Path(config.data_dir) / "validation-pats"
    if validation_dir.is_dir():  # validation loss over the patients that have a reference dose
        validation = load_split(validation_dir, cache_dir=config.cache_dir, require_dose=False,
                                skip_incomplete=config.skip_incomplete, progress=progress)
        if validation.has_dose.any():
            validation_arrays = downsample_split(validation.select(np.flatnonzero(validation.has_dose)),
                                                 config.resolution)
        else:
            logger.info("%s has no dose.csv files: no validation loss", validation_dir)
    logger.info("Training on %d patients at %d³%s", len(train_arrays), config.resolution,
                f", validating on {len(validation_arrays)}" if validation_arrays is not None else "")

    # -- 3. Hardware: strategy (first: it may split the CPU), precision policy, determinism.
    placement = make_placement(config.devices, config.multi_worker)
    strategy = placement.strategy
    device, capabilities = describe_devices()
    if saved is not None and config.precision == "auto":
        policy = saved.precision  # resume under the checkpoint's policy, whatever this machine would pick
    else:
        policy = resolve_precision(config.precision, capabilities)
    # The saved config records the concrete policy; loading under it restores the loss-scale optimizer.
    config = dataclasses.replace(config, precision=policy)
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(config.seed)
    if not capabilities:
        if config.xla:
            logger.warning("XLA is on and no GPU is visible: on CPUs XLA's 3D convolutions measured "
                           "many times slower than TensorFlow's own; --no-xla is faster here")
        else:  # deterministic ops, so a resumed run equals an uninterrupted one (Keras turns XLA off with them)
            tf.config.experimental.enable_op_determinism()
    global_batch = config.batch_size * placement.replicas
    learning_rate = config.learning_rate * (placement.replicas if config.scale_lr else 1)
    logger.info("Strategy: %s; batch %d per device × %d replica(s) = %d global; learning rate %g%s",
                placement.description, config.batch_size, placement.replicas, global_batch, learning_rate,
                " (scaled by the replica count)" if config.scale_lr and placement.replicas > 1 else "")

    # -- 4. Model: the newest checkpoint that loads, else a new one.
    with strategy.scope():
        resumed = load_newest(config.models_dir)
        if resumed is not None:
            initial_epoch, model = resumed
            logger.info("Resuming %s from epoch %d", config.model_name, initial_epoch)
        else:
            initial_epoch = 0
            model = build_unet(config)
            model.compile(
                optimizer=keras.optimizers.Adam(learning_rate, beta_1=0.5, beta_2=0.999),
                loss="mean_absolute_error",
            )
        if config.xla and placement.replicas > 1:
            logger.warning("XLA off: Keras 3's fit cannot jit-compile a step that spans several replicas "
                           "(keras-team/keras#19005); training under %s without XLA", placement.description)
        model.jit_compile = config.xla and placement.replicas == 1
    logger.info("Device: %s; dtype policy %s (%s); XLA %s", device, policy,
                type(model.optimizer).__name__, "on" if model.jit_compile else "off")

    config.models_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(config.models_dir / CONFIG_FILE, config.to_json() + "\n")
    if initial_epoch >= config.epochs:
        logger.info("Model %s is already trained to epoch %d (--epochs %d): nothing to do",
                    config.model_name, initial_epoch, config.epochs)
        return TrainResult(initial_epoch, initial_epoch, policy, device, _newest(config))

    # -- 5. Fit: one dataset over the remaining epochs, so each epoch's order depends on (seed, epoch).
    #    With several replicas, each global batch is split between them (the arrays are not copied).
    callbacks = [
        ReseedDropoutEachEpoch(config.seed),
        EpochCSVLogger(config.run_dir / LOG_FILE, initial_epoch, samples_per_epoch=len(train_arrays)),
        RotatingCheckpoint(config.models_dir, config.save_every, config.keep, config.epochs),
    ]
    if config.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=str(config.run_dir / "tensorboard")))
    full_batches = placement.replicas > 1
    model.fit(
        training_dataset(train_arrays, global_batch, config.seed, initial_epoch, config.epochs,
                         full_batches=full_batches),
        steps_per_epoch=steps_per_epoch(len(train_arrays), global_batch),
        epochs=config.epochs,
        initial_epoch=initial_epoch,
        validation_data=(evaluation_dataset(validation_arrays, global_batch, full_batches=full_batches)
                         if validation_arrays is not None else None),
        callbacks=callbacks,
        shuffle=False,  # the dataset is already shuffled, per epoch, by seed
        verbose=verbose,
    )
    return TrainResult(initial_epoch, config.epochs, policy, device, _newest(config))


def _newest(config: TrainConfig) -> Path | None:
    checkpoints = list_checkpoints(config.models_dir)
    return checkpoints[0][1] if checkpoints else None


def model_weights(model: keras.Model) -> list[np.ndarray]:
    """Every weight of ``model`` (trainable and not) as numpy arrays, for comparisons."""
    return [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.weights]
