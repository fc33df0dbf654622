"""One training run, top to bottom: settings, data, hardware, model, loop."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from provided_code.config import ConfigError, TrainConfig
from provided_code.infra.tf_config import Cluster, read_tf_config
from provided_code.data.augment import ROTATION_STEP_DEGREES
from provided_code.data import mapped
from provided_code.data.cache import load_split
from provided_code.data.provenance import record_training
from provided_code.data.split_arrays import SplitArrays, stacked_nbytes
from provided_code.data.csv_io import PatientDataError, discover_patients
from provided_code.data.resample import downsample_split
from provided_code.data.tf_dataset import updates_per_epoch
from provided_code.data_folder import require_split, split_dir
from provided_code.exclusions import excluded_patients, split_patients
from provided_code.folds import SPLITS_FILE, dealing_for
from provided_code.errors import UserError
from provided_code.infra.environment import describe_cpu_kernels
from provided_code.infra.host_memory import available_memory
from provided_code.infra.progress import Progress, no_progress
from provided_code.model_spec import ModelSpec
from provided_code.losses import loss_function
from provided_code.beams import augmentations_that_move_beams
from provided_code.run_folder import CONFIG_FILE, RunFolder
from provided_code.training.admission import admit, loss_changed_at, recipe_changed_at, with_changes_recorded
from provided_code.training.checkpoints import RotatingCheckpoint
from provided_code.training.cost import model_cost
from provided_code.training.curves import TrainingCurves
from provided_code.training.dead_output import DeadOutputGuard
from provided_code.training.divergence import DivergenceError, DivergenceGuard, loss_history
from provided_code.training.ema import ema_momentum
from provided_code.training.epoch_line import EpochLine
from provided_code.training.epoch_log import EpochCSVLogger, read_log, repair_log
from provided_code.training.epoch_timer import EpochTimer
from provided_code.training.epoch_seeds import ReseedDropoutEachEpoch
from provided_code.training.hardware import Hardware, resolve_hardware
from provided_code.training.feeds import fit_patient_inputs, training_input, validation_input
from provided_code.training.freeze import FreezeForEpochs, frozen_layers, frozen_variables
from provided_code.training.init_from import load_parent, parent_label, parent_record, take_weights
from provided_code.training.loop import run_epochs
from provided_code.training.lr_schedule import epoch_learning_rates
from provided_code.training.memory import PeakMemory
from provided_code.training.model import new_model
from provided_code.training.step import TrainStep
from provided_code.training.validation_scores import Validation, ValidationScores

logger = logging.getLogger(__name__)
MEMORY_SHARE = 0.5  # the stacked arrays may take this share of the available memory (the rest: TensorFlow,
#                    the model, the batches), else the run trains from the cache file mapped into memory


class WorkerLostError(UserError, RuntimeError):
    """A multi-worker run stopped because another worker failed or stopped answering."""


@dataclasses.dataclass
class TrainResult:
    first_epoch: int  # epochs already done when this run started
    last_epoch: int  # epochs done when it finished
    policy: str
    device: str
    checkpoint: Path | None  # the newest checkpoint
    is_chief: bool = True  # this process wrote the run (the one worker of a run, or a multi-worker run's chief)


def train(config: TrainConfig, progress: Progress = no_progress, verbose: int | str = 0,
          start_over: bool = False, given: set[str] | None = None, change_recipe: bool = False,
          cluster: Cluster | None = None) -> TrainResult:
    """Train ``config.model_name`` up to ``config.epochs``, resuming from its newest checkpoint.

    ``verbose``: 1 draws Keras's progress bar (for a terminal); otherwise one log line per epoch.
    ``start_over``: move the model's checkpoints, config and log aside and train from scratch.
    ``given``, ``change_recipe``: a resume takes the saved settings, except those in ``given``
    (None: all of ``config``'s); a recipe setting that differs is refused unless
    ``change_recipe``, and then recorded (:meth:`TrainConfig.resume`).
    ``cluster``: with ``config.multi_worker``, ``TF_CONFIG`` as the caller read it (None: read here).
    The run holds the model folder's lock throughout (with ``--multi-worker``, the chief: the one
    that writes); a second run on the same folder is refused. A diverging run stops with a
    :class:`~provided_code.training.divergence.DivergenceError` before it saves the diverged epoch.
    """
    folder = RunFolder(config.run_dir)
    cluster = (cluster or read_tf_config()) if config.multi_worker else None
    if cluster is not None and not cluster.is_chief:
        return _train(config, folder, cluster, progress, verbose, False, given, change_recipe)
    with folder.lock("training"):
        return _train(config, folder, cluster, progress, verbose, start_over, given, change_recipe)


def _train(config: TrainConfig, folder: RunFolder, cluster: Cluster | None, progress: Progress, verbose: int | str,
           start_over: bool, given: set[str] | None, change_recipe: bool) -> TrainResult:
    if start_over:  # the earlier model's files, its predictions, scores, zips and plots included
        moved = folder.start_over()
        if moved is not None:
            logger.warning("--start-over: moved the earlier run's files into %s", moved)
    config, saved, changes = admit(config, folder, given, change_recipe)  # 1. a resume takes the saved run's
    train_arrays, validation = _load_data(config, progress)  # 2. cached, stacked, at the training resolution
    # per-patient prescriptions and beams, when the data has them: made once per split here; the
    # model the run trains (its site, architecture and inputs), resolved once
    config, spec, (train_arrays, *validating) = fit_patient_inputs(
        config, [train_arrays] + ([validation.arrays] if validation is not None else []), saved)
    if validation is not None:
        validation = dataclasses.replace(validation, arrays=validating[0])
    hardware = resolve_hardware(config, cluster, saved)  # 3. strategy, precision, XLA
    config = dataclasses.replace(config, precision=hardware.policy)  # saved with the concrete policy
    updates = updates_per_epoch(len(train_arrays), config.batch_size, hardware.placement.replicas, config.accumulate)
    initial_epoch, model, config = _new_or_resumed_model(config, spec, folder, hardware, updates,  # 4. newest that
                                                         restarting=saved is not None)  # loads, or new (or the parent's)
    if initial_epoch >= config.epochs:  # config.json stays as it is: nothing was trained with these settings
        logger.info("Model %s is already trained to epoch %d (--epochs %d): nothing to do%s",
                    config.model_name, initial_epoch, config.epochs,
                    f"; the recipe change ({', '.join(name for name, _, _ in changes)}) is not recorded" if changes
                    else "")
        return TrainResult(initial_epoch, initial_epoch, hardware.policy, hardware.device, folder.newest_checkpoint(),
                           hardware.placement.is_chief)
    if changes:
        config = with_changes_recorded(config, changes, initial_epoch + 1)
        logger.warning("Recipe changed from epoch %d on (--change-recipe; recorded in %s's history): %s",
                       initial_epoch + 1, CONFIG_FILE,
                       "; ".join(f"{name} {old!r} -> {new!r}" for name, old, new in changes))
    config = dataclasses.replace(config, cost=model_cost(model, config))
    _describe_run(config, spec, hardware, model, validation)
    placement = hardware.placement
    if placement.is_chief:
        folder.write_config(config)
        if config.folds:  # what the fold trains on, file by file, for its commissioning (data/provenance.py)
            record_training(folder.trained_on, train_arrays, initial_epoch + 1)

    # 5. The loop: one schedule over the remaining epochs (training/feeds.py). Only the chief writes.
    strategy = placement.strategy
    train_data = training_input(strategy, train_arrays, config, spec, first_epoch=initial_epoch)
    validation_data = validation_input(strategy, validation.arrays, config, spec) if validation is not None else None
    frozen = _frozen_layers(config, model, initial_epoch)
    step = TrainStep(model, strategy, config.batch_size, xla=hardware.xla, accumulate=config.accumulate,
                     recompute=config.recompute, spec=spec, loss_fn=loss_function(config.loss, config.dvh_weight, spec),
                     frozen=frozen_variables(model, frozen))
    callbacks, measures = _callbacks_and_measures(config, spec, folder, hardware, model, validation, initial_epoch,
                                                  train_arrays)
    if frozen:  # on every worker
        callbacks.append(FreezeForEpochs(step, config.freeze_epochs))
    show_bar = verbose == 1 and placement.is_chief
    callback_list = keras.callbacks.CallbackList(callbacks, model=model, add_progbar=show_bar,
                                                 verbose=1 if show_bar else 0, epochs=config.epochs, steps=updates)
    if placement.is_chief:  # rows of epochs trained but not checkpointed are trained again: dropped
        repair_log(folder.log, initial_epoch)
    guard = DivergenceGuard(loss_history(read_log(folder.log), loss_changed_at(config), initial_epoch),
                            newest_checkpoint=folder.newest_checkpoint,
                            highest_dose_gy=spec.site.max_prescription_gy * (1 + config.dvh_weight))
    try:
        run_epochs(step, callback_list, train_data, updates, initial_epoch, config.epochs, validation_data,
                   batch_logs=show_bar, measures=measures, guard=guard)
    except DivergenceError as error:
        newest = folder.checkpoints()
        if changes and placement.is_chief and (not newest or newest[0][0] <= initial_epoch):
            # No checkpoint was trained with the changed recipe: config.json goes back to what the
            # checkpoints were trained with, so that the plain command resumes them as they were.
            folder.write_config(saved)
            raise DivergenceError(f"{error} The recipe change was not kept: {folder.config_file} "
                                  f"holds the saved recipe again.") from None
        raise
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.CancelledError,
            tf.errors.AbortedError, tf.errors.InternalError) as error:
        _raise_corrupt_chunk(train_arrays, validation)
        if placement.workers == 1:
            raise
        raise WorkerLostError(
            f"Multi-worker training stopped: a worker failed or stopped answering (the others wait at most "
            f"--collective-timeout {config.collective_timeout:g} s; {type(error).__name__}: {_reason(error)}). "
            f"The newest checkpoint in {folder.models} is intact: restart every worker with the same "
            f"command to resume.") from None
    except tf.errors.OpError:
        _raise_corrupt_chunk(train_arrays, validation)
        raise
    logger.info("Weights fingerprint %s (the same on every worker of a run)", weights_fingerprint(model))
    return TrainResult(initial_epoch, config.epochs, hardware.policy, hardware.device, folder.newest_checkpoint(),
                       placement.is_chief)


def _load_data(config: TrainConfig, progress: Progress) -> tuple[SplitArrays, Validation | None]:
    """The training patients, and the validation patients with doses (None without any): parsed
    once into the cache, stacked in memory (or mapped from the cache file: :func:`_memory_map`),
    brought to the training resolution. The patients of ``--exclude`` are left out of training;
    with ``--folds``, the training split is dealt into folds and this fold's held-out patients
    are its validation patients (:func:`_fold_data`)."""
    train_dir = require_split(config.data_dir, "train")
    validation_dir = split_dir(config.data_dir, "validation")
    memory_map = _memory_map(config, train_dir, validation_dir)
    downsample = mapped.downsampled if memory_map else downsample_split
    excluded = excluded_patients(config.excluded)
    try:  # the excluded are read too (they are dealt into the folds), but their files may be what excluded them
        full = load_split(train_dir, cache_dir=config.cache_dir, require_dose=True,
                          skip_incomplete=config.skip_incomplete, progress=progress, memory_map=memory_map,
                          site=config.site, leave_out=excluded)
    except PatientDataError as error:
        if error.patient_id not in {folder.name for folder in discover_patients(train_dir)}:
            raise
        way_out = (f"; to train without {error.patient_id}, list it with a reason in an exclusion file "
                   f"(patient,reason) and pass --exclude FILE (docs/commissioning.md)")
        raise PatientDataError(error.patient_id, error.path, error.problem + way_out) from None
    patients = _check_excluded(config, excluded, full, train_dir)
    if config.folds:
        return _fold_data(config, full, downsample(full, config.resolution), excluded, train_dir, patients)
    train_arrays = downsample(full, config.resolution)
    del full
    if excluded:
        train_arrays = train_arrays.select([row for row, pid in enumerate(train_arrays.patient_ids)
                                            if pid not in excluded])
    validation = None
    if validation_dir.is_dir():
        patients = load_split(validation_dir, cache_dir=config.cache_dir, require_dose=False,
                              skip_incomplete=config.skip_incomplete, progress=progress, memory_map=memory_map,
                              site=config.site)
        if patients.has_dose.any():
            full = patients.select(np.flatnonzero(patients.has_dose))
            validation = Validation(downsample(full, config.resolution), full)
        else:
            logger.info("%s has no dose.csv files: no validation loss", validation_dir)
    logger.info("Training on %d patients at %d³%s", len(train_arrays), config.resolution,
                f", validating on {len(validation.full)}" if validation is not None else "")
    return train_arrays, validation


def _check_excluded(config: TrainConfig, excluded: set[str], full: SplitArrays, train_dir: Path) -> list[str]:
    """Every patient of the training split (:func:`provided_code.exclusions.split_patients`: those
    read into ``full`` and the patients of ``--exclude``, ``excluded``, whose files could not be read,
    in its ``skipped``); each excluded patient must be one of them (a name that is not is a typo:
    refused, naming it), and each is said in the log with its reason (the problem with the files not
    read, :func:`~provided_code.data.cache.load_split` says)."""
    patients = split_patients(full.patient_ids, full.skipped, excluded)
    unknown = sorted(excluded - set(patients))
    if unknown:
        raise ConfigError(f"Invalid `exclude`. Expected patients of {train_dir} ({config.excluded_by.get('file', '')}). "
                          f"Received: {', '.join(unknown)}, not among them")
    if len(excluded) >= len(patients):
        raise ConfigError(f"Invalid `exclude`. Expected some of the {len(patients)} training patients of "
                          f"{train_dir} left to train on. Received: all of them excluded")
    for entry in config.excluded:  # those whose files were not read load_split has said, with why
        logger.info("Excluded from training: %s (%s)", entry["patient"], entry["reason"])
    return patients


def _fold_data(config: TrainConfig, full: SplitArrays, low: SplitArrays, excluded: set[str],
               train_dir: Path, patients: list[str]) -> tuple[SplitArrays, Validation]:
    """Fold ``config.fold``'s patients: the training split dealt into ``config.folds`` folds once
    (:func:`provided_code.folds.dealing_for`, checked against the model's ``splits.json``); this
    fold trains on the others' and is validated (its loss, scores and best checkpoint) on its own
    held-out ones; excluded patients are in neither, and are dealt all the same, those whose files
    could not be read too (``patients``: the split's, :func:`_check_excluded`)."""
    dealing = dealing_for(config.model_dir, patients, config.folds, config.seed,
                          source=str(train_dir))
    held_out = set(dealing.held_out_of(config.fold, excluded))
    validating = [row for row, pid in enumerate(full.patient_ids) if pid in held_out]
    training = [row for row, pid in enumerate(full.patient_ids) if pid not in held_out and pid not in excluded]
    if not validating or not training:
        deal_again = (f" (its held-out patients, {', '.join(dealing.held_out_of(config.fold))}, are all excluded): "
                      f"deal the patients again, as a new --model-name with another --seed or fewer --folds"
                      if not validating else "")
        raise ConfigError(f"Fold {config.fold} of {config.folds} has {len(training)} patients to train on and "
                          f"{len(validating)} held out once the excluded are left out: too few for a fold"
                          + deal_again)
    logger.info("Fold %d of %d (%s): training on %d patients of the other folds, validating on its %d held-out "
                "patients (%s); %s is not used by a fold", config.fold, config.folds, config.model_dir / SPLITS_FILE,
                len(training), len(validating), ", ".join(full.patient_ids[row] for row in validating),
                split_dir(config.data_dir, "validation"))
    return low.select(training), Validation(low.select(validating), full.select(validating))


def _memory_map(config: TrainConfig, train_dir: Path, validation_dir: Path) -> bool:
    """Whether to train from the cache file mapped into memory: with ``--memory-map``, or when the
    stacked arrays (every patient at 128³ while loading, and at the training resolution) would take
    more than ``MEMORY_SHARE`` of the memory available. Says which, and why, in the log."""
    patients = len(discover_patients(train_dir)) + (len(discover_patients(validation_dir))
                                                    if validation_dir.is_dir() else 0)
    need = stacked_nbytes(patients, site=config.site) + (
        stacked_nbytes(patients, config.resolution, site=config.site) if config.resolution != 128 else 0)
    available, source = available_memory()
    sizes = (f"{patients} patients stacked would take {need / 1e9:.1f} GB; "
             + (f"{available / 1e9:.1f} GB available ({source})" if available is not None else source))
    if config.memory_map:
        logger.info("Data: mapped from the cache files (--memory-map); %s", sizes)
        return True
    if available is not None and need > MEMORY_SHARE * available:
        logger.warning("Data: mapped from the cache files, as --memory-map does: %s, more than %d%% of it. Each "
                       "batch reads its patients from the files (the page cache keeps what is hot)", sizes,
                       round(100 * MEMORY_SHARE))
        return True
    logger.info("Data: stacked in memory; %s", sizes)
    return False


def _new_or_resumed_model(config: TrainConfig, spec: ModelSpec, folder: RunFolder, hardware: Hardware,
                          updates: int, restarting: bool) -> tuple[int, keras.Model, TrainConfig]:
    """``(epochs done, model, config)``: the newest checkpoint that loads, else a new model (with
    ``--ema``, averaging over about ``EMA_EPOCHS`` epochs of ``updates`` updates) that, with a
    parent (``config.parent``), takes the parent's weights, recorded in the config returned; the
    optimizer built eagerly, under the strategy; every worker checked to resume from the same epoch.
    ``restarting``: the run has a saved config (a model started from the parent before, with no
    checkpoint of its own yet)."""
    strategy = hardware.placement.strategy
    with strategy.scope():
        resumed = folder.load_newest()
    if resumed is not None:
        initial_epoch, model = resumed
        logger.info("Resuming %s from epoch %d%s", config.model_name, initial_epoch,
                    f" (it started from the {parent_label(config.parent)}; not loaded again)" if config.parent else "")
    else:
        initial_epoch = 0
        parent = None
        if config.parent:  # read before the new model, outside the strategy's scope
            parent = load_parent(config.parent, "pass --start-over (with --init-from) to start from it as it is now"
                                 if restarting else "run the command again to start from it as it is now")
        with strategy.scope():
            model = new_model(spec, hardware.learning_rate, ema=config.ema, ema_momentum=ema_momentum(updates))
            if parent is not None:
                matching = take_weights(model, spec, parent)
                config = dataclasses.replace(config, parent=parent_record(parent, matching))
                for line in matching.describe(parent_label(config.parent)):
                    logger.info("%s", line)
    with strategy.scope():
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    if hardware.placement.workers > 1:
        _check_workers_agree(hardware.placement.strategy, initial_epoch)
    return initial_epoch, model, config


def _frozen_layers(config: TrainConfig, model: keras.Model, initial_epoch: int) -> list[str]:
    """With ``--freeze`` and epochs of it left: the layers the training step holds (said in the log)."""
    frozen, thawed = frozen_layers(model, config)
    if not frozen or initial_epoch >= config.freeze_epochs:
        return []
    logger.info("Frozen for the first %d epoch(s) (--freeze %s): %s%s", config.freeze_epochs, config.freeze,
                ", ".join(frozen),
                f"; training from the start, not taken from the parent: {', '.join(thawed)}" if thawed else "")
    return frozen


def _describe_run(config: TrainConfig, spec: ModelSpec, hardware: Hardware, model: keras.Model,
                  validation: Validation | None) -> None:
    logger.info("Device: %s; dtype policy %s (%s); XLA %s (%s); %s; %s", hardware.device, hardware.policy,
                type(model.optimizer).__name__, "on" if hardware.xla else "off", hardware.xla_reason,
                describe_cpu_kernels(),
                "recomputing block activations in the backward pass" if config.recompute else "activations kept")
    scoring = ("off" if not config.score_every else "off (no validation patients with doses)" if validation is None
               else f"every {config.score_every} epoch(s) and at the last")
    logger.info("Recipe: loss %s%s; augmentation %s; learning rate %s%s%s; validation scores %s", config.loss,
                f" + {config.dvh_weight:g} × DVH term" if config.dvh_weight else "",
                config.augment, config.lr_schedule,
                f" after {config.warmup_epochs} warm-up epoch(s)" if config.warmup_epochs else "",
                "; weights averaged (validated, scored and kept as best: the average)" if config.ema else "", scoring)
    if config.parent:
        logger.info("Started from the %s of site %s (%s, SHA-256 %s…): %d layers taken%s", parent_label(config.parent),
                    config.parent["site"], config.parent["folder"], config.parent["sha256"][:12],
                    len(config.parent.get("taken", ())), f", {len(config.parent['not_taken'])} not"
                    if config.parent.get("not_taken") else " (every weight)")
    broken = augmentations_that_move_beams(spec.gantry_angles, config.augmentations, ROTATION_STEP_DEGREES)
    if broken and not spec.beam_slots:  # per-patient angles turn with the patient
        logger.warning("The beam angles %s are not carried into themselves by the augmentation %s: after it, "
                       "the beam channels describe beams the patient did not have (use angles symmetric under "
                       "those moves, or --augment without %s)", spec.beam_angles_text, " and ".join(broken),
                       " and ".join(broken))
    logger.info("Network: %s, %d filters × widths %s at %d³, %s norm, %s head; inputs CT, %d structures of site "
                "%s%s%s%s", spec.arch, spec.filters, config.widths, spec.resolution, spec.norm, spec.head,
                len(spec.site.names), spec.site.name,
                (", each patient's prescription" if spec.patient_prescriptions else ", prescription")
                if spec.prescription_channel else "",
                (f", each patient's beams (up to {spec.beam_slots}; {spec.beam_channels})" if spec.beam_slots
                 else f", {len(spec.gantry_angles)} beams at gantry {spec.beam_angles_text}° ({spec.beam_channels})")
                if spec.gantry_angles else "",
                ", the beams' primary fluence (--physics)" if spec.physics else "")
    cost = config.cost
    logger.info("Cost: %s parameters, %.3g GMAC a sample forward, %.2f GB a step at batch %d under %s (weights, "
                "gradients, Adam and every activation; estimated: scripts/model_cost.py)", f"{cost['parameters']:,}",
                cost["gmac_per_sample"], cost["memory_gb"], cost["batch_size"], cost["policy"])


def _callbacks_and_measures(config: TrainConfig, spec: ModelSpec, folder: RunFolder, hardware: Hardware,
                            model: keras.Model, validation: Validation | None, initial_epoch: int,
                            train_arrays: SplitArrays) -> tuple[list, list]:
    """The Keras callbacks (every worker: dropout seeds and the learning rate; the chief: log, its
    console line, checkpoints, curves, TensorBoard) and the epoch measures (every worker: the
    dead-output check, which stops them alike; the chief: peak memory, then the validation scores,
    whose predictions must not count in the peak, then the epoch's timer, whose seconds include them)."""
    callbacks = [ReseedDropoutEachEpoch(config.seed),
                 epoch_learning_rates(hardware.learning_rate, config.epochs, config.lr_schedule, config.warmup_epochs)]
    predict_batch = tf.function(lambda inputs: model(inputs, training=False), jit_compile=hardware.xla,
                                autograph=False)
    guard = DeadOutputGuard(train_arrays, config.batch_size, predict_batch, spec, folder.newest_checkpoint)
    if not hardware.placement.is_chief:
        return callbacks, [guard]
    measures = [guard, PeakMemory()]
    callbacks += [
        EpochCSVLogger(folder.log),
        EpochLine(config.epochs),
        RotatingCheckpoint(folder, config.save_every, config.keep, config.epochs,
                           kept_until_scored=_before_an_unscored_change(config, folder, initial_epoch)),
    ]
    if config.score_every and validation is not None:
        measures.append(ValidationScores(validation, config.batch_size, config.score_every, config.epochs, folder,
                                         model, predict_batch, spec))
        callbacks.append(TrainingCurves(folder, initial_epoch))
    if config.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=str(folder.tensorboard)))
    measures.append(EpochTimer(samples_per_epoch=len(train_arrays)))
    return callbacks, measures


