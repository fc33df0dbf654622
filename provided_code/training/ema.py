"""Weight averaging (``--ema``): the optimizer keeps an exponential moving average of the weights
(Keras's own ``use_ema``); training goes on with the raw weights, and everything that judges or
keeps the model (validation loss, validation scores, ``best.keras``) sees the averaged ones."""

from __future__ import annotations

import contextlib

import keras

EMA_MOMENTUM = 0.999  # per update: the average spans about 1,000 updates (10 epochs of 200 patients at batch 2)


def uses_ema(model: keras.Model) -> bool:
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # under a loss-scale optimizer
    return bool(getattr(optimizer, "use_ema", False))


def use_averaged_weights(model: keras.Model) -> None:
    """Overwrite the model's trainable weights with the optimizer's averages (for prediction)."""
    model.optimizer.finalize_variable_values(model.trainable_variables)


@contextlib.contextmanager
def averaged_weights(model: keras.Model):
    """Inside: the model holds its averaged weights (if its optimizer averages); after: its raw
    weights again, exactly."""
    if not uses_ema(model):
        yield
        return
    raw = [keras.ops.convert_to_numpy(variable.value) for variable in model.trainable_variables]
    use_averaged_weights(model)
    try:
        yield
    finally:
        for variable, value in zip(model.trainable_variables, raw):
            variable.assign(value)
