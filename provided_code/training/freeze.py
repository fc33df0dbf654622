"""``--freeze encoder --freeze-epochs N``: the encoder's weights taken from the parent stay fixed
for the first N epochs of a fine-tune, then everything trains.

The training step zeroes the frozen variables' summed gradients before ``optimizer.apply``
(:class:`~provided_code.training.step.TrainStep`). Adam's moments of those variables start at zero
and a zero gradient keeps them there (m ← β₁m + (1 − β₁)·0), so their update, m̂ / (√v̂ + ε), is
exactly 0 / ε = 0: the weights stay bit-identical, and so do a resumed run's (its checkpoint holds
the zero moments). When they thaw, their moments start from zero while Adam's bias correction is
that of the global step count: the first updates of the thawed encoder are larger than a fresh
Adam's (about (1 − β₁) / √(1 − β₂) ≈ 16 × the rate on the first, 1 / √(1 − β₂ᵏ) after k), which a
lower fine-tuning rate keeps small. The encoder's layers not taken from the parent (another
site's first convolution) train from the start: fixing random weights would help nothing.
"""

from __future__ import annotations

import logging

import keras

from provided_code.config import TrainConfig
from provided_code.networks.build import network_body

logger = logging.getLogger(__name__)


def frozen_layers(model: keras.Model, config: TrainConfig) -> tuple[list[str], list[str]]:
    """``(frozen, thawed)``: with ``--freeze encoder``, the encoder's layers with trainable weights
    that the parent gave (all of them without a parent), and those it did not give (they train
    from the start); ``([], [])`` without ``--freeze``."""
    if config.freeze == "none":
        return [], []
    not_given = {entry["layer"] for entry in config.parent.get("not_taken", ())}
    in_encoder = network_body(config.arch).in_encoder
    encoder = [layer.name for layer in model.layers if in_encoder(layer.name) and layer.trainable_weights]
    return [name for name in encoder if name not in not_given], [name for name in encoder if name in not_given]


def frozen_variables(model: keras.Model, layers: list[str]) -> list:
    """The trainable variables of ``layers``."""
    return [variable for name in layers for variable in model.get_layer(name).trainable_weights]


class FreezeForEpochs(keras.callbacks.Callback):
    """At each epoch's start: the step's frozen variables held while the epoch (0-based) is below
    ``epochs``, free after (on every worker, like the dropout seeds)."""

    def __init__(self, step, epochs: int):
        super().__init__()
        self.step = step
        self.epochs = epochs

    def on_epoch_begin(self, epoch, logs=None):
        frozen = epoch < self.epochs
        if self.step.set_frozen(frozen) != frozen and not frozen:
            logger.info("Epoch %d: the frozen layers train from now on (--freeze-epochs %d)", epoch + 1, self.epochs)
