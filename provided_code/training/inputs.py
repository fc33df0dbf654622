"""What a run feeds its training step, as ``tf.distribute`` datasets: the training updates (each
epoch's order from (seed, epoch); the possible-dose mask when the loss needs it; the augmentation's
draws, made on the host and applied on the device inside the step) and the validation batches.
Training and ``scripts/bench_train.py`` build them here, from a :class:`~provided_code.config.TrainConfig`."""

from __future__ import annotations

import tensorflow as tf

from provided_code.data.augment import Augmenter
from provided_code.data.cache import SplitArrays
from provided_code.data.tf_dataset import distributed_dataset, update_schedule
from provided_code.losses import needs_possible_dose_mask


def training_input(strategy: tf.distribute.Strategy, arrays: SplitArrays, config, first_epoch: int,
                   epochs: int | None = None):
    """Every update of epochs ``first_epoch .. epochs - 1`` (default ``config.epochs``) of ``arrays``
    (at the training resolution): ``config.batch_size`` patients per replica, ``config.accumulate``
    micro-batches, each update's weights summing to 1; every worker feeds its own replicas' share."""
    augmenter = Augmenter(config.augmentations, arrays.possible_dose_mask, config.seed) if config.augmentations else None
    schedule = update_schedule(len(arrays), config.batch_size, strategy.num_replicas_in_sync, config.accumulate,
                               seed=config.seed, first_epoch=first_epoch,
                               epochs=config.epochs if epochs is None else epochs)
    return distributed_dataset(strategy, arrays, schedule, with_mask=needs_possible_dose_mask(config.loss),
                               augmenter=augmenter)


def validation_input(strategy: tf.distribute.Strategy, arrays: SplitArrays, config) -> tuple:
    """``(dataset, patients)`` for the validation loss: every patient of ``arrays`` once, in order,
    weighted 1 (padding 0), batched as training is."""
    schedule = update_schedule(len(arrays), config.batch_size, strategy.num_replicas_in_sync, config.accumulate,
                               seed=0, first_epoch=0, epochs=1, shuffle=False, mean=False)
    return distributed_dataset(strategy, arrays, schedule, with_mask=needs_possible_dose_mask(config.loss)), len(arrays)
