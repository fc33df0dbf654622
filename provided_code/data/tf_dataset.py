"""``tf.distribute`` input over stacked arrays (this module imports TensorFlow; ``batches`` does not).

Each worker builds only its own replicas' share of every update, from its own copy of the stacked
arrays (fancy indexing, no copy of the split); TensorFlow hands the elements to the local replicas
in turn. An element is a dict: ``ct`` and ``structure_masks`` (uint16, what the model eats),
``dose`` (float32 Gy, ``(..., 1)``) and ``weight`` (float32, per patient), with
``accumulate × batch_size`` patients, micro-batch after micro-batch.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from provided_code.data.batches import epoch_updates, take_batch


def updates_per_epoch(num_patients: int, batch_size: int, replicas: int = 1, accumulate: int = 1) -> int:
    return math.ceil(num_patients / (batch_size * replicas * accumulate))


def update_schedule(num_patients: int, batch_size: int, replicas: int, accumulate: int, seed: int,
                    first_epoch: int, epochs: int, shuffle: bool = True, mean: bool = True) -> list:
    """``(rows, weights)`` of every update of epochs ``first_epoch .. epochs - 1``, arrays shaped
    ``(accumulate, replicas, batch_size)``.

    ``mean``: weights sum to 1 over each update's real patients (a training loss that is the
    update's mean, whatever the split); otherwise 1 per real patient (sums, for evaluation).
    Padding patients weigh 0.
    """
    schedule = []
    for epoch in range(first_epoch, epochs):
        for rows, real in epoch_updates(num_patients, batch_size, replicas, accumulate, seed, epoch, shuffle):
            weights = real.astype(np.float32)
            schedule.append((rows, weights / weights.sum() if mean else weights))
    return schedule


def element_spec(resolution: int, patients: int | None = None) -> dict:
    volume = (patients, resolution, resolution, resolution)
    return {"ct": tf.TensorSpec(volume, tf.uint16), "structure_masks": tf.TensorSpec(volume, tf.uint16),
            "dose": tf.TensorSpec((*volume, 1), tf.float32), "weight": tf.TensorSpec((patients,), tf.float32)}


def take_element(arrays, rows: np.ndarray, weights: np.ndarray) -> dict:
    inputs, dose = take_batch(arrays, rows)
    return {**inputs, "dose": dose, "weight": weights}


def distributed_dataset(strategy: tf.distribute.Strategy, arrays, schedule: list, prefetch: int = 2):
    """The schedule's updates as a distributed dataset: one element per replica per update."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = strategy.num_replicas_in_sync // context.num_input_pipelines
        first = context.input_pipeline_id * local  # this worker's first replica

        def generate():
            for rows, weights in schedule:
                for replica in range(first, first + local):
                    # micro-batches of this replica, one after another
                    yield take_element(arrays, rows[:, replica].reshape(-1), weights[:, replica].reshape(-1))

        patients = schedule[0][0][:, 0].size if schedule else None
        dataset = tf.data.Dataset.from_generator(generate, output_signature=element_spec(arrays.resolution, patients))
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(schedule) * local))
        return dataset.prefetch(prefetch)

    return strategy.distribute_datasets_from_function(dataset_fn)