def _before_an_unscored_change(config: TrainConfig, folder: RunFolder, initial_epoch: int) -> int | None:
    """The epochs done before the run's last recipe change, while no epoch since has been scored
    (its log, up to the resumed ``initial_epoch``: later rows were not checkpointed and are trained
    again), else None: the newest checkpoint of those epochs is kept until one is."""
    changed_at = recipe_changed_at(config)
    if changed_at <= 1:
        return None
    scored = any(changed_at <= int(row["epoch"]) <= initial_epoch and row["val_dose_score"]
                 and math.isfinite(float(row["val_dose_score"])) for row in read_log(folder.log))
    return None if scored else changed_at - 1


def _raise_corrupt_chunk(train_arrays: SplitArrays, validation: Validation | None) -> None:
    """Raise the memory-mapped chunk that failed its checksum in the input pipeline (TensorFlow
    reports it wrapped, with a traceback), if one did."""
    corrupt = mapped.corrupt_chunk_error(train_arrays, *((validation.arrays, validation.full) if validation else ()))
    if corrupt is not None:
        raise corrupt from None


def _reason(error: Exception) -> str:
    """The informative line of a TensorFlow runtime error (its first line is often just 'Graph execution error')."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if any(word in line for word in ("unhealthy", "aborted", "timed out", "Deadline", "Connection", "Socket")):
            return line[:300]
    return lines[0][:300] if lines else type(error).__name__


def weights_fingerprint(model: keras.Model) -> str:
    """A short hash of every weight's bytes: replicas and workers in sync show the same one."""
    digest = hashlib.sha256()
    for weight in model_weights(model):
        digest.update(weight.tobytes())
    return digest.hexdigest()[:16]


