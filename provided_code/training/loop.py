"""The training loop: epochs of optimizer updates, Keras callbacks around them, and epoch measures.

Callbacks get the hooks ``fit`` would give them (train, epoch and test begin/end; batch hooks only
when a progress bar is shown, since reading a step's loss makes the host wait for the device).
Epoch measures (:class:`EpochMeasure`: peak memory, validation scores) add figures to an epoch's
logs. Every figure of an epoch (loss, validation loss, the measures') is in its logs before any
callback's ``on_epoch_end`` runs, so callbacks read them in any order.
"""

from __future__ import annotations

from typing import Sequence

import keras

from provided_code.training.divergence import DivergenceGuard, epoch_mean_loss
from provided_code.training.ema import averaged_weights
from provided_code.training.step import TrainStep


class EpochMeasure:
    """What an epoch adds to its logs beside the losses, asked in turn after the validation loss and
    before the callbacks' ``on_epoch_end`` (a callback could not add to the logs the others read).
    The loop holds the averaged weights (``--ema``) while it measures. Override what is needed."""

    def start(self) -> None:
        """Once, before the first epoch."""

    def begin_epoch(self, epoch: int) -> None:
        """At the start of epoch ``epoch`` (0-based), before its first step."""

    def end_updates(self, epoch: int) -> None:
        """When the updates of epoch ``epoch`` are done, before it is validated."""

    def measure(self, epoch: int) -> dict:
        """The figures of epoch ``epoch`` (0-based), by log name; empty when it measures nothing then."""
        return {}


def run_epochs(step: TrainStep, callbacks: keras.callbacks.CallbackList, train_data, updates_per_epoch: int,
               first_epoch: int, epochs: int, validation=None, batch_logs: bool = False,
               measures: Sequence[EpochMeasure] = (), guard: DivergenceGuard | None = None) -> dict:
    """Train epochs ``first_epoch .. epochs - 1`` (0-based) from ``train_data``, which holds exactly
    ``updates_per_epoch`` elements per epoch; ``validation`` is ``(dataset, patients)`` or None.

    ``measures``: asked in turn after the validation loss (peak memory first, before the scores'
    predictions; the epoch's timer last, so that its seconds include them).
    The validation loss and the measures see the averaged weights if the optimizer keeps them
    (``--ema``); the training steps, the callbacks and the checkpoints the raw ones.
    ``guard``: checks each epoch's loss first, and stops the run (raises) before anything of a
    diverged epoch is validated, measured, logged or saved.
    Returns the last epoch's logs."""
    logs: dict = {}
    for measure in measures:
        measure.start()
    callbacks.on_train_begin()
    batches = iter(train_data)
    for epoch in range(first_epoch, epochs):
        callbacks.on_epoch_begin(epoch)
        for measure in measures:
            measure.begin_epoch(epoch)
        losses = []
        for index in range(updates_per_epoch):
            if batch_logs:
                callbacks.on_train_batch_begin(index)
            losses.append(step.train(next(batches)))
            if batch_logs:
                callbacks.on_train_batch_end(index, {"loss": float(losses[-1])})
        logs = {"loss": epoch_mean_loss(losses, step.loss_scaling, epoch)}
        for measure in measures:
            measure.end_updates(epoch)
        if guard is not None:
            guard.check(epoch, logs["loss"])
        with averaged_weights(step.model):  # what is judged and kept: the averaged weights under --ema
            if validation is not None:
                callbacks.on_test_begin()
                logs["val_loss"] = step.evaluate(*validation)
                callbacks.on_test_end({"loss": logs["val_loss"]})
            for measure in measures:
                logs.update(measure.measure(epoch))
        callbacks.on_epoch_end(epoch, logs)
    callbacks.on_train_end(logs)
    return logs
