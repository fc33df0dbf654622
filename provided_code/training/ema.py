"""Weight averaging (``--ema``): the optimizer keeps an exponential moving average of the weights
(Keras's own ``use_ema``); training goes on with the raw weights, and everything that judges or
keeps the model (validation loss, validation scores, ``best.keras``) sees the averaged ones."""

from __future__ import annotations

import contextlib

import keras

from provided_code.inference import use_averaged_weights

EMA_EPOCHS = 2  # the average's time constant, in epochs
EMA_MOMENTUM = 0.999  # Keras's setting until the run sets its own (ema_momentum)


def ema_momentum(updates_per_epoch: int) -> float:
    """The per-update momentum whose average spans about ``EMA_EPOCHS`` epochs. A fixed 0.999
    (1,000 updates, 36 epochs of 55 patients at batch 2) lagged far behind at 64³: a dose score of
    8.5 Gy at epoch 90 where the raw weights scored 5.5 (docs/recipe.md, "The longer comparison")."""
    return 1.0 - 1.0 / (EMA_EPOCHS * max(1, updates_per_epoch))


def uses_ema(model: keras.Model) -> bool:
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # under a loss-scale optimizer
    return bool(getattr(optimizer, "use_ema", False))


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