def replicas_agree(strategy: tf.distribute.Strategy, value_fn) -> tuple[bool, float]:
    """``(agree, mean)``: whether the whole number ``value_fn()`` (called in each replica's context)
    is the same on every replica of every worker, from all-reduced sums of the values and their
    squares: n·Σv² = (Σv)² only when all are equal. The sums are float64, exact while
    n·v² < 2⁵³ (float32 was exact only while n·v² < 2²⁴: three replicas at epoch 2401 disagreed)."""
    def per_replica():
        value = tf.cast(value_fn(), tf.float64)
        return value, value * value

    @tf.function(autograph=False)
    def sums():
        values, squares = strategy.run(per_replica)
        return strategy.reduce("SUM", values, axis=None), strategy.reduce("SUM", squares, axis=None)

    total, squares = (float(x) for x in sums())
    replicas = strategy.num_replicas_in_sync
    return abs(squares * replicas - total * total) < 0.5, total / replicas


def _check_workers_agree(strategy: tf.distribute.Strategy, initial_epoch: int) -> None:
    """Every worker must resume from the same epoch (they read the same --results-dir)."""
    agree, mean = replicas_agree(strategy, lambda: tf.constant(initial_epoch, tf.int64))
    if not agree:
        raise ConfigError(f"The workers would resume from different epochs (this one from {initial_epoch}, "
                          f"the mean {mean:g}): --results-dir must be storage every worker "
                          f"shares, with the same checkpoints.")


def model_weights(model: keras.Model) -> list[np.ndarray]:
    """Every weight of ``model`` (trainable and not) as numpy arrays, for comparisons."""
    return [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.weights]
