"""``tf.distribute`` input over stacked arrays (this module imports TensorFlow; ``batches`` does not).

Each worker builds only its own replicas' share of every update, from its own copy of the stacked
arrays (fancy indexing, no copy of the split; with memory-mapped arrays, it reads only its share's
patients); TensorFlow hands the elements to the local replicas in turn. An element is a :class:`TrainingElement` with ``accumulate × batch_size`` patients,
micro-batch after micro-batch.
"""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np
import tensorflow as tf

from provided_code.data.augment import Augmenter
from provided_code.data.batches import epoch_updates, fit_vectors, take_batch
from provided_code.model_spec import ANGLES, InputSpec, ModelSpec


class TrainingElement(TypedDict, total=False):
    """What the input sends the training step, per replica (patients first; R: the resolution)."""

    # what the model eats: the inputs provided_code.model_spec declares, each under its name
    ct: tf.Tensor  # (patients, R, R, R) uint16 grey values
    structure_masks: tf.Tensor  # (patients, R, R, R) uint16 (uint32 above 16 structures), bit k = site.names[k]
    prescriptions: tf.Tensor  # (patients, targets) float32 Gy; with per-patient prescriptions only
    beam_angles: tf.Tensor  # (patients, slots) float32 gantry degrees, NaN unused; with per-patient beams only
    dose: tf.Tensor  # (patients, R, R, R, 1) float32 Gy
    weight: tf.Tensor  # (patients,) float32: the update's real patients sum to 1 (training), padding 0
    possible_dose_mask: tf.Tensor  # (patients, R, R, R) bool; with a masked loss only
    plane_source: tf.Tensor  # (patients, R·R) int32 axial index map, -1 outside; with augmentation only
    slice_shift: tf.Tensor  # (patients,) int32 shift along the slice axis; with augmentation only
    mirrored: tf.Tensor  # (patients,) bool: mirror pairs' bits to swap, angles to negate; with augmentation only
    turn_degrees: tf.Tensor  # (patients,) float32 the axial turn; with augmentation of per-patient angles only


def updates_per_epoch(num_patients: int, batch_size: int, replicas: int = 1, accumulate: int = 1) -> int:
    return math.ceil(num_patients / (batch_size * replicas * accumulate))


def update_schedule(num_patients: int, batch_size: int, replicas: int, accumulate: int, seed: int,
                    first_epoch: int, epochs: int, shuffle: bool = True, mean: bool = True) -> list:
    """``(rows, weights, epoch, index)`` of every update of epochs ``first_epoch .. epochs - 1``:
    arrays shaped ``(accumulate, replicas, batch_size)``, the epoch and the update's index in it.

    ``mean``: weights sum to 1 over each update's real patients (a training loss that is the
    update's mean, whatever the split); otherwise 1 per real patient (sums, for evaluation).
    Padding patients weigh 0.
    """
    schedule = []
    for epoch in range(first_epoch, epochs):
        for index, (rows, real) in enumerate(epoch_updates(num_patients, batch_size, replicas, accumulate, seed,
                                                           epoch, shuffle)):
            weights = real.astype(np.float32)
            schedule.append((rows, weights / weights.sum() if mean else weights, epoch, index))
    return schedule


def element_spec(resolution: int, inputs: tuple[InputSpec, ...], patients: int | None = None,
                 with_mask: bool = False, augmented: bool = False) -> dict:
    """The element's tensors: the declared model ``inputs`` (a model's ``spec.inputs``), the dose
    and weights, the mask with ``with_mask``, the draws with ``augmented``."""
    volume = (patients, resolution, resolution, resolution)
    spec = {model_input.name: tf.TensorSpec((patients, *model_input.shape(resolution)), model_input.dtype)
            for model_input in inputs}
    spec.update({"dose": tf.TensorSpec((*volume, 1), tf.float32), "weight": tf.TensorSpec((patients,), tf.float32)})
    if with_mask:
        spec["possible_dose_mask"] = tf.TensorSpec(volume, tf.bool)
    if augmented:
        spec["plane_source"] = tf.TensorSpec((patients, resolution * resolution), tf.int32)
        spec["slice_shift"] = tf.TensorSpec((patients,), tf.int32)
        spec["mirrored"] = tf.TensorSpec((patients,), tf.bool)
        if any(model_input.moves == ANGLES for model_input in inputs):
            spec["turn_degrees"] = tf.TensorSpec((patients,), tf.float32)
    return spec


