"""The learning rate of each epoch, from the epoch number alone (so a resumed run continues the schedule)."""

from __future__ import annotations

import math

import keras


def learning_rate_at(epoch: int, peak: float, epochs: int, schedule: str, warmup_epochs: int = 0) -> float:
    """The rate of epoch ``epoch`` (0-based) of ``epochs``.

    Warm-up: ``peak × (epoch + 1) / (warmup_epochs + 1)`` for the first ``warmup_epochs`` epochs
    (each below the peak). Then
    ``constant``: ``peak``; ``cosine``: ``peak × (1 + cos(π t)) / 2`` with ``t`` the fraction of
    the epochs after warm-up already done (the first such epoch runs at the peak).
    """
    if epoch < warmup_epochs:
        return peak * (epoch + 1) / (warmup_epochs + 1)
    if schedule == "constant":
        return peak
    if schedule == "cosine":
        done = (epoch - warmup_epochs) / max(1, epochs - warmup_epochs)
        return peak * 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))
    raise ValueError(f"Invalid `schedule`. Expected 'constant' or 'cosine'. Received: schedule={schedule!r}")


def epoch_learning_rates(peak: float, epochs: int, schedule: str, warmup_epochs: int = 0) -> keras.callbacks.Callback:
    """A callback that sets the optimizer's rate at the start of every epoch."""
    return keras.callbacks.LearningRateScheduler(
        lambda epoch, _rate: learning_rate_at(epoch, peak, epochs, schedule, warmup_epochs))
