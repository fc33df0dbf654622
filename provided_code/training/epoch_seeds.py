"""Dropout randomness that depends only on (seed, epoch, layer), not on the run's history."""

from __future__ import annotations

import keras
import numpy as np


class ReseedDropoutEachEpoch(keras.callbacks.Callback):
    """At each epoch's start, set every seeded layer's generator state from ``(seed, epoch, layer)``.

    Keras does not store seed-generator state in ``.keras`` files, so without this a resumed run
    would draw different dropout masks from an uninterrupted one.
    """

    def __init__(self, seed: int):
        super().__init__()
        self.seed = seed

    def on_epoch_begin(self, epoch, logs=None):
        generators = [layer.seed_generator for layer in self.model.layers
                      if isinstance(getattr(layer, "seed_generator", None), keras.random.SeedGenerator)]
        for index, generator in enumerate(generators):
            start = np.random.default_rng([self.seed, epoch, index]).integers(0, 2**31 - 1)
            generator.state.assign(np.array([start, 0], dtype=generator.state.dtype))