def take_element(arrays, rows: np.ndarray, weights: np.ndarray, inputs: tuple[InputSpec, ...], with_mask: bool = False,
                 draws: dict[str, np.ndarray] | None = None) -> dict:
    model_inputs, dose = take_batch(arrays, rows, inputs)
    element = {**model_inputs, "dose": dose, "weight": weights}
    if with_mask:
        element["possible_dose_mask"] = arrays.possible_dose_mask[rows]
    return {**element, **(draws or {})}


def distributed_dataset(strategy: tf.distribute.Strategy, arrays, schedule: list, spec: ModelSpec, prefetch: int = 2,
                        with_mask: bool = False, augmenter: Augmenter | None = None):
    """The schedule's updates as a distributed dataset of the model ``spec`` describes (its inputs):
    one element per replica per update. ``with_mask``:
    elements carry ``possible_dose_mask``. ``augmenter``: they carry its draws for
    ``(epoch, update index)``, split between replicas like the patients.
    """

    inputs = spec.inputs
    arrays = fit_vectors(arrays, inputs)  # once (training made them already: this is arrays)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = strategy.num_replicas_in_sync // context.num_input_pipelines
        first = context.input_pipeline_id * local  # this worker's first replica
        patients = schedule[0][0][:, 0].size if schedule else None
        tensors = element_spec(arrays.resolution, inputs, patients, with_mask, augmenter is not None)
        names = list(tensors)
        last_draws = {}  # the current update's draws: elements come in order, replica after replica

        def produce(position):
            """Element ``position``: update ``position // local``, local replica ``position % local``."""
            update, replica = divmod(int(position), local)
            rows, weights, epoch, index = schedule[update]
            mine = None
            if augmenter is not None:  # drawn for the whole update: the same however it is split
                if last_draws.get("update") != update:
                    needed = np.zeros(rows.shape, bool)
                    needed[:, first:first + local] = True  # this worker's replicas: only their masks are read
                    drawn = augmenter.draw(rows.reshape(-1), epoch, index, needed.reshape(-1))
                    last_draws.update(update=update, draws={
                        name: value.reshape(*rows.shape, *value.shape[1:]) for name, value in drawn.items()})
                mine = {name: value[:, first + replica].reshape(-1, *value.shape[3:])
                        for name, value in last_draws["draws"].items()}
            # micro-batches of this replica, one after another
            element = take_element(arrays, rows[:, first + replica].reshape(-1),
                                   weights[:, first + replica].reshape(-1), inputs, with_mask, mine)
            return tuple(np.asarray(element[name], dtype=tensors[name].dtype.as_numpy_dtype) for name in names)

        def as_element(*values):
            for name, value in zip(names, values):
                value.set_shape(tensors[name].shape)
            return dict(zip(names, values))

        # One Python call per element through numpy_function: half the cost per element of
        # Dataset.from_generator (scripts/bench_train.py, input_pipeline_share).
        dataset = tf.data.Dataset.range(len(schedule) * local).map(tf.autograph.experimental.do_not_convert(
            lambda position: as_element(*tf.numpy_function(produce, [position], [tensors[n].dtype for n in names]))))
        # A fixed prefetch, no autotuning: tf.data's autotune thread sleeps up to a minute between
        # rounds, and deleting the iterator waited for it (measured: 9 to 51 s at the end of a run).
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.prefetch(prefetch).with_options(options)

    return strategy.distribute_datasets_from_function(dataset_fn)
