"""What a run feeds its training step, as ``tf.distribute`` datasets: the training updates (each
epoch's order from (seed, epoch); the possible-dose mask when the loss needs it; the augmentation's
draws, made on the host and applied on the device inside the step) and the validation batches.
Training and ``scripts/bench_train.py`` build them here, from a :class:`~provided_code.config.TrainConfig`
(the recipe: batches, order, augmentation, loss) and the model's
:class:`~provided_code.model_spec.ModelSpec` (its inputs)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tensorflow as tf

from provided_code.config import ConfigError
from provided_code.data.augment import Augmenter
from provided_code.data.batches import fit_vectors, plan_files_not_taken, warn_plan_files_not_taken
from provided_code.data.split_arrays import SplitArrays
from provided_code.data.tf_dataset import distributed_dataset, update_schedule
from provided_code.model_spec import ModelSpec
from provided_code.losses import needs_possible_dose_mask

logger = logging.getLogger(__name__)


def fit_patient_inputs(config, splits: list[SplitArrays], saved=None) -> tuple:
    """``(config, spec, splits)``: ``config`` with the per-patient inputs its data asks for
    (``patient_prescriptions``, ``beam_slots``: the most beams any patient of ``splits`` has, at
    least the run-wide angles' count, so that a patient without its own fits), and each split with
    the model's per-patient vectors made once for every patient (:func:`fit_vectors`: a patient
    that does not fit the model is refused, naming its file), what the batches index; ``spec`` is
    the model that config describes (``config.spec``), resolved here once for the run.

    A new run takes them; a resumed one (``saved``: its saved config, whose values ``config``
    already holds) keeps its own, and is refused in one line, naming the first patient's file,
    when its data now has per-patient files its model would take had it been trained on them.
    Plan files the model does not take (``--beams 0``, no prescription channel, a resumed model
    of run-wide beams) are named in one warning per split. Patients without their own files take
    the run-wide values (the site's prescriptions, the run's angles).
    """
    prescriptions = bool(config.prescription_channel and any(arrays.prescriptions is not None for arrays in splits))
    slots = 0
    with_beams = [arrays for arrays in splits if arrays.beam_angles is not None]
    if config.beams and with_beams:
        counts = np.concatenate([np.isfinite(arrays.beam_angles).sum(axis=1) for arrays in with_beams])
        slots = int(max(counts.max(), len(config.gantry_angles)))  # any patient without beams.csv fits too
    if saved is None:
        config = dataclasses.replace(config, patient_prescriptions=prescriptions, beam_slots=slots)
    else:  # what a new run on this data would take and this model cannot
        refused = {name: why for name, why in config.spec.inputs_left_out().items()
                   if (name == "prescriptions" and prescriptions) or (name == "beam_angles" and slots)}
        for arrays in splits:
            found = plan_files_not_taken(arrays, refused)
            if found is not None:
                raise ConfigError(f"Cannot resume model {config.model_name!r} in {config.run_dir}: it does not take "
                                  f"{found}, and its inputs cannot change. Train a new --model-name.")
    spec = config.spec
    left_out = spec.inputs_left_out()
    fitted = []
    for arrays in splits:
        warn_plan_files_not_taken(arrays, left_out, f"Model {config.model_name!r}")
        fitted.append(fit_vectors(arrays, spec.inputs))
    if spec.patient_prescriptions or spec.beam_slots:
        logger.info("Per-patient inputs: %s", "; ".join(part for part in (
            "prescriptions (patients without prescriptions.csv: the site's)" if spec.patient_prescriptions else "",
            f"beams, up to {spec.beam_slots} per patient, turned with the patient by augmentation (patients "
            f"without beams.csv: gantry {spec.beam_angles_text}°)" if spec.beam_slots else "") if part))
    return config, spec, fitted


def training_input(strategy: tf.distribute.Strategy, arrays: SplitArrays, config, spec: ModelSpec, first_epoch: int,
                   epochs: int | None = None):
    """Every update of epochs ``first_epoch .. epochs - 1`` (default ``config.epochs``) of ``arrays``
    (at the training resolution): ``config.batch_size`` patients per replica, ``config.accumulate``
    micro-batches, each update's weights summing to 1; every worker feeds its own replicas' share."""
    augmenter = Augmenter(config.augmentations, arrays.possible_dose_mask, config.seed) if config.augmentations else None
    schedule = update_schedule(len(arrays), config.batch_size, strategy.num_replicas_in_sync, config.accumulate,
                               seed=config.seed, first_epoch=first_epoch,
                               epochs=config.epochs if epochs is None else epochs)
    return distributed_dataset(strategy, arrays, schedule, spec, with_mask=needs_possible_dose_mask(config.loss),
                               augmenter=augmenter)


def validation_input(strategy: tf.distribute.Strategy, arrays: SplitArrays, config, spec: ModelSpec) -> tuple:
    """``(dataset, patients)`` for the validation loss: every patient of ``arrays`` once, in order,
    weighted 1 (padding 0), batched as training is."""
    schedule = update_schedule(len(arrays), config.batch_size, strategy.num_replicas_in_sync, config.accumulate,
                               seed=0, first_epoch=0, epochs=1, shuffle=False, mean=False)
    return distributed_dataset(strategy, arrays, schedule, spec,
                               with_mask=needs_possible_dose_mask(config.loss)), len(arrays)
