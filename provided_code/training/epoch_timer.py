"""How long each epoch took, and how fast its updates went: the log's ``epoch_seconds`` and
``samples_per_s``."""

from __future__ import annotations

import time

from provided_code.training.loop import EpochMeasure


class EpochTimer(EpochMeasure):
    """``epoch_seconds``: from the epoch's start to its measures' end (validation and scoring
    included: the last measure asked); ``samples_per_s``: ``samples_per_epoch`` over the seconds
    of the updates alone. The updates' end is known without a batch-level hook (one would make the
    host wait for the device after every step)."""

    def __init__(self, samples_per_epoch: int):
        self.samples_per_epoch = samples_per_epoch
        self._start = self._updates_end = None

    def begin_epoch(self, epoch: int) -> None:
        self._start, self._updates_end = time.perf_counter(), None

    def end_updates(self, epoch: int) -> None:
        self._updates_end = time.perf_counter()

    def measure(self, epoch: int) -> dict:
        now = time.perf_counter()
        updates_seconds = (self._updates_end or now) - self._start
        return {"epoch_seconds": round(now - self._start, 3),
                "samples_per_s": round(self.samples_per_epoch / updates_seconds, 4)}
