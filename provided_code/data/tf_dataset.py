"""``tf.data`` adapters over stacked arrays (this module imports TensorFlow; ``batches`` does not)."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from provided_code.data.batches import epoch_batches, take_batch


def _signature(resolution: int):
    volume = (None, resolution, resolution, resolution)
    return (
        {"ct": tf.TensorSpec(volume, tf.uint16), "structure_masks": tf.TensorSpec(volume, tf.uint16)},
        tf.TensorSpec((*volume, 1), tf.float32),
    )


def steps_per_epoch(num_patients: int, batch_size: int) -> int:
    return math.ceil(num_patients / batch_size)


def training_dataset(arrays, batch_size: int, seed: int, first_epoch: int, epochs: int,
                     shuffle: bool = True, prefetch: int = 2, full_batches: bool = False) -> tf.data.Dataset:
    """Batches of epochs ``first_epoch .. epochs - 1`` (0-based), one epoch after another.

    Give Keras ``steps_per_epoch=steps_per_epoch(len(arrays), batch_size)`` so that it keeps one
    iterator across epochs: epoch ``e`` then sees exactly the order ``epoch_batches(..., e)``,
    whether or not the run was resumed. Inputs stay in their compact dtypes (uint16); the model
    casts them on the device.

    ``full_batches``: a last, partial batch of an epoch is
    topped up with that epoch's first rows (so that no replica gets an empty batch).
    """
    schedule = []
    for epoch in range(first_epoch, epochs):
        batches = epoch_batches(len(arrays), batch_size, seed, epoch, shuffle)
        if full_batches and len(batches[-1]) < batch_size:
            first = np.concatenate(batches)[: batch_size - len(batches[-1])]
            batches[-1] = np.concatenate([batches[-1], first])
        schedule += batches

    def generate():
        for rows in schedule:
            yield take_batch(arrays, rows)

    dataset = tf.data.Dataset.from_generator(generate, output_signature=_signature(arrays.resolution))
    # A known length lets Keras plan epochs instead of discovering the end by running off it.
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(schedule)))
    return dataset.prefetch(prefetch)


def evaluation_dataset(arrays, batch_size: int, prefetch: int = 2, full_batches: bool = False) -> tf.data.Dataset:
    """One pass over every patient in order (validation loss)."""
    return training_dataset(arrays, batch_size, seed=0, first_epoch=0, epochs=1, shuffle=False, prefetch=prefetch,
                            full_batches=full_batches)
